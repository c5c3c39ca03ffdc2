//! Fake `libnvidia-ml.so.1`: NVML queries answered from the emulated device state.
