//! Cost of one reclaim scan (what the monitor adds to each tick): `cargo bench -p node-ledger
//! --bench reclaim`. Registrations are held by other open ledger handles (live owners), so
//! every occupied slot costs one refused `F_OFD_SETLK`; a free slot costs a load.

use std::time::Instant;

use node_ledger::Ledger;

fn main() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("gpu0/ledger");
    let monitor = Ledger::open_or_create(&path, 0).unwrap();
    let g = monitor.group(1, 1 << 40).unwrap();
    for live in [0usize, 8, 64] {
        let holders: Vec<Ledger> = (0..live)
            .map(|_| {
                let h = Ledger::open_existing(&path).unwrap();
                h.register(std::process::id(), g).unwrap();
                h
            })
            .collect();
        let mut best = f64::MAX;
        for _ in 0..7 {
            let n = 20_000;
            let t = Instant::now();
            for _ in 0..n {
                assert!(monitor.reclaim_dead().unwrap().is_empty());
            }
            best = best.min(t.elapsed().as_secs_f64() / n as f64);
        }
        println!(
            "reclaim scan, {live:2} live registrations: {:7.2} us per scan (at a 10 ms tick: {:.3} % of a core)",
            best * 1e6,
            best / 0.010 * 100.0
        );
        drop(holders);
        monitor.reclaim_dead().unwrap();
    }
}
