//! How clients reach us: the hooked-symbol table, the `dlsym` hook (RTLD_NEXT keeps the caller's
//! semantics) and the `cuGetProcAddress`/`_v2` rewrite (version AND flags honoured, real
//! pointer for everything not hooked, `symbolStatus` from the driver untouched).

use std::ffi::{c_char, c_void, CStr};

use cuda_abi::{resolve, Resolution};

macro_rules! hooked_symbols {
    (hooked: [$($s:ident),* $(,)?], internal: [$($i:ident),* $(,)?] $(,)?) => {
        /// Every driver symbol the shim needs: the hooked ones (exported by us) first, then the
        /// ones it only calls itself.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Sym {
            $(#[doc = concat!("`", stringify!($s), "` (hooked).")] $s,)*
            $(#[doc = concat!("`", stringify!($i), "` (called by the shim only).")] $i,)*
        }
        /// Names of [`Sym`], by discriminant.
        pub const SYM_NAMES: &[&str] = &[$(stringify!($s),)* $(stringify!($i),)*];
        /// Number of symbols.
        pub const SYM_COUNT: usize = SYM_NAMES.len();
        /// All symbols, by discriminant.
        pub const SYMS: &[Sym] = &[$(Sym::$s,)* $(Sym::$i,)*];
        /// Our implementation of `s` (null for internal-only symbols).
        pub fn our_fn(s: Sym) -> *mut c_void {
            match s {
                $(Sym::$s => crate::api::$s as *const () as *mut c_void,)*
                #[allow(unreachable_patterns)]
                _ => std::ptr::null_mut(),
            }
        }
    };
}

hooked_symbols! {
    hooked: [
        cuInit,
        cuGetProcAddress, cuGetProcAddress_v2,
        cuMemAlloc, cuMemAlloc_v2, cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocManaged,
        cuMemFree, cuMemFree_v2,
        cuMemAllocAsync, cuMemAllocAsync_ptsz, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
        cuMemFreeAsync, cuMemFreeAsync_ptsz,
        cuMemPoolCreate, cuMemPoolDestroy, cuMemPoolTrimTo,
        cuMemCreate, cuMemRelease, cuMemRetainAllocationHandle, cuMemMap, cuMemUnmap,
        cuMemExportToShareableHandle,
        cuArrayCreate, cuArray3DCreate, cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy,
        cuMipmappedArrayCreate, cuMipmappedArrayDestroy,
        cuMemGetInfo, cuMemGetInfo_v2, cuDeviceTotalMem, cuDeviceTotalMem_v2,
        cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchKernelEx, cuLaunchKernelEx_ptsz,
        cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, cuGraphLaunch, cuGraphLaunch_ptsz,
        cuLaunch, cuLaunchGrid, cuLaunchGridAsync, cuLaunchCooperativeKernelMultiDevice,
        cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4, cuCtxDestroy, cuCtxDestroy_v2,
        cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,
        cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2,
        cuGraphAddMemAllocNode, cuGraphAddNode, cuGraphAddNode_v2, cuGraphInstantiate, cuGraphInstantiate_v2, cuGraphInstantiateWithFlags,
        cuGraphExecDestroy, cuGraphDestroy,
        cuGraphExecUpdate, cuGraphExecUpdate_v2, cuGraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams_v2,
        cuGraphExecNodeSetParams, cuGraphExecChildGraphNodeSetParams,
        cuDeviceGraphMemTrim,
        cuCtxSetLimit,
        cuGraphInstantiateWithParams, cuGraphInstantiateWithParams_ptsz, cuGraphUpload, cuGraphUpload_ptsz,
        cuCtxSynchronize, cuCtxSynchronize_v2, cuStreamSynchronize, cuStreamSynchronize_ptsz, cuEventSynchronize,
        cuStreamBeginCapture, cuStreamBeginCapture_ptsz, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz, cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz,
        cuStreamEndCapture, cuStreamEndCapture_ptsz,
    ],
    internal: [
        cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, cuCtxGetCurrent,
        cuDevicePrimaryCtxGetState,
        cuDeviceGet, cuDeviceGetAttribute,
        cuDeviceGetCount, cuDeviceGetUuid, cuCtxGetDevice, cuDeviceGetGraphMemAttribute, cuCtxGetLimit,
        cuMemPoolGetAttribute, cuDeviceGetMemPool, cuDeviceGetDefaultMemPool, cuStreamGetCaptureInfo_v2, cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
        cuStreamGetDevice, cuStreamGetCtx, cuMemGetAllocationPropertiesFromHandle,
        cuGraphGetNodes, cuGraphNodeGetType, cuGraphKernelNodeGetParams, cuGraphKernelNodeGetParams_v2, cuGraphChildGraphNodeGetGraph,
    ],
}

/// The symbol called `name`, if the shim knows it (not on a hot path).
pub fn sym_by_name(name: &[u8]) -> Option<Sym> {
    if !name.starts_with(b"cu") {
        return None;
    }
    SYM_NAMES.iter().position(|n| n.as_bytes() == name).map(|i| SYMS[i])
}

/// Our hook for an exported driver symbol, or `None` if we pass it through.
pub fn hook_for_symbol(name: &[u8]) -> Option<*mut c_void> {
    sym_by_name(name).map(our_fn).filter(|p| !p.is_null())
}

/// Logic of our `dlsym`: ask glibc; if the answer is a driver function we hook, hand out ours.
/// `RTLD_NEXT` never reaches here on x86-64 (the trampoline tail-jumps to glibc so that glibc
/// sees the real caller); elsewhere it is resolved relative to us (documented limitation).
///
/// # Safety
/// Same contract as glibc's `dlsym`: `name` is null or NUL-terminated.
pub unsafe fn dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real) = crate::real::dlsym_fn() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's own arguments to glibc's dlsym.
    let p = unsafe { real(handle, name) };
    if p.is_null() || name.is_null() {
        return p;
    }
    // SAFETY: name is non-null and, per dlsym's contract, NUL-terminated.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    if let Some(ours) = hook_for_symbol(n) {
        if ours == p || crate::real::is_in_driver(p) {
            return ours;
        }
    } else if let Some(ours) = crate::nvml::hook_for_symbol(n) {
        if ours == p || crate::real::is_in_object(p, b"libnvidia-ml") {
            return ours;
        }
    }
    p
}

/// After the real `cuGetProcAddress*` succeeded for (`name`, `version`, `flags`): the pointer
/// to hand out instead, if the entry it resolves to is one we hook.
pub fn proc_address_override(name: &[u8], version: i32, flags: u64) -> Option<*mut c_void> {
    let name = std::str::from_utf8(name).ok()?;
    match resolve(name, version, flags) {
        Resolution::Found(e) => hook_for_symbol(e.symbol.as_bytes()),
        _ => None,
    }
}

/// What to hand a `cuGetProcAddress*` caller once the real driver answered `driver_ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcAnswer {
    /// The driver's pointer: an entry point we do not hook.
    Driver,
    /// Our hook of the same ABI.
    Ours(*mut c_void),
    /// Refused: a hooked API asked for at a CUDA version newer than cuda-abi's table is checked
    /// against, and the driver answered with a function other than the ABI the table knows, so
    /// its signature is unknown. Neither our hook (another signature) nor the driver's pointer
    /// (no quota, no throttle) is safe.
    Unknown,
}

/// Decides [`ProcAnswer`]. Up to [`cuda_abi::NEWEST_CHECKED_CUDA_VERSION`] (13.0, driver 580) the
/// table has every ABI the headers name (cuda-abi's header test), so the table's row is the
/// driver's. Beyond it (a 13.x runtime on a newer driver) a hooked API may have gained an ABI we
/// do not know: ours is handed out only if the driver answered with exactly the real function of
/// the table's row (`real_of`, the driver's export of that symbol).
pub fn proc_answer(
    name: &[u8],
    version: i32,
    flags: u64,
    driver_ptr: *mut c_void,
    real_of: impl Fn(Sym) -> *mut c_void,
) -> ProcAnswer {
    let Some(ours) = proc_address_override(name, version, flags) else {
        return ProcAnswer::Driver;
    };
    if i64::from(version) <= i64::from(cuda_abi::NEWEST_CHECKED_CUDA_VERSION) {
        return ProcAnswer::Ours(ours);
    }
    let known = std::str::from_utf8(name).ok().and_then(|n| match resolve(n, version, flags) {
        Resolution::Found(e) => sym_by_name(e.symbol.as_bytes()),
        _ => None,
    });
    match known.map(real_of) {
        Some(real) if !real.is_null() && real == driver_ptr => ProcAnswer::Ours(ours),
        _ => ProcAnswer::Unknown,
    }
}

/// Exported `dlsym`. RTLD_NEXT ((void*)-1) tail-jumps to glibc's dlsym with the stack untouched,
/// so glibc sees our caller's return address and "next" keeps its meaning; every other handle
/// goes to `dlsym_entry`.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
#[cfg(target_arch = "x86_64")]
#[unsafe(no_mangle)]
#[unsafe(naked)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne 3f",
        "mov rax, qword ptr [rip + {real}@GOTPCREL]",
        "mov rax, qword ptr [rax]",
        "test rax, rax",
        "jz 1f",
        "jmp rax",
        "1:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "xor eax, eax",
        "ret",
        "3:",
        "jmp {hook}",
        real = sym crate::real::TRAMPOLINE_DLSYM,
        resolve = sym resolve_real_dlsym,
        hook = sym dlsym_entry,
    )
}

#[cfg(target_arch = "x86_64")]
extern "C" fn resolve_real_dlsym() -> *mut c_void {
    std::panic::catch_unwind(|| crate::real::dlsym_fn().map_or(std::ptr::null_mut(), |f| f as *mut c_void))
        .unwrap_or(std::ptr::null_mut())
}

/// Non-RTLD_NEXT `dlsym` calls land here (from the trampoline, or directly on other targets).
#[cfg_attr(not(target_arch = "x86_64"), export_name = "dlsym")]
extern "C" fn dlsym_entry(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: the caller's arguments, under dlsym's own contract.
    std::panic::catch_unwind(|| unsafe { dlsym_hook(handle, name) }).unwrap_or(std::ptr::null_mut())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_abi::PROC_TABLE;

    #[test]
    fn every_hooked_symbol_is_a_table_symbol() {
        for n in SYM_NAMES {
            assert!(PROC_TABLE.iter().any(|e| e.symbol == *n), "{n} not in cuda-abi's table");
        }
    }

    #[test]
    fn proc_address_honours_version_and_flags() {
        let ours = |s: Sym| Some(our_fn(s));
        assert_eq!(proc_address_override(b"cuMemAlloc", 12000, 0), ours(Sym::cuMemAlloc_v2));
        assert_eq!(proc_address_override(b"cuMemAlloc", 3000, 0), ours(Sym::cuMemAlloc));
        assert_eq!(proc_address_override(b"cuLaunchKernel", 12000, 0), ours(Sym::cuLaunchKernel));
        assert_eq!(proc_address_override(b"cuLaunchKernel", 12000, 2), ours(Sym::cuLaunchKernel_ptsz));
        assert_eq!(proc_address_override(b"cuMemAllocAsync", 12000, 2), ours(Sym::cuMemAllocAsync_ptsz));
        assert_eq!(proc_address_override(b"cuGetProcAddress", 12000, 0), ours(Sym::cuGetProcAddress_v2));
        assert_eq!(proc_address_override(b"cuGetProcAddress", 11030, 0), ours(Sym::cuGetProcAddress));
        assert_eq!(proc_address_override(b"cuMemcpyHtoD", 12000, 2), None, "unhooked passes through");
        assert_eq!(proc_address_override(b"cuGetExportTable", 12000, 0), None);
        assert_eq!(proc_address_override(b"cuCtxSynchronize", 12000, 0), ours(Sym::cuCtxSynchronize));
        assert_eq!(proc_address_override(b"cuStreamSynchronize", 12000, 2), ours(Sym::cuStreamSynchronize_ptsz));
        assert_eq!(proc_address_override(b"cuEventSynchronize", 12000, 0), ours(Sym::cuEventSynchronize));
        assert_eq!(proc_address_override(b"cuCtxGetDevice", 12000, 0), None, "internal-only");
        assert_eq!(proc_address_override(b"cuNoSuch", 12000, 0), None);
        assert_eq!(proc_address_override(b"cuLaunchKernelEx", 11000, 0), None);
    }

    #[test]
    fn cuda_13_callers_get_our_hooks() {
        let ours = |s: Sym| Some(our_fn(s));
        for v in [13000, 12090] {
            assert_eq!(proc_address_override(b"cuMemAlloc", v, 0), ours(Sym::cuMemAlloc_v2));
            assert_eq!(proc_address_override(b"cuCtxCreate", v, 0), ours(Sym::cuCtxCreate_v4));
            assert_eq!(proc_address_override(b"cuCtxDestroy", v, 0), ours(Sym::cuCtxDestroy_v2));
            assert_eq!(proc_address_override(b"cuMemAllocAsync", v, 2), ours(Sym::cuMemAllocAsync_ptsz));
            assert_eq!(proc_address_override(b"cuMemAllocFromPoolAsync", v, 0), ours(Sym::cuMemAllocFromPoolAsync));
            assert_eq!(proc_address_override(b"cuMemCreate", v, 0), ours(Sym::cuMemCreate));
            assert_eq!(proc_address_override(b"cuMemMap", v, 0), ours(Sym::cuMemMap));
            assert_eq!(proc_address_override(b"cuMemUnmap", v, 0), ours(Sym::cuMemUnmap));
            assert_eq!(proc_address_override(b"cuLaunchKernelEx", v, 2), ours(Sym::cuLaunchKernelEx_ptsz));
            assert_eq!(proc_address_override(b"cuDevicePrimaryCtxReset", v, 0), ours(Sym::cuDevicePrimaryCtxReset_v2));
            assert_eq!(proc_address_override(b"cuGraphExecUpdate", v, 0), ours(Sym::cuGraphExecUpdate_v2));
            assert_eq!(proc_address_override(b"cuGraphExecKernelNodeSetParams", v, 0), ours(Sym::cuGraphExecKernelNodeSetParams_v2));
            // CUDA 12.0 gave the name to cuGraphInstantiateWithFlags.
            assert_eq!(proc_address_override(b"cuGraphInstantiate", v, 0), ours(Sym::cuGraphInstantiateWithFlags));
        }
        // The 5-argument ABIs of older callers.
        assert_eq!(proc_address_override(b"cuGraphInstantiate", 10000, 0), ours(Sym::cuGraphInstantiate));
        assert_eq!(proc_address_override(b"cuGraphInstantiate", 11080, 2), ours(Sym::cuGraphInstantiate_v2));
        // The CUDA 10.x ABIs of the exec changes.
        assert_eq!(proc_address_override(b"cuGraphExecUpdate", 11080, 0), ours(Sym::cuGraphExecUpdate));
        assert_eq!(proc_address_override(b"cuGraphExecKernelNodeSetParams", 11080, 0), ours(Sym::cuGraphExecKernelNodeSetParams));
        assert_eq!(proc_address_override(b"cuGraphKernelNodeGetParams", 12000, 0), None, "internal-only");
        // The CUDA 2.0 ABI of cuCtxCreate, still exported (ctypes code, cuGetProcAddress below
        // 3020): its context is released before the process dies like any other.
        assert_eq!(proc_address_override(b"cuCtxCreate", 3000, 0), ours(Sym::cuCtxCreate));
        assert_eq!(hook_for_symbol(b"cuCtxCreate"), Some(our_fn(Sym::cuCtxCreate)));
        // CUDA 13.0's new ABI of cuCtxSynchronize (a context argument).
        assert_eq!(proc_address_override(b"cuCtxSynchronize", 13000, 0), ours(Sym::cuCtxSynchronize_v2));
    }

    #[test]
    fn versions_beyond_the_checked_headers_need_the_drivers_own_answer() {
        let real_alloc = 0x1000 as *mut c_void;
        let real_of = |s: Sym| if s == Sym::cuMemAlloc_v2 { real_alloc } else { std::ptr::null_mut() };
        let other = 0x2000 as *mut c_void;
        // Within the checked headers: the table is the driver's answer.
        assert_eq!(proc_answer(b"cuMemAlloc", 13000, 0, other, real_of), ProcAnswer::Ours(our_fn(Sym::cuMemAlloc_v2)));
        // Beyond: ours only when the driver gave exactly the ABI the table knows.
        assert_eq!(proc_answer(b"cuMemAlloc", 13010, 0, real_alloc, real_of), ProcAnswer::Ours(our_fn(Sym::cuMemAlloc_v2)));
        assert_eq!(proc_answer(b"cuMemAlloc", 14000, 0, other, real_of), ProcAnswer::Unknown);
        assert_eq!(proc_answer(b"cuMemAlloc", 14000, 0, std::ptr::null_mut(), |_| std::ptr::null_mut()), ProcAnswer::Unknown);
        // Not hooked: the driver's pointer at any version.
        assert_eq!(proc_answer(b"cuMemcpyHtoD", 14000, 0, other, real_of), ProcAnswer::Driver);
        assert_eq!(proc_answer(b"cuCtxGetDevice", 14000, 0, other, real_of), ProcAnswer::Driver);
    }

    /// NVIDIA's `cuda.h` of each checked header set (as cuda-abi's header test finds them:
    /// `$CUDA_HEADERS_DIR` / `$CUDA13_HEADERS_DIR`, default `<repo>/.cuda-headers[-13]`) with the
    /// `CUDA_VERSION` it declares.
    fn cuda_headers() -> Vec<(String, i32)> {
        [("CUDA_HEADERS_DIR", ".cuda-headers", 12090), ("CUDA13_HEADERS_DIR", ".cuda-headers-13", 13000)]
            .into_iter()
            .map(|(var, default, version)| {
                let dir = std::env::var_os(var).map_or_else(
                    || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(default),
                    std::path::PathBuf::from,
                );
                let text = std::fs::read_to_string(dir.join("cuda.h"))
                    .unwrap_or_else(|e| panic!("{}/cuda.h: {e} (run scripts/setup-test-env.sh)", dir.display()));
                assert!(text.contains(&format!("#define CUDA_VERSION {version}")), "{} is not CUDA {version}", dir.display());
                (text, version)
            })
            .collect()
    }

    /// Every function `cuda.h` declares (`CUresult CUDAAPI name(`, deprecated ones included).
    fn declared_functions(cuda_h: &str) -> std::collections::BTreeSet<&str> {
        cuda_h
            .match_indices("CUresult CUDAAPI ")
            .filter_map(|(i, m)| {
                let rest = &cuda_h[i + m.len()..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
                rest[end..].starts_with('(').then(|| &rest[..end])
            })
            .collect()
    }

    /// Driven by NVIDIA's headers, not by the table: every launch (`cuLaunch*`, graph launch
    /// and upload, instantiation) and device allocation (`cuMemAlloc*`, graph memory nodes)
    /// entry point `cuda.h` declares, deprecated ones included, is in cuda-abi's table and
    /// hooked, for each ABI a caller can reach: `cuGetProcAddress` at that header's version with
    /// either default-stream flavour, and every older ABI the table has (an exported symbol a
    /// `-lcuda` binary or `dlsym` reaches). A name missing from the table fails here, not only a
    /// row missing from the hooked list.
    #[test]
    fn every_launch_and_alloc_entry_cuda_h_declares_is_hooked() {
        // Not a kernel launch: cuLaunchHostFunc runs a host function in stream order (no SM work).
        let not_gpu_work = ["cuLaunchHostFunc", "cuMemAllocHost"];
        let must = |n: &str| {
            !not_gpu_work.contains(&n)
                && (n.starts_with("cuLaunch")
                    || n.starts_with("cuMemAlloc")
                    || n.starts_with("cuGraphLaunch")
                    || n.starts_with("cuGraphUpload")
                    || n.starts_with("cuGraphInstantiate")
                    // What an exec's launches run (its price, see graphcost).
                    || n.starts_with("cuGraphExecUpdate")
                    || n.starts_with("cuGraphExecKernelNodeSetParams")
                    || n.starts_with("cuGraphExecChildGraphNodeSetParams")
                    || n.starts_with("cuGraphExecNodeSetParams")
                    || n.starts_with("cuGraphAddMemAllocNode")
                    // Any node type, memory allocation nodes included (CUDA 12.2).
                    || n.starts_with("cuGraphAddNode"))
        };
        let mut missing = Vec::new();
        let mut checked = 0;
        for (text, version) in cuda_headers() {
            let names: Vec<&str> = declared_functions(&text).into_iter().filter(|n| must(n)).collect();
            assert!(names.contains(&"cuLaunchKernel") && names.contains(&"cuMemAlloc"), "CUDA {version}: cuda.h parsed: {names:?}");
            for name in names {
                checked += 1;
                let mut rows: Vec<&cuda_abi::ProcEntry> = Vec::new();
                for flags in [0, 2] {
                    match resolve(name, version, flags) {
                        Resolution::Found(e) => rows.push(e),
                        // A versioned symbol cuda.h declares under its own name (`cuGraphInstantiate_v2`).
                        _ => match cuda_abi::entry_for_symbol(name) {
                            Some(e) => rows.push(e),
                            None => missing.push(format!("CUDA {version}: {name} (flags {flags}) not in cuda-abi's table")),
                        },
                    }
                }
                rows.extend(PROC_TABLE.iter().filter(|e| e.name == name));
                for e in rows {
                    if hook_for_symbol(e.symbol.as_bytes()).is_none() {
                        missing.push(format!("CUDA {version}: {name}: {} ({}) not hooked", e.symbol, e.pfn));
                    }
                }
            }
        }
        assert!(checked > 20, "only {checked} names checked");
        missing.sort();
        missing.dedup();
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn every_alloc_and_launch_entry_in_the_table_is_hooked() {
        for e in PROC_TABLE {
            let must = e.name.starts_with("cuMemAlloc")
                || e.name.starts_with("cuLaunch")
                || e.name == "cuGraphLaunch"
                || e.name == "cuGraphUpload"
                || e.name.starts_with("cuGraphInstantiate")
                || e.name == "cuMemCreate"
                || e.name.contains("ArrayCreate")
                || (e.name.starts_with("cuMemFree") && e.name != "cuMemFreeHost")
                || e.name == "cuMemGetInfo";
            if must && e.name != "cuMemAllocHost" {
                assert!(hook_for_symbol(e.symbol.as_bytes()).is_some(), "{} unhooked", e.symbol);
            }
        }
    }
}
