//! Fake `libcuda.so.1`: the CUDA driver API on top of the emulated device.
