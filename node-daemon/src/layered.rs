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

/// Lists the override files for `base`: `<base stem>.d/*.json` beside it, sorted by name, but
/// not hidden names (`.#50-local.json`, an editor's lock link while an operator edits that
/// file; `.50-local.json.swp`): skipped as systemd skips them in its drop-in directories. No
/// such directory: none. A directory that cannot be listed (its permissions, not a directory,
/// an I/O error) is an error naming it: its overrides are never silently skipped (an
/// override file that cannot be read is refused when [`load`] reads it).
pub fn override_files(base: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let Some(stem) = base.file_stem() else {
        return Ok(Vec::new());
    };
    let dir = base.with_file_name(format!("{}.d", stem.to_string_lossy()));
    let err = |e: std::io::Error| ConfigError {
        file: dir.clone(),
        line: None,
        column: None,
        field: None,
        message: format!("cannot list the override directory: {e}; refusing to run without its overrides"),
    };
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let mut v = Vec::new();
    for e in rd {
        let p = e.map_err(err)?.path();
        let hidden = p.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
        if p.extension().is_some_and(|x| x == "json") && !hidden {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// Loads `base` and its `<stem>.d/*.json` overrides ([`override_files`]) with [`load`];
/// returns the config and the files it came from, base first.
pub fn load_with_overrides<T: DeserializeOwned>(
    base: &Path,
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<(T, Vec<PathBuf>), ConfigError> {
    let mut files = vec![base.to_path_buf()];
    files.extend(override_files(base)?);
    let cfg = load(&files, validate)?;
    Ok((cfg, files))
}

/// [`load_with_overrides`] over `defaults` (serialized): the files are merged key by key over
/// the built-in defaults, so a block given in part (`{"machine": {"gpu_util": {"enabled":
/// false}}}`) keeps the defaults of the keys it leaves out, also inside a block whose type
/// has no defaults of its own.
pub fn load_with_overrides_over<T: DeserializeOwned + serde::Serialize>(
    base: &Path,
    defaults: &T,
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<(T, Vec<PathBuf>), ConfigError> {
    let mut files = vec![base.to_path_buf()];
    files.extend(override_files(base)?);
    let start = serde_json::to_value(defaults).map_err(|e| ConfigError {
        file: base.to_path_buf(),
        line: None,
        column: None,
        field: None,
        message: format!("the built-in defaults do not serialize: {e}"),
    })?;
    let cfg = load_over(start, &files, validate)?;
    Ok((cfg, files))
}

/// [`load`] of `files` merged key by key over `defaults` (serialized), as
/// [`load_with_overrides_over`] does for a daemon's base file and its overrides: for a tool
/// that takes one config block from a file of its own (`simulate --health`).
pub fn load_files_over<T: DeserializeOwned + serde::Serialize>(
    files: &[PathBuf],
    defaults: &T,
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<T, ConfigError> {
    let start = serde_json::to_value(defaults).map_err(|e| ConfigError {
        file: files.first().cloned().unwrap_or_default(),
        line: None,
        column: None,
        field: None,
        message: format!("the built-in defaults do not serialize: {e}"),
    })?;
    load_over(start, files, validate)
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
        use std::os::unix::fs::FileTypeExt as _;
        let t = m.file_type();
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a named pipe"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(err(format!("is {what}, not a regular file; refusing to read it")));
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
    load_over(Value::Object(Default::default()), files, validate)
}

/// [`load`] with the files merged over `start` (an object).
fn load_over<T: DeserializeOwned>(
    start: Value,
    files: &[PathBuf],
    validate: impl Fn(&T) -> Result<(), (String, String)>,
) -> Result<T, ConfigError> {
    let mut layers = Vec::new();
    let mut merged = start;
    for p in files {
        let text = read_bounded(p)?;
        // A key given twice in one object is refused: serde_json keeps the later value, and
        // an error in it would be blamed on the line of the first.
        let v: Value = serde_json::from_str::<Unique>(&text).map(|u| u.0).map_err(|e| ConfigError {
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

/// Locates `field` (dotted) in `files` (base first) for an error found after loading them (a
/// check of the finalized config): as [`load`] locates its own errors. A file that cannot be
/// read now is passed over.
pub fn locate_in_files(files: &[PathBuf], field: &str, message: String) -> ConfigError {
    let layers: Vec<Layer> = files
        .iter()
        .filter_map(|p| read_bounded(p).ok().map(|text| Layer { path: p.clone(), text }))
        .collect();
    let mut e = locate(&layers, field, message);
    if layers.is_empty() {
        // Built-in defaults: no file to name.
        e.file = PathBuf::from("(built-in defaults)");
    }
    e
}

/// Blames the last layer that mentions the field's deepest key; when none mentions it (a
/// default the files left as it is), the last that mentions its nearest enclosing block.
fn locate(layers: &[Layer], field: &str, message: String) -> ConfigError {
    let segs: Vec<&str> = field
        .split('.')
        .filter(|s| !s.is_empty() && *s != "?")
        .collect();
    for n in (1..=segs.len()).rev() {
        for l in layers.iter().rev() {
            if let Some(line) = find_key_line(&l.text, &segs[..n]) {
                return ConfigError {
                    file: l.path.clone(),
                    line: Some(line),
                    column: None,
                    field: Some(field.into()),
                    message,
                };
            }
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

/// Refuses JSON `text` (attributed to `path`) that is not JSON or gives a key twice in one
/// object, naming the line: serde_json keeps the later value, and an error in it would be
/// blamed on the line of the first. For configs read whole by other means (node-agent's).
pub fn refuse_duplicate_keys(path: &Path, text: &str) -> Result<(), ConfigError> {
    serde_json::from_str::<Unique>(text).map(|_| ()).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: Some(e.line()),
        column: Some(e.column()),
        field: None,
        message: format!("invalid JSON: {e}"),
    })
}

/// A JSON value whose objects have no key twice (serde_json's `Value` keeps the last).
struct Unique(Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Unique(e)) = a.next_element()? {
            v.push(e);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = a.next_key::<String>()? {
            if m.contains_key(&k) {
                return Err(serde::de::Error::custom(format_args!(
                    "key `{k}` given twice in one object (only one value can count)"
                )));
            }
            let Unique(v) = a.next_value()?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
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
        assert!(e.message.contains("is a device, not a regular file"), "{e}");
        // A directory is named as one (not Rust's `FileType { .. }` debug form).
        let e = load::<serde_json::Value>(&[d.path().to_owned()], |_| Ok(())).unwrap_err();
        assert!(e.message.contains("is a directory, not a regular file"), "{e}");
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
        assert!(e.message.contains("is a named pipe, not a regular file"), "{e}");
    }

    /// An override directory that cannot be listed was taken for none: the daemon ran without
    /// the operator's overrides, and `check-config` said the config was fine. Now an error
    /// naming the directory (here a file in its place, which fails to list as root too; an
    /// unreadable directory fails alike for a user without the right to read it).
    #[test]
    fn an_override_directory_that_cannot_be_listed_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "sysmonitor.json", "{}");
        assert_eq!(override_files(&base).unwrap(), Vec::<PathBuf>::new(), "no directory: no overrides");
        let dir = write(d.path(), "sysmonitor.d", "{}");
        let e = override_files(&base).unwrap_err();
        assert_eq!(e.file, dir);
        assert!(e.message.contains("cannot list"), "{e}");
        let e = load_with_overrides::<serde_json::Value>(&base, |_| Ok(())).unwrap_err();
        assert_eq!(e.file, dir, "{e}");
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            std::fs::remove_file(&dir).unwrap();
            std::fs::create_dir(&dir).unwrap();
            write(&dir, "50-x.json", "{}");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
            let e = override_files(&base);
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(e.unwrap_err().file, dir);
        }
    }

    /// A key given twice: serde_json kept the later value, and an error in it was blamed on
    /// the first's line. Now refused, at the second's line.
    #[test]
    fn a_key_given_twice_is_refused_at_the_second() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.json", "{\"name\": \"x\",\n\"inner\": {\"a\": 1,\n \"b\": 2,\n \"a\": 3}}");
        let e = load::<Top>(std::slice::from_ref(&a), ok).unwrap_err();
        assert_eq!((e.file.clone(), e.line), (a, Some(4)), "{e}");
        assert!(e.message.contains("`a` given twice"), "{e}");
        // The same key in two objects, and in two files, is no repetition.
        let b = write(d.path(), "b.json", "{\"name\": \"y\", \"inner\": {\"a\": 2, \"b\": [{\"a\": 1}, {\"a\": 1}]}}");
        let t = load::<serde_json::Value>(&[b.clone(), b], |_| Ok(())).unwrap();
        assert_eq!(t["inner"]["b"][1]["a"], 1);
    }

    /// A default a file left as it is, found wrong beside the values the files gave (another
    /// field's limit), is blamed on the block it belongs to, not on no line at all.
    #[test]
    fn an_error_in_a_default_is_blamed_on_its_block() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.json", "{\"name\": \"x\",\n\"inner\": {\n\"a\": 7}}");
        let e = load::<Top>(std::slice::from_ref(&a), |_: &Top| Err(("inner.b".into(), "too small".into()))).unwrap_err();
        assert_eq!((e.line, e.field.as_deref()), (Some(2), Some("inner.b")), "{e}");
        let e = locate_in_files(std::slice::from_ref(&a), "inner.a", "bad".into());
        assert_eq!((e.file, e.line), (a, Some(3)));
        assert_eq!(locate_in_files(&[], "x", "bad".into()).file, PathBuf::from("(built-in defaults)"));
    }

    /// Merged over the defaults, a block given in part keeps the defaults of the rest, also in
    /// a type whose fields have no defaults of their own.
    #[test]
    fn a_partial_block_keeps_the_defaults_of_the_rest() {
        #[derive(Debug, Deserialize, serde::Serialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Strict {
            a: u32,
            b: u32,
        }
        #[derive(Debug, Deserialize, serde::Serialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Cfg {
            s: Strict,
            v: Vec<u32>,
        }
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "c.json", r#"{"s": {"b": 5}, "v": [9]}"#);
        let defaults = Cfg { s: Strict { a: 1, b: 2 }, v: vec![1, 2, 3] };
        let (c, _) = load_with_overrides_over(&base, &defaults, |_: &Cfg| Ok(())).unwrap();
        assert_eq!(c, Cfg { s: Strict { a: 1, b: 5 }, v: vec![9] }, "arrays are replaced whole");
        write(d.path(), "c.json", r#"{"s": {"c": 5}}"#);
        assert!(load_with_overrides_over(&base, &defaults, |_: &Cfg| Ok(())).is_err(), "unknown keys still refused");
    }

    /// A tool's one-block file (`simulate --health`) in part keeps the defaults of the keys it
    /// leaves out, and its errors name file, line and field.
    #[test]
    fn a_partial_block_file_is_merged_over_the_defaults() {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Inner {
            healthy: f64,
            unhealthy: f64,
        }
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Block {
            gpu_util: Inner,
            window_ms: u64,
        }
        let defaults = Block { gpu_util: Inner { healthy: 50.0, unhealthy: 80.0 }, window_ms: 100 };
        let d = tempfile::tempdir().unwrap();
        let p = write(d.path(), "h.json", "{\"gpu_util\": {\"unhealthy\": 90}}");
        let got: Block = load_files_over(std::slice::from_ref(&p), &defaults, |_| Ok(())).unwrap();
        assert_eq!(got, Block { gpu_util: Inner { healthy: 50.0, unhealthy: 90.0 }, window_ms: 100 });
        let bad = write(d.path(), "bad.json", "{\n  \"window_ms\": \"soon\"\n}");
        let e = load_files_over::<Block>(std::slice::from_ref(&bad), &defaults, |_| Ok(())).unwrap_err();
        assert_eq!((e.file.clone(), e.line, e.field.as_deref()), (bad, Some(2), Some("window_ms")), "{e}");
    }

    #[test]
    fn override_dir_is_sorted_json_only() {
        let d = tempfile::tempdir().unwrap();
        let base = write(d.path(), "sysmonitor.json", "{}");
        std::fs::create_dir(d.path().join("sysmonitor.d")).unwrap();
        write(&d.path().join("sysmonitor.d"), "20-b.json", "{}");
        write(&d.path().join("sysmonitor.d"), "10-a.json", "{}");
        write(&d.path().join("sysmonitor.d"), "README", "");
        // An editor's lock link (Emacs) to nowhere, and a hidden file: neither is an override.
        std::os::unix::fs::symlink("root@host.1234:1700000000", d.path().join("sysmonitor.d/.#20-b.json")).unwrap();
        write(&d.path().join("sysmonitor.d"), ".hidden.json", "{");
        let names: Vec<_> = override_files(&base)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["10-a.json", "20-b.json"]);
    }
}
