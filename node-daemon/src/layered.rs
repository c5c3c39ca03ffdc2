//! Layered JSON config: a base file plus override files merged over it, with errors that name
//! the file, line and field at fault.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::ConfigError;

/// One source file and its text, kept to locate fields in errors.
struct Layer {
    path: PathBuf,
    text: String,
}

/// Lists the override files for `base`: `<base stem>.d/*.json` beside it, sorted by name.
pub fn override_files(base: &Path) -> Vec<PathBuf> {
    let Some(stem) = base.file_stem() else {
        return Vec::new();
    };
    let dir = base.with_file_name(format!("{}.d", stem.to_string_lossy()));
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    v
}

/// Loads `base` and its `<stem>.d/*.json` overrides ([`override_files`]) with [`load`];
/// returns the config and the files it came from, base first.
pub fn load_with_overrides<T: DeserializeOwned>(
    base: &Path,
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<(T, Vec<PathBuf>), ConfigError> {
    let mut files = vec![base.to_path_buf()];
    files.extend(override_files(base));
    let cfg = load(&files, validate)?;
    Ok((cfg, files))
}

/// Largest config file accepted (a config is a few KiB; a huge file is a mistake or an attack).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Reads a whole config file, refusing one over [`MAX_FILE_BYTES`] before reading it whole
/// (the size is checked up front and the read is bounded) and anything but a regular file (a
/// FIFO, a device such as `/dev/zero`, a directory; a symlink to a regular file is fine). The
/// file is opened non-blocking: opening a FIFO with no writer would otherwise hang
/// `check-config` and the daemon's reload for good.
pub fn read_bounded(p: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let err = |message: String| ConfigError {
        file: p.to_path_buf(),
        line: None,
        column: None,
        field: None,
        message,
    };
    let too_big = || {
        err(format!(
            "larger than {MAX_FILE_BYTES} bytes; refusing to read it"
        ))
    };
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    let m = f.metadata().map_err(|e| err(format!("cannot read: {e}")))?;
    if !m.is_file() {
        return Err(err(format!(
            "not a regular file ({:?}); refusing to read it",
            m.file_type()
        )));
    }
    if m.len() > MAX_FILE_BYTES {
        return Err(too_big());
    }
    let mut text = String::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big());
    }
    Ok(text)
}

/// Loads `files` in order (later ones override earlier ones key by key), deserializes into `T`,
/// then runs `validate`, which returns `(dotted field, message)` on a semantic error.
pub fn load<T: DeserializeOwned>(
    files: &[PathBuf],
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<T, ConfigError> {
    let mut layers = Vec::new();
    let mut merged = Value::Object(Default::default());
    for p in files {
        let text = read_bounded(p)?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ConfigError {
            file: p.clone(),
            line: Some(e.line()),
            column: Some(e.column()),
            field: None,
            message: format!("invalid JSON: {e}"),
        })?;
        if !v.is_object() {
            return Err(ConfigError {
                file: p.clone(),
                line: Some(1),
                column: None,
                field: None,
                message: "top level must be a JSON object".into(),
            });
        }
        merge(&mut merged, v);
        layers.push(Layer {
            path: p.clone(),
            text,
        });
    }
    let cfg: T = serde_path_to_error::deserialize(merged).map_err(|e| {
        let field = e.path().to_string();
        let msg = e.inner().to_string();
        locate(&layers, &field, msg)
    })?;
    validate(&cfg).map_err(|(field, msg)| locate(&layers, &field, msg))?;
    Ok(cfg)
}

/// Blames the last layer that mentions the field's deepest known key.
fn locate(layers: &[Layer], field: &str, message: String) -> ConfigError {
    let segs: Vec<&str> = field
        .split('.')
        .filter(|s| !s.is_empty() && *s != "?")
        .collect();
    for l in layers.iter().rev() {
        if let Some(line) = find_key_line(&l.text, &segs) {
            return ConfigError {
                file: l.path.clone(),
                line: Some(line),
                column: None,
                field: Some(field.into()),
                message,
            };
        }
    }
    let file = layers.last().map(|l| l.path.clone()).unwrap_or_default();
    ConfigError {
        file,
        line: None,
        column: None,
        field: (!field.is_empty() && field != ".").then(|| field.to_string()),
        message,
    }
}

/// Line (1-based) of the last segment's key, found by searching each key after the previous.
fn find_key_line(text: &str, segs: &[&str]) -> Option<usize> {
    if segs.is_empty() {
        return None;
    }
    let mut pos = 0;
    for s in segs {
        // Array indices in the path (e.g. `xid_critical[2]`) are searched by their key only.
        let key = s.split('[').next().unwrap_or(s);
        let needle = format!("\"{key}\"");
        pos += text[pos..].find(&needle)?;
    }
    Some(text[..pos].matches('\n').count() + 1)
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
        #[serde(default)]
        b: u32,
    }
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Top {
        name: String,
        inner: Inner,
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn ok(_: &Top) -> Result<(), (String, String)> {
        Ok(())
    }

    #[test]
    fn overrides_merge_key_by_key() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.json", r#"{"name":"x","inner":{"a":1,"b":2}}"#);
        let b = write(d.path(), "b.json", r#"{"inner":{"b":5}}"#);
        let t: Top = load(&[a, b], ok).unwrap();
        assert_eq!(
            t,
            Top {
                name: "x".into(),
                inner: Inner { a: 1, b: 5 }
            }
        );
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            d.path(),
            "a.json",
            "{\n\"name\": \"x\",\n\"inner\": {\"a\": 1,}\n}",
        );
        let e = load::<Top>(std::slice::from_ref(&a), ok).unwrap_err();
        assert_eq!(e.file, a);
        assert_eq!(e.line, Some(3));
    }

    #[test]
    fn type_error_names_the_override_file_line_and_field() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.json", "{\"name\":\"x\",\n\"inner\":{\"a\":1}}");
        let b = write(
            d.path(),
            "b.json",
            "{\n  \"inner\": {\n    \"a\": \"three\"\n  }\n}",
        );
        let e = load::<Top>(&[a, b.clone()], ok).unwrap_err();
        assert_eq!(
            (e.file.clone(), e.line, e.field.as_deref()),
            (b, Some(3), Some("inner.a")),
            "{e}"
        );
        assert!(e.to_string().contains("inner.a"));
    }

    #[test]
    fn unknown_field_is_rejected_with_its_name() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            d.path(),
            "a.json",
            "{\"name\":\"x\",\n\"inner\":{\"a\":1,\n\"typo\":3}}",
        );
        let e = load::<Top>(&[a], ok).unwrap_err();
        assert!(e.message.contains("typo"), "{e}");
    }

    #[test]
    fn validation_error_points_at_the_field() {
        let d = tempfile::tempdir().unwrap();
        let a = write(
            d.path(),
            "a.json",
            "{\"name\":\"x\",\n\"inner\":{\n\"a\":0}}",
        );
        let e = load::<Top>(&[a], |t: &Top| {
            if t.inner.a == 0 {
                Err(("inner.a".into(), "must be > 0".into()))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(e.to_string().split(": ").last(), Some("must be > 0"));
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_before_it_is_parsed() {
        let d = tempfile::tempdir().unwrap();
        // Valid JSON, just too big: only the size check can refuse it.
        let mut big = String::from("{\"a\": 1, \"pad\": \"");
        big.push_str(&"x".repeat(MAX_FILE_BYTES as usize));
        big.push_str("\"}");
        let p = write(d.path(), "big.json", &big);
        let e = load::<serde_json::Value>(std::slice::from_ref(&p), |_| Ok(())).unwrap_err();
        assert_eq!(e.file, p);
        assert!(e.message.contains("larger than"), "{e}");
        // An endless device is refused as well, without reading it.
        let e = load::<serde_json::Value>(&["/dev/zero".into()], |_| Ok(())).unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        // Just under the limit is fine.
        let ok = format!(
            "{{\"pad\": \"{}\"}}",
            "x".repeat(MAX_FILE_BYTES as usize - 20)
        );
        let p = write(d.path(), "ok.json", &ok);
        assert!(load::<serde_json::Value>(&[p], |_| Ok(())).is_ok());
    }

    /// A FIFO (here with no writer, so a blocking open would never return) is refused at
    /// once, as base or override, naming it: it hung `check-config` and a reload.
    #[test]
    fn a_fifo_config_file_is_refused_not_waited_on() {
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "sysmonitor.json", "{}");
        std::fs::create_dir(d.path().join("sysmonitor.d")).unwrap();
        let fifo = d.path().join("sysmonitor.d/50-fifo.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let b = base.clone();
        // On a thread: without the fix the open blocks for good, and the test fails on the
        // channel instead of hanging.
        std::thread::spawn(move || tx.send(load_with_overrides::<serde_json::Value>(&b, |_| Ok(())).map(|_| ())));
        let e = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the load returns").unwrap_err();
        assert_eq!(e.file, fifo);
        assert!(e.message.contains("not a regular file"), "{e}");
    }

    #[test]
    fn override_dir_is_sorted_json_only() {
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "sysmonitor.json", "{}");
        std::fs::create_dir(d.path().join("sysmonitor.d")).unwrap();
        write(&d.path().join("sysmonitor.d"), "20-b.json", "{}");
        write(&d.path().join("sysmonitor.d"), "10-a.json", "{}");
        write(&d.path().join("sysmonitor.d"), "README", "");
        let names: Vec<_> = override_files(&base)
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["10-a.json", "20-b.json"]);
    }
}
