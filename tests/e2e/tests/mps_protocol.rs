//! The fake `nvidia-cuda-mps-control` through its real command-line protocol: daemon start and
//! refusal of a second one, every command's reply, unknown and malformed commands, servers as
//! real processes (and a crashed one disappearing), and `quit` resetting MPS on the device.

mod workloads_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use workloads_support::*;

fn env_path(host: &Host, key: &str) -> PathBuf {
    PathBuf::from(host.env().iter().find(|(k, _)| k == key).unwrap().1.clone())
}

fn device(host: &Host) -> emu_device::Device {
    let p = emu_device::Profile::by_id("t4").unwrap();
    emu_device::Device::open(&env_path(host, "GPUEMU_STATE"), p).expect("state file")
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

#[test]
fn protocol_round_trips_through_the_real_binary() {
    let host = host("t4");
    let pipe = env_path(&host, "CUDA_MPS_PIPE_DIRECTORY");

    let out = run_bounded(
        host.tool("nvidia-cuda-mps-control"),
        "get_server_list\n",
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Cannot find MPS control daemon process"
    );

    let mut nodev = host.tool("nvidia-cuda-mps-control");
    nodev.arg("-d").env_remove("GPUEMU_STATE");
    let out = run_bounded(nodev, "", Duration::from_secs(10));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("GPUEMU_STATE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !pipe.join("control").exists(),
        "a failed start leaves no socket behind"
    );

    mps_start(&host);
    let _guard = MpsGuard(&host);
    assert!(pipe.join("control").exists());
    let daemon: u32 = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(daemon));
    assert!(
        device(&host).mps_status().enabled,
        "daemon start turns MPS on in the device"
    );
    let mut again = host.tool("nvidia-cuda-mps-control");
    again.arg("-d");
    let out = run_bounded(again, "", Duration::from_secs(10));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already running"));

    assert_eq!(mps(&host, "get_server_list\n"), "");
    assert_eq!(
        mps(&host, "get_default_active_thread_percentage\n"),
        "100.0\n"
    );
    assert_eq!(
        mps(
            &host,
            &format!("start_server -uid {}\nget_server_list\n", uid())
        )
        .lines()
        .count(),
        1
    );
    let server: u32 = mps(&host, "get_server_list\n").trim().parse().unwrap();
    assert!(alive(server));
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{server}/comm"))
            .unwrap()
            .trim(),
        "nvidia-cuda-mps"
    );
    assert_eq!(mps(&host, &format!("get_client_list {server}\n")), "");
    let replies = mps(
        &host,
        &format!(
            "set_default_active_thread_percentage 40\nget_default_active_thread_percentage\n\
             set_active_thread_percentage {server} 30\nget_active_thread_percentage {server}\n\
             set_default_device_pinned_mem_limit 0 2G\nget_default_device_pinned_mem_limit 0\n\
             set_active_thread_percentage 1 50\nfrobnicate\nset_default_active_thread_percentage 0\n"
        ),
    );
    let lines: Vec<&str> = replies.lines().collect();
    assert_eq!(
        lines[..5],
        ["40.0", "40.0", "30.0", "30.0", "2G"],
        "{replies}"
    );
    assert_eq!(lines[5], "Server 1 not found");
    assert_eq!(lines[6], "Invalid command: frobnicate");
    assert!(lines[7].starts_with("Invalid arguments. Usage: set_default_active_thread_percentage"));
    assert_eq!(
        device(&host).default_active_thread_pct(),
        30,
        "new clients get the server's percentage"
    );

    // A crashed server leaves the list.
    // SAFETY: kill(2) of the server the daemon started for this test.
    unsafe { libc::kill(server as i32, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mps(&host, "get_server_list\n").is_empty() {
        assert!(Instant::now() < deadline, "dead server still listed");
        std::thread::sleep(Duration::from_millis(20));
    }

    assert_eq!(mps(&host, "quit\n"), "");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(daemon) || pipe.join("control").exists() {
        assert!(Instant::now() < deadline, "daemon did not exit on quit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pipe.join("nvidia-cuda-mps-control.pid").exists());
    assert!(
        !device(&host).mps_status().enabled,
        "quit turns MPS off in the device"
    );
    let log =
        std::fs::read_to_string(env_path(&host, "CUDA_MPS_LOG_DIRECTORY").join("control.log"))
            .unwrap();
    assert!(
        log.contains("Starting control daemon using socket"),
        "{log}"
    );

    // Values set before quit are lost (MPS docs): a new daemon starts from 100.
    mps_start(&host);
    assert_eq!(
        mps(&host, "get_default_active_thread_percentage\n"),
        "100.0\n"
    );

    let daemon2: u32 = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A daemon whose pipe directory is removed (a deleted scratch host) exits by itself.
    std::fs::remove_dir_all(&pipe).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(daemon2) {
        assert!(
            Instant::now() < deadline,
            "daemon outlived its control socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
