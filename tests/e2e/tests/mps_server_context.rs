//! The MPS server holds the context its clients share, as on a real GPU: NVIDIA's MPS docs say
//! the server "owns the CUDA context on the GPU", and NVML lists it as a compute process with
//! memory. An MPS client's own context holds only its local memory (on an H200, driver 580:
//! 228-290 MiB per MPS client against 526-580 MiB without MPS). The emulated server takes a
//! whole context's memory while it runs and gives it back when MPS quits; without that much
//! free it does not start, and the client waiting for it fails to connect.

use std::time::Duration;

use e2e::emu_device::{Profile, ProcessInfo};
use e2e::{wait_until, EmuHost};

const T: Duration = Duration::from_secs(60);

#[test]
fn the_mps_server_holds_the_shared_context_until_mps_quits() {
    let host = EmuHost::new();
    let dev = host.device();
    let profile = Profile::by_id(&dev.info().profile_id).unwrap();
    host.mps_control(Some("-d"), "");

    let mut a = host.client(&["ctx", "ready", "wait"]);
    assert!(a.wait_for_line("ready", T).is_some(), "{}", a.stderr());
    let spid = wait_until("the server", T, || host.mps_servers().first().copied());
    let listed = |pid: u32| -> Option<ProcessInfo> {
        dev.snapshot().processes.into_iter().find(|p| p.pid == pid)
    };
    let server = wait_until("the server's context", T, || {
        listed(spid).filter(|p| p.contexts > 0)
    });
    assert!(server.mps_server && !server.mps_client, "{server:?}");
    assert_eq!(server.used_memory, profile.context_bytes(), "a whole context: {server:?}");
    let client = listed(a.pid()).expect("the client is listed");
    assert!(client.mps_client, "{client:?}");
    assert_eq!(
        client.context_memory,
        profile.context_local_bytes(),
        "an MPS client's context holds its local memory only: {client:?}"
    );
    let snap = dev.snapshot();
    assert_eq!(snap.memory_used, server.used_memory + client.used_memory);

    // The client is done; the server runs on, holding its context.
    a.send_line("go");
    a.finish(T);
    wait_until("the client gone", T, || listed(a.pid()).is_none().then_some(()));
    assert_eq!(dev.snapshot().memory_used, profile.context_bytes());

    // quit stops the server: its memory comes back.
    host.mps_control(None, "quit\n");
    wait_until("the server's memory back", T, || {
        (dev.snapshot().memory_used == 0 && listed(spid).is_none()).then_some(())
    });
}

#[test]
fn no_server_starts_without_room_for_its_context_and_its_client_fails_to_connect() {
    let host = EmuHost::new();
    let dev = host.device();
    let profile = Profile::by_id(&dev.info().profile_id).unwrap();
    // Another process holds all but room for one MPS client's context (not the server's).
    let me = dev.attach().unwrap();
    let leave = profile.context_local_bytes() + (64 << 20);
    dev.alloc(&me, profile.total_memory - leave, 0).unwrap();
    host.mps_control(Some("-d"), "");

    // The client's context would fit, but it waits for its server, which cannot start: the
    // connection fails (CUDA_ERROR_MPS_CONNECTION_FAILED) and the client never runs work.
    let mut a = host.client(&["ctx", "spin", "1", "1000", "1"]);
    a.finish(T);
    let out = a.stdout();
    assert!(
        out.contains("fatal=cuInit CUDA_ERROR_MPS_CONNECTION_FAILED(805)"),
        "the connection fails with 805: {out}\n{}",
        a.stderr()
    );
    assert!(
        !out.lines().any(|l| l == "ctx=0" || l == "spin=0"),
        "a client got a context or ran work without a server: {out}"
    );
    assert!(a.stderr().contains("could not start an MPS server"), "{}", a.stderr());
    let control_log = host.log_dir().join("control.log");
    let log = std::fs::read_to_string(&control_log).unwrap_or_default();
    assert!(log.contains("exited with status"), "{log}");
    assert!(
        dev.snapshot().processes.iter().all(|p| !p.mps_server),
        "a server holds a context it had no room for"
    );
    // The daemon does not start a server for that client over and over.
    assert_eq!(
        log.matches("Starting new server").count(),
        1,
        "one failed start per client:\n{log}"
    );
    host.mps_control(None, "quit\n");
    dev.detach(&me);
}
