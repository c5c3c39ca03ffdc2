//! Checks every Rust declaration in `cuda-abi` against NVIDIA's `cuda.h` / `cudaTypedefs.h`:
//! generates a C file of `_Static_assert`s from the Rust tables and compiles it with `cc -fsyntax-only`.
//! Headers come from `$CUDA_HEADERS_DIR` (default `<repo>/.cuda-headers`, filled by
//! `scripts/setup-test-env.sh`).

use cuda_abi::*;
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

fn headers_dir() -> PathBuf {
    match std::env::var_os("CUDA_HEADERS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cuda-headers"),
    }
}

/// `(C struct typedef, Rust size, [(C field, Rust offset)])`.
fn struct_layouts() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
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
        layout!("CUmemLocation", CUmemLocation, ["type" => type_, "id" => id]),
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
        layout!("CUmemPoolProps", CUmemPoolProps, [
            "allocType" => allocType, "handleTypes" => handleTypes, "location" => location,
            "win32SecurityAttributes" => win32SecurityAttributes, "maxSize" => maxSize,
            "usage" => usage, "reserved" => reserved,
        ]),
    ]
}

/// The C source of all assertions; public to the test so a mutation check can reuse it.
fn generate_c() -> String {
    let mut c = String::new();
    c.push_str("#define __CUDA_API_VERSION_INTERNAL 1\n#include <stddef.h>\n#include <cuda.h>\n#include <cudaTypedefs.h>\n");
    c.push_str("#define CHECK(cond, what) _Static_assert(cond, what)\n");
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

fn compile(src: &str) -> Result<(), String> {
    let dir = headers_dir();
    for h in ["cuda.h", "cudaTypedefs.h"] {
        if !dir.join(h).is_file() {
            return Err(format!(
                "NVIDIA header {h} not found in {} — run scripts/setup-test-env.sh or set CUDA_HEADERS_DIR",
                dir.display()
            ));
        }
    }
    let out = std::env::temp_dir().join(format!("cuda_abi_header_check_{}_{}.c", std::process::id(), src.len()));
    std::fs::write(&out, src).map_err(|e| format!("write {}: {e}", out.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let res = Command::new(&cc)
        .args(["-std=c11", "-fsyntax-only", "-Wno-deprecated-declarations", "-I"])
        .arg(&dir)
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

#[test]
fn rust_declarations_match_nvidia_headers() {
    let src = generate_c();
    assert!(src.matches("CHECK(").count() > 300, "expected a full set of checks");
    if let Err(e) = compile(&src) {
        panic!("{e}");
    }
}

#[test]
fn a_wrong_declaration_is_caught() {
    // Same generator, one value and one signature deliberately broken: the check must fail on both.
    let src = generate_c()
        .replace("CHECK(CUDA_ERROR_OUT_OF_MEMORY == 2,", "CHECK(CUDA_ERROR_OUT_OF_MEMORY == 3,")
        .replace("(CUdeviceptr * dptr, size_t bytesize);", "(CUdeviceptr * dptr, unsigned int bytesize);");
    let err = compile(&src).expect_err("broken declarations must not compile");
    assert!(err.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{err}");
    assert!(err.contains("PFN_cuMemAlloc_v3020"), "{err}");
}
