//! A small command-line reader: `--name value`, `--name=value` and `--flag`, with errors that
//! name the flag and what was wrong, and a check that nothing unknown was passed.

use std::collections::BTreeMap;
use std::str::FromStr;

/// Parsed `--name [value]` pairs, consumed by the typed getters.
#[derive(Debug, Default)]
pub struct Args {
    values: BTreeMap<String, Option<String>>,
}

impl Args {
    /// Parses `argv` (without the program name). `flags` lists the options that take no value.
    pub fn parse<I: IntoIterator<Item = String>>(argv: I, flags: &[&str]) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        let mut it = argv.into_iter();
        while let Some(a) = it.next() {
            let Some(body) = a.strip_prefix("--") else {
                return Err(format!("unexpected argument '{a}' (options start with --; see --help)"));
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (body.to_string(), None),
            };
            let value = if flags.contains(&name.as_str()) || name == "help" {
                if inline.is_some() {
                    return Err(format!("--{name} takes no value"));
                }
                None
            } else {
                match inline {
                    Some(v) => Some(v),
                    None => Some(it.next().ok_or_else(|| format!("--{name} needs a value (see --help)"))?),
                }
            };
            if values.insert(name.clone(), value).is_some() {
                return Err(format!("--{name} given twice"));
            }
        }
        Ok(Args { values })
    }

    /// True (and consumed) when `--name` was given.
    pub fn flag(&mut self, name: &str) -> bool {
        self.values.remove(name).is_some()
    }

    /// The value of `--name` parsed as `T`, if given.
    pub fn opt<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.values.remove(name) {
            None => Ok(None),
            Some(None) => Err(format!("--{name} needs a value")),
            Some(Some(v)) => v.parse::<T>().map(Some).map_err(|e| format!("--{name} '{v}': {e}")),
        }
    }

    /// The value of `--name` parsed as `T`, or `default`.
    pub fn get<T: FromStr>(&mut self, name: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        Ok(self.opt(name)?.unwrap_or(default))
    }

    /// Fails when an option was passed that no getter asked for.
    pub fn finish(self) -> Result<(), String> {
        match self.values.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!("unknown option --{k} (see --help)")),
        }
    }
}

/// Checks `lo <= v <= hi` for option `name`.
pub fn in_range<T: PartialOrd + std::fmt::Display>(name: &str, v: T, lo: T, hi: T) -> Result<T, String> {
    if v < lo || v > hi {
        Err(format!("--{name} {v} is out of range [{lo}, {hi}]"))
    } else {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn reads_values_flags_and_inline_values() {
        let mut a = Args::parse(argv("--rate 20 --json --duration=1.5"), &["json"]).unwrap();
        assert_eq!(a.get("rate", 1.0).unwrap(), 20.0);
        assert_eq!(a.get("duration", 0.0).unwrap(), 1.5);
        assert!(a.flag("json"));
        assert_eq!(a.get("kernels", 4u32).unwrap(), 4);
        a.finish().unwrap();
    }

    #[test]
    fn rejects_unknown_missing_bad_and_repeated() {
        let a = Args::parse(argv("--bogus 1"), &[]).unwrap();
        assert!(a.finish().unwrap_err().contains("--bogus"));
        assert!(Args::parse(argv("--rate"), &[]).unwrap_err().contains("needs a value"));
        let mut a = Args::parse(argv("--rate fast"), &[]).unwrap();
        assert!(a.get("rate", 1.0f64).unwrap_err().contains("'fast'"));
        assert!(Args::parse(argv("--rate 1 --rate 2"), &[]).unwrap_err().contains("twice"));
        assert!(Args::parse(argv("stray"), &[]).unwrap_err().contains("stray"));
        assert!(in_range("rate", 0.0, 0.001, 1e6).is_err());
    }
}
