//! A ledger truncated while mapped (issue 8 obs. 3): touching the mapping must not kill the
//! process with SIGBUS; it reads zeros and the header check reports the damage.

use node_ledger::Ledger;

#[test]
fn a_truncated_ledger_reads_zeros_instead_of_killing_the_process() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("gpu0/ledger");
    let l = Ledger::open_or_create(&p, 0).unwrap();
    let g = l
        .group(node_ledger::ledger::group_id_for("c"), 1 << 30)
        .unwrap();
    l.try_reserve_group(g, 1 << 20).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(0)
        .unwrap();
    // Without the handler this access dies of SIGBUS.
    assert_eq!(l.group_used(g), 0, "the mapping now reads zeros");
    assert!(l.try_reserve_group(g, 1).is_err(), "a zero quota refuses");
    let e = l.check_header().unwrap_err().to_string();
    assert!(
        e.contains("total_size") && e.contains(&*p.to_string_lossy()),
        "{e}"
    );
    // A fault outside any ledger is still a fault: not tested here (it would kill the runner).
}

#[test]
fn an_emptied_ledger_is_damage_not_a_fresh_ledger_for_the_next_opener() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("gpu0/ledger");
    let l = Ledger::open_or_create(&p, 0).unwrap();
    let g = l
        .group(node_ledger::ledger::group_id_for("c"), 64 << 20)
        .unwrap();
    l.try_reserve_group(g, 40 << 20).unwrap();
    std::fs::write(&p, b"").unwrap(); // truncate -s 0
    match Ledger::open_or_create(&p, 0) {
        Err(e) => assert!(e.to_string().contains("total_size"), "{e}"),
        Ok(_) => panic!("a newcomer re-initialised the truncated ledger: a fresh 0 usage"),
    }
}
