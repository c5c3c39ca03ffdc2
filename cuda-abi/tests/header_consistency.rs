//! Checks every Rust declaration in `cuda-abi` against NVIDIA's `cuda.h` / `cudaTypedefs.h`:
//! generates a C file of `_Static_assert`s from the Rust tables and compiles it with `cc -fsyntax-only`.
//! Two header sets, both fetched by `scripts/setup-test-env.sh` from NVIDIA's wheels: CUDA 12.9
//! from `$CUDA_HEADERS_DIR` (default `<repo>/.cuda-headers`) and CUDA 13.0 (driver 580) from
//! `$CUDA13_HEADERS_DIR` (default `<repo>/.cuda-headers-13`). Every declaration is checked against
//! every header set whose `CUDA_VERSION` is not older than the declaration (an ABI row `@13000` only
//! against 13.x); the same asserts where the ABI did not change.

use cuda_abi::*;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

/// A header set: where it is and the `CUDA_VERSION` its `cuda.h` must define.
#[derive(Clone)]
struct Headers {
    dir: PathBuf,
    cuda_version: u32,
}

fn headers_dir_from(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(default),
    }
}

fn headers_12() -> Headers {
    Headers { dir: headers_dir_from("CUDA_HEADERS_DIR", ".cuda-headers"), cuda_version: 12090 }
}

fn headers_13() -> Headers {
    Headers { dir: headers_dir_from("CUDA13_HEADERS_DIR", ".cuda-headers-13"), cuda_version: 13000 }
}

/// `(C struct typedef, Rust size, [(C field, Rust offset)])`.
type Layout = (&'static str, usize, Vec<(&'static str, usize)>);

fn struct_layouts() -> Vec<Layout> {
    macro_rules! layout {
        ($c:literal, $t:ty, [$($cf:literal => $rf:ident),* $(,)?]) => {
            ($c, size_of::<$t>(), vec![$(($cf, offset_of!($t, $rf))),*])
        };
    }
    vec![
        layout!("CUuuid", CUuuid, ["bytes" => bytes]),
        layout!("CUipcMemHandle", CUipcMemHandle, ["reserved" => reserved]),
        layout!("CUlaunchAttributeValue", CUlaunchAttributeValue, []),
        layout!("CUlaunchAttribute", CUlaunchAttribute, ["id" => id, "value" => value]),
        layout!("CUlaunchConfig", CUlaunchConfig, [
            "gridDimX" => gridDimX, "gridDimY" => gridDimY, "gridDimZ" => gridDimZ,
            "blockDimX" => blockDimX, "blockDimY" => blockDimY, "blockDimZ" => blockDimZ,
            "sharedMemBytes" => sharedMemBytes, "hStream" => hStream, "attrs" => attrs, "numAttrs" => numAttrs,
        ]),
        layout!("CUDA_LAUNCH_PARAMS_v1", CUDA_LAUNCH_PARAMS_v1, [
            "function" => function, "gridDimX" => gridDimX, "gridDimY" => gridDimY, "gridDimZ" => gridDimZ,
            "blockDimX" => blockDimX, "blockDimY" => blockDimY, "blockDimZ" => blockDimZ,
            "sharedMemBytes" => sharedMemBytes, "hStream" => hStream, "kernelParams" => kernelParams,
        ]),
        layout!("CUgraphNodeParams", CUgraphNodeParams, [
            "type" => type_, "reserved0" => reserved0, "kernel" => u, "alloc" => u, "free" => u, "graph" => u, "reserved2" => reserved2,
        ]),
        layout!("CUDA_CHILD_GRAPH_NODE_PARAMS", CUDA_CHILD_GRAPH_NODE_PARAMS, ["graph" => graph, "ownership" => ownership]),
        layout!("CUDA_KERNEL_NODE_PARAMS_v3", CUDA_KERNEL_NODE_PARAMS, [
            "func" => func, "gridDimX" => gridDimX, "blockDimZ" => blockDimZ, "sharedMemBytes" => sharedMemBytes,
            "kernelParams" => kernelParams, "extra" => extra, "kern" => kern, "ctx" => ctx,
        ]),
        layout!("CUDA_MEM_ALLOC_NODE_PARAMS_v2", CUDA_MEM_ALLOC_NODE_PARAMS, [
            "poolProps" => poolProps, "accessDescs" => accessDescs, "accessDescCount" => accessDescCount,
            "bytesize" => bytesize, "dptr" => dptr,
        ]),
        layout!("CUDA_MEM_FREE_NODE_PARAMS", CUdeviceptr, []),
        layout!("CUmemLocation", CUmemLocation, ["type" => type_, "id" => id]),
        layout!("CUDA_KERNEL_NODE_PARAMS_v1", CUDA_KERNEL_NODE_PARAMS_v1, [
            "func" => func, "gridDimX" => gridDimX, "blockDimZ" => blockDimZ, "sharedMemBytes" => sharedMemBytes,
            "kernelParams" => kernelParams, "extra" => extra,
        ]),
        layout!("CUDA_KERNEL_NODE_PARAMS", CUDA_KERNEL_NODE_PARAMS, [
            "func" => func, "gridDimX" => gridDimX, "blockDimZ" => blockDimZ, "sharedMemBytes" => sharedMemBytes,
            "kernelParams" => kernelParams, "extra" => extra, "kern" => kern, "ctx" => ctx,
        ]),
        layout!("CUmemAllocationProp", CUmemAllocationProp, [
            "type" => type_, "requestedHandleTypes" => requestedHandleTypes, "location" => location,
            "win32HandleMetaData" => win32HandleMetaData, "allocFlags" => allocFlags,
        ]),
        layout!("CUmemAccessDesc", CUmemAccessDesc, ["location" => location, "flags" => flags]),
        layout!("CUDA_ARRAY_DESCRIPTOR", CUDA_ARRAY_DESCRIPTOR, [
            "Width" => Width, "Height" => Height, "Format" => Format, "NumChannels" => NumChannels,
        ]),
        layout!("CUDA_ARRAY3D_DESCRIPTOR", CUDA_ARRAY3D_DESCRIPTOR, [
            "Width" => Width, "Height" => Height, "Depth" => Depth, "Format" => Format,
            "NumChannels" => NumChannels, "Flags" => Flags,
        ]),
        layout!("CUgraphExecUpdateResultInfo", CUgraphExecUpdateResultInfo, [
            "result" => result, "errorNode" => errorNode, "errorFromNode" => errorFromNode,
        ]),
        layout!("CUgraphEdgeData", CUgraphEdgeData, [
            "from_port" => from_port, "to_port" => to_port, "type" => type_, "reserved" => reserved,
        ]),
        layout!("CUDA_ARRAY_DESCRIPTOR_v1", CUDA_ARRAY_DESCRIPTOR_v1, [
            "Width" => Width, "Height" => Height, "Format" => Format, "NumChannels" => NumChannels,
        ]),
        layout!("CUDA_ARRAY3D_DESCRIPTOR_v1", CUDA_ARRAY3D_DESCRIPTOR_v1, [
            "Width" => Width, "Height" => Height, "Depth" => Depth, "Format" => Format,
            "NumChannels" => NumChannels, "Flags" => Flags,
        ]),
        layout!("CUDA_MEM_ALLOC_NODE_PARAMS", CUDA_MEM_ALLOC_NODE_PARAMS, [
            "poolProps" => poolProps, "accessDescs" => accessDescs, "accessDescCount" => accessDescCount,
            "bytesize" => bytesize, "dptr" => dptr,
        ]),
        layout!("CUDA_GRAPH_INSTANTIATE_PARAMS", CUDA_GRAPH_INSTANTIATE_PARAMS, [
            "flags" => flags, "hUploadStream" => hUploadStream, "hErrNode_out" => hErrNode_out,
            "result_out" => result_out,
        ]),
        layout!("CUmemPoolProps", CUmemPoolProps, [
            "allocType" => allocType, "handleTypes" => handleTypes, "location" => location,
            "win32SecurityAttributes" => win32SecurityAttributes, "maxSize" => maxSize,
            "usage" => usage, "reserved" => reserved,
        ]),
    ]
}

/// The C source of all assertions; public to the test so a mutation check can reuse it.
fn generate_c(cuda_version: u32) -> String {
    let mut c = String::new();
    c.push_str("#define __CUDA_API_VERSION_INTERNAL 1\n#include <stddef.h>\n#include <cuda.h>\n#include <cudaTypedefs.h>\n");
    c.push_str("#define CHECK(cond, what) _Static_assert(cond, what)\n");
    writeln!(c, "CHECK(CUDA_VERSION == {cuda_version}, \"these are the CUDA {cuda_version} headers\");").unwrap();
    for (ty, name, v, since) in ENUM_VALUES_SINCE {
        if *since <= cuda_version {
            writeln!(c, "CHECK({name} == {v}, \"{ty}::{name} == {v} (since {since})\");").unwrap();
        } else {
            writeln!(c, "#ifdef {name}\n#error \"{name} is a macro before {since}?\"\n#endif").unwrap();
        }
    }
    for (name, v) in MACRO_VALUES {
        writeln!(c, "CHECK({name} == {v}, \"#define {name} {v}\");").unwrap();
    }
    for (name, v) in CUresult::ALL {
        writeln!(c, "CHECK({name} == {v}, \"CUresult {name} == {v}\");").unwrap();
    }
    for (ty, name, v) in ENUM_VALUES {
        writeln!(c, "CHECK({name} == {v}, \"{ty}::{name} == {v}\");").unwrap();
        writeln!(c, "CHECK(sizeof({ty}) == 4, \"sizeof({ty}) == 4\");").unwrap();
    }
    for (name, size) in SCALARS {
        writeln!(c, "CHECK(sizeof({name}) == {size}, \"sizeof({name}) == {size}\");").unwrap();
    }
    for (handle, st) in HANDLES {
        writeln!(c, "CHECK(__builtin_types_compatible_p({handle}, struct {st} *), \"{handle} is struct {st} *\");").unwrap();
    }
    for (st, size, fields) in struct_layouts() {
        writeln!(c, "CHECK(sizeof({st}) == {size}, \"sizeof({st}) == {size}\");").unwrap();
        for (f, off) in fields {
            writeln!(c, "CHECK(offsetof({st}, {f}) == {off}, \"offsetof({st}, {f}) == {off}\");").unwrap();
        }
    }
    for (i, e) in PROC_TABLE.iter().enumerate() {
        if e.version > cuda_version {
            continue;
        }
        let alias = format!("ours_{i}_{}", e.pfn);
        writeln!(c, "{}", e.c_typedef(&alias)).unwrap();
        writeln!(
            c,
            "CHECK(__builtin_types_compatible_p({alias}, {pfn}), \"{pfn} (symbol {sym}): declared as CUresult({params})\");",
            pfn = e.pfn,
            sym = e.symbol,
            params = e.c_params().replace('"', "'"),
        )
        .unwrap();
    }
    c
}

fn compile(h: &Headers, src: &str) -> Result<(), String> {
    let dir = &h.dir;
    for h in ["cuda.h", "cudaTypedefs.h"] {
        if !dir.join(h).is_file() {
            return Err(format!(
                "NVIDIA header {h} not found in {} — run scripts/setup-test-env.sh or set CUDA_HEADERS_DIR",
                dir.display()
            ));
        }
    }
    let out = std::env::temp_dir().join(format!(
        "cuda_abi_header_check_{}_{}_{}.c",
        std::process::id(),
        h.cuda_version,
        src.len()
    ));
    std::fs::write(&out, src).map_err(|e| format!("write {}: {e}", out.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let res = Command::new(&cc)
        .args(["-std=c11", "-fsyntax-only", "-Wno-deprecated-declarations", "-I"])
        .arg(dir)
        .arg(&out)
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    let _ = std::fs::remove_file(&out);
    if res.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&res.stderr);
        let msgs: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        Err(format!("{} mismatch(es) against the headers:\n{}", msgs.len(), msgs.join("\n")))
    }
}

/// `PFN_<name>_v<N>[_ptsz|_ptds]` typedefs of `cudaTypedefs.h`: (name, N, suffix).
fn header_pfns(h: &Headers) -> Vec<(String, u32, String)> {
    let text = std::fs::read_to_string(h.dir.join("cudaTypedefs.h"))
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup-test-env.sh)", h.dir.display()));
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("typedef CUresult (CUDAAPI *PFN_") else { continue };
        let Some(end) = rest.find(')') else { continue };
        let tag = &rest[..end];
        let (base, suffix) = match tag.rsplit_once('_') {
            Some((b, s)) if s == "ptsz" || s == "ptds" => (b, s.to_string()),
            _ => (tag, String::new()),
        };
        let Some((name, v)) = base.rsplit_once("_v") else { continue };
        if let Ok(v) = v.parse::<u32>() {
            out.push((name.to_string(), v, suffix));
        }
    }
    out
}

fn check_headers(h: &Headers) {
    let src = generate_c(h.cuda_version);
    assert!(src.matches("CHECK(").count() > 300, "expected a full set of checks");
    if let Err(e) = compile(h, &src) {
        panic!("CUDA {}: {e}", h.cuda_version);
    }
}

#[test]
fn rust_declarations_match_cuda_12_9_headers() {
    check_headers(&headers_12());
}

#[test]
fn rust_declarations_match_cuda_13_headers() {
    check_headers(&headers_13());
}

/// For every API the table declares, its newest ABI in each header set (plain and per-thread) is
/// a table row: `cuGetProcAddress(name, CUDA_VERSION)` then never resolves to an older row than
/// the driver of that version hands out (the shim would otherwise wrap a function of another
/// signature).
#[test]
fn the_table_has_the_newest_abi_of_every_api_it_declares() {
    let mut missing = Vec::new();
    for h in [headers_12(), headers_13()] {
        let pfns = header_pfns(&h);
        assert!(pfns.len() > 500, "{}: only {} PFN typedefs parsed", h.dir.display(), pfns.len());
        let names: std::collections::BTreeSet<&str> = PROC_TABLE.iter().map(|e| e.name).collect();
        for name in names {
            for pt in [false, true] {
                let newest = pfns.iter().filter(|(n, _, s)| n == name && s.is_empty() != pt).map(|(_, v, _)| *v).max();
                let ours = PROC_TABLE
                    .iter()
                    .filter(|e| e.name == name && !e.alias && e.variant.is_per_thread() == pt)
                    .map(|e| e.version)
                    .filter(|v| *v <= h.cuda_version)
                    .max();
                if let Some(v) = newest {
                    if ours != Some(v) {
                        missing.push(format!("CUDA {}: {name} newest{} ABI v{v}, table has {ours:?}", h.cuda_version, if pt { " per-thread" } else { "" }));
                    }
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// Each alias row (a name that answers with another API's entry point) is what cuda.h says: a
/// `#define <name> <symbol>` in both header sets, and in 12.9's cudaTypedefs.h (13.0 dropped these
/// macros) `#define PFN_<name> <pfn>`. Its older ABIs stay declared in the 13.0 headers (the driver
/// still exports them for binaries built before).
#[test]
fn aliases_are_the_headers_defines() {
    let aliases: Vec<&ProcEntry> = PROC_TABLE.iter().filter(|e| e.alias).collect();
    assert!(!aliases.is_empty());
    let define = |text: &str, from: &str| {
        text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(from)).then(|| w.next().unwrap_or("").to_string())
        })
    };
    for h in [headers_12(), headers_13()] {
        let read = |f: &str| std::fs::read_to_string(h.dir.join(f)).unwrap_or_else(|e| panic!("{}/{f}: {e}", h.dir.display()));
        let (cuda_h, typedefs) = (read("cuda.h"), read("cudaTypedefs.h"));
        let pfns = header_pfns(&h);
        for e in &aliases {
            assert_eq!(define(&cuda_h, e.name).as_deref(), Some(e.symbol), "CUDA {}: cuda.h's {}", h.cuda_version, e.name);
            if h.cuda_version < 13000 {
                assert_eq!(define(&typedefs, &format!("PFN_{}", e.name)).as_deref(), Some(e.pfn), "CUDA {}", h.cuda_version);
            }
            let older: Vec<u32> = PROC_TABLE.iter().filter(|r| r.name == e.name && !r.alias).map(|r| r.version).collect();
            for v in older {
                assert!(pfns.iter().any(|(n, pv, _)| n == e.name && *pv == v), "CUDA {}: PFN_{}_v{v} declared", h.cuda_version, e.name);
            }
        }
    }
}

#[test]
fn cuda_13_abis_are_refused_by_the_12_9_headers() {
    // Without the version filter the 12.9 headers reject the @13000 rows: the filter is load-bearing.
    let h = headers_12();
    let mut src = generate_c(h.cuda_version);
    for e in PROC_TABLE.iter().filter(|e| e.version > h.cuda_version) {
        writeln!(src, "{}", e.c_typedef(&format!("late_{}", e.pfn))).unwrap();
        writeln!(src, "CHECK(__builtin_types_compatible_p(late_{0}, {0}), \"{0}\");", e.pfn).unwrap();
    }
    assert!(PROC_TABLE.iter().any(|e| e.version >= 13000), "the table declares CUDA 13 ABIs");
    let err = compile(&h, &src).expect_err("12.9 headers have no CUDA 13 typedefs");
    assert!(err.contains("PFN_cuCtxSynchronize_v13000"), "{err}");
}

#[test]
fn a_wrong_declaration_is_caught() {
    // Same generator, one value and one signature deliberately broken: the check must fail on both,
    // against both header sets.
    for h in [headers_12(), headers_13()] {
        let src = generate_c(h.cuda_version)
            .replace("CHECK(CUDA_ERROR_OUT_OF_MEMORY == 2,", "CHECK(CUDA_ERROR_OUT_OF_MEMORY == 3,")
            .replace("(CUdeviceptr * dptr, size_t bytesize);", "(CUdeviceptr * dptr, unsigned int bytesize);");
        let err = compile(&h, &src).expect_err("broken declarations must not compile");
        assert!(err.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{err}");
        assert!(err.contains("PFN_cuMemAlloc_v3020"), "{err}");
    }
    // The 13.0 header set really is CUDA 13: its version check fails on the 12.9 headers.
    let err = compile(&headers_12(), &generate_c(13000)).expect_err("12.9 headers are not 13.0");
    assert!(err.contains("CUDA 13000 headers"), "{err}");
}
