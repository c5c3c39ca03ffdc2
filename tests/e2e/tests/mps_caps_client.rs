//! An active-thread percentage set through `nvidia-cuda-mps-control` caps a client's SM share
//! on the emulated GPU: a server's percentage for clients that connect afterwards, a client's
//! own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`. As in real MPS, a running client keeps the limit it
//! started with: `set_active_thread_percentage <client pid>` is refused (`Server <pid> not
//! found`) and a server's new percentage does not reach it. Rates are compared against an
//! uncapped run in the same test.

mod workloads_support;

use std::time::Duration;

use workloads_support::*;

/// Mean iterations/s over progress lines after the first `skip`.
fn rate(p: &mut Proc, skip: usize, take: usize) -> f64 {
    let mut v = Vec::new();
    for i in 0..skip + take {
        let l = p.wait_line("iters_per_s", Duration::from_secs(60));
        if i >= skip {
            v.push(json(&l)["iters_per_s"].as_f64().unwrap());
        }
    }
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn mps_percentage_caps_a_client() {
    let host = host("t4");
    mps_start(&host);
    let _guard = MpsGuard(&host);
    let args = ["--kernel-us", "5000", "--state-mb", "16"];

    let mut free = offline(&host, &args);
    let full = rate(&mut free, 1, 4);
    let server: u32 = mps(&host, "get_server_list\n")
        .trim()
        .parse()
        .expect("server started for the client");
    assert_eq!(
        mps(&host, &format!("get_client_list {server}\n")).trim(),
        free.pid().to_string()
    );

    // A client pid is not a server: refused, as by the real control daemon.
    assert_eq!(
        mps(
            &host,
            &format!("set_active_thread_percentage {} 25\n", free.pid())
        ),
        format!("Server {} not found\n", free.pid())
    );
    // The server's percentage does not reach a client that is already running.
    assert_eq!(
        mps(
            &host,
            &format!("set_active_thread_percentage {server} 25\n")
        ),
        "25.0\n"
    );
    let still_free = rate(&mut free, 1, 4);
    assert!(
        still_free / full > 0.8,
        "a running client was capped: {still_free:.2} it/s vs {full:.2} it/s"
    );
    let (st, _) = free.stop(libc::SIGTERM, Duration::from_secs(30));
    assert!(st.success());

    // The server's percentage applies to clients that connect afterwards.
    let mut late = offline(&host, &args);
    let capped_new = rate(&mut late, 1, 4);
    late.stop(libc::SIGTERM, Duration::from_secs(30));

    // A client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE wins over its server's percentage.
    assert_eq!(
        mps(
            &host,
            &format!("set_active_thread_percentage {server} 100\n")
        ),
        "100.0\n"
    );
    let mut c = host.command("offline");
    c.args(["--json", "--report-interval", "0.2"])
        .args(args)
        .env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25");
    let mut own = Proc::spawn(c);
    let capped_env = rate(&mut own, 1, 4);
    own.stop(libc::SIGTERM, Duration::from_secs(30));

    for (what, r) in [
        ("new-client cap", capped_new),
        ("client env cap", capped_env),
    ] {
        let ratio = r / full;
        assert!(
            ratio < 0.45 && ratio > 0.1,
            "{what}: {r:.2} it/s vs {full:.2} it/s uncapped (ratio {ratio:.2}, expected ~0.25)"
        );
    }
}
