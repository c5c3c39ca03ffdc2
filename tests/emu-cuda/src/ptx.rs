//! Just enough PTX reading to load a module: the `.entry` names and their parameter counts.

/// A kernel entry found in PTX text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Kernel name as `cuModuleGetFunction` looks it up.
    pub name: String,
    /// Number of parameters in its signature.
    pub params: usize,
}

/// Why an image is not loadable.
#[derive(Debug, PartialEq, Eq)]
pub enum PtxError {
    /// Not PTX text (a cubin/fatbin, or garbage): `CUDA_ERROR_INVALID_IMAGE`.
    NotPtx,
    /// PTX without the mandatory `.version` / `.target`: `CUDA_ERROR_INVALID_PTX`.
    Malformed(&'static str),
}

/// Parses the entries of a PTX module.
pub fn parse(text: &str) -> Result<Vec<Entry>, PtxError> {
    if !text.contains(".entry") && !text.contains(".version") {
        return Err(PtxError::NotPtx);
    }
    let code = strip_comments(text);
    if !code.contains(".version") {
        return Err(PtxError::Malformed("missing .version"));
    }
    if !code.contains(".target") {
        return Err(PtxError::Malformed("missing .target"));
    }
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find(".entry") {
        let after = &rest[i + ".entry".len()..];
        let boundary_ok = after.starts_with(|c: char| c.is_whitespace());
        rest = after;
        if !boundary_ok {
            continue;
        }
        let after = after.trim_start();
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '$' | '.')).collect();
        if name.is_empty() {
            return Err(PtxError::Malformed("an .entry has no name"));
        }
        let sig = &after[name.len()..];
        let params = match (sig.trim_start().starts_with('('), sig.find(')')) {
            (true, Some(close)) => sig[..close].matches(".param").count(),
            _ => 0,
        };
        out.push(Entry { name, params });
    }
    Ok(out)
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                rest = rest[b + 2..].find("*/").map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIN: &str = "//\n// spin(u64 cycles)\n.version 7.0\n.target sm_52\n.address_size 64\n\n.visible .entry spin(\n\t.param .u64 spin_param_0\n)\n{\n ret;\n}\n";

    #[test]
    fn finds_entries_and_params() {
        assert_eq!(parse(SPIN).unwrap(), vec![Entry { name: "spin".into(), params: 1 }]);
        let two = ".version 8.0\n.target sm_80\n.entry a() { ret; }\n/* .entry hidden( */\n.visible .entry _Z3addPfS_i(.param .u64 p0, .param .u64 p1, .param .u32 n)\n{ret;}";
        let e = parse(two).unwrap();
        assert_eq!(e, vec![Entry { name: "a".into(), params: 0 }, Entry { name: "_Z3addPfS_i".into(), params: 3 }]);
    }

    #[test]
    fn rejects_non_ptx() {
        assert_eq!(parse("\u{7f}ELF...."), Err(PtxError::NotPtx));
        assert_eq!(parse(".entry x() {}"), Err(PtxError::Malformed("missing .version")));
        assert_eq!(parse(".version 7.0\n.entry x() {}"), Err(PtxError::Malformed("missing .target")));
    }
}
