//! A daemon maps one ledger per pod of its GPU (pods gone within the grace included): every
//! one of those mappings is protected from a tenant's truncation, and one that cannot be is
//! refused, never mapped unprotected. Its own test binary: it takes every guard slot.

use node_ledger::Ledger;

#[test]
fn many_pod_ledgers_are_each_protected_and_one_past_the_guards_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // 200 pods' ledgers, as a daemon of a busy GPU holds them.
    let ledgers: Vec<(std::path::PathBuf, Ledger)> = (0..200)
        .map(|i| {
            let p = d.path().join(format!("pods/{i}/gpu0/ledger"));
            let l = Ledger::open_or_create(&p, 0).unwrap();
            (p, l)
        })
        .collect();
    let (p, l) = ledgers.last().unwrap();
    let g = l.group(node_ledger::ledger::group_id_for("c"), 1 << 30).unwrap();
    l.try_reserve_group(g, 1 << 20).unwrap();
    std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(0).unwrap();
    // With 64 guard slots this read died of SIGBUS (the whole test binary with it).
    assert_eq!(l.group_used(g), 0, "the 200th mapping reads zeros");
    assert!(l.check_header().is_err());

    // Every guard slot taken: the next ledger is refused, saying why.
    let mut held = Vec::new();
    loop {
        let g = node_ledger::sigbus::Guard::register(0x1000, 0x1000);
        if !g.protected() {
            break;
        }
        held.push(g);
    }
    let p = d.path().join("pods/last/gpu0/ledger");
    let e = Ledger::open_or_create(&p, 0).expect_err("an unprotected mapping is refused");
    assert!(e.to_string().contains("SIGBUS guard"), "{e}");
    drop(held);
    assert!(Ledger::open_or_create(&p, 0).is_ok(), "with a slot free again it opens");
}
