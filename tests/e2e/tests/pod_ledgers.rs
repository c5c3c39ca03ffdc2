//! One ledger per pod (`node_ledger::pods`): what a tenant writes into the ledger its containers
//! see reaches no other pod. Every offline process can write the ledger it registers in with
//! plain stores; with one ledger per GPU shared by all offline containers (node-agent's
//! `inject.pod_ledgers` off, the layout before pod ledgers), a tenant that fills it with 0xff
//! makes every neighbour's group look full, and the neighbour's next allocation is refused. With
//! a ledger per pod, mounted alone into that pod's containers, the same write lands in the
//! tenant's own file, and the neighbour allocates on. The containers are made as node-agent's
//! Allocate describes them (its mounts, in a mount namespace of their own); the tenant is root in
//! its container, the neighbour's processes run as uid 65534. Needs root.

mod shim_support;

use std::process::Command;
use std::time::Duration;

use e2e::EmuHost;
use node_agent::allocate::{create_pod_ledger, pod_ledger_mount, static_edits};
use node_agent::config::AgentConfig;
use node_ledger::PodUid;
use shim_support::*;

const T: Duration = Duration::from_secs(30);

fn uid(s: &str) -> PodUid {
    PodUid::parse(s).unwrap()
}

/// `program args` of a shimmed client of group `group` (quota `quota`), run as a container
/// with Allocate's `mounts` (container paths are host paths here): the mounts are made first,
/// in a mount namespace of its own, then `program` runs as uid/gid 65534 with the shim
/// preloaded into it alone.
fn in_container(host: &EmuHost, mounts: &[(String, String, bool)], program: &str, quota: u64, group: &str, args: &[&str]) -> Command {
    let base = limited(host, program, quota, group);
    let prog = base.get_program().to_owned();
    let script = e2e::allocate_mounts_script(mounts.iter().map(|(h, c, ro)| (h.as_str(), c.as_str(), *ro)), host.ledger_dir());
    let script = format!(
        "{script}exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups env LD_PRELOAD='{}' \"$@\"\n",
        shim().display()
    );
    let mut c = host.command("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"]).arg(prog).args(args);
    for (k, v) in base.get_envs() {
        if k == "LD_PRELOAD" {
            continue;
        }
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

/// The mounts a container of pod `pod` gets for its ledger: its pod's file, or (`shared`) the
/// GPU's ledger directory.
fn ledger_mounts(cfg: &AgentConfig, pod: PodUid, shared: bool) -> Vec<(String, String, bool)> {
    let m = if shared {
        let mut c = cfg.clone();
        c.inject.pod_ledgers = false;
        static_edits(&c, 0).1.into_iter().filter(|m| m.container_path.ends_with("/gpu0")).collect()
    } else {
        create_pod_ledger(cfg, 0, pod).unwrap();
        vec![pod_ledger_mount(cfg, 0, pod)]
    };
    assert_eq!(m.len(), 1, "{m:?}");
    m.into_iter().map(|m| (m.host_path, m.container_path, m.read_only)).collect()
}

/// Pod B holds 64 MiB of its 256 MiB; pod A's tenant fills the ledger it sees with 0xff after
/// the header; then pod B asks for 128 MiB more. Returns that allocation's result (`0`:
/// granted) and B's holder's output.
fn neighbours(shared: bool) -> String {
    let host = host_for_users();
    let mut cfg = AgentConfig { ledger_dir: host.ledger_dir().to_path_buf(), ..Default::default() };
    cfg.inject.ledger_container_dir = host.ledger_dir().to_path_buf();
    // The GPU's own ledger (the monitor makes it): where the shim looks, and a pod's file is
    // mounted over it.
    let gpu_ledger = node_ledger::config::ledger_path(host.ledger_dir(), 0);
    node_ledger::Ledger::open_or_create(&gpu_ledger, 0).unwrap().set_access(0o666, None).unwrap();
    let (a, b) = (uid("0000000a-0000-4000-8000-00000000000a"), uid("0000000b-0000-4000-8000-00000000000b"));
    let (ma, mb) = (ledger_mounts(&cfg, a, shared), ledger_mounts(&cfg, b, shared));
    let group = |p: PodUid| node_ledger::ledger::pod_group_name(&p.to_string());
    let mut holder = host.spawn(&mut in_container(&host, &mb, "shim_client", 256 * MIB, &group(b), &["ctx", "alloc", &(64 * MIB).to_string(), "ready", "wait", "exit"]));
    holder.wait_for_line("ready", T).unwrap_or_else(|| panic!("pod B's holder never got its memory:\n{}", holder.stderr()));
    // The same process all along (unshare, sh, setpriv and env each exec the next): uid 65534.
    let status = std::fs::read_to_string(format!("/proc/{}/status", holder.pid())).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534")), "{status}");
    // Pod A's tenant: 0xff over everything after the header of the ledger it sees.
    let seen = gpu_ledger.display().to_string();
    let header = node_ledger::layout::HEADER_SIZE;
    let body = node_ledger::layout::LAYOUT_SIZE - header;
    let script = e2e::allocate_mounts_script(ma.iter().map(|(h, c, ro)| (h.as_str(), c.as_str(), *ro)), host.ledger_dir());
    let script = format!("{script}head -c {body} /dev/zero | tr '\\000' '\\377' | dd of='{seen}' bs=4096 seek={header} oflag=seek_bytes conv=notrunc status=none || exit 93\n");
    let st = host.command("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).status().unwrap();
    assert!(st.success(), "the tenant's write: {st:?}");
    let mut more = in_container(&host, &mb, "shim_client", 256 * MIB, &group(b), &["ctx", "alloc", &(128 * MIB).to_string(), "exit"]);
    let out = host.spawn(&mut more).finish(T);
    if !shared {
        // Pod B's own ledger is as it was: its holder's registration and 64 MiB; the GPU's
        // ledger, which no pod saw, holds nobody.
        let lb = node_ledger::Ledger::open_existing(&node_ledger::pods::pod_ledger_path(host.ledger_dir(), b, 0)).unwrap();
        assert!(lb.check_header().is_ok());
        let procs = lb.procs();
        assert_eq!(procs.iter().map(|p| p.mem_bytes).collect::<Vec<_>>(), [64 * MIB], "{procs:?}");
        assert!(node_ledger::Ledger::open_existing(&gpu_ledger).unwrap().procs().is_empty());
    }
    holder.send_line("go");
    let held = holder.finish(T);
    assert!(held.contains("alloc=0"), "{held}");
    out.lines()
        .find_map(|l| e2e::field(l, "alloc").map(String::from))
        .unwrap_or_else(|| panic!("no alloc result: {out}"))
}

#[test]
fn a_tenants_raw_writes_into_its_ledger_reach_no_other_pod() {
    if e2e::lacks_root("make mount namespaces") {
        return;
    }
    assert_eq!(neighbours(false), "0", "a ledger per pod: pod B allocates on");
    assert_ne!(neighbours(true), "0", "one shared ledger: pod A's write refused pod B's allocation");
}
