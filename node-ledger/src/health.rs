//! The five SysMonitor health states (MuxFlow fig. 6b): the one health enum of the node
//! runtime, stored in the ledger (as its `u32` discriminant), in the monitor's state file and
//! its metrics (as its lowercase name), and stepped by sysmonitor's health machine.

use serde::{Deserialize, Serialize};

/// GPU health as decided by the monitor; only the monitor writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u32)]
pub enum HealthState {
    /// Monitor started, no verdict yet (also what a fresh ledger reads).
    Init = 0,
    /// All metrics below their thresholds; offline work may be admitted.
    Healthy = 1,
    /// A metric past its Unhealthy threshold; no new offline work.
    Unhealthy = 2,
    /// A metric past its Overlimit threshold; offline work is evicted.
    Overlimit = 3,
    /// Device unavailable.
    Disabled = 4,
}

impl HealthState {
    /// Decodes a stored value; unknown values map to `None` (caller decides, usually "not healthy").
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Init,
            1 => Self::Healthy,
            2 => Self::Unhealthy,
            3 => Self::Overlimit,
            4 => Self::Disabled,
            _ => return None,
        })
    }

    /// Whether offline work may be admitted to a GPU in this state.
    pub fn admits_offline(self) -> bool {
        self == Self::Healthy
    }

    /// Every state, in discriminant order.
    pub const ALL: [HealthState; 5] = [
        Self::Init,
        Self::Healthy,
        Self::Unhealthy,
        Self::Overlimit,
        Self::Disabled,
    ];

    /// The lowercase name used in state files, metrics labels and logs (also its serde form).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
            Self::Overlimit => "overlimit",
            Self::Disabled => "disabled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_unknown() {
        for s in [
            HealthState::Init,
            HealthState::Healthy,
            HealthState::Unhealthy,
            HealthState::Overlimit,
            HealthState::Disabled,
        ] {
            assert_eq!(HealthState::from_u32(s as u32), Some(s));
        }
        assert_eq!(HealthState::from_u32(5), None);
        for s in HealthState::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()), "serde form is the lowercase name");
            assert_eq!(serde_json::from_str::<HealthState>(&json).unwrap(), s);
        }
        assert!(HealthState::Healthy.admits_offline());
        assert!(!HealthState::Unhealthy.admits_offline());
    }
}
