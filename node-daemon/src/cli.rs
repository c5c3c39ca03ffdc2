//! What both daemons' command lines share: `--config`/`--gpu` (clap), locating the config
//! (flag, environment, default path, or built-in defaults) and the log setup.

use std::path::{Path, PathBuf};

use crate::ConfigError;

/// `--config FILE` and `--gpu N`, accepted before or after the subcommand.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ConfigArgs {
    /// Base config file (JSON), plus the `<stem>.d/*.json` overrides beside it.
    ///
    /// Overrides are merged over the base in name order, key by key. Default: the daemon's
    /// environment variable, else its file under /etc/xshare (see CONFIG in the daemon's own
    /// --help). A missing default file means built-in defaults; a file named here or by the
    /// variable must exist.
    #[arg(short = 'c', long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Index of the GPU this instance serves (overrides the config's `gpu_index`).
    #[arg(long, global = true, value_name = "N")]
    pub gpu: Option<u32>,
}

/// Declares a daemon's command line, `struct Cli`, the shape both daemons share: the
/// [`ConfigArgs`] (`cfg`), then an optional subcommand of type `$cmd` (`cmd`; none means
/// `run`). `$name` and `$after_help` are its name and long-help epilogue; the doc comments
/// before them are its about text, the version is the calling crate's. The calling crate
/// depends on `clap` (derive).
#[macro_export]
macro_rules! daemon_cli {
    ($(#[$doc:meta])* name = $name:literal, after_long_help = $after:expr, cmd = $cmd:ty $(,)?) => {
        $(#[$doc])*
        #[derive(Debug, clap::Parser)]
        #[command(name = $name, version, after_long_help = $after)]
        struct Cli {
            #[command(flatten)]
            cfg: $crate::cli::ConfigArgs,
            /// What to do (default: run).
            #[command(subcommand)]
            cmd: Option<$cmd>,
        }
    };
}

/// A loaded configuration and where it came from.
#[derive(Debug, Clone)]
pub struct Loaded<C> {
    /// The configuration.
    pub config: C,
    /// The base file SIGHUP reloads from (also when it did not exist at start).
    pub base: PathBuf,
    /// The files in force, base first; empty for built-in defaults.
    pub files: Vec<PathBuf>,
}

impl ConfigArgs {
    /// The base config file: `--config`, else `$env_var`, else `default`; and whether it was
    /// named explicitly (by flag or environment).
    pub fn base(&self, env_var: &str, default: &str) -> (PathBuf, bool) {
        match self
            .config
            .clone()
            // An empty variable (`VAR=` in a unit file) names no file: as if unset.
            .or_else(|| std::env::var_os(env_var).filter(|v| !v.is_empty()).map(PathBuf::from))
        {
            Some(p) => (p, true),
            None => (PathBuf::from(default), false),
        }
    }

    /// Loads the config with `load` (base plus overrides). A config named explicitly must
    /// load; the default file may be absent, which means built-in defaults (with a warning).
    pub fn load<C: Default>(
        &self,
        env_var: &str,
        default: &str,
        load: impl Fn(&Path) -> Result<(C, Vec<PathBuf>), ConfigError>,
    ) -> Result<Loaded<C>, ConfigError> {
        let (base, explicit) = self.base(env_var, default);
        if !explicit && defaults_without_base(&base)? {
            tracing::warn!(path = %base.display(), "no config file; using built-in defaults");
            return Ok(Loaded {
                config: C::default(),
                base,
                files: Vec::new(),
            });
        }
        let (config, files) = load(&base)?;
        Ok(Loaded {
            config,
            base,
            files,
        })
    }
}

/// Whether the built-in defaults apply because there is no base config at `base`: `Ok(false)`
/// when it exists, `Ok(true)` when it does not and no override file lies beside it, and an
/// error naming the first override file when one does (overrides with no base to merge into
/// were ignored: built-in defaults ran, an operator's tighter thresholds silently not). At
/// start ([`ConfigArgs::load`]) and at every reload alike.
pub fn defaults_without_base(base: &Path) -> Result<bool, ConfigError> {
    if base.exists() {
        return Ok(false);
    }
    match crate::layered::override_files(base)?.into_iter().next() {
        None => Ok(true),
        Some(first) => Err(ConfigError {
            file: first,
            line: None,
            column: None,
            field: None,
            message: format!(
                "an override file with no base config: create {} (`{{}}` takes the built-in defaults) for the overrides beside it to apply",
                base.display()
            ),
        }),
    }
}

/// The one directory the shipped units let the daemons write (`ReadWritePaths=` under
/// `ProtectSystem=strict`).
pub const UNIT_WRITABLE_DIR: &str = "/run/xshare";

/// `check-config`'s warnings for the paths a daemon writes (`(field, path)`, after
/// defaults are filled in) that lie outside [`UNIT_WRITABLE_DIR`]: the shipped unit would
/// start the daemon on a read-only file system there, and it would exit at once, again at
/// every restart. A check run outside the unit cannot see that; it says so instead.
pub fn unit_write_warnings(paths: &[(&str, &Path)]) -> Vec<String> {
    paths
        .iter()
        .filter(|(_, p)| !p.as_os_str().is_empty() && !p.starts_with(UNIT_WRITABLE_DIR))
        .map(|(f, p)| {
            format!(
                "{f} {} is outside {UNIT_WRITABLE_DIR}, the only directory the shipped unit lets the daemon write \
                 (ProtectSystem=strict): add ReadWritePaths={} in a drop-in (systemctl edit), or the daemon exits at start",
                p.display(),
                p.parent().unwrap_or(p).display()
            )
        })
        .collect()
}

/// The line `check-config` ends with: the files in force, base first, or, with none, that the
/// built-in defaults are (no file at the default path `base`).
pub fn config_ok_line(files: &[PathBuf], base: &Path) -> String {
    if files.is_empty() {
        return format!("config ok: built-in defaults (no config file at {})", base.display());
    }
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    format!("config ok: {}", names.join(" + "))
}

/// What both daemons apply to a loaded config before using it: `$XSHARE_LEDGER_DIR` (when set
/// and not empty) over `ledger_dir`, then `--gpu` over `gpu_index`.
pub fn apply_overrides(ledger_dir: &mut PathBuf, gpu_index: &mut u32, gpu: Option<u32>) {
    if let Some(d) =
        std::env::var_os(node_ledger::config::ENV_LEDGER_DIR).filter(|d| !d.is_empty())
    {
        *ledger_dir = d.into();
    }
    if let Some(g) = gpu {
        *gpu_index = g;
    }
}

/// `{gpu}` in a per-GPU path of a config (a state file, a directory) replaced by the GPU's
/// index: one config file serves every GPU's instance (`xshare-sysmonitor@N`,
/// `xshare-mps-manager@N` read the same file), and a path without it would be shared by all.
pub fn expand_gpu(p: &mut PathBuf, gpu: u32) {
    if let Some(t) = p.to_str().filter(|t| t.contains(GPU_PLACEHOLDER)) {
        *p = PathBuf::from(t.replace(GPU_PLACEHOLDER, &gpu.to_string()));
    }
}

/// What [`expand_gpu`] replaces.
pub const GPU_PLACEHOLDER: &str = "{gpu}";

/// Takes the lock that makes a daemon the one writer of its state file, `<file>.lock`
/// beside it, wherever the file is (the default, in the GPU's directory, included): two GPUs'
/// instances given one file (a path without `{gpu}` in a config they share, or another GPU's
/// default path written out, as `check-config` prints it) would overwrite each other's state,
/// and every reader would act on the wrong GPU's. The second to start is refused, naming the
/// holder. A state file in another GPU's directory (a sibling of `gpu_dir` named `gpu<N>`) is
/// refused outright, so that the daemon of the GPU that owns that directory is never the one
/// kept from starting.
pub fn lock_state_file(state_file: &Path, gpu_dir: &Path, daemon: &str) -> Result<std::fs::File, String> {
    let dir = state_file.parent();
    let theirs = dir.filter(|d| {
        *d != gpu_dir
            && d.parent().is_some_and(|p| Some(p) == gpu_dir.parent())
            && d.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix("gpu").is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            })
    });
    if let Some(d) = theirs {
        return Err(format!(
            "{daemon}: state file {} lies in another GPU's directory {}; refusing to write it (each GPU \
             needs its own: put {GPU_PLACEHOLDER} in state_file, or leave it unset)",
            state_file.display(),
            d.display()
        ));
    }
    let lock = PathBuf::from(format!("{}.lock", state_file.display()));
    let what = format!(
        "{daemon} writing the state file {} (each GPU needs its own: put {GPU_PLACEHOLDER} in state_file)",
        state_file.display()
    );
    crate::instance::lock(&lock, &what)
}

/// The heading of a daemon's `status`: `what` (e.g. `GPU 0`) with the writer's pid and the
/// state file's age, or, when that writer is not running, that what follows is how it left
/// things.
pub fn status_heading(what: &str, daemon: &str, pid: u32, running: bool, age_ms: u64) -> String {
    if running {
        format!("{what}  ({daemon} pid {pid}, updated {age_ms} ms ago)")
    } else {
        format!(
            "{what}  ({daemon} pid {pid} is not running: its state as it left it, {:.1} s ago)",
            age_ms as f64 / 1000.0
        )
    }
}

/// Writes `text` to stdout. A closed reader (`status | head`) is not an error: the output is
/// simply no longer wanted, so it ends quietly instead of panicking as `print!` would.
pub fn out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(format!("writing to stdout: {e}")),
    }
}

/// Logs to stderr at `$RUST_LOG` (default `info`), coloured only on a terminal (never into
/// files, pipes or the journal).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Override files beside a missing default base were ignored: now an error naming them.
    #[test]
    fn overrides_without_the_default_base_are_an_error_not_ignored() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("x.json");
        let a = ConfigArgs { config: None, gpu: None };
        let var = "XSHARE_TEST_UNSET_CONFIG_VAR";
        let load = |p: &Path| -> Result<(u32, Vec<PathBuf>), ConfigError> { Ok((7, vec![p.to_path_buf()])) };
        let l = a.load(var, base.to_str().unwrap(), load).unwrap();
        assert_eq!(l.config, 0, "no base, no overrides: the defaults");
        std::fs::create_dir(d.path().join("x.d")).unwrap();
        std::fs::write(d.path().join("x.d/50-tight.json"), "{}").unwrap();
        let e = a.load(var, base.to_str().unwrap(), load).expect_err("overrides with no base");
        assert!(e.to_string().contains("50-tight.json") && e.to_string().contains("x.json"), "{e}");
        std::fs::write(&base, "{}").unwrap();
        assert_eq!(a.load(var, base.to_str().unwrap(), load).unwrap().config, 7);
    }

    /// `XSHARE_SYSMONITOR_CONFIG=` (empty, as a unit file's `Environment=` can leave it) named
    /// a config file called "" and the daemon refused to start: empty means unset.
    #[test]
    fn an_empty_config_variable_names_no_file() {
        let a = ConfigArgs { config: None, gpu: None };
        let var = "XSHARE_TEST_EMPTY_CONFIG_VAR";
        std::env::set_var(var, "");
        assert_eq!(a.base(var, "/etc/xshare/x.json"), (PathBuf::from("/etc/xshare/x.json"), false));
        std::env::set_var(var, "/tmp/x.json");
        assert_eq!(a.base(var, "/etc/xshare/x.json"), (PathBuf::from("/tmp/x.json"), true));
        std::env::remove_var(var);
    }

    /// A state file put under /var/lib passed `check-config` and then failed on the unit's
    /// read-only file system at every restart.
    #[test]
    fn a_written_path_outside_the_units_writable_directory_is_warned_of() {
        let w = unit_write_warnings(&[
            ("state_file", Path::new("/var/lib/xshare/monitor-gpu0.json")),
            ("ledger_dir", Path::new("/run/xshare")),
            ("log_dir", Path::new("/run/xshare/daemons/gpu0/mps-log")),
            ("pipe_dir", Path::new("")),
        ]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("state_file /var/lib/xshare/monitor-gpu0.json is outside /run/xshare") && w[0].contains("ReadWritePaths=/var/lib/xshare"), "{w:?}");
        assert!(unit_write_warnings(&[("x", Path::new("/run/xshare-other/f"))]).len() == 1, "a sibling directory is outside");
    }

    /// `check-config` on the built-in defaults said `config ok: ` and named nothing.
    #[test]
    fn the_config_ok_line_names_the_files_or_the_built_in_defaults() {
        let base = Path::new("/etc/xshare/x.json");
        assert_eq!(config_ok_line(&[], base), "config ok: built-in defaults (no config file at /etc/xshare/x.json)");
        let files = [base.to_path_buf(), PathBuf::from("/etc/xshare/x.d/50-a.json")];
        assert_eq!(config_ok_line(&files, base), "config ok: /etc/xshare/x.json + /etc/xshare/x.d/50-a.json");
    }

    #[test]
    fn a_status_says_when_its_writer_is_gone() {
        assert_eq!(status_heading("GPU 1", "monitor", 7, true, 250), "GPU 1  (monitor pid 7, updated 250 ms ago)");
        assert_eq!(
            status_heading("GPU 1", "monitor", 7, false, 61_000),
            "GPU 1  (monitor pid 7 is not running: its state as it left it, 61.0 s ago)"
        );
    }

    #[test]
    fn gpu_in_a_path_is_the_index() {
        let mut p = PathBuf::from("/var/lib/xshare/gpu{gpu}/state-{gpu}.json");
        expand_gpu(&mut p, 3);
        assert_eq!(p, PathBuf::from("/var/lib/xshare/gpu3/state-3.json"));
        let mut p = PathBuf::from("/run/x/state.json");
        expand_gpu(&mut p, 3);
        assert_eq!(p, PathBuf::from("/run/x/state.json"));
    }

    /// Every state file is locked beside itself (`<file>.lock`), the default in the GPU's
    /// own directory included: GPU 0 given its default path and GPU 1 given that same path
    /// written out (`check-config` prints it so) took no lock and `state.json.lock`, and both
    /// wrote one file. A state file in another GPU's directory is refused outright.
    #[test]
    fn two_gpus_never_both_lock_one_state_file() {
        if let Ok(args) = std::env::var("XSHARE_TEST_LOCK_AS") {
            // The other process of this test: another GPU's daemon, given a state file and its
            // own GPU directory.
            let (file, dir) = args.split_once('\n').unwrap();
            std::process::exit(if lock_state_file(Path::new(file), Path::new(dir), "d").is_ok() { 0 } else { 3 });
        }
        let d = tempfile::tempdir().unwrap();
        let (gpu0, gpu1) = (d.path().join("daemons/gpu0"), d.path().join("daemons/gpu1"));
        let file = gpu0.join("state.json");
        // POSIX locks never conflict within one process: the other daemon is another process.
        let other = |file: &Path, dir: &Path| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "cli::tests::two_gpus_never_both_lock_one_state_file", "--test-threads=1"])
                .env("XSHARE_TEST_LOCK_AS", format!("{}\n{}", file.display(), dir.display()))
                .output()
                .unwrap()
                .status
                .code()
        };
        let _held = lock_state_file(&file, &gpu0, "d").unwrap();
        assert!(gpu0.join("state.json.lock").exists(), "the default path is locked too");
        assert_eq!(other(&file, &d.path().join("elsewhere/gpu1")), Some(3), "both locked {}", file.display());
        let e = lock_state_file(&file, &gpu1, "d").unwrap_err();
        assert!(e.contains("another GPU's directory"), "{e}");
        let shared = d.path().join("shared/state.json");
        let _shared = lock_state_file(&shared, &gpu1, "d").unwrap();
        assert_eq!(other(&shared, &gpu0), Some(3), "both locked {}", shared.display());
        assert_eq!(other(&d.path().join("shared/other.json"), &gpu0), Some(0), "the child takes a free lock");
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cfg: ConfigArgs,
        #[command(subcommand)]
        cmd: Option<Cmd>,
    }
    #[derive(clap::Subcommand, Debug, PartialEq)]
    enum Cmd {
        Run,
    }

    #[test]
    fn config_and_gpu_go_before_or_after_the_subcommand() {
        for argv in [
            &["d", "--config", "/x.json", "--gpu", "2", "run"][..],
            &["d", "run", "-c", "/x.json", "--gpu", "2"][..],
        ] {
            let c = Cli::try_parse_from(argv).unwrap();
            assert_eq!(c.cmd, Some(Cmd::Run));
            assert_eq!(c.cfg.config.as_deref(), Some(Path::new("/x.json")));
            assert_eq!(c.cfg.gpu, Some(2));
        }
        let e = Cli::try_parse_from(["d", "--gpu", "two"]).err().unwrap();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--gpu"), "{e}");
    }

    #[test]
    fn an_explicit_config_must_exist_the_default_may_be_absent() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("none.json");
        let load = |p: &Path| -> Result<(u32, Vec<PathBuf>), ConfigError> {
            crate::layered::load_with_overrides(p, |_: &u32| Ok(()))
        };
        let env = "XSHARE_NODE_DAEMON_TEST_UNSET";
        let absent = ConfigArgs::default();
        let l = absent.load(env, missing.to_str().unwrap(), load).unwrap();
        assert_eq!((l.config, l.files.len()), (0, 0), "built-in defaults");
        let named = ConfigArgs {
            config: Some(missing.clone()),
            gpu: None,
        };
        let e = named.load(env, "/nonexistent", load).unwrap_err();
        assert_eq!(e.file, missing);
        std::fs::write(&missing, "7").unwrap();
        let l = named.load(env, "/nonexistent", load);
        assert!(l.is_err(), "top level must be an object");
    }
}
