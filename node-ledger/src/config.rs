//! Config bits every node component shares (ledger directory, GPU index) and the config-error
//! type that names file, line and field: the one such type (the daemons' layered loader in
//! `node-daemon` returns it too; it lives here because the shim, which links only this crate,
//! reports config errors as well).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Default ledger directory; the ledger of GPU N is `<dir>/gpu<N>/ledger`.
pub const DEFAULT_LEDGER_DIR: &str = "/run/xshare";
/// Env var overriding the ledger directory.
pub const ENV_LEDGER_DIR: &str = "XSHARE_LEDGER_DIR";
/// Env var overriding the GPU index.
pub const ENV_GPU_INDEX: &str = "XSHARE_GPU_INDEX";

/// Where a component finds its GPU's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Directory holding `gpu<N>/ledger` files.
    pub ledger_dir: PathBuf,
    /// Index of the GPU this component serves.
    pub gpu_index: u32,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            ledger_dir: PathBuf::from(DEFAULT_LEDGER_DIR),
            gpu_index: 0,
        }
    }
}

impl LedgerConfig {
    /// Path of this GPU's ledger file.
    pub fn ledger_path(&self) -> PathBuf {
        ledger_path(&self.ledger_dir, self.gpu_index)
    }

    /// Path of this GPU's status file ([`status_path`]).
    pub fn status_path(&self) -> PathBuf {
        status_path(&self.ledger_dir, self.gpu_index)
    }

    /// Applies `XSHARE_LEDGER_DIR` / `XSHARE_GPU_INDEX` from `get` (normally `std::env::var`).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(d) = get(ENV_LEDGER_DIR).filter(|d| !d.is_empty()) {
            self.ledger_dir = PathBuf::from(d);
        }
        if let Some(g) = get(ENV_GPU_INDEX) {
            self.gpu_index = g.trim().parse().map_err(|_| ConfigError {
                file: PathBuf::from(format!("${ENV_GPU_INDEX}")),
                line: None,
                column: None,
                field: Some(ENV_GPU_INDEX.into()),
                message: format!("`{g}` is not a GPU index (expected 0, 1, ...)"),
            })?;
        }
        Ok(())
    }
}

/// Env var mapping the GPUs a process may see to the host GPUs whose ledgers count them:
/// `<host index>=<UUID>[,<host index>=<UUID>...]`, e.g.
/// `XSHARE_GPUS=1=GPU-5d9c...,0=GPU-0a1b...` (UUIDs as NVML and nvidia-smi print them; order
/// does not matter). The shim asks the driver for the UUID of each `CUdevice` ordinal, so the
/// mapping holds whatever `CUDA_VISIBLE_DEVICES` says (indices, UUIDs, any order, a subset).
/// A container that sees more than one GPU needs it; with one GPU, `XSHARE_GPU_INDEX` alone
/// still works. A GPU the process sees but this list lacks gets no quota at all (fail closed).
pub const ENV_GPUS: &str = "XSHARE_GPUS";

/// One entry of [`ENV_GPUS`]: a host GPU index and that GPU's UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuMapEntry {
    /// Host GPU index: its ledger is `<ledger dir>/gpu<index>/ledger`.
    pub index: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower case.
    pub uuid: String,
}

/// Parses the value of [`ENV_GPUS`]. Every entry must be `<index>=GPU-<hex and dashes>`; an
/// index or a UUID named twice is an error (one GPU, one ledger).
pub fn parse_gpu_map(v: &str) -> Result<Vec<GpuMapEntry>, ConfigError> {
    let err = |message: String| ConfigError {
        file: PathBuf::from(format!("${ENV_GPUS}")),
        line: None,
        column: None,
        field: Some(ENV_GPUS.into()),
        message,
    };
    let mut out: Vec<GpuMapEntry> = Vec::new();
    for item in v.split(',').map(str::trim) {
        let (idx, uuid) = item
            .split_once('=')
            .ok_or_else(|| err(format!("entry `{item}` is not `<host index>=<GPU UUID>`")))?;
        let index: u32 = idx
            .trim()
            .parse()
            .map_err(|_| err(format!("entry `{item}`: `{idx}` is not a GPU index")))?;
        let uuid = uuid.trim().to_ascii_lowercase();
        let hex = uuid.strip_prefix("gpu-").unwrap_or("");
        if hex.len() != 36 || !hex.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(err(format!("entry `{item}`: `{uuid}` is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")));
        }
        let uuid = format!("GPU-{hex}");
        if out.iter().any(|e| e.index == index || e.uuid == uuid) {
            return Err(err(format!("entry `{item}`: GPU index or UUID named twice")));
        }
        out.push(GpuMapEntry { index, uuid });
    }
    Ok(out)
}

/// `<dir>/gpu<N>/ledger`.
pub fn ledger_path(dir: &Path, gpu_index: u32) -> PathBuf {
    dir.join(format!("gpu{gpu_index}")).join("ledger")
}

/// `<dir>/status/gpu<N>`: the daemons' published status of GPU N (`crate::status`), in a
/// directory of its own that node-agent mounts read-only into offline containers.
pub fn status_path(dir: &Path, gpu_index: u32) -> PathBuf {
    dir.join(STATUS_DIR).join(format!("gpu{gpu_index}"))
}

/// The status files' directory under the ledger directory.
pub const STATUS_DIR: &str = "status";

/// `<dir>/daemons/gpu<N>`: GPU N's daemon-only directory, never mounted into a container: the
/// daemons' single-instance locks, the operator's requests (`disabled`, `enable`) and the
/// daemons' JSON state files. In the `gpu<N>` directory, which offline containers get
/// read-write, a tenant could hold a lock (a restarted monitor could not start), re-enable a
/// GPU an XID disabled, or forge the state another daemon acts on.
pub fn daemon_dir(dir: &Path, gpu_index: u32) -> PathBuf {
    dir.join(DAEMON_DIR).join(format!("gpu{gpu_index}"))
}

/// The daemon-only directories' parent under the ledger directory ([`daemon_dir`]).
pub const DAEMON_DIR: &str = "daemons";

/// A config problem, located: `file:line:column: field `x`: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file at fault (or `$VAR` for an environment variable).
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// Dotted path of the field at fault, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// A validation error for `field` (dotted path) found in `text` from `file`; the line is that
    /// of the field's key when it can be found.
    pub fn invalid(file: &Path, text: &str, field: &str, message: impl Into<String>) -> Self {
        let key = field.rsplit('.').next().unwrap_or(field);
        Self {
            file: file.to_owned(),
            line: line_of_key(text, key),
            column: None,
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }
}

fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let quoted = format!("\"{key}\"");
    text.lines()
        .position(|l| l.contains(&quoted))
        .map(|i| i + 1)
}

/// Parses JSON text attributed to `path`; errors carry line, column and field path. The text
/// must be one JSON object: serde would read a struct from an array too (`[]` as a config of
/// all defaults, `[1, 2]` as its first fields in order).
pub fn parse_json<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    let first = text.trim_start_matches(|c: char| c.is_ascii_whitespace()).chars().next();
    if first.is_some_and(|c| c != '{') {
        let line = text[..text.len() - text.trim_start_matches(|c: char| c.is_ascii_whitespace()).len()].matches('\n').count() + 1;
        return Err(ConfigError {
            file: path.to_owned(),
            line: Some(line),
            column: None,
            field: None,
            message: "a config is one JSON object (`{ ... }`)".into(),
        });
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        ConfigError {
            file: path.to_owned(),
            line: Some(inner.line()).filter(|l| *l > 0),
            column: Some(inner.column()).filter(|c| *c > 0),
            field: (field != ".").then_some(field),
            message: strip_position(&inner.to_string()),
        }
    })
}

fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[]` was taken as a config of all defaults (serde reads a struct from an array).
    #[test]
    fn a_config_that_is_no_object_is_refused() {
        #[derive(Debug, serde::Deserialize, Default)]
        #[serde(default)]
        struct C {
            #[allow(dead_code)]
            a: u32,
        }
        for t in ["[]", "\n  [1]", "1", "\"x\"", "null"] {
            let e = parse_json::<C>(Path::new("c.json"), t).unwrap_err();
            assert!(e.message.contains("one JSON object"), "{t}: {e}");
        }
        assert_eq!(parse_json::<C>(Path::new("c.json"), "\n\n  [").unwrap_err().line, Some(3));
        assert!(parse_json::<C>(Path::new("c.json"), " {\"a\": 1}").is_ok());
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        ledger: LedgerConfig,
        quota: Inner,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        fraction: f64,
    }

    #[test]
    fn type_error_names_line_and_field() {
        let text = "{\n  \"ledger\": {\"gpu_index\": 0},\n  \"quota\": {\n    \"fraction\": \"lots\"\n  }\n}";
        let e = parse_json::<Outer>(Path::new("/etc/x.json"), text).unwrap_err();
        assert_eq!(e.line, Some(4));
        assert_eq!(e.field.as_deref(), Some("quota.fraction"));
        let s = e.to_string();
        assert!(s.starts_with("/etc/x.json:4:"), "{s}");
        assert!(s.contains("field `quota.fraction`"), "{s}");
    }

    #[test]
    fn unknown_field_is_named() {
        let text = "{\"ledger\": {\"gpu_idx\": 1}, \"quota\": {\"fraction\": 0.4}}";
        let e = parse_json::<Outer>(Path::new("c.json"), text).unwrap_err();
        assert!(e.message.contains("gpu_idx"), "{e}");
        assert_eq!(e.line, Some(1));
    }

    #[test]
    fn invalid_locates_key_line() {
        let text = "{\n \"a\": 1,\n \"fraction\": 7\n}";
        let e = ConfigError::invalid(Path::new("f"), text, "quota.fraction", "must be in (0,1]");
        assert_eq!(e.line, Some(3));
        assert_eq!(
            e.to_string(),
            "f:3: field `quota.fraction`: must be in (0,1]"
        );
    }

    #[test]
    fn gpu_map_parses_and_refuses_ambiguity() {
        let u0 = "GPU-0a1b2c3d-0000-4000-8000-000000000000";
        let u1 = "GPU-5D9C0000-0000-4000-8000-000000000001";
        let m = parse_gpu_map(&format!("1={u1}, 0={u0}")).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].index, m[0].uuid.as_str()), (1, "GPU-5d9c0000-0000-4000-8000-000000000001"));
        assert_eq!(m[1].index, 0);
        for bad in [
            String::new(),
            format!("x={u0}"),
            "0=GPU-123".to_string(),
            format!("0={u0},0={u1}"),
            format!("0={u0},1={u0}"),
            u0.to_string(),
        ] {
            let e = parse_gpu_map(&bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(ENV_GPUS), "{bad}: {e}");
        }
    }

    #[test]
    fn env_overrides_and_bad_gpu_index() {
        let mut c = LedgerConfig::default();
        c.apply_env(|k| match k {
            ENV_LEDGER_DIR => Some("/tmp/l".into()),
            ENV_GPU_INDEX => Some("3".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.ledger_path(), PathBuf::from("/tmp/l/gpu3/ledger"));
        let e = c
            .apply_env(|k| (k == ENV_GPU_INDEX).then(|| "x".into()))
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some(ENV_GPU_INDEX));
        assert_eq!(c.gpu_index, 3, "last good value kept");
    }
}
