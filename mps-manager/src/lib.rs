//! Owns the MPS control daemon per GPU: dynamic SM allocation, crash/hang detection and recovery.
