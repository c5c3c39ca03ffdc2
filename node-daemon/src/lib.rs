//! Plumbing shared by the node daemons (`sysmonitor`, `mps-manager`), so neither depends on
//! the other and `node-ledger` (linked into every offline process) stays small:
//!
//! - [`cli`]: `--config`/`--gpu` (clap), locating the config, log setup;
//! - [`signals`]: stop/reload flags set by async-signal-safe handlers;
//! - [`sdnotify`]: systemd readiness, status and watchdog;
//! - [`layered`]: a base JSON config plus `<stem>.d/*.json` overrides, errors naming file, line
//!   and field ([`ConfigError`], the one config-error type, defined in `node-ledger` because the
//!   shim reports config errors too);
//! - [`state_file`]: atomic JSON state files;
//! - [`clock`]: monotonic and wall-clock milliseconds, the boot id;
//! - [`errlog`]: the log lines of an operation that keeps failing, rate-limited;
//! - [`evictor`]: pidfd signalling and the one evictor (every signal checked by pid + start time);
//! - [`instance`]: the single-instance lock (a POSIX write lock; the error names the holder);
//! - [`monitor_state`]: the monitor's state file, one writer and several readers;
//! - [`offline_pods`]: the offline pods on this node (node-agent writes, the monitors read) and
//!   a process's pod from its cgroup, and whether a pod's cgroup still holds a process;
//! - [`procns`]: a host pid as the ledger knows the process (its pid namespace, its pid there),
//!   only for a process that holds the ledger open;
//! - [`run`]: the run/reload loop.

pub mod cli;
pub mod clock;
pub mod errlog;
pub mod evictor;
pub mod instance;
pub mod layered;
pub mod monitor_state;
pub mod offline_pods;
pub mod procns;
pub mod run;
pub mod sdnotify;
pub mod signals;
pub mod state_file;
pub mod status;

pub use node_ledger::ConfigError;
