//! CUDA driver API declarations (types, enum values, struct layouts, entry-point versions) as published in NVIDIA's `cuda.h` / `cudaTypedefs.h`.
