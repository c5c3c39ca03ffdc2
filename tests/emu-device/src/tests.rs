use super::*;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("emu-device-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&d);
    d
}

#[test]
fn creates_with_profile_and_reopens() {
    let p = tmp("create");
    let d = Device::open(&p, &profile::A10).unwrap();
    assert_eq!(d.info().name, "NVIDIA A10");
    assert_eq!(d.info().sm_count, 72);
    drop(d);
    // Reopening keeps the existing profile whatever is asked.
    let d = Device::open(&p, &profile::H100).unwrap();
    assert_eq!(d.info().profile_id, "a10");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn corrupt_file_is_refused_with_path() {
    let p = tmp("corrupt");
    std::fs::write(&p, vec![7u8; STATE_SIZE]).unwrap();
    let e = Device::open(&p, &profile::T4).err().expect("must refuse");
    assert!(matches!(e, EmuError::Corrupt { .. }));
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    std::fs::write(&p, b"short").unwrap();
    let e = Device::open(&p, &profile::T4).err().expect("must refuse");
    assert!(e.to_string().contains("size is 5 bytes"), "{e}");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn memory_is_accounted_against_capacity() {
    let p = tmp("mem");
    let d = Device::open(&p, &profile::T4).unwrap();
    let c = d.attach().unwrap();
    let total = profile::T4.total_memory;
    let a = d.alloc(&c, total / 2, 0).unwrap();
    let b = d.alloc(&c, total / 4, 0).unwrap();
    assert_ne!(a, b);
    assert_eq!(d.mem_info(), (total - total / 2 - total / 4, total));
    let e = d.alloc(&c, total / 2, 0).unwrap_err();
    assert_eq!(e.to_curesult(), cuda_abi::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    d.free(&c, total / 2);
    d.alloc(&c, total / 2, 0).unwrap();
    let snap = d.snapshot();
    assert_eq!(snap.processes.len(), 1);
    assert_eq!(snap.processes[0].used_memory, total / 2 + total / 4);
    d.detach(&c);
    assert_eq!(d.mem_info().0, total);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn kernel_takes_emulated_time_and_wait_returns_end() {
    let p = tmp("kernel");
    let d = Device::open(&p, &profile::T4).unwrap();
    let c = d.attach().unwrap();
    let t0 = now_ns();
    // 4 blocks of 3.18 M cycles at 1590 MHz (10% occupancy, full clock) = 2 ms.
    let k = d.launch(&c, Launch { blocks: 4, cycles_per_block: 3_180_000, after: 0 }).unwrap();
    assert_eq!(d.kernel_status(k), KernelStatus::Pending);
    let end = d.wait(&c, k).unwrap();
    let took = end - t0;
    assert!((1_900_000..2_500_000).contains(&took), "{took}");
    assert!(now_ns() >= end);
    d.collect(k);
    assert_eq!(d.kernel_status(k), KernelStatus::Gone);
    std::fs::remove_file(&p).unwrap();
}

fn fake_client(d: &Device, pid: u32, contexts: u32, mps: bool) {
    let mut g = d.shm.lock();
    let start_time = procinfo::start_time(pid).unwrap();
    let generation = g.header.mps_generation;
    let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].used == 0).unwrap();
    g.clients[c] = layout::ClientSlot {
        used: 1,
        pid,
        start_time,
        contexts,
        mem_used: 1 << 20,
        mps_gen: if mps { generation } else { 0 },
        ..Default::default()
    };
    g.header.used_memory += 1 << 20;
}

/// Turns MPS on as the control daemon `control_pid` would: its control socket (a plain file
/// here) in a pipe directory of this test's own, which this test process, the client, then
/// connects through.
fn mps_on(d: &Device, control_pid: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("emu-device-pipe-{}-{}", std::process::id(), emu_device_seq()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("control");
    if !sock.exists() {
        std::fs::write(&sock, b"").unwrap();
    }
    d.set_mps_pipe_dir(&dir);
    d.mps_start(control_pid, &sock);
    dir
}

/// The calling test process's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A stand-in MPS server (a `sleep` process) recorded on the device as a server of `uid`
/// holding its context, as the emulated `nvidia-cuda-mps-server` does once started (its
/// memory left out, so the tests' memory sums stay their clients').
struct FakeServer(std::process::Child);

impl FakeServer {
    fn start(d: &Device, uid: u32) -> Self {
        let child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        fake_client(d, child.id(), 1, false);
        let mut g = d.shm.lock();
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].used != 0 && g.clients[c].pid == child.id()).unwrap();
        g.clients[c].mps_server = 1;
        g.clients[c].uid = uid;
        // It sees the same /dev/shm as the test (one mount namespace).
        (g.clients[c].shm_dev, g.clients[c].shm_ino) = crate::dev_shm_id().unwrap_or((0, 0));
        g.clients[c].mem_used = 0;
        g.header.used_memory -= 1 << 20;
        FakeServer(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the control daemon does for client `me`: its connection asks for its user's server
/// (one look answers "connecting"), and the daemon hands it to `server`.
fn serve(d: &Device, me: &Client, server: &FakeServer) {
    let e = d.mps_admit(me).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnecting { .. }), "{e}");
    assert_eq!(d.mps_requests(), vec![(me.pid(), euid())]);
    assert!(d.mps_hand_over(me.pid(), server.pid()).unwrap(), "the server is ready");
    assert!(d.mps_requests().is_empty());
}

fn wait_reaped(d: &Device, pid: u32) {
    for _ in 0..200 {
        if d.snapshot().processes.iter().all(|p| p.pid != pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("dead client {pid} never reaped");
}

/// A context holds device memory, as a real one does: NVML counts it for the process and the
/// device; a second context adds its local memory only; an MPS client holds its local memory
/// only (the server holds the rest); all of it comes back with the contexts; and a context
/// that does not fit is refused.
#[test]
fn contexts_hold_device_memory() {
    let p = tmp("ctxmem");
    let d = Device::open(&p, &profile::H100).unwrap();
    let me = d.attach().unwrap();
    d.context_created(&me, None).unwrap();
    assert_eq!(d.memory().1, profile::H100.context_bytes());
    assert_eq!(d.compute_processes(), vec![(me.pid(), 526 << 20)], "the H200's 526 MiB");
    d.context_created(&me, None).unwrap();
    assert_eq!(d.memory().1, profile::H100.context_bytes() + profile::H100.context_local_bytes());
    d.context_destroyed(&me);
    assert_eq!(d.memory().1, profile::H100.context_bytes());
    d.context_destroyed(&me);
    assert_eq!(d.memory().1, 0, "the last context gives back the per-process part too");
    d.context_destroyed(&me);
    assert_eq!(d.memory().1, 0, "one destroy too many gives back nothing more");
    // As an MPS client (a process started once MPS runs): the local memory alone.
    d.detach(&me);
    let me = d.attach().unwrap();
    mps_on(&d, 1);
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let mine: Vec<_> = d.compute_processes().into_iter().filter(|p| p.0 != srv.pid()).collect();
    assert_eq!(mine, vec![(me.pid(), 264 << 20)], "an MPS client's 264 MiB");
    d.context_destroyed(&me);
    d.mps_quit();
    // No room left for a context: refused, nothing charged.
    let free = d.mem_info().0;
    d.alloc(&me, free - (100 << 20), 512).unwrap();
    let used = d.memory().1;
    let r = d.context_created(&me, None);
    assert!(matches!(r, Err(EmuError::OutOfMemory { .. })), "{r:?}");
    assert_eq!(d.memory().1, used);
    assert_eq!(d.contexts(&me), 0);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn dead_client_with_live_context_poisons_mps_until_quit() {
    let p = tmp("poison");
    let d = Device::open(&p, &profile::T4).unwrap();
    mps_on(&d, 1);
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, child.id(), 1, true);
    d.gate(&me).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    wait_reaped(&d, child.id());
    let st = d.mps_status();
    assert!(st.poisoned, "{st:?}");
    assert_eq!(st.culprit_pid, Some(child.id()));
    // What is left held is this process's own context (an MPS client's: its local memory).
    assert_eq!(d.mem_info().0, profile::T4.total_memory - profile::T4.context_local_bytes(), "dead client's memory is given back");
    // A neighbour's call hangs: run it on a thread and see it not return.
    let d = std::sync::Arc::new(d);
    let d2 = d.clone();
    let h = std::thread::spawn(move || d2.gate(&me));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!h.is_finished(), "neighbour must hang while MPS is poisoned");
    // New clients are refused.
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsServerNotReady)));
    d.mps_quit();
    let r = h.join().unwrap();
    assert!(matches!(r, Err(EmuError::MpsClientTerminated)), "{r:?}");
    d.context_destroyed(&me);
    mps_on(&d, 1);
    // A terminated client stays terminated for its life, whatever it destroys or creates.
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsClientTerminated)));
    // Relaunched (a new registration, as a new process gets), it asks the new daemon afresh.
    d.detach(&me);
    let me = d.attach().unwrap();
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    d.gate(&me).unwrap();
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn dead_client_without_context_is_harmless() {
    let p = tmp("harmless");
    let d = Device::open(&p, &profile::T4).unwrap();
    mps_on(&d, 1);
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, child.id(), 0, true);
    let mut child2 = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, child2.id(), 1, false); // not an MPS client
    child.kill().unwrap();
    child.wait().unwrap();
    child2.kill().unwrap();
    child2.wait().unwrap();
    wait_reaped(&d, child.id());
    wait_reaped(&d, child2.id());
    assert!(!d.mps_status().poisoned);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn mps_percentages_validate_and_apply() {
    let p = tmp("pct");
    let d = Device::open(&p, &profile::T4).unwrap();
    assert!(d.set_default_active_thread_pct(50).is_err(), "MPS off");
    mps_on(&d, 1);
    assert!(d.set_default_active_thread_pct(0).is_err());
    assert!(d.set_default_active_thread_pct(101).is_err());
    d.set_default_active_thread_pct(50).unwrap();
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, Some(30)).unwrap();
    assert_eq!(d.snapshot().processes[0].active_thread_pct, 30);
    // Fixed at connection: a later default reaches only clients that connect afterwards, and
    // a second context keeps the connection's limit.
    d.set_default_active_thread_pct(20).unwrap();
    assert_eq!(d.snapshot().processes[0].active_thread_pct, 30, "a running client keeps its limit");
    d.context_created(&me, Some(10)).unwrap();
    assert_eq!(d.snapshot().processes[0].active_thread_pct, 30, "same connection, same limit");
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn lock_holder_killed_with_sigkill_does_not_wedge_the_device() {
    use std::os::fd::AsRawFd;
    let p = tmp("flock");
    let d = std::sync::Arc::new(Device::open(&p, &profile::T4).unwrap());
    // Another process takes the state lock and is then SIGKILLed while holding it.
    // (bash takes the lock on fd 9 and execs into sleep, so the holder is exactly our child.)
    let mut holder = std::process::Command::new("bash")
        .args(["-c", "exec 9<>\"$0\"; flock 9; exec sleep 30"])
        .arg(&p)
        .spawn()
        .unwrap();
    let probe = std::fs::File::open(&p).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // SAFETY: non-blocking flock probe on our own descriptor.
    while unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        // SAFETY: releasing the probe lock we just took.
        unsafe { libc::flock(probe.as_raw_fd(), libc::LOCK_UN) };
        assert!(std::time::Instant::now() < deadline, "holder never took the lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    let d2 = d.clone();
    let t = std::thread::spawn(move || d2.snapshot().memory_total);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!t.is_finished(), "the lock must exclude other processes");
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(t.join().unwrap(), profile::T4.total_memory);
    std::fs::remove_file(&p).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn memory_never_exceeds_capacity_and_returns_to_zero(ops in proptest::collection::vec((proptest::bool::ANY, 1u64..8), 1..60)) {
        let p = tmp(&format!("prop-{}", emu_device_seq()));
        let d = Device::open(&p, &profile::T4).unwrap();
        let c = d.attach().unwrap();
        let total = profile::T4.total_memory;
        let unit = total / 16;
        let mut live: Vec<u64> = Vec::new();
        for (is_alloc, n) in ops {
            if is_alloc || live.is_empty() {
                let bytes = n * unit;
                let used: u64 = live.iter().sum();
                match d.alloc(&c, bytes, 0) {
                    Ok(_) => {
                        proptest::prop_assert!(used + bytes <= total);
                        live.push(bytes);
                    }
                    Err(EmuError::OutOfMemory { free, .. }) => {
                        proptest::prop_assert!(used + bytes > total);
                        proptest::prop_assert_eq!(free, total - used);
                    }
                    Err(e) => proptest::prop_assert!(false, "{}", e),
                }
            } else {
                let b = live.swap_remove((n as usize) % live.len());
                d.free(&c, b);
            }
            let used: u64 = live.iter().sum();
            proptest::prop_assert_eq!(d.mem_info(), (total - used, total));
        }
        d.detach(&c);
        proptest::prop_assert_eq!(d.mem_info().0, total);
        std::fs::remove_file(&p).unwrap();
    }
}

fn emu_device_seq() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

#[test]
fn terminate_client_clears_the_hang_of_a_dead_client_and_spares_neighbours() {
    let p = tmp("terminate");
    let d = Device::open(&p, &profile::T4).unwrap();
    mps_on(&d, 1);
    let generation = d.mps_status().generation;
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, child.id(), 1, true);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_reaped(&d, child.id());
    assert!(d.mps_status().poisoned);
    assert!(matches!(d.mps_terminate_client(12345678), Err(EmuError::NoSuchClient(_))));
    assert!(d.mps_status().poisoned, "an unknown pid changes nothing");
    d.mps_terminate_client(child.id()).unwrap();
    let st = d.mps_status();
    assert!(!st.poisoned, "{st:?}");
    assert_eq!(st.generation, generation, "no reset: same server");
    d.gate(&me).expect("the neighbour's context survives and progresses");
    // Terminating a live client fails its own calls only.
    let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, other.id(), 1, true);
    d.mps_terminate_client(other.id()).unwrap();
    d.gate(&me).unwrap();
    assert!(!d.mps_status().poisoned);
    other.kill().unwrap();
    other.wait().unwrap();
    wait_reaped(&d, other.id());
    assert!(!d.mps_status().poisoned, "a terminated client's death does not hang the server");
    std::fs::remove_file(&p).unwrap();
}

/// `GPUEMU_MPS_KILL=teardown`: a client killed with kernels in flight does not hang its server
/// (an H200 dropped such a client at once) but the fatal error tears the server's other
/// clients down: their calls fail with CUDA_ERROR_ILLEGAL_ADDRESS. One killed with nothing in
/// flight, or terminated first (`terminate_client`), harms nobody.
#[test]
fn in_teardown_mode_a_client_killed_mid_kernel_takes_its_neighbours_down() {
    let p = tmp("teardown");
    let d = Device::open(&p, &profile::T4).unwrap();
    d.set_mps_kill_teardown(true);
    mps_on(&d, 1);
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let kill_with = |kernel: bool, terminate_first: bool| {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        fake_client(&d, child.id(), 1, true);
        if kernel {
            let slot = {
                let g = d.shm.lock();
                (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == child.id()).unwrap() as u32
            };
            let start_time = procinfo::start_time(child.id()).unwrap();
            let c = Client { slot, pid: child.id(), start_time };
            // Seconds of work: still running when the process dies.
            d.launch(&c, Launch { blocks: 40, cycles_per_block: 20_000_000_000, after: 0 }).unwrap();
        }
        if terminate_first {
            d.mps_terminate_client(child.id()).unwrap();
        }
        child.kill().unwrap();
        child.wait().unwrap();
        wait_reaped(&d, child.id());
    };
    kill_with(false, false);
    d.gate(&me).expect("nothing in flight: nobody harmed");
    kill_with(true, true);
    d.gate(&me).expect("terminated before the kill: nobody harmed");
    assert_eq!(d.mps_status().fatal_errors, 0);
    assert_eq!(d.xid_count(), 0, "nobody harmed: no XID");
    kill_with(true, false);
    let st = d.mps_status();
    assert!(!st.poisoned, "no hang: {st:?}");
    assert_eq!(st.fatal_errors, 1, "{st:?}");
    let (n, xids) = d.xids_after(0);
    assert_eq!(n, 1);
    assert_eq!((xids[0].code, xids[0].pid), (31, me.pid), "XID 31 naming the torn-down client, as on the H200");
    let e = d.gate(&me).unwrap_err();
    assert!(matches!(e, EmuError::MpsFatalError), "{e}");
    assert_eq!(e.to_curesult(), cuda_abi::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    std::fs::remove_file(&p).unwrap();
}

/// After a fatal error the server refuses new clients until every client it tore down has
/// exited (NVIDIA's MPS docs, "Server Recovery": CUDA_ERROR_MPS_SERVER_NOT_READY). A torn-down
/// client that lingers keeps the online service's relaunch out; once it exits, newcomers
/// connect.
#[test]
fn in_teardown_mode_no_new_client_connects_while_a_torn_down_one_lives() {
    let p = tmp("teardown-ready");
    let d = Device::open(&p, &profile::T4).unwrap();
    d.set_mps_kill_teardown(true);
    mps_on(&d, 1);
    let srv = FakeServer::start(&d, euid());
    let mut lingering = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, lingering.id(), 1, true);
    let mut killed = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, killed.id(), 1, true);
    let slot = {
        let g = d.shm.lock();
        (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == killed.id()).unwrap() as u32
    };
    let c = Client { slot, pid: killed.id(), start_time: procinfo::start_time(killed.id()).unwrap() };
    d.launch(&c, Launch { blocks: 40, cycles_per_block: 20_000_000_000, after: 0 }).unwrap();
    killed.kill().unwrap();
    killed.wait().unwrap();
    wait_reaped(&d, killed.id());
    assert_eq!(d.mps_status().fatal_errors, 1);
    let me = d.attach().unwrap();
    serve(&d, &me, &srv);
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsServerNotReady), "{e}");
    lingering.kill().unwrap();
    lingering.wait().unwrap();
    wait_reaped(&d, lingering.id());
    d.context_created(&me, None).expect("every torn-down client has exited: the server takes clients again");
    std::fs::remove_file(&p).unwrap();
}

/// Every client that dies holding a context stays connected (listed with the uid it connected
/// with) and keeps the server hung until each one is terminated: terminating the first of two
/// dead clients is not enough.
#[test]
fn each_dead_client_stays_connected_until_terminated() {
    let p = tmp("dead-two");
    let d = Device::open(&p, &profile::T4).unwrap();
    mps_on(&d, 1);
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let uid = euid();
    assert_eq!(d.snapshot().processes.iter().find(|p| p.pid == me.pid()).map(|p| p.uid), Some(uid), "uid recorded with the context");
    let mut a = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let mut b = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, a.id(), 1, true);
    fake_client(&d, b.id(), 1, true);
    {
        let mut g = d.shm.lock();
        for s in g.clients.iter_mut().filter(|s| s.pid == b.id()) {
            s.uid = 4242;
        }
    }
    for c in [&mut a, &mut b] {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    wait_reaped(&d, a.id());
    wait_reaped(&d, b.id());
    let st = d.mps_status();
    assert!(st.poisoned, "{st:?}");
    let mut dead = st.dead_clients.clone();
    dead.sort();
    let mut want = vec![(a.id(), 0), (b.id(), 4242)];
    want.sort();
    assert_eq!(dead, want);
    let first = st.culprit_pid.unwrap();
    d.mps_terminate_client(first).unwrap();
    let st = d.mps_status();
    assert!(st.poisoned, "the other dead client still hangs the server: {st:?}");
    assert_eq!(st.dead_clients.len(), 1);
    assert!(matches!(d.mps_terminate_client(first), Err(EmuError::NoSuchClient(_))), "terminated once");
    d.mps_terminate_client(st.dead_clients[0].0).unwrap();
    let st = d.mps_status();
    assert!(!st.poisoned && st.dead_clients.is_empty(), "{st:?}");
    d.gate(&me).unwrap();
    std::fs::remove_file(&p).unwrap();
}

/// Sets the uid (and queue ticket) of the fake client `pid`.
fn fake_uid(d: &Device, pid: u32, uid: u32, wait: u64) {
    let mut g = d.shm.lock();
    let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].used != 0 && g.clients[c].pid == pid).unwrap();
    g.clients[c].uid = uid;
    g.clients[c].mps_wait = wait;
}

/// MPS serves one user at a time (nvidia-cuda-mps-control(1)): a client of another user than
/// the connected clients' is queued, first come first served, until they are done; a process
/// already connected keeps its connection for further contexts; without MPS nothing waits.
#[test]
fn mps_serves_one_user_at_a_time() {
    // SAFETY: geteuid has no preconditions.
    let me_uid = unsafe { libc::geteuid() };
    let other = me_uid.wrapping_add(1000);
    let p = tmp("users");
    let d = Device::open(&p, &profile::T4).unwrap();
    let me = d.attach().unwrap();
    let mut a = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, a.id(), 1, false);
    fake_uid(&d, a.id(), other, 0);
    // No MPS: users do not matter.
    d.mps_admit(&me).unwrap();
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);

    // A process started once MPS runs.
    d.detach(&me);
    let me = d.attach().unwrap();
    mps_on(&d, 1);
    {
        let mut g = d.shm.lock();
        let generation = g.header.mps_generation;
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == a.id()).unwrap();
        g.clients[c].mps_gen = generation;
    }
    // Another user's client holds a context on the server: queued, at cuInit and at context
    // creation alike, and shown as queued.
    let e = d.mps_admit(&me).unwrap_err();
    assert!(matches!(e, EmuError::MpsUserQueued { server_uid, uid } if server_uid == other && uid == me_uid), "{e}");
    assert!(e.to_string().contains("one user at a time"), "{e}");
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsUserQueued { .. })));
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid).unwrap();
    assert!(q.mps_queued && q.contexts == 0 && !q.mps_client, "{q:?}");

    // Its clients are done: this user's turn; the daemon hands this client to its server.
    d.context_destroyed(&Client { slot: slot_of(&d, a.id()), pid: a.id(), start_time: procinfo::start_time(a.id()).unwrap() });
    let srv = FakeServer::start(&d, me_uid);
    serve(&d, &me, &srv);
    d.mps_admit(&me).unwrap();
    d.context_created(&me, None).unwrap();
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid).unwrap();
    assert!(!q.mps_queued && q.mps_client && q.uid == me_uid, "{q:?}");
    // Already connected: a second context never waits, even behind a queued other user.
    fake_uid(&d, a.id(), other, 1);
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);
    d.context_destroyed(&me);

    // Nobody connected, but a client of another user queued first: it goes first.
    let e = d.mps_admit(&me).unwrap_err();
    assert!(matches!(e, EmuError::MpsUserQueued { server_uid, .. } if server_uid == other), "{e}");
    // Queued after this one: this one goes first.
    fake_uid(&d, a.id(), other, u64::MAX);
    d.mps_admit(&me).unwrap();
    a.kill().unwrap();
    a.wait().unwrap();
    std::fs::remove_file(&p).unwrap();
}

fn slot_of(d: &Device, pid: u32) -> u32 {
    let g = d.shm.lock();
    (0..MAX_CLIENTS).find(|&c| g.clients[c].used != 0 && g.clients[c].pid == pid).unwrap() as u32
}

/// `reading`, `compute_processes` and `samples_after` (what the fake NVML answers from at
/// every monitor sample) say what the full snapshot and sample ring say.
#[test]
fn cheap_readings_agree_with_the_snapshot() {
    let p = tmp("reading");
    let d = Device::open(&p, &profile::H100).unwrap();
    let c = d.attach().unwrap();
    d.context_created(&c, None).unwrap();
    d.alloc(&c, 3 << 20, 512).unwrap();
    for _ in 0..4 {
        let t = d.launch(&c, Launch { blocks: 66, cycles_per_block: 2_000_000, after: 0 }).unwrap();
        d.wait(&c, t).unwrap();
        std::thread::sleep(Duration::from_millis(6));
    }
    let r = d.reading();
    let s = d.snapshot();
    assert_eq!((r.memory_total, r.memory_used), (s.memory_total, s.memory_used));
    assert_eq!(d.memory(), (s.memory_total, s.memory_used), "the unlocked read is the same");
    d.alloc(&c, 1 << 20, 512).unwrap();
    assert_eq!(d.memory(), (s.memory_total, s.memory_used + (1 << 20)), "and live");
    d.free(&c, 1 << 20);
    assert!(r.timestamp_ns <= s.timestamp_ns && r.busy_ns_total <= s.busy_ns_total);
    assert!(r.busy_ns_total > 0.0 && r.gpu_util > 0.0, "{r:?}");
    let listed: Vec<(u32, u64)> =
        s.processes.iter().filter(|p| p.contexts > 0).map(|p| (p.pid, p.used_memory)).collect();
    assert_eq!(d.compute_processes(), listed);
    assert_eq!(listed, vec![(c.pid(), profile::H100.context_bytes() + (3 << 20))]);
    let times = |v: Vec<Sample>| v.iter().map(|x| x.t_ns).collect::<Vec<u64>>();
    let all = times(d.samples());
    assert!(all.len() >= 3, "{}", all.len());
    for cut in [0, all[0], all[1], all[all.len() - 2], u64::MAX] {
        // Compared while the device took no new sample (one every 5 ms) in between.
        for attempt in 0.. {
            let before = times(d.samples());
            let got = times(d.samples_after(cut));
            if times(d.samples()) != before {
                assert!(attempt < 100, "the ring never held still");
                continue;
            }
            let newer = before.iter().filter(|&&t| t > cut).count();
            assert_eq!(got, before[before.len() - (newer + 1).min(before.len())..], "cut {cut}");
            break;
        }
    }
    d.detach(&c);
    assert!(d.compute_processes().is_empty());
    assert_eq!(d.memory().1, 0);
    std::fs::remove_file(&p).unwrap();
}

/// The seqlock: a reader that takes no lock, racing a writer that keeps two header fields
/// equal under the lock (writing one, pausing, writing the other), never returns a pair that
/// differs. The same reader without the retry (`check` false) does see torn pairs: the test
/// would fail without it.
#[test]
fn lock_free_readers_never_see_a_torn_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let p = tmp("torn");
    let d = Arc::new(Device::open(&p, &profile::H100).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 0.0;
            while !stop.load(Ordering::Relaxed) {
                x += 1.0;
                {
                    let mut g = d.shm.lock();
                    g.header.busy_ns = x;
                    let t = std::time::Instant::now();
                    while t.elapsed() < Duration::from_micros(30) {
                        std::hint::spin_loop();
                    }
                    g.header.sm_active_ns = x;
                }
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_micros(30) {
                    std::hint::spin_loop();
                }
            }
        })
    };
    let pair = |v: &shm::View<'_>| {
        let h = v.header();
        Some((h.busy_ns, h.sm_active_ns))
    };
    // Without the retry: torn pairs show up (the writer is mid-write half of the time).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut torn_unchecked = 0;
    while torn_unchecked < 3 && std::time::Instant::now() < deadline {
        let (a, b) = d.shm.optimistic_checked(false, pair).unwrap();
        if a != b {
            torn_unchecked += 1;
        }
    }
    // With it: never, and most reads still need no lock.
    let (mut ok, mut fell_back) = (0u32, 0u32);
    let t = std::time::Instant::now();
    while ok < 20_000 && t.elapsed() < Duration::from_secs(20) {
        match d.shm.optimistic(pair) {
            Some((a, b)) => {
                assert_eq!(a, b, "torn read returned after {ok} good ones");
                ok += 1;
            }
            None => fell_back += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(torn_unchecked >= 3, "a reader without the retry never saw a torn write: the test shows nothing");
    assert!(ok > 100, "lock-free reads never got through ({ok} ok, {fell_back} fell back)");
    std::fs::remove_file(&p).unwrap();
}

/// A holder killed inside the lock leaves the sequence odd: lock-free reads then take the
/// lock (they never spin forever), and the next holder moves the sequence on.
#[test]
fn an_odd_sequence_left_by_a_dead_writer_falls_back_to_the_lock() {
    let p = tmp("oddseq");
    let d = Device::open(&p, &profile::H100).unwrap();
    let _ = d.counters();
    // SAFETY: test-only poke of the sequence, as a writer killed inside the lock leaves it.
    unsafe {
        let seq = std::ptr::addr_of_mut!((*d.shm.map_ptr()).header.seq);
        *seq |= 1;
    }
    assert!(d.shm.optimistic(|v| Some(v.header().total_memory)).is_none());
    assert_eq!(d.counters().memory_total, profile::H100.total_memory, "answered under the lock");
    assert_eq!(d.shm.optimistic(|v| Some(v.header().total_memory)), Some(profile::H100.total_memory));
    std::fs::remove_file(&p).unwrap();
}

/// Lock-free counters stay live: time integrals grow while a kernel runs and stop when it
/// finishes even though no lock holder came by in between (the reader takes the lock at the
/// horizon, a kernel's end); an allocation shows at once; a dead client's memory is given
/// back within the reap period to a reader that only ever asks for counters.
#[test]
fn lock_free_counters_are_live() {
    let p = tmp("livecounters");
    let d = Device::open(&p, &profile::H100).unwrap();
    let c = d.attach().unwrap();
    d.context_created(&c, None).unwrap();
    let c0 = d.counters();
    // 66 of 132 SMs (full clock, 1980 MHz) for 19.8e6 cycles: 10 ms of device time.
    let t = d.launch(&c, Launch { blocks: 66, cycles_per_block: 19_800_000, after: 0 }).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let c1 = d.counters();
    let busy = c1.busy_ns_total - c0.busy_ns_total;
    assert!((busy - 10e6).abs() < 0.05e6, "busy {busy} ns, the kernel ran 10 ms");
    assert!(matches!(d.kernel_status(t), KernelStatus::Done { .. }));
    d.collect(t);
    d.alloc(&c, 5 << 20, 512).unwrap();
    assert_eq!(d.counters().memory_used, profile::H100.context_bytes() + (5 << 20), "an allocation shows in the next reading");
    assert_eq!(d.memory().1, profile::H100.context_bytes() + (5 << 20));
    d.detach(&c);
    assert_eq!(d.memory().1, 0);
    // A client that dies holding memory, and nobody but lock-free readers around.
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, child.id(), 1, false);
    assert_eq!(d.memory().1, 1 << 20);
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = std::time::Instant::now();
    while d.memory().1 != 0 {
        assert!(t0.elapsed() < Duration::from_secs(2), "dead client's memory never given back");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(d.compute_processes().is_empty());
    std::fs::remove_file(&p).unwrap();
}

/// `reading` taken without the lock says what the locked one says: same memory and clock,
/// integrals and utilization of the same instant (checked against `reading_locked` with the
/// state held still: a kernel running, nobody else touching it).
#[test]
fn lock_free_reading_agrees_with_the_locked_one() {
    let p = tmp("agree");
    let d = Device::open(&p, &profile::H100).unwrap();
    let c = d.attach().unwrap();
    d.context_created(&c, None).unwrap();
    d.alloc(&c, 7 << 20, 512).unwrap();
    let t = d.launch(&c, Launch { blocks: 40, cycles_per_block: 1_000_000_000, after: 0 }).unwrap();
    // A full utilization window behind us.
    std::thread::sleep(Duration::from_millis(150));
    let mut quick_seen = 0;
    for _ in 0..200 {
        let a = d.reading();
        let b = d.reading_locked();
        assert!(a.timestamp_ns <= b.timestamp_ns);
        assert_eq!((a.memory_total, a.memory_used, a.sm_clock_mhz), (b.memory_total, b.memory_used, b.sm_clock_mhz));
        assert!(a.busy_ns_total <= b.busy_ns_total && a.sm_active_ns_total <= b.sm_active_ns_total);
        // Rates over the gap between the two: exactly the running kernel's (40 of 132 SMs).
        let dt = (b.timestamp_ns - a.timestamp_ns) as f64;
        if dt > 1000.0 {
            assert!(((b.busy_ns_total - a.busy_ns_total) / dt - 1.0).abs() < 1e-6);
            assert!(((b.sm_active_ns_total - a.sm_active_ns_total) / dt - 40.0 / 132.0).abs() < 1e-6);
        }
        assert!((a.gpu_util - b.gpu_util).abs() < 0.02, "{a:?} {b:?}");
        quick_seen += 1;
        std::thread::sleep(Duration::from_micros(300));
    }
    assert!(quick_seen > 0);
    let _ = t;
    d.detach(&c);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn an_idle_card_idles_its_clock_and_says_why() {
    // Real cards drop to a few hundred MHz with nothing running (nvidia-smi on an idle H200:
    // 345 of 1980 MHz) and NVML gives GpuIdle as the reason; the monitor must not read that
    // clock as load, and the emulator must show it so that tests see what hosts do.
    let p = tmp("idle-clock");
    let d = Device::open(&p, &profile::H100).unwrap();
    assert_eq!(d.sm_clock_mhz(), profile::H100.idle_sm_clock_mhz);
    assert_eq!(d.clock_event_reasons(), 0x1, "nvmlClocksEventReasonGpuIdle");
    let c = d.attach().unwrap();
    // A small kernel: the boost clock, no reason.
    let k = d.launch(&c, Launch { blocks: 4, cycles_per_block: 1_980_000_000, after: 0 }).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(d.sm_clock_mhz(), profile::H100.max_sm_clock_mhz);
    assert_eq!(d.clock_event_reasons(), 0);
    // Every SM demanded twice over: load pulls the clock down (the power cap's reason).
    let k2 = d.launch(&c, Launch { blocks: 528, cycles_per_block: 1_980_000_000, after: 0 }).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert!(d.sm_clock_mhz() < profile::H100.max_sm_clock_mhz);
    assert_eq!(d.clock_event_reasons(), 0x4, "nvmlClocksEventReasonSwPowerCap");
    let _ = (k, k2);
    d.detach(&c);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn an_address_range_past_the_address_space_is_refused() {
    // A real driver refuses a reservation larger than its virtual address space; the
    // emulator's used to wrap (release) or panic (debug), and past 2^48 its addresses would
    // have named another GPU.
    let p = tmp("va-limit");
    let d = Device::open(&p, &profile::H100).unwrap();
    let a = d.reserve_address(1 << 30, 0).expect("1 GiB of address space");
    assert!(a + (1 << 30) <= VA_LIMIT);
    assert_eq!(d.reserve_address(u64::MAX, 0), None);
    assert_eq!(d.reserve_address(VA_LIMIT, 0), None);
    assert_eq!(d.reserve_address(1 << 20, 1 << 63), None, "an alignment past the space");
    // Nothing was taken by the refusals: the next range follows the first.
    let b = d.reserve_address(1 << 30, 0).unwrap();
    assert!(b >= a + (1 << 30) && b + (1 << 30) <= VA_LIMIT);
    std::fs::remove_file(&p).unwrap();
}

/// The GPM snapshot is the device's, not a reader's: two openings of one state file (two
/// processes) read the same counters anywhere within one refresh period, whichever reads
/// first and whether or not it takes the lock; the snapshot holds the counters at the period's
/// boundary (not at the first read), so under a kernel on 66 of 132 SMs two boundaries apart
/// by one period differ by exactly one period of busy time and half of it SM-active.
#[test]
fn the_gpm_snapshot_is_one_per_device_taken_at_the_refresh_boundary() {
    let p = tmp("gpm-boundary");
    let d = Device::open(&p, &profile::H100).unwrap();
    let other = Device::open(&p, &profile::H100).unwrap();
    let c = d.attach().unwrap();
    d.context_created(&c, None).unwrap();
    // 66 of 132 SMs for about 4 s (1980 MHz once the clock is up).
    d.launch(&c, Launch { blocks: 66, cycles_per_block: 8_000_000_000, after: 0 }).unwrap();
    let launched = now_ns();
    let period = GPM_REFRESH_NS;
    // Reads that fall within one period (tried again if a busy machine delays one past it).
    let a = (0..4)
        .find_map(|_| {
            while now_ns() % period > period / 10 {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(150));
            let a = other.gpm_counters();
            std::thread::sleep(Duration::from_millis(200));
            let live = d.counters();
            let b = d.gpm_counters();
            let locked = d.gpm_counters_locked();
            // Within one period, and a boundary the kernel was already running at (a snapshot
            // dated before the launch is behind the live counters by less than the time since).
            if physics::gpm_boundary(live.timestamp_ns) != a.timestamp_ns
                || physics::gpm_boundary(now_ns()) != a.timestamp_ns
                || a.timestamp_ns <= launched
            {
                return None;
            }
            assert_eq!(a, b, "two processes, one period: one snapshot");
            assert_eq!(b, locked, "taken without the lock or under it: the same");
            assert_eq!(a.timestamp_ns % period, 0, "dated at the boundary");
            // Taken at the boundary, not at the first read 150 ms after it: the live counters
            // are ahead by the time since the boundary (the kernel runs all along).
            let ahead = live.busy_ns_total - a.busy_ns_total;
            let expect = (live.timestamp_ns - a.timestamp_ns) as f64;
            assert!((ahead - expect).abs() < 1.0, "ahead by {ahead} ns, {expect} ns since the boundary");
            Some(a)
        })
        .expect("no two reads 200 ms apart within one period in 4 tries");
    // A later period's snapshot, read first by the other opening this time.
    while physics::gpm_boundary(now_ns()) == a.timestamp_ns {
        std::thread::sleep(Duration::from_millis(20));
    }
    let next = other.gpm_counters();
    assert_eq!(next, d.gpm_counters_locked());
    let span = (next.timestamp_ns - a.timestamp_ns) as f64;
    assert!(span >= period as f64);
    assert!((next.busy_ns_total - a.busy_ns_total - span).abs() < 1.0, "{a:?} {next:?}");
    let sm = next.sm_active_ns_total - a.sm_active_ns_total;
    assert!((sm - span / 2.0).abs() < 1.0, "66 of 132 SMs: {sm} ns over {span} ns");
    d.detach(&c);
    std::fs::remove_file(&p).unwrap();
}

/// One MPS server takes 48 clients on Volta and later (nvidia-cuda-mps-control(1)): the 49th
/// context is refused with `CUDA_ERROR_MPS_MAX_CLIENTS_REACHED`, and once a client lets its
/// context go the next one gets in. Without MPS no such limit applies.
#[test]
fn an_mps_server_takes_48_clients() {
    let p = tmp("mps-max-clients");
    let d = Device::open(&p, &profile::T4).unwrap();
    assert_eq!(profile::mps_max_clients((7, 5)), 48);
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let me = d.attach().unwrap();
    let mut sleepers: Vec<std::process::Child> =
        (0..48).map(|_| std::process::Command::new("sleep").arg("30").spawn().unwrap()).collect();
    // Without MPS: 48 others with contexts, and this process still gets one.
    for s in &sleepers {
        fake_client(&d, s.id(), 1, false);
    }
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);
    for s in &sleepers {
        let mut g = d.shm.lock();
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == s.id()).unwrap();
        g.clients[c] = layout::ClientSlot::default();
        g.header.used_memory -= 1 << 20;
    }
    // A process started once MPS runs.
    d.detach(&me);
    let me = d.attach().unwrap();
    mps_on(&d, std::process::id());
    for s in &sleepers {
        fake_client(&d, s.id(), 1, true);
        fake_uid(&d, s.id(), euid, 0);
    }
    let srv = FakeServer::start(&d, euid);
    serve(&d, &me, &srv);
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsMaxClients { limit: 48 }), "{e}");
    assert_eq!(e.to_curesult(), cuda_abi::CUresult::CUDA_ERROR_MPS_MAX_CLIENTS_REACHED);
    assert_eq!(d.contexts(&me), 0);
    // One client lets its context go: room for the next.
    {
        let mut g = d.shm.lock();
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == sleepers[0].id()).unwrap();
        g.clients[c].contexts = 0;
    }
    d.context_created(&me, None).unwrap();
    assert_eq!(d.contexts(&me), 1);
    d.context_destroyed(&me);
    d.mps_quit();
    for s in &mut sleepers {
        s.kill().unwrap();
        s.wait().unwrap();
    }
    d.detach(&me);
    std::fs::remove_file(&p).unwrap();
}

/// The limit is on client CUDA *contexts* per device (NVIDIA's MPS docs), not processes: with
/// 47 contexts of other clients on the server, this process gets one context (the 48th) and
/// its second is refused; 48 contexts of one other process leave no room either. Before, a
/// process already connected skipped the check and could open any number of contexts.
#[test]
fn the_mps_client_limit_counts_contexts_not_processes() {
    let p = tmp("mps-max-contexts");
    let d = Device::open(&p, &profile::T4).unwrap();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let me = d.attach().unwrap();
    mps_on(&d, std::process::id());
    let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, other.id(), 47, true);
    fake_uid(&d, other.id(), euid, 0);
    let srv = FakeServer::start(&d, euid);
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsMaxClients { limit: 48 }), "{e}");
    assert_eq!(d.contexts(&me), 1);
    d.context_destroyed(&me);
    // One process holding all 48.
    {
        let mut g = d.shm.lock();
        let c = (0..MAX_CLIENTS).find(|&c| g.clients[c].pid == other.id()).unwrap();
        g.clients[c].contexts = 48;
    }
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsMaxClients { limit: 48 })));
    d.mps_quit();
    other.kill().unwrap();
    other.wait().unwrap();
    d.detach(&me);
    std::fs::remove_file(&p).unwrap();
}

/// A real MPS client attaches to shared memory its server keeps in the server's `/dev/shm`: a
/// client that sees another `/dev/shm` (a container given one of its own) cannot connect, and
/// stays unconnected for its life (`CUDA_ERROR_MPS_CONNECTION_FAILED`). (Clients that see the
/// server's `/dev/shm` connect: every other test's `FakeServer` shares the test's.)
#[test]
fn a_client_that_does_not_see_the_servers_dev_shm_cannot_connect() {
    let p = tmp("shm-attach");
    let d = Device::open(&p, &profile::T4).unwrap();
    let me = d.attach().unwrap();
    mps_on(&d, std::process::id());
    let srv = FakeServer::start(&d, euid());
    // The server runs with another directory as its /dev/shm (mps-manager's mps_shm_dir).
    let elsewhere = tmp("shm-attach-dir");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let id = crate::file_id(&elsewhere).unwrap();
    let srv_slot = slot_of(&d, srv.pid()) as usize;
    (d.shm.lock().clients[srv_slot].shm_dev, d.shm.lock().clients[srv_slot].shm_ino) = id;
    serve(&d, &me, &srv);
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnectionFailed(_)), "{e}");
    assert!(e.to_string().contains("/dev/shm") && e.to_string().contains("shm_dir"), "{e}");
    assert_eq!(e.to_curesult(), cuda_abi::CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED);
    // For its life: the server's /dev/shm given back does not reconnect it.
    (d.shm.lock().clients[srv_slot].shm_dev, d.shm.lock().clients[srv_slot].shm_ino) = crate::dev_shm_id().unwrap();
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnectionFailed(_)) && e.to_string().contains("shared memory"), "{e}");
    assert_eq!(d.contexts(&me), 0);
    let _ = std::fs::remove_dir_all(&elsewhere);
    let _ = std::fs::remove_file(&p);
}

/// Real MPS connects a client only through the control daemon (nvidia-cuda-mps-control(1)):
/// the client asks for its user's server and connects once the daemon tells it that server is
/// ready. A client's context waits until the daemon hands it to a server of its own user that
/// holds its context; a refused connection fails for the process's life
/// (`CUDA_ERROR_MPS_CONNECTION_FAILED`), and so does asking a daemon that is gone.
#[test]
fn a_client_connects_only_once_the_daemon_hands_it_to_its_users_ready_server() {
    let p = tmp("connect-order");
    let d = Device::open(&p, &profile::T4).unwrap();
    let me = d.attach().unwrap();
    mps_on(&d, std::process::id());
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnecting { .. }), "no server yet: {e}");
    assert_eq!(d.contexts(&me), 0);
    assert_eq!(d.mps_requests(), vec![(me.pid(), euid())], "the daemon sees the request");
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid()).unwrap();
    assert!(q.mps_asking && !q.mps_client && !q.mps_handed, "{q:?}");
    // A server still starting (no context yet): the client keeps waiting.
    let srv = FakeServer::start(&d, euid());
    let srv_slot = slot_of(&d, srv.pid()) as usize;
    d.shm.lock().clients[srv_slot].contexts = 0;
    assert!(!d.mps_hand_over(me.pid(), srv.pid()).unwrap(), "not ready");
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsConnecting { .. })));
    // Another user's server is never this client's.
    let other = FakeServer::start(&d, euid().wrapping_add(1000));
    let e = d.mps_hand_over(me.pid(), other.pid()).unwrap_err();
    assert!(e.to_string().contains("own user's server"), "{e}");
    // Ready: handed over, the client connects.
    d.shm.lock().clients[srv_slot].contexts = 1;
    assert!(d.mps_hand_over(me.pid(), srv.pid()).unwrap());
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid()).unwrap();
    assert!(q.mps_handed && !q.mps_client, "handed, not yet connected: {q:?}");
    d.context_created(&me, None).unwrap();
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid()).unwrap();
    assert!(q.mps_client && !q.mps_handed, "{q:?}");
    // Its contexts gone, the process stays connected to its server: no new request.
    d.context_destroyed(&me);
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);
    assert!(d.mps_requests().is_empty());

    // A daemon that is gone connects nobody.
    d.mps_quit();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    mps_on(&d, dead_pid);
    let e = d.mps_admit(&me).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnectionFailed(_)) && e.to_string().contains("gone"), "{e}");
    d.mps_quit();

    // Refused (its server could not start): the connection fails, and stays failed.
    mps_on(&d, std::process::id());
    assert!(matches!(d.mps_admit(&me), Err(EmuError::MpsConnecting { .. })));
    d.mps_refuse(me.pid());
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::MpsConnectionFailed(_)), "{e}");
    assert_eq!(e.to_curesult(), cuda_abi::CUresult::CUDA_ERROR_MPS_CONNECTION_FAILED);
    assert!(matches!(d.mps_admit(&me), Err(EmuError::MpsConnectionFailed(_))), "sticky");
    assert!(d.mps_requests().is_empty());
    d.mps_quit();
    d.detach(&me);
    std::fs::remove_file(&p).unwrap();
}

/// A process reaches MPS only through the control socket in its `CUDA_MPS_PIPE_DIRECTORY`
/// (nvidia-cuda-mps-control(1): "If the connection attempt fails, the program continues to
/// run as it normally would without MPS"): one whose directory holds no daemon runs outside
/// MPS for its life (a whole context of its own, no percentage, no request, no queue), even
/// after MPS restarts; one that names the daemon's directory by another path (a container's
/// bind mount, here a symlink) is its client.
#[test]
fn a_client_reaches_mps_only_through_the_daemons_socket() {
    let p = tmp("pipe-dir");
    let d = Device::open(&p, &profile::T4).unwrap();
    let me = d.attach().unwrap();
    let pipe = mps_on(&d, std::process::id());
    d.set_default_active_thread_pct(20).unwrap();
    // This process looks in an empty directory: no daemon there.
    let elsewhere = std::env::temp_dir().join(format!("emu-device-nopipe-{}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    d.set_mps_pipe_dir(&elsewhere);
    d.mps_admit(&me).expect("no daemon reached: CUDA goes on without MPS");
    assert!(d.runs_outside_mps(&me));
    assert!(d.mps_requests().is_empty(), "it asked no daemon");
    d.context_created(&me, None).unwrap();
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid()).unwrap();
    assert!(q.mps_outside && !q.mps_client && !q.mps_asking, "{q:?}");
    assert_eq!(q.active_thread_pct, 100, "no MPS limit outside MPS");
    assert_eq!(q.context_memory, profile::T4.context_bytes(), "a whole context of its own");
    d.context_destroyed(&me);
    // Decided for the process's life: the right directory later changes nothing.
    d.set_mps_pipe_dir(&pipe);
    d.context_created(&me, None).unwrap();
    assert!(d.runs_outside_mps(&me));
    d.context_destroyed(&me);
    d.detach(&me);

    // A new process naming the daemon's directory through a symlink reaches it.
    let me = d.attach().unwrap();
    let link = std::env::temp_dir().join(format!("emu-device-pipelink-{}", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&pipe, &link).unwrap();
    d.set_mps_pipe_dir(&link);
    assert!(matches!(d.mps_admit(&me), Err(EmuError::MpsConnecting { .. })), "asks the daemon");
    assert!(!d.runs_outside_mps(&me));
    d.mps_quit();
    d.detach(&me);
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_dir_all(&elsewhere);
    let _ = std::fs::remove_dir_all(&pipe);
    std::fs::remove_file(&p).unwrap();
}

/// A control daemon replacing one that died without `quit` (mps-manager SIGKILLs a hung one)
/// starts MPS afresh: the dead daemon's servers went with it, so its connected clients lose
/// their contexts (CUDA_ERROR_MPS_CLIENT_TERMINATED) and new clients reach the new daemon's
/// socket. A second start by the running daemon changes nothing.
#[test]
fn a_daemon_replacing_a_dead_one_starts_mps_afresh() {
    let p = tmp("daemon-replaced");
    let d = Device::open(&p, &profile::T4).unwrap();
    let mut old = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    mps_on(&d, old.id());
    let me = d.attach().unwrap();
    let srv = FakeServer::start(&d, euid());
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let generation = d.mps_status().generation;
    // The running daemon starting again: nothing changes.
    mps_on(&d, std::process::id());
    assert_eq!(d.mps_status().generation, generation, "a live daemon keeps MPS");
    d.gate(&me).expect("still connected");
    old.kill().unwrap();
    old.wait().unwrap();
    // Its replacement (another socket) starts afresh.
    mps_on(&d, std::process::id());
    let st = d.mps_status();
    assert_eq!(st.generation, generation + 1, "{st:?}");
    assert!(matches!(d.gate(&me), Err(EmuError::MpsClientTerminated)));
    d.context_destroyed(&me);
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsClientTerminated)), "terminated for life");
    d.detach(&me);
    let me = d.attach().unwrap();
    assert!(matches!(d.context_created(&me, None), Err(EmuError::MpsConnecting { .. })), "relaunched, asks the new daemon");
    d.mps_quit();
    d.detach(&me);
    std::fs::remove_file(&p).unwrap();
}

/// CUDA looks for the MPS control daemon once, when it initialises: a process that found none
/// runs without MPS for its life, even once MPS starts (nvidia-cuda-mps-control(1)), at cuInit
/// and at its first context alike; the same process relaunched joins MPS.
#[test]
fn a_process_initialised_before_mps_started_runs_without_it_for_life() {
    let p = tmp("before-mps");
    let d = Device::open(&p, &profile::T4).unwrap();
    let me = d.attach().unwrap();
    d.mps_admit(&me).unwrap();
    assert!(!d.runs_outside_mps(&me), "no MPS at all: nothing to say");
    mps_on(&d, 1);
    let srv = FakeServer::start(&d, euid());
    d.mps_admit(&me).unwrap();
    assert!(d.mps_requests().is_empty(), "it asks the new daemon for nothing");
    d.context_created(&me, None).unwrap();
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid).unwrap();
    assert!(!q.mps_client && q.mps_outside, "{q:?}");
    d.context_destroyed(&me);
    d.context_created(&me, None).unwrap();
    assert!(d.runs_outside_mps(&me), "a new context changes nothing");
    d.context_destroyed(&me);
    // The first context of an in-process client decides as cuInit does.
    d.detach(&me);
    d.mps_quit();
    let me = d.attach().unwrap();
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);
    mps_on(&d, 1);
    d.context_created(&me, None).unwrap();
    assert!(d.runs_outside_mps(&me));
    d.context_destroyed(&me);
    // Relaunched, it reaches MPS.
    d.detach(&me);
    let me = d.attach().unwrap();
    serve(&d, &me, &srv);
    d.context_created(&me, None).unwrap();
    let q = d.snapshot().processes.into_iter().find(|p| p.pid == me.pid).unwrap();
    assert!(q.mps_client && !q.mps_outside, "{q:?}");
    d.context_destroyed(&me);
    d.mps_quit();
    d.detach(&me);
    std::fs::remove_file(&p).unwrap();
}

/// The compute mode rules the contexts a process makes of its own (outside MPS, or as an MPS
/// server), not MPS clients (NVIDIA's MPS docs: "Exclusive-mode restrictions are applied to
/// the MPS server, not MPS clients"). DEFAULT: any number. EXCLUSIVE_PROCESS: one context on
/// the device in all (CUDA programming guide), a second refused with
/// CUDA_ERROR_DEVICE_UNAVAILABLE naming the holder, whoever asks (the holder itself included,
/// an MPS server too); a dead holder's context went with it. PROHIBITED: none
/// (CUDA_ERROR_UNKNOWN, cuda.h). Set as nvidia-smi sets it: root only, EXCLUSIVE_THREAD no more.
#[test]
fn compute_modes_rule_contexts_of_their_own_not_mps_clients() {
    use cuda_abi::CUresult;
    let p = tmp("compute-mode");
    let d = Device::open(&p, &profile::T4).unwrap();
    assert_eq!(d.compute_mode(), compute_mode::DEFAULT, "a new GPU's, as after a reboot");
    let force = |m: u32| d.shm.lock().header.compute_mode = m;
    let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    fake_client(&d, other.id(), 1, false);
    let me = d.attach().unwrap();

    // DEFAULT: a context beside another process's.
    d.context_created(&me, None).unwrap();
    d.context_destroyed(&me);

    // EXCLUSIVE_PROCESS: the other process holds the one context.
    force(compute_mode::EXCLUSIVE_PROCESS);
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::DeviceUnavailable { holder } if holder == other.id()), "{e}");
    assert_eq!(e.to_curesult(), CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE);
    assert_eq!(d.snapshot().processes.iter().find(|q| q.pid == me.pid).map(|q| q.contexts), Some(0), "refused: nothing held");
    // Its context went with it, reaped or not.
    other.kill().unwrap();
    other.wait().unwrap();
    d.context_created(&me, None).expect("the holder is dead");
    let e = d.context_created(&me, None).unwrap_err();
    assert!(matches!(e, EmuError::DeviceUnavailable { holder } if holder == me.pid), "one context in all: {e}");
    d.context_destroyed(&me);

    // Under MPS the server holds the one context; its clients connect all the same (a process
    // started once MPS runs: this one ran without it, for its life).
    d.detach(&me);
    let pipe = mps_on(&d, std::process::id());
    let srv = FakeServer::start(&d, euid());
    let me = d.attach().unwrap();
    serve(&d, &me, &srv);
    d.context_created(&me, None).expect("an MPS client is no exclusive holder");
    d.context_created(&me, None).expect("nor is its second context");
    d.context_destroyed(&me);
    d.context_destroyed(&me);
    d.detach(&me);
    // A server cannot start while a process outside MPS holds the device.
    let mut outside = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    drop(srv);
    fake_client(&d, outside.id(), 1, false);
    let server = d.attach().unwrap();
    let e = d.mps_server_context(&server).unwrap_err();
    assert!(matches!(e, EmuError::DeviceUnavailable { holder } if holder == outside.id()), "{e}");
    outside.kill().unwrap();
    outside.wait().unwrap();
    d.mps_server_context(&server).expect("the device is free again");
    d.context_destroyed(&server);

    // PROHIBITED: no context of its own, no server; nothing is held.
    force(compute_mode::PROHIBITED);
    let e = d.mps_server_context(&server).unwrap_err();
    assert!(matches!(e, EmuError::ComputeProhibited), "{e}");
    d.mps_quit();
    let e = d.context_created(&server, None).unwrap_err();
    assert!(matches!(e, EmuError::ComputeProhibited), "{e}");
    assert_eq!(e.to_curesult(), CUresult::CUDA_ERROR_UNKNOWN);
    d.detach(&server);

    // Setting it: nvidia-smi's rules.
    if euid() == 0 {
        d.set_compute_mode(compute_mode::EXCLUSIVE_PROCESS).unwrap();
        assert_eq!(d.compute_mode(), compute_mode::EXCLUSIVE_PROCESS);
        assert!(matches!(d.set_compute_mode(compute_mode::EXCLUSIVE_THREAD), Err(EmuError::NotSupported(_))));
        assert!(matches!(d.set_compute_mode(9), Err(EmuError::InvalidValue(_))));
        assert_eq!(d.compute_mode(), compute_mode::EXCLUSIVE_PROCESS, "refusals change nothing");
    } else {
        assert!(matches!(d.set_compute_mode(compute_mode::DEFAULT), Err(EmuError::NoPermission(_))));
    }
    let _ = std::fs::remove_dir_all(&pipe);
    std::fs::remove_file(&p).unwrap();
}

/// XIDs reach NVML event sets through the device's ring: a reader sees the ones after its
/// count, in order; one that falls more than the ring behind loses the oldest. Only root
/// reports one (the kernel driver does on a real host).
#[test]
fn xids_are_kept_in_order_and_a_reader_far_behind_loses_the_oldest() {
    let p = tmp("xids");
    let d = Device::open(&p, &profile::H100).unwrap();
    if euid() != 0 {
        assert!(matches!(d.report_xid(79, 0), Err(EmuError::NoPermission(_))));
        return;
    }
    d.report_xid(79, 0).unwrap();
    d.report_xid(43, 1234).unwrap();
    let (n, v) = d.xids_after(0);
    assert_eq!(n, 2);
    assert_eq!(v.iter().map(|x| (x.code, x.pid)).collect::<Vec<_>>(), [(79, 0), (43, 1234)]);
    assert_eq!(d.xids_after(1).1.len(), 1, "only the ones after the reader's count");
    assert!(d.xids_after(2).1.is_empty());
    for i in 0..(layout::XID_RING as u64 + 5) {
        d.report_xid(1000 + i, 0).unwrap();
    }
    let (n, v) = d.xids_after(2);
    assert_eq!(n, 2 + layout::XID_RING as u64 + 5);
    assert_eq!(v.len(), layout::XID_RING, "the ring holds the newest");
    assert_eq!(v[0].code, 1005, "the oldest five are lost to a reader that far behind");
    std::fs::remove_file(&p).unwrap();
}

/// A fractional MPS percentage was rounded to the nearest whole one: 12.5 % gave 13 %, more SMs
/// than asked for. The device now rounds down.
#[test]
fn a_fractional_active_thread_percentage_never_grants_more_than_asked() {
    assert_eq!(crate::whole_pct(12.5), 12);
    assert_eq!(crate::whole_pct(12.99), 12);
    assert_eq!(crate::whole_pct(40.0), 40);
    assert_eq!(crate::whole_pct(39.999_999_999_9), 40, "a float's last bit is no percent");
    assert_eq!(crate::whole_pct(0.4), 1);
    assert_eq!(crate::whole_pct(250.0), 100);
    assert_eq!(crate::whole_pct(f64::NAN), 1);
}
