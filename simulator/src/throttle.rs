//! The offline launch throttle on a simulated GPU.
//!
//! PENDING: the real control law is being moved out of the shim (a cdylib with a load-time
//! constructor, which the simulator must not link) into the FFI-free crate `xshare-control`.
//! Until that crate is merged, protected modes run the offline job unthrottled (duty 1) and
//! say so in their report (`throttle: "unthrottled (xshare-control not merged)"`).

use serde::Serialize;

use crate::model::{evaluate, OnlineLoad, Pair, Share, View};

/// Throttle settings the simulator passes to the control law.
#[derive(Debug, Clone, Serialize)]
pub struct ThrottleSettings {
    /// Whether the throttle runs at all in protected modes.
    pub enabled: bool,
}

impl Default for ThrottleSettings {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Per-GPU controller state (one offline process).
#[derive(Debug, Clone)]
pub struct ThrottleState {}

impl ThrottleState {
    pub fn new(_s: &ThrottleSettings) -> Self {
        Self {}
    }

    /// The GPU over one tick with the offline job capped at `cap` SMs.
    pub fn settle(
        &mut self,
        _s: &ThrottleSettings,
        load: &OnlineLoad,
        pair: &Pair,
        cap: f64,
        _tick_s: f64,
    ) -> View {
        evaluate(load, pair, Share::Space { cap, duty: 1.0 })
    }
}

/// What the report says about the throttle.
pub fn description() -> &'static str {
    "unthrottled (xshare-control not merged)"
}
