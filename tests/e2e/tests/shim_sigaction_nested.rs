//! A signal handler that sets SIGINT/SIGTERM's action, run on a thread that is inside the
//! shim's `sigaction` at that moment, must not hang the process. The shim keeps the
//! application's SIGINT/SIGTERM actions behind a lock of its own; its holders used to keep
//! every signal unblocked, so a SIGUSR1 delivered to the holder ran the application's handler
//! there, and that handler's `signal(SIGTERM, SIG_DFL)` (the reset-to-default pattern of
//! re-raising and crash-reporting handlers) spun forever on the lock its own thread held. The
//! holders now block every signal on their own thread while they hold it: the SIGUSR1 waits
//! until the lock is released and its handler then runs, before the interrupted `sigaction`
//! returns. `exit.test_sigaction_hold_ms` holds the lock long enough to land the signal inside
//! every time.
//!
//! The client is C (built here with `cc`), run as uid 65534 when the test runs as root.

mod shim_support;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::{field, EmuChild, EmuHost};
use shim_support::*;

/// How long the shim holds the actions' lock inside each SIGINT/SIGTERM `sigaction`.
const HOLD_MS: u64 = 2000;

/// What the shim logs at the start of each test hold.
const HOLD_LINE: &str = "test hold of the application's signal actions";

/// The client: SIGTERM's action set before the first driver call (so the shim records it when
/// it installs its handlers), a SIGUSR1 handler that resets SIGTERM to the default, a primary
/// context, then a second thread that sets SIGINT's action (through the shim, held) while the
/// test sends SIGUSR1 to that very thread. Prints `tid=`, then `sigaction=RC usr1=0|1
/// old_ok=0|1 mask_kept=0|1` (`usr1`: the handler had run when `sigaction` returned; `old_ok`:
/// it read back the action recorded for SIGTERM; `mask_kept`: the thread's signal mask after
/// the call is the one it had before), then `ready`, and idles until signalled (60 s at most).
const CLIENT_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*cuInit_t)(unsigned);
typedef int (*cuDeviceGet_t)(int *, int);
typedef int (*cuDevicePrimaryCtxRetain_t)(void **, int);

static volatile sig_atomic_t usr1_ran;
static volatile sig_atomic_t usr1_old_ok;

static void app_term(int s) { (void)s; _exit(43); }
static void app_int(int s) { (void)s; _exit(42); }

/* The reset-to-default pattern: through the shim's signal(), which takes its actions' lock. */
static void on_usr1(int s) {
    (void)s;
    void (*old)(int) = signal(SIGTERM, SIG_DFL);
    usr1_old_ok = old == app_term;
    usr1_ran = 1;
}

static void *setter(void *arg) {
    (void)arg;
    sigset_t before, after;
    pthread_sigmask(SIG_SETMASK, NULL, &before);
    printf("tid=%ld\n", (long)syscall(SYS_gettid));
    fflush(stdout);
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = app_int;
    sigemptyset(&a.sa_mask);
    int rc = sigaction(SIGINT, &a, NULL); /* held by the shim; SIGUSR1 lands meanwhile */
    int ran = usr1_ran;
    pthread_sigmask(SIG_SETMASK, NULL, &after);
    int kept = 1;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&before, s) != sigismember(&after, s))
            kept = 0;
    printf("sigaction=%d usr1=%d old_ok=%d mask_kept=%d\n", rc, ran, (int)usr1_old_ok, kept);
    fflush(stdout);
    return NULL;
}

int main(void) {
    signal(SIGTERM, app_term);
    struct sigaction u;
    memset(&u, 0, sizeof u);
    u.sa_handler = on_usr1;
    u.sa_flags = SA_RESTART;
    sigemptyset(&u.sa_mask);
    sigaction(SIGUSR1, &u, NULL);
    /* A mask of the application's own on the setter thread (inherited), to be kept. */
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hup, NULL);

    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("fatal=dlopen\n"); return 2; }
    cuInit_t init = (cuInit_t)dlsym(lib, "cuInit");
    cuDeviceGet_t get = (cuDeviceGet_t)dlsym(lib, "cuDeviceGet");
    cuDevicePrimaryCtxRetain_t retain = (cuDevicePrimaryCtxRetain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
    if (!init || !get || !retain) { printf("fatal=dlsym\n"); return 2; }
    int dev = 0;
    void *ctx = NULL;
    int rc = init(0);
    if (rc == 0) rc = get(&dev, 0);
    if (rc == 0) rc = retain(&ctx, dev);
    if (rc != 0) { printf("fatal=cuda rc=%d\n", rc); return 2; }

    pthread_t t;
    if (pthread_create(&t, NULL, setter, NULL) != 0) { printf("fatal=pthread_create\n"); return 2; }
    pthread_join(t, NULL);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 60; i++)
        sleep(1);
    return 3;
}
"#;

/// Builds the client into the host's directory (readable and runnable by every user).
fn client(host: &EmuHost) -> PathBuf {
    build_c(host, "sigaction_nested", CLIENT_C, &["-pthread"])
}

/// Polls `c` (up to `limit`) until `ok(c)`; false if it ended or the time ran out first.
fn wait_until(c: &mut EmuChild, limit: Duration, ok: impl Fn(&EmuChild) -> bool) -> bool {
    let start = Instant::now();
    while !ok(c) {
        if !c.alive() || start.elapsed() >= limit {
            return ok(c);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

#[test]
fn signal_handler_setting_sigterm_on_the_thread_holding_the_actions_lock_does_not_hang() {
    let host = host_for_users();
    // GPU 0's ledger, as the monitor creates it, so a non-root client can use it.
    let _ledger = ledger(&host);
    let cfg = host.root().join("xcuda-sigaction-hold.json");
    std::fs::write(&cfg, format!(r#"{{"exit": {{"test_sigaction_hold_ms": {HOLD_MS}}}}}"#)).unwrap();
    e2e::chmod(&cfg, 0o644);
    let bin = client(&host);
    let mut c = limited(&host, bin.to_str().unwrap(), 1 << 30, "nested");
    c.env("XCUDA_CONFIG", &cfg);
    if e2e::is_root() {
        // std drops the supplementary groups when root switches uid.
        c.uid(NOBODY).gid(NOBODY);
    }
    let mut c = host.spawn(&mut c);

    assert!(wait_until(&mut c, T, |c| !c.lines("tid=").is_empty()), "no tid line:\n{}\n{}", c.stdout(), c.stderr());
    let tid: i32 = field(&c.lines("tid=")[0], "tid").and_then(|t| t.parse().ok()).expect("tid");
    // The setter thread's sigaction(SIGINT) is the first held call.
    assert!(wait_until(&mut c, T, |c| c.stderr().contains(HOLD_LINE)), "the hold never happened:\n{}\n{}", c.stdout(), c.stderr());
    // SAFETY: tgkill(2) to a thread of our own child, which is not reaped (it is alive: the
    // hold just started and lasts HOLD_MS).
    let r = unsafe { libc::syscall(libc::SYS_tgkill, c.pid() as i32, tid, libc::SIGUSR1) };
    assert_eq!(r, 0, "tgkill: {}", std::io::Error::last_os_error());

    // The handler's own signal() is held too: two holds, plus a generous margin.
    let limit = Duration::from_millis(2 * HOLD_MS) + Duration::from_secs(20);
    if !wait_until(&mut c, limit, |c| !c.lines("sigaction=").is_empty()) {
        let (out, err) = (c.stdout(), c.stderr());
        c.kill9();
        panic!(
            "hung: the SIGUSR1 handler's signal(SIGTERM) on the thread inside the shim's \
             sigaction waited for the lock its own thread holds (no `sigaction=` line within \
             {limit:?}; client killed)\nstdout:\n{out}\nstderr:\n{err}"
        );
    }
    let line = c.lines("sigaction=")[0].clone();
    eprintln!("{line}");
    let err = c.stderr();
    assert_eq!(field(&line, "sigaction"), Some("0"), "{line}\n{err}");
    assert_eq!(
        field(&line, "usr1"),
        Some("1"),
        "the SIGUSR1 sent during the hold must run its handler before the held sigaction returns \
         (blocked while the lock is held, delivered when it is released): {line}\n{err}"
    );
    assert_eq!(field(&line, "old_ok"), Some("1"), "signal() in the handler read back the wrong SIGTERM action: {line}\n{err}");
    assert_eq!(field(&line, "mask_kept"), Some("1"), "the thread's own signal mask was not restored: {line}\n{err}");
    assert_eq!(err.matches(HOLD_LINE).count(), 2, "the handler's signal() went through the shim too:\n{err}");

    // The shim's SIGTERM handling still works, with the action the handler recorded
    // (SIG_DFL): contexts released, then SIGTERM's default action. (With the application's
    // first SIGTERM handler still recorded it would exit 43.)
    assert!(wait_until(&mut c, T, |c| !c.lines("ready").is_empty()), "no ready line:\n{}\n{}", c.stdout(), c.stderr());
    c.signal(libc::SIGTERM);
    let st = c.wait_timeout(T);
    let err = c.stderr();
    if st.is_none() {
        c.kill9();
    }
    let st = st.unwrap_or_else(|| panic!("SIGTERM after the nested sigaction never ended the client:\n{err}"));
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}\n{}\n{err}", c.stdout());
    assert!(err.contains("contexts released; taking the default action"), "{err}");
    assert!(err.contains("released primary context before exit"), "{err}");
}
