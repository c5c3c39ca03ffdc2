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

/// `<dir>/gpu<N>/ledger`.
pub fn ledger_path(dir: &Path, gpu_index: u32) -> PathBuf {
    dir.join(format!("gpu{gpu_index}")).join("ledger")
}

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

/// Parses JSON text attributed to `path`; errors carry line, column and field path.
pub fn parse_json<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
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
