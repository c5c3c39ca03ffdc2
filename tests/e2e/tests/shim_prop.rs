//! Property, across processes: random interleavings of alloc/free by several shimmed processes
//! of one container never take the container past its quota (as seen in the shared ledger and
//! on the emulated device) and always return to zero.

mod shim_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use e2e::EmuHost;
use proptest::prelude::*;
use shim_support::*;

const QUOTA: u64 = 48 * MIB;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    Free,
    Sleep(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..24).prop_map(|m| Op::Alloc(m * MIB)),
        3 => Just(Op::Free),
        1 => (1u64..5).prop_map(Op::Sleep),
    ]
}

fn steps(ops: &[Op], path: &str) -> Vec<String> {
    let mut v = vec!["ctx".to_string()];
    for o in ops {
        match o {
            Op::Alloc(b) => v.extend([path.to_string(), b.to_string()]),
            Op::Free => v.push("free".into()),
            Op::Sleep(ms) => v.extend(["sleep".to_string(), ms.to_string()]),
        }
    }
    v.push("freeall".into());
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn processes_never_exceed_the_shared_quota_and_return_to_zero(
        plans in proptest::collection::vec(proptest::collection::vec(op(), 5..25), 2..5),
    ) {
        let host = EmuHost::new();
        let dev = host.device();
        let l = Arc::new(ledger(&host));
        let g = l.group(node_ledger::ledger::group_id_for("prop"), QUOTA).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (l, stop, dev) = (l.clone(), stop.clone(), host.device());
            std::thread::spawn(move || {
                let (mut max_ledger, mut max_dev) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    max_ledger = max_ledger.max(l.group_used(g));
                    // Allocations, not what the processes' contexts hold (outside any quota).
                    max_dev = max_dev.max(dev.snapshot().memory_allocated());
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
                (max_ledger, max_dev)
            })
        };
        let paths = ["alloc", "async", "managed", "vmm"];
        let mut kids: Vec<_> = plans.iter().enumerate().map(|(i, ops)| {
            let mut c = limited(&host, "shim_client", QUOTA, "prop");
            c.args(steps(ops, paths[i % paths.len()]));
            host.spawn(&mut c)
        }).collect();
        for k in kids.iter_mut() {
            let out = k.finish(T);
            prop_assert!(!out.contains("fatal="), "{out}");
        }
        stop.store(true, Ordering::Relaxed);
        let (max_ledger, max_dev) = watcher.join().unwrap();
        prop_assert!(max_ledger <= QUOTA, "ledger peaked at {max_ledger}");
        prop_assert!(max_dev <= QUOTA, "device memory peaked at {max_dev}");
        prop_assert_eq!(l.group_used(g), 0);
        prop_assert_eq!(dev.snapshot().memory_allocated(), 0);
        prop_assert!(l.procs().is_empty(), "{:?}", l.procs());
    }
}
