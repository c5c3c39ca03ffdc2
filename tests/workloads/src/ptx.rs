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
