//! The pure `cuGetProcAddress` resolver: (name, requested CUDA version, flags) -> table entry.

use crate::procs::{ProcEntry, PROC_TABLE};
use crate::types::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

/// Outcome of a lookup, mirroring `CUdriverProcAddressQueryResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The entry (and so the exported symbol and ABI) that answers the request.
    Found(&'static ProcEntry),
    /// No entry point of that name is known (`CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`).
    SymbolNotFound,
    /// The name is known but every ABI of it is newer than the requested version
    /// (`CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`).
    VersionNotSufficient,
}

impl PartialEq for ProcEntry {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for ProcEntry {}

/// Resolves against the crate's [`PROC_TABLE`].
pub fn resolve(name: &str, cuda_version: i32, flags: u64) -> Resolution {
    resolve_in(PROC_TABLE, name, cuda_version, flags)
}

/// Resolves `name` in `table`: the highest plain entry with version <= `cuda_version`; with
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` in `flags`, the highest per-thread entry instead
/// when one exists that is not older than that plain ABI (a newer plain ABI without a per-thread
/// twin wins, so the caller never gets an older signature than it asked for).
pub fn resolve_in(table: &'static [ProcEntry], name: &str, cuda_version: i32, flags: u64) -> Resolution {
    let mut known = false;
    let mut plain: Option<&'static ProcEntry> = None;
    let mut per_thread: Option<&'static ProcEntry> = None;
    for e in table.iter().filter(|e| e.name == name) {
        known = true;
        if i64::from(e.version) > i64::from(cuda_version) {
            continue;
        }
        let slot = if e.variant.is_per_thread() { &mut per_thread } else { &mut plain };
        if slot.is_none_or_older(e.version) {
            *slot = Some(e);
        }
    }
    if !known {
        return Resolution::SymbolNotFound;
    }
    let want_pt = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let chosen = match (plain, per_thread) {
        (Some(p), Some(t)) if want_pt && t.version >= p.version => Some(t),
        (None, Some(t)) if want_pt => Some(t),
        (Some(p), _) => Some(p),
        (None, _) => None,
    };
    match chosen {
        Some(e) => Resolution::Found(e),
        None => Resolution::VersionNotSufficient,
    }
}

trait OlderThan {
    fn is_none_or_older(&self, v: u32) -> bool;
}

impl OlderThan for Option<&'static ProcEntry> {
    fn is_none_or_older(&self, v: u32) -> bool {
        !matches!(self, Some(cur) if cur.version >= v)
    }
}

/// Looks an exported symbol up in the table (`"cuMemAlloc_v2"` -> its entry, never an alias).
pub fn entry_for_symbol(symbol: &str) -> Option<&'static ProcEntry> {
    PROC_TABLE.iter().find(|e| e.symbol == symbol && !e.alias)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::Variant;

    fn sym(name: &str, v: i32, flags: u64) -> &'static str {
        match resolve(name, v, flags) {
            Resolution::Found(e) => e.symbol,
            other => panic!("{name}@{v}/{flags}: {other:?}"),
        }
    }

    #[test]
    fn picks_highest_version_not_above_request() {
        assert_eq!(sym("cuMemAlloc", 12090, 0), "cuMemAlloc_v2");
        assert_eq!(sym("cuMemAlloc", 3020, 0), "cuMemAlloc_v2");
        assert_eq!(sym("cuMemAlloc", 3010, 0), "cuMemAlloc");
        assert_eq!(sym("cuGetProcAddress", 11030, 0), "cuGetProcAddress");
        assert_eq!(sym("cuGetProcAddress", 11080, 0), "cuGetProcAddress");
        assert_eq!(sym("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
        assert_eq!(sym("cuCtxCreate", 12040, 0), "cuCtxCreate_v3");
        assert_eq!(sym("cuCtxCreate", 12050, 0), "cuCtxCreate_v4");
        assert_eq!(sym("cuDevicePrimaryCtxRelease", 10020, 0), "cuDevicePrimaryCtxRelease");
        assert_eq!(sym("cuDevicePrimaryCtxRelease", 11000, 0), "cuDevicePrimaryCtxRelease_v2");
        // CUDA 13.0 (driver 580): new ABIs of cuCtxSynchronize / cuCtxGetDevice, the rest unchanged.
        assert_eq!(sym("cuCtxSynchronize", 13000, 0), "cuCtxSynchronize_v2");
        assert_eq!(sym("cuCtxSynchronize", 12090, 0), "cuCtxSynchronize");
        assert_eq!(sym("cuCtxGetDevice", 13000, 0), "cuCtxGetDevice_v2");
        assert_eq!(sym("cuCtxCreate", 13000, 0), "cuCtxCreate_v4");
        assert_eq!(sym("cuMemAlloc", 13000, 0), "cuMemAlloc_v2");
    }

    #[test]
    fn cu_graph_instantiate_changed_abi_and_then_name() {
        // 10.0: 5 arguments; 11.0: the same as `_v2`; 12.0: the name is cuGraphInstantiateWithFlags.
        let by_version = [(10000, "cuGraphInstantiate"), (10020, "cuGraphInstantiate"), (11000, "cuGraphInstantiate_v2")]
            .into_iter()
            .chain([(11080, "cuGraphInstantiate_v2"), (12000, "cuGraphInstantiateWithFlags"), (13000, "cuGraphInstantiateWithFlags")]);
        for (v, want) in by_version {
            assert_eq!((v, sym("cuGraphInstantiate", v, 0), sym("cuGraphInstantiate", v, 2)), (v, want, want));
        }
        assert_eq!(resolve("cuGraphInstantiate", 9020, 0), Resolution::VersionNotSufficient);
        assert_eq!(sym("cuGraphInstantiateWithFlags", 12000, 0), "cuGraphInstantiateWithFlags");
        let e = entry_for_symbol("cuGraphInstantiateWithFlags").unwrap();
        assert!(!e.alias && e.name == "cuGraphInstantiateWithFlags", "{e:?}");
    }

    #[test]
    fn per_thread_flag_selects_ptsz_and_ptds() {
        assert_eq!(sym("cuLaunchKernel", 12000, 2), "cuLaunchKernel_ptsz");
        assert_eq!(sym("cuLaunchKernel", 12000, 0), "cuLaunchKernel");
        assert_eq!(sym("cuLaunchKernel", 12000, 1), "cuLaunchKernel");
        assert_eq!(sym("cuMemcpyHtoD", 12000, 2), "cuMemcpyHtoD_v2_ptds");
        assert_eq!(sym("cuMemAllocAsync", 11020, 2), "cuMemAllocAsync_ptsz");
        // Per-thread variant newer than the request: the plain ABI answers.
        assert_eq!(sym("cuLaunchKernel", 6050, 2), "cuLaunchKernel");
        // No per-thread variant at all: the plain one answers.
        assert_eq!(sym("cuMemAlloc", 12000, 2), "cuMemAlloc_v2");
    }

    #[test]
    fn not_found_and_version_not_sufficient() {
        assert_eq!(resolve("cuNoSuchThing", 12000, 0), Resolution::SymbolNotFound);
        assert_eq!(resolve("", 12000, 0), Resolution::SymbolNotFound);
        assert_eq!(resolve("cuMemAlloc_v2", 12000, 0), Resolution::SymbolNotFound);
        assert_eq!(resolve("cuLaunchKernelEx", 11050, 0), Resolution::VersionNotSufficient);
        assert_eq!(resolve("cuGetProcAddress", 11020, 0), Resolution::VersionNotSufficient);
        assert_eq!(resolve("cuInit", -1, 0), Resolution::VersionNotSufficient);
    }

    #[test]
    fn table_is_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for e in PROC_TABLE {
            assert!(seen.insert((e.name, e.version, e.variant as u8)), "duplicate row {e:?}");
            if e.alias {
                // Another API's row, under this name from this version on.
                let target = entry_for_symbol(e.symbol).unwrap_or_else(|| panic!("{e:?}: no row for its symbol"));
                assert!((target.pfn, target.params, target.variant) == (e.pfn, e.params, e.variant), "{e:?}");
                assert!(target.name != e.name && target.version < e.version, "{e:?}");
                continue;
            }
            assert!(e.pfn.starts_with(&format!("PFN_{}_v{}", e.name, e.version)), "{e:?}");
            match e.variant {
                Variant::Plain => assert!(!e.pfn.ends_with("_ptsz") && !e.pfn.ends_with("_ptds")),
                Variant::Ptsz => assert!(e.pfn.ends_with("_ptsz") && e.symbol.ends_with("_ptsz")),
                Variant::Ptds => assert!(e.pfn.ends_with("_ptds") && e.symbol.ends_with("_ptds")),
            }
            assert!(e.symbol.starts_with(e.name), "{e:?}");
        }
        let rows: Vec<_> = PROC_TABLE.iter().filter(|e| !e.alias).collect();
        let syms: std::collections::HashSet<_> = rows.iter().map(|e| e.symbol).collect();
        assert_eq!(syms.len(), rows.len(), "one symbol implements one ABI");
    }

    #[test]
    fn c_signature_from_rust_declaration() {
        let e = entry_for_symbol("cuGetErrorString").unwrap();
        assert_eq!(e.c_params(), "CUresult error, const char * * pStr");
        let e = entry_for_symbol("cuCtxSynchronize").unwrap();
        assert_eq!(e.c_params(), "void");
        assert_eq!(crate::procs::c_type("*const *mut c_void"), "void * const *");
    }

    proptest::proptest! {
        #[test]
        fn resolution_is_the_newest_fitting_abi(
            idx in 0..PROC_TABLE.len(),
            version in 1000i32..14000,
            flags in 0u64..3,
        ) {
            let name = PROC_TABLE[idx].name;
            let rows: Vec<&ProcEntry> = PROC_TABLE.iter().filter(|e| e.name == name).collect();
            let fitting: Vec<&&ProcEntry> = rows.iter().filter(|e| i64::from(e.version) <= i64::from(version)).collect();
            match resolve(name, version, flags) {
                Resolution::Found(e) => {
                    proptest::prop_assert_eq!(e.name, name);
                    proptest::prop_assert!(i64::from(e.version) <= i64::from(version));
                    // No fitting plain ABI is newer than the answer.
                    let newest_plain = fitting.iter().filter(|r| !r.variant.is_per_thread()).map(|r| r.version).max();
                    if let Some(v) = newest_plain {
                        proptest::prop_assert!(e.version >= v);
                    }
                    // Per-thread answers only when asked for.
                    if e.variant.is_per_thread() {
                        proptest::prop_assert!(flags & 2 != 0);
                    }
                    // Asked for per-thread and a fitting per-thread ABI at least as new exists: it answers.
                    let pt = fitting.iter().filter(|r| r.variant.is_per_thread()).map(|r| r.version).max();
                    if flags & 2 != 0 && pt.is_some_and(|t| newest_plain.is_none_or(|p| t >= p)) {
                        proptest::prop_assert!(e.variant.is_per_thread());
                    }
                }
                Resolution::VersionNotSufficient => proptest::prop_assert!(fitting.is_empty()),
                Resolution::SymbolNotFound => proptest::prop_assert!(false, "{} is in the table", name),
            }
        }
    }
}
