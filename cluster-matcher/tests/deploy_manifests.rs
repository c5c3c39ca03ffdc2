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

/// The text of the block scalar `key: |` in `text` (a ConfigMap's file), its indentation
/// removed: the embedded document as kube-scheduler reads it.
fn block_scalar(text: &str, key: &str) -> String {
    let mut lines = text.lines().skip_while(|l| l.trim() != format!("{key}: |"));
    let head = lines.next().unwrap_or_else(|| panic!("no `{key}: |`"));
    let outer = head.len() - head.trim_start().len();
    let body: Vec<&str> =
        lines.take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > outer).collect();
    let indent = body.iter().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min().unwrap();
    body.iter().map(|l| l.get(indent..).unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The value of a top-level (unindented) `key:` of a YAML document.
fn top_level<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    doc.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).map(|v| v.split('#').next().unwrap().trim())
}

/// kube-scheduler stops filtering after max(100, N x pct %) feasible nodes and only those
/// reach the extender: the embedded KubeSchedulerConfiguration must filter every node, so
/// the planned node is always among those offered (the extender reads its absence as
/// kube-scheduler's own filters refusing it). Top-level is the xshare profile's: it is the
/// only profile.
#[test]
fn the_scheduler_filters_every_node_so_the_extender_sees_the_planned_one() {
    let config = block_scalar(&read("scheduler-config.yaml"), "xshare-scheduler-config.yaml");
    assert_eq!(top_level(&config, "kind"), Some("KubeSchedulerConfiguration"), "{config}");
    assert_eq!(top_level(&config, "apiVersion"), Some("kubescheduler.config.k8s.io/v1"), "{config}");
    assert_eq!(top_level(&config, "percentageOfNodesToScore"), Some("100"), "{config}");
    let profiles = config.split("\nprofiles:\n").nth(1).expect("profiles");
    let entries: Vec<&str> = profiles.lines().take_while(|l| l.starts_with(' ')).filter(|l| l.trim_start().starts_with("- ")).collect();
    assert_eq!(entries, vec!["  - schedulerName: xshare-scheduler"], "one profile, xshare's");
    assert!(!profiles.lines().take_while(|l| l.starts_with(' ')).any(|l| l.contains("percentageOfNodesToScore")), "no profile overrides it");
}

/// The extender serves its verbs over TLS with the scheduler's client certificate required,
/// and the scheduler's configuration speaks to it that way: https, `enableHTTPS`, a client
/// certificate and the CA of the extender's. The probes and Prometheus use the plain
/// metrics port, which is the one the annotations name.
#[test]
fn the_scheduler_reaches_the_extender_over_tls_with_a_client_certificate() {
    let ext = read("extender.yaml");
    // The keys a cert-manager Secret has (tls.crt, tls.key, ca.crt): no other.
    for arg in ["--tls-cert=/etc/xshare-tls/tls.crt", "--tls-key=/etc/xshare-tls/tls.key", "--client-ca=/etc/xshare-tls/ca.crt", "--client-name=xshare-scheduler", "--metrics-listen=0.0.0.0:9888"] {
        assert!(ext.contains(&format!("- {arg}")), "extender.yaml lacks {arg}");
    }
    assert!(!ext.contains("--insecure-http"), "extender.yaml serves plain HTTP");
    assert_eq!(value_of(&ext, "prometheus.io/port:"), Some("9888"));
    assert!(ext.contains("httpGet: {path: /healthz, port: metrics}"), "probes on the metrics port");
    assert!(ext.contains("secretName: xshare-extender-tls"), "the TLS Secret is mounted");
    let config = block_scalar(&read("scheduler-config.yaml"), "xshare-scheduler-config.yaml");
    let url = value_of(&config, "- urlPrefix:").expect("urlPrefix");
    assert!(url.starts_with("https://"), "{url}");
    assert_eq!(value_of(&config, "enableHTTPS:"), Some("true"));
    for key in ["certFile:", "keyFile:", "caFile:", "serverName:"] {
        assert!(value_of(&config, key).is_some_and(|v| !v.is_empty()), "tlsConfig lacks {key}");
    }
    let host = url.trim_start_matches("https://").split([':', '/']).next().unwrap();
    assert_eq!(value_of(&config, "serverName:"), Some(host), "serverName is the Service's name");
}
