//! Owns the MPS control daemon per GPU: dynamic SM allocation, crash/hang detection and recovery.

pub mod budget;
pub mod config;
pub mod control;
pub mod detect;
pub mod manager;
