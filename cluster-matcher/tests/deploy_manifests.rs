//! What the manifests in `deploy/` must agree on (read as text: no YAML parser in the
//! workspace; each check names the lines it looks for).

use std::path::Path;

fn read(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The value after `key:` on the first line (trimmed) that starts with it.
fn value_of<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().map(str::trim).find_map(|l| l.strip_prefix(key)).map(|v| v.trim().trim_matches('"'))
}

/// The second scheduler's leader-election lease is one its service account may renew: the
/// built-in system:kube-scheduler role allows get/update only on the lease `kube-scheduler`.
#[test]
fn the_scheduler_can_renew_the_lease_its_config_names() {
    let config = read("scheduler-config.yaml");
    let lease = value_of(&config, "resourceName:").expect("leaderElection.resourceName");
    assert_eq!(value_of(&config, "resourceNamespace:"), Some("kube-system"));
    let rbac = read("scheduler-rbac.yaml");
    let docs: Vec<&str> = rbac.split("\n---").collect();
    let role = docs
        .iter()
        .find(|d| d.contains("kind: Role\n") && d.contains("coordination.k8s.io"))
        .expect("a Role for the lease");
    assert!(role.contains("namespace: kube-system"), "{role}");
    assert!(role.contains(&format!("resourceNames: [\"{lease}\"]")), "{role}");
    assert!(role.contains("verbs: [\"get\", \"update\"]") && role.contains("verbs: [\"create\"]"), "{role}");
    let name = value_of(role, "name:").unwrap();
    assert!(
        docs.iter().any(|d| d.contains("kind: RoleBinding") && d.contains(&format!("name: {name}\n"))
            && d.contains("name: xshare-scheduler\n")),
        "the Role is bound to the xshare-scheduler service account"
    );
    assert!(rbac.contains("name: system:kube-scheduler"));
}

/// One extender at a time: two overlapping in a rolling update would each keep their own
/// record of binds in flight and could bind two pods onto one GPU.
#[test]
fn the_extender_is_replaced_never_overlapped() {
    let d = read("extender.yaml");
    let deployment = d.split("\n---").find(|x| x.contains("kind: Deployment")).expect("the Deployment");
    assert_eq!(value_of(deployment, "replicas:"), Some("1"));
    let strategy = deployment.split("strategy:").nth(1).expect("a strategy");
    assert_eq!(value_of(strategy, "type:"), Some("Recreate"), "{strategy}");
}
