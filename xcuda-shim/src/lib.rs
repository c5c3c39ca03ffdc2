//! `libxcuda.so`: the LD_PRELOAD library that enforces memory quota, launch throttle and graceful exit in offline CUDA processes.
