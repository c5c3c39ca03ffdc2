//! The cells configuration file: chains (cell hierarchies per GPU type), the physical cluster
//! and the virtual clusters, parsed from JSON with errors that name file, line and field.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

/// Whole cells configuration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CellsConfig {
    /// Homogeneous cell chains, one per GPU type / topology.
    pub chains: Vec<ChainConfig>,
    /// Top-level physical cells with their node names.
    pub physical_cells: Vec<PhysicalCellConfig>,
    /// Tenants and the cells each is guaranteed.
    #[serde(default)]
    pub virtual_clusters: Vec<VirtualClusterConfig>,
    /// How many colocated (MuxFlow offline) jobs one GPU may hold; default 1.
    #[serde(default = "one")]
    pub colocated_per_gpu: u32,
}

fn one() -> u32 {
    1
}

/// One homogeneous cell hierarchy.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChainConfig {
    /// Chain name, referenced by physical cells and virtual clusters.
    pub name: String,
    /// GPU model of every GPU in the chain (e.g. "V100").
    pub gpu_type: String,
    /// Levels bottom-up: the first is the GPU, each next one groups `children` of the previous.
    pub levels: Vec<LevelConfig>,
    /// The level whose cells are one host; defaults to the top level.
    #[serde(default)]
    pub node_level: Option<String>,
}

/// One level of a chain.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LevelConfig {
    /// Level name, e.g. "gpu", "pcie", "socket", "node", "rack".
    pub name: String,
    /// Number of cells of the level below in one cell of this level (absent for the GPU level).
    #[serde(default)]
    pub children: Option<u32>,
}

/// One physical cell of the cluster: a cell of some chain level; below the node level it is
/// part of one host, which then lends only those GPUs (indices 0..).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PhysicalCellConfig {
    /// Chain name.
    pub chain: String,
    /// Level name; defaults to the chain's top level.
    #[serde(default)]
    pub level: Option<String>,
    /// Host names, one per node-level cell inside, in order; GPU indices run 0.. per host.
    pub nodes: Vec<String>,
}

/// A tenant's virtual private cluster.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VirtualClusterConfig {
    /// Tenant name.
    pub name: String,
    /// Guaranteed cells: counts per chain and level.
    pub cells: Vec<VcCellsConfig>,
}

/// `count` cells of `level` in `chain`, guaranteed to one VC.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VcCellsConfig {
    /// Chain name.
    pub chain: String,
    /// Level name in that chain.
    pub level: String,
    /// How many such cells.
    pub count: u32,
}

impl CellsConfig {
    /// Reads and parses a config file; errors name the file, line and field path.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            file: path.display().to_string(),
            source: e,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses config text; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            ConfigError::Syntax {
                file: origin.to_string(),
                line: inner.line(),
                column: inner.column(),
                field,
                message: inner.to_string(),
            }
        })
    }
}

/// Finds the 1-based line of the value at a JSON path such as `virtual_clusters[1].cells[0].chain`
/// (best effort: `None` when the text does not contain it).
pub(crate) fn line_of(text: &str, path: &str) -> Option<usize> {
    let mut pos = 0usize;
    let bytes = text.as_bytes();
    for seg in split_path(path) {
        pos = skip_ws(bytes, pos);
        match seg {
            Seg::Key(k) => {
                if bytes.get(pos) != Some(&b'{') {
                    return None;
                }
                pos += 1;
                loop {
                    pos = skip_ws(bytes, pos);
                    if bytes.get(pos) != Some(&b'"') {
                        return None;
                    }
                    let end = skip_string(bytes, pos)?;
                    let key = &text[pos + 1..end - 1];
                    pos = skip_ws(bytes, end);
                    if bytes.get(pos) != Some(&b':') {
                        return None;
                    }
                    pos = skip_ws(bytes, pos + 1);
                    if key == k {
                        break;
                    }
                    pos = skip_value(bytes, pos)?;
                    pos = skip_ws(bytes, pos);
                    if bytes.get(pos) != Some(&b',') {
                        return None;
                    }
                    pos += 1;
                }
            }
            Seg::Index(i) => {
                if bytes.get(pos) != Some(&b'[') {
                    return None;
                }
                pos += 1;
                for _ in 0..i {
                    pos = skip_ws(bytes, pos);
                    pos = skip_value(bytes, pos)?;
                    pos = skip_ws(bytes, pos);
                    if bytes.get(pos) != Some(&b',') {
                        return None;
                    }
                    pos += 1;
                }
                pos = skip_ws(bytes, pos);
            }
        }
    }
    Some(text[..pos.min(text.len())].matches('\n').count() + 1)
}

enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

fn split_path(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Seg::Key(name));
        }
        for idx in rest.split('[').filter(|s| !s.is_empty()) {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                out.push(Seg::Index(i));
            }
        }
    }
    out
}

fn skip_ws(b: &[u8], mut p: usize) -> usize {
    while p < b.len() && b[p].is_ascii_whitespace() {
        p += 1;
    }
    p
}

fn skip_string(b: &[u8], mut p: usize) -> Option<usize> {
    p += 1;
    while p < b.len() {
        match b[p] {
            b'\\' => p += 2,
            b'"' => return Some(p + 1),
            _ => p += 1,
        }
    }
    None
}

fn skip_value(b: &[u8], p: usize) -> Option<usize> {
    match *b.get(p)? {
        b'"' => skip_string(b, p),
        b'{' | b'[' => {
            let mut depth = 0i32;
            let mut q = p;
            while q < b.len() {
                match b[q] {
                    b'"' => {
                        q = skip_string(b, q)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(q + 1);
                        }
                    }
                    _ => {}
                }
                q += 1;
            }
            None
        }
        _ => {
            let mut q = p;
            while q < b.len() && !matches!(b[q], b',' | b'}' | b']') && !b[q].is_ascii_whitespace()
            {
                q += 1;
            }
            Some(q)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_of_finds_nested_values() {
        let text = "{\n  \"a\": 1,\n  \"b\": [\n    {\"x\": 1},\n    {\"x\": \"q,]\",\n     \"y\": 2}\n  ]\n}";
        assert_eq!(line_of(text, "a"), Some(2));
        assert_eq!(line_of(text, "b[0].x"), Some(4));
        assert_eq!(line_of(text, "b[1].y"), Some(6));
        assert_eq!(line_of(text, "b[2]"), None);
    }

    #[test]
    fn syntax_error_names_file_line_and_field() {
        let text = "{\n \"chains\": [{\"name\": \"v\", \"gpu_type\": \"V100\",\n \"levels\": [{\"name\": \"gpu\", \"children\": \"two\"}]}],\n \"physical_cells\": []}";
        let err = CellsConfig::parse(text, "c.json").unwrap_err().to_string();
        assert!(err.contains("c.json:3"), "{err}");
        assert!(err.contains("chains[0].levels[0].children"), "{err}");
    }
}
