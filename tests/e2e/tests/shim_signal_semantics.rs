//! The shim catches SIGINT/SIGTERM to release an offline process's contexts before it dies,
//! and must otherwise leave the application's signal semantics as they are without it. Three C
//! clients (built here with `cc`, run as uid 65534 when the test runs as root), each a common
//! pattern that the shim used to break:
//!
//! - an event-loop server that blocks SIGTERM/SIGINT in every thread and reads them through a
//!   `signalfd` (systemd-style daemons, libuv/tokio-style loops): the shim's exit helper
//!   unblocked them on its own thread, so the kernel delivered the signal there and the shim
//!   took the default action: the process died instead of writing its checkpoint;
//! - the glibc manual's "Termination in Handler" idiom (clean up, `signal(sig, SIG_DFL)`,
//!   `raise(sig)`): the new action was only recorded while the handler's own action stayed in
//!   the kernel, so the re-raised signal ran the handler again, for ever;
//! - a one-shot handler (`SA_RESETHAND`): the kernel reset it to SIG_DFL at delivery, and the
//!   shim put its own handler back with the one-shot action still recorded, so a second
//!   Ctrl-C no longer killed the process.

mod shim_support;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitStatus;

use e2e::{EmuChild, EmuHost};
use shim_support::*;

/// What every client does first: CUDA through `dlopen` (as the CUDA runtime does), a primary
/// context and 1 MiB held, then `ready`.
const CUDA_PRELUDE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

typedef int (*cuInit_t)(unsigned);
typedef int (*cuDeviceGet_t)(int *, int);
typedef int (*cuDevicePrimaryCtxRetain_t)(void **, int);
typedef int (*cuCtxSetCurrent_t)(void *);
typedef int (*cuMemAlloc_t)(unsigned long long *, size_t);

static void cuda_up(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("fatal=dlopen\n"); fflush(stdout); _exit(2); }
    cuInit_t init = (cuInit_t)dlsym(lib, "cuInit");
    cuDeviceGet_t get = (cuDeviceGet_t)dlsym(lib, "cuDeviceGet");
    cuDevicePrimaryCtxRetain_t retain = (cuDevicePrimaryCtxRetain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cuCtxSetCurrent_t set = (cuCtxSetCurrent_t)dlsym(lib, "cuCtxSetCurrent");
    cuMemAlloc_t alloc = (cuMemAlloc_t)dlsym(lib, "cuMemAlloc_v2");
    if (!init || !get || !retain || !set || !alloc) { printf("fatal=dlsym\n"); fflush(stdout); _exit(2); }
    int dev = 0;
    void *ctx = NULL;
    unsigned long long p = 0;
    int rc = init(0);
    if (rc == 0) rc = get(&dev, 0);
    if (rc == 0) rc = retain(&ctx, dev);
    if (rc == 0) rc = set(ctx);
    if (rc == 0) rc = alloc(&p, 1 << 20);
    if (rc != 0) { printf("fatal=cuda rc=%d\n", rc); fflush(stdout); _exit(2); }
}
"#;

/// SIGTERM/SIGINT blocked (after CUDA is up, so the shim's threads exist by then), read from a
/// signalfd once the "training step" (2 s) is over: prints `graceful signo=N` and exits 0.
const SIGNALFD_C: &str = r#"
int main(void) {
    cuda_up();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sfd = signalfd(-1, &set, 0);
    printf("ready\n");
    fflush(stdout);
    sleep(2);
    struct pollfd pf = { sfd, POLLIN, 0 };
    if (poll(&pf, 1, 20000) == 1) {
        struct signalfd_siginfo si;
        if (read(sfd, &si, sizeof si) == sizeof si) {
            printf("graceful signo=%u\n", si.ssi_signo);
            fflush(stdout);
            return 0;
        }
    }
    printf("nosignal\n");
    return 1;
}
"#;

/// The glibc manual's "Termination in Handler": `handler=N` per call; more than 5 calls is the
/// loop, which exits 99 rather than spinning for ever.
const RERAISE_C: &str = r#"
static volatile sig_atomic_t calls;
static void on_term(int s) {
    calls++;
    char m[32];
    int n = snprintf(m, sizeof m, "handler=%d\n", (int)calls);
    write(1, m, n);
    if (calls > 5) { write(1, "looping\n", 8); _exit(99); }
    signal(s, SIG_DFL);
    raise(s);
}
int main(void) {
    signal(SIGTERM, on_term);
    cuda_up();
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 60; i++) sleep(1);
    return 3;
}
"#;

/// A one-shot SIGINT handler (`SA_RESETHAND`): prints `handler` per call; the second SIGINT
/// takes the default action. Exits 0 (`survived`) if the process outlives both.
const ONESHOT_C: &str = r#"
static void on_int(int s) { (void)s; write(1, "handler\n", 8); }
int main(void) {
    struct sigaction a;
    memset(&a, 0, sizeof a);
    a.sa_handler = on_int;
    a.sa_flags = SA_RESETHAND;
    sigemptyset(&a.sa_mask);
    sigaction(SIGINT, &a, NULL);
    cuda_up();
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 30; i++) sleep(1);
    printf("survived\n");
    return 0;
}
"#;

/// A SIGTERM handler set through one of glibc's older entry points (`sysv_signal`,
/// `__sysv_signal` — what `signal` is in a strict-standards build — or `sigset`, chosen by
/// `SET`) once CUDA is up, i.e. after the shim's handler is in: prints `handler` per call and
/// carries on. glibc's versions call its internal `sigaction`, past the shim's export.
const OLD_SIGNAL_C: &str = r#"
static void on_term(int s) { (void)s; write(1, "handler\n", 8); }
int main(void) {
    cuda_up();
    if (SET(SIGTERM, on_term) == SIG_ERR) { printf("fatal=set\n"); return 2; }
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 30; i++) sleep(1);
    printf("survived\n");
    return 0;
}
"#;

/// The client under the shim (as uid 65534 when root), with a ledger it can use, once `ready`.
fn start(host: &EmuHost, name: &str, main: &str) -> EmuChild {
    start_with(host, name, main, &[])
}

/// [`start`], the client built with `flags` besides.
fn start_with(host: &EmuHost, name: &str, main: &str, flags: &[&str]) -> EmuChild {
    let _ledger = ledger(host);
    let flags: Vec<&str> = ["-Wno-unused-result"].iter().chain(flags).copied().collect();
    let bin = build_c(host, name, &format!("{CUDA_PRELUDE}{main}"), &flags);
    let mut c = limited(host, bin.to_str().unwrap(), 64 * MIB, name);
    if e2e::is_root() {
        c.uid(NOBODY).gid(NOBODY);
    }
    let mut k = host.spawn(&mut c);
    if k.wait_for_line("ready", T).is_none() {
        panic!("{name}: no ready line:\n{}\n{}", k.stdout(), k.stderr());
    }
    k
}

/// The client's end, killed (and said so) if it did not end within the test timeout.
fn ended(k: &mut EmuChild, what: &str) -> ExitStatus {
    match k.wait_timeout(T) {
        Some(s) => s,
        None => {
            let (out, err) = (k.stdout(), k.stderr());
            k.kill9();
            panic!("{what}: still running (killed)\nstdout:\n{out}\nstderr:\n{err}");
        }
    }
}

#[test]
fn a_sigterm_the_application_blocks_everywhere_is_its_own_to_read() {
    let host = host_for_users();
    let mut k = start(&host, "sigfd", SIGNALFD_C);
    k.signal(libc::SIGTERM);
    let st = ended(&mut k, "signalfd server");
    let (out, err) = (k.stdout(), k.stderr());
    assert_eq!(
        (st.code(), st.signal()),
        (Some(0), None),
        "the server must read its SIGTERM from its signalfd and end by itself; the shim took it:\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(out.contains("graceful signo=15"), "{out}\n{err}");
    assert!(!err.contains("signal received"), "the shim never sees a signal the application blocks: {err}");
    // Its contexts are still released, at its normal exit.
    assert!(err.contains("released primary context before exit"), "{err}");
}

#[test]
fn a_handler_that_restores_the_default_and_reraises_ends_the_process_by_the_signal() {
    let host = host_for_users();
    let mut k = start(&host, "reraise", RERAISE_C);
    k.signal(libc::SIGTERM);
    let st = ended(&mut k, "re-raising client");
    let (out, err) = (k.stdout(), k.stderr());
    assert!(!out.contains("looping"), "the re-raise ran the handler again and again:\n{out}\n{err}");
    assert_eq!(st.signal(), Some(libc::SIGTERM), "{st:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert_eq!(out.matches("handler=").count(), 1, "the handler runs once: {out}");
    // The re-raise came back through the shim, with the default action: released first.
    assert!(err.contains("contexts released; taking the default action"), "{err}");
    assert!(err.contains("released primary context before exit"), "{err}");
}

#[test]
fn a_one_shot_handler_runs_once_and_the_second_signal_takes_the_default_action() {
    let host = host_for_users();
    let mut k = start(&host, "oneshot", ONESHOT_C);
    k.signal(libc::SIGINT);
    if k.wait_for_line("handler", T).is_none() {
        panic!("the one-shot handler never ran:\n{}\n{}", k.stdout(), k.stderr());
    }
    k.signal(libc::SIGINT);
    let st = ended(&mut k, "one-shot client");
    let (out, err) = (k.stdout(), k.stderr());
    assert_eq!(st.signal(), Some(libc::SIGINT), "the second SIGINT must take the default action: {st:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert_eq!(out.matches("handler").count(), 1, "{out}");
    assert!(err.contains("contexts released; taking the default action"), "{err}");
}

/// A SIGTERM handler set through `sysv_signal`, `__sysv_signal` or `sigset` after the shim's is
/// in stays behind the shim's: the shim sees the first SIGTERM (launches frozen, work
/// synchronised) and runs the application's handler, which carries on. `sysv_signal`'s action is
/// one-shot, so the second SIGTERM takes the default action, and the shim releases the contexts
/// before it does. Fails without the shim's exports of these (glibc's go past its `sigaction`):
/// the application's handler replaces the shim's in the kernel, the shim never sees a signal,
/// and the second SIGTERM kills a process whose contexts were never released.
#[test]
fn handlers_set_through_the_older_signal_calls_stay_behind_the_shims() {
    let host = host_for_users();
    for (name, set, one_shot) in [("sysv", "sysv_signal", true), ("sysv_internal", "__sysv_signal", true), ("sigset", "sigset", false)] {
        let define = format!("-DSET={set}");
        let mut k = start_with(&host, name, OLD_SIGNAL_C, &["-Wno-deprecated-declarations", &define]);
        k.signal(libc::SIGTERM);
        if k.wait_for_line("handler", T).is_none() {
            panic!("{set}: the application's handler never ran:\n{}\n{}", k.stdout(), k.stderr());
        }
        let err = k.stderr();
        assert!(err.contains("signal received; launches frozen"), "{set}: the shim never saw the SIGTERM:\n{err}");
        if one_shot {
            k.signal(libc::SIGTERM);
            let st = ended(&mut k, set);
            let (out, err) = (k.stdout(), k.stderr());
            assert_eq!(st.signal(), Some(libc::SIGTERM), "{set}: the second SIGTERM takes the default action: {st:?}\n{out}\n{err}");
            assert_eq!(out.matches("handler").count(), 1, "{set}: {out}");
            assert!(err.contains("contexts released; taking the default action"), "{set}: released before dying:\n{err}");
        } else {
            k.signal(libc::SIGTERM);
            let deadline = std::time::Instant::now() + T;
            while k.lines("handler").len() < 2 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(k.lines("handler").len(), 2, "{set}: a persistent handler runs again:\n{}\n{}", k.stdout(), k.stderr());
            k.kill9();
        }
    }
}
