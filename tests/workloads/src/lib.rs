//! Online (inference-like) and offline (training-like) CUDA client programs used by tests and demos.
