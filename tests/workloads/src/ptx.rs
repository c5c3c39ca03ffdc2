//! The `spin` kernel as PTX text, loaded with `cuModuleLoadData` on the emulator and on GPUs.
//!
//! Convention shared with the emulator (`emu` branch): entry `spin`, one parameter
//! `u64 cycles`. On a GPU every thread busy-waits until `%clock64` has advanced by `cycles`;
//! the emulator reads the same parameter and takes `cycles / SM clock` of emulated time with an
//! SM demand of `min(gridDim, SM count)` blocks.

/// Name of the kernel entry in [`SPIN_PTX`].
pub const SPIN_ENTRY: &std::ffi::CStr = c"spin";

/// PTX ISA 7.0 for `sm_52` and newer (JIT-compiled by the driver for the actual GPU).
pub const SPIN_PTX: &std::ffi::CStr = c"//
// spin(u64 cycles): busy-wait `cycles` SM clock ticks in every thread.
//
.version 7.0
.target sm_52
.address_size 64

.visible .entry spin(
	.param .u64 spin_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [spin_param_0];
	mov.u64 	%rd2, %clock64;
$L__spin_loop:
	mov.u64 	%rd3, %clock64;
	sub.s64 	%rd4, %rd3, %rd2;
	setp.lt.u64 	%p1, %rd4, %rd1;
	@%p1 bra 	$L__spin_loop;
	ret;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_declares_the_agreed_entry_and_parameter() {
        let text = SPIN_PTX.to_str().unwrap();
        assert!(text.contains(".visible .entry spin("));
        assert!(text.contains(".param .u64 spin_param_0"));
        assert!(text.contains("%clock64"));
        assert!(text.contains(".target sm_52"));
        assert_eq!(SPIN_ENTRY.to_str().unwrap(), "spin");
    }
}

#[cfg(test)]
mod ptxas {
    use super::*;

    /// Assembles the kernel with NVIDIA's `ptxas` for every architecture the project meets
    /// (Maxwell to Hopper): `$PTXAS`, default `<repo>/.cuda-tools/ptxas` as installed by
    /// `scripts/setup-test-env.sh` from pip `nvidia-cuda-nvcc-cu12`.
    #[test]
    fn spin_ptx_assembles_for_real_gpus() {
        let ptxas = std::env::var_os("PTXAS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cuda-tools/ptxas")
            });
        assert!(
            ptxas.exists(),
            "NVIDIA's ptxas not found at {} (run scripts/setup-test-env.sh or set PTXAS)",
            ptxas.display()
        );
        let dir = std::env::temp_dir().join(format!("spin-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("spin.ptx");
        std::fs::write(&src, SPIN_PTX.to_bytes()).unwrap();
        for arch in ["sm_52", "sm_75", "sm_80", "sm_86", "sm_90"] {
            let out = std::process::Command::new(&ptxas)
                .arg(format!("-arch={arch}"))
                .arg(&src)
                .arg("-o")
                .arg(dir.join(format!("spin_{arch}.cubin")))
                .output()
                .expect("run ptxas");
            assert!(
                out.status.success(),
                "ptxas -arch={arch}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
