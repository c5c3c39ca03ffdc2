//! Owns the MPS control daemon per GPU: dynamic SM allocation, crash/hang detection and recovery.
//!
//! One user per MPS GPU: MPS serves one user at a time (nvidia-cuda-mps-control(1): a client
//! of another user than the running server's is queued until that server's clients are done,
//! then a server for that user replaces it), so the online service and the offline containers
//! of a GPU must run as one uid. [`config::Config::client_uid`] names it; the manager then
//! reports and evicts offline processes of any other uid ([`manager::Manager::check`]).
//!
//! An offline process doing GPU work outside MPS (it initialised CUDA before the control
//! daemon ran: CUDA looks for it once) is out of reach of the SM budget: the manager finds it
//! ([`outside`]) and evicts it for a restart under MPS, or reports it.
//!
//! Processes outside MPS are first kept from the GPU altogether: the manager holds the GPU in
//! the EXCLUSIVE_PROCESS compute mode ([`compute_mode`]), where only the MPS server may hold a
//! context of its own.
//!
//! The control daemon is only ever signalled as the pid + start time recorded when the
//! manager started or detected it ([`control::DaemonId`]), through a pidfd.

pub mod budget;
pub mod compute_mode;
pub mod config;
pub mod control;
pub mod detect;
pub mod manager;
pub mod outside;
pub mod serverlog;
