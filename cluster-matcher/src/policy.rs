//! Offline allocation policies of a placement round, chosen by `cluster.json`'s `policy`
//! (issue 11): which offline jobs a round should favour on which shared GPUs.
//!
//! Every policy works on the round's allowed pairs and their predicted normalized throughput
//! (the predictor's co-located speed: heterogeneity- and space-sharing-aware by construction)
//! and reshapes the pair weights the matching then maximizes; forbidden pairs stay forbidden,
//! memory and tenant rules are not touched. [`Policy::MaxThroughput`] (the default) leaves
//! the weights alone: MuxFlow's maximum total throughput (KM matching).
//!
//! * [`Policy::GavelMaxMin`]: Gavel's heterogeneity-aware max-min fairness (Narayanan et al.,
//!   OSDI'20, §3.1): an LP ([`gavel`], solved with `microlp`) gives each job the share of time
//!   it should spend on each GPU type so that the smallest throughput normalized to an equal
//!   share is largest; the round's matching then realizes those time shares (Gavel's
//!   round-based mechanism, without its received-time history).
//! * [`Policy::Drf`]: Dominant Resource Fairness (Ghodsi et al., NSDI'11) across offline
//!   tenants over (SM share, GPU memory) of the round's shared GPUs (`drf`): each tenant's
//!   quota is what DRF's progressive filling gives it over its jobs that may run somewhere
//!   this round (its oldest jobs, running ones first); the matching places as many admitted
//!   jobs as it can, maximizing throughput among those plans, and gives GPUs that no admitted
//!   job can use to jobs over quota (work-conserving: no GPU idles while a job that fits it
//!   waits).
//! * [`Policy::Optimus`]: Optimus-style marginal gain (Peng et al., EuroSys'18): a pair is
//!   worth the share of the job's remaining work it completes per second
//!   (`predicted / remaining_s`, [`JobFeedback::remaining_s`]), so the matching spends GPUs
//!   where they shorten completion times most (a job with no estimate counts as one hour).
//! * [`Policy::Gandiva`]: Gandiva-style introspective packing (Xiao et al., OSDI'18): pairs
//!   are tried without prediction (every allowed pair weighs the same); a running pair whose
//!   measured normalized throughput ([`JobFeedback::measured_normalized`]) is at least
//!   [`GANDIVA_KEEP`] is kept, one below it is refused for this round so the job migrates.

pub mod drf;
pub mod gavel;

use serde::{Deserialize, Serialize};

pub use drf::{drf, drf_limited};

use crate::matching::FORBIDDEN;
use crate::plan::OfflineJob;

/// Gandiva: a tried pair is kept when the offline job's measured normalized throughput there
/// is at least this (it then runs at least half as fast as alone beside the online service).
pub const GANDIVA_KEEP: f64 = 0.5;

/// Optimus: remaining solo work assumed for a job without an estimate (s).
pub const OPTIMUS_DEFAULT_REMAINING_S: f64 = 3600.0;

/// Gavel: weight of predicted throughput beside the LP's time shares in the matching (breaks
/// ties and fills GPUs the LP leaves idle without overriding its shares).
pub const GAVEL_THROUGHPUT_EPS: f64 = 1e-3;

/// Gandiva: bonus weight for keeping a pair that pays (no move without a reason).
pub const GANDIVA_KEEP_BONUS: f64 = 1.0;

/// A round's offline allocation policy (`cluster.json` key `policy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(clap::ValueEnum)]
pub enum Policy {
    /// Maximum total predicted throughput (MuxFlow's KM matching).
    #[default]
    MaxThroughput,
    /// Gavel's heterogeneity- and space-sharing-aware max-min fairness (LP).
    GavelMaxMin,
    /// Dominant Resource Fairness across offline tenants over (SM share, GPU memory).
    Drf,
    /// Optimus-style marginal gain: predicted throughput over remaining work.
    Optimus,
    /// Gandiva-style introspective packing: try, keep what pays, migrate the rest.
    Gandiva,
}

impl Policy {
    /// Every policy, default first.
    pub const ALL: [Policy; 5] =
        [Policy::MaxThroughput, Policy::GavelMaxMin, Policy::Drf, Policy::Optimus, Policy::Gandiva];

    /// The name `cluster.json` uses.
    pub fn name(self) -> &'static str {
        match self {
            Policy::MaxThroughput => "max-throughput",
            Policy::GavelMaxMin => "gavel-max-min",
            Policy::Drf => "drf",
            Policy::Optimus => "optimus",
            Policy::Gandiva => "gandiva",
        }
    }

    /// Parses [`Policy::name`].
    pub fn from_name(s: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// What the caller observed of an offline job, for the policies that use it (all optional;
/// `workloads.json` key `feedback`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFeedback {
    /// Estimated solo seconds of work left (Optimus).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_s: Option<f64>,
    /// Measured normalized throughput (0..1 of alone) where it runs now (`current`; Gandiva).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_normalized: Option<f64>,
}

impl JobFeedback {
    /// Nothing observed.
    pub fn is_empty(&self) -> bool {
        self.remaining_s.is_none() && self.measured_normalized.is_none()
    }
}

/// One shared-GPU slot of the round as the policies see it.
#[derive(Debug, Clone)]
pub struct Slot<'a> {
    /// GPU type (node `gpu_type`).
    pub gpu_type: &'a str,
    /// SM percentage the offline side gets on this GPU (all its jobs together).
    pub sm_percent: f64,
    /// Memory the offline side may use (MiB).
    pub memory_mib: u64,
}

/// The policy's reshaping of a round's pair weights, computed once per round.
#[derive(Debug, Clone)]
pub enum Shaped {
    /// Gavel's LP shares.
    Gavel {
        /// Time share of job `j` on GPU type `t`: `x[j * types + t]`.
        x: Vec<f64>,
        /// Number of GPU types.
        types: usize,
        /// Each GPU's type index.
        gpu_type: Vec<usize>,
    },
    /// DRF quotas.
    Drf {
        /// Whether each job is within its tenant's quota.
        admitted: Vec<bool>,
        /// Added to an admitted job's pairs: more than any matching's whole predicted
        /// throughput, so the matching places as many admitted jobs as it can first and
        /// gives jobs over quota only GPUs no admitted job can use (work-conserving).
        bonus: f64,
    },
    /// Optimus marginal gain.
    Optimus {
        /// Per job, 1 / remaining seconds.
        inv_remaining: Vec<f64>,
    },
    /// Gandiva introspection.
    Gandiva {
        /// Per job, the GPU index it runs on and whether that pair pays.
        keep: Vec<Option<(usize, bool)>>,
    },
}

impl Shaped {
    /// The weight the matching uses for GPU `gi` and job `j`, given the predicted one
    /// (`base`, never [`FORBIDDEN`] here). May return [`FORBIDDEN`].
    pub fn weight(&self, gi: usize, j: usize, base: f64) -> f64 {
        match self {
            Shaped::Gavel { x, types, gpu_type } => x[j * types + gpu_type[gi]] + GAVEL_THROUGHPUT_EPS * base,
            Shaped::Drf { admitted, bonus } => {
                if admitted[j] {
                    base + bonus
                } else {
                    base
                }
            }
            Shaped::Optimus { inv_remaining } => base * inv_remaining[j],
            Shaped::Gandiva { keep } => match keep[j] {
                Some((g, true)) if g == gi => 1.0 + GANDIVA_KEEP_BONUS,
                Some((g, false)) if g == gi => FORBIDDEN,
                _ => 1.0,
            },
        }
    }
}

impl Shaped {
    /// The part of job `j`'s shaped weight `w` that ranks its pairs: `w` less DRF's admission
    /// tier (the scale of the pairwise path's keep bonus).
    pub fn ranking_part(&self, j: usize, w: f64) -> f64 {
        match self {
            Shaped::Drf { admitted, bonus } if admitted[j] => w - bonus,
            _ => w,
        }
    }
}

/// Prepares `policy` for a round: `slots` are the candidate GPUs (index = GPU index),
/// `jobs` the round's offline jobs, `per_gpu` jobs per GPU at most, `weight(gi, j)` the
/// predicted weight ([`FORBIDDEN`] for a forbidden pair), `current(j)` the GPU index a job runs
/// on now (if among the slots). `None`: use the weights as they are (maximum throughput).
pub fn shape(
    policy: Policy,
    slots: &[Slot],
    jobs: &[OfflineJob],
    per_gpu: usize,
    weight: &dyn Fn(usize, usize) -> f64,
    current: &dyn Fn(usize) -> Option<usize>,
) -> Option<Shaped> {
    match policy {
        Policy::MaxThroughput => None,
        Policy::GavelMaxMin => Some(gavel::shape(slots, jobs.len(), per_gpu, weight)),
        Policy::Drf => Some(drf::shape(slots, jobs, per_gpu, weight, current)),
        Policy::Optimus => Some(Shaped::Optimus {
            inv_remaining: jobs
                .iter()
                .map(|j| {
                    let r = j.feedback.remaining_s.filter(|r| r.is_finite() && *r > 0.0);
                    1.0 / r.unwrap_or(OPTIMUS_DEFAULT_REMAINING_S).max(1.0)
                })
                .collect(),
        }),
        Policy::Gandiva => Some(Shaped::Gandiva {
            keep: (0..jobs.len())
                .map(|j| {
                    current(j).map(|g| (g, jobs[j].feedback.measured_normalized.is_none_or(|m| m >= GANDIVA_KEEP)))
                })
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, tenant: &str, mem: u64) -> OfflineJob {
        OfflineJob {
            name: name.into(),
            tenant: tenant.into(),
            memory_mib: mem,
            gpu_types: vec![],
            profile: None,
            current: None,
            held_memory_quota_mib: None,
            allowed_nodes: None,
            feedback: JobFeedback::default(),
        }
    }

    fn slot(gpu_type: &str) -> Slot<'_> {
        Slot { gpu_type, sm_percent: 60.0, memory_mib: 16_000 }
    }

    #[test]
    fn names_round_trip_and_default_is_km() {
        for p in Policy::ALL {
            assert_eq!(Policy::from_name(p.name()), Some(p));
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{}\"", p.name()));
        }
        assert_eq!(Policy::default(), Policy::MaxThroughput);
        assert!(shape(Policy::MaxThroughput, &[], &[], 1, &|_, _| 1.0, &|_| None).is_none());
    }

    /// Optimus, by hand: one GPU, a long job (predicted 0.9, 10 h left) and a short one
    /// (predicted 0.5, 1 h left). KM takes the long one (0.9 > 0.5); Optimus the short one:
    /// 0.5 / 3600 > 0.9 / 36000 (it completes 5x more of its remaining work per second).
    #[test]
    fn optimus_prefers_the_larger_marginal_gain() {
        let mut long = job("long", "a", 1000);
        long.feedback.remaining_s = Some(36_000.0);
        let mut short = job("short", "a", 1000);
        short.feedback.remaining_s = Some(3600.0);
        let base = [0.9, 0.5];
        let s = shape(Policy::Optimus, &[slot("V100")], &[long, short], 1, &|_, j| base[j], &|_| None).unwrap();
        let (wl, ws) = (s.weight(0, 0, base[0]), s.weight(0, 1, base[1]));
        assert!((wl - 0.9 / 36_000.0).abs() < 1e-15 && (ws - 0.5 / 3600.0).abs() < 1e-15);
        assert!(ws > wl, "the short job must win");
    }

    /// Gandiva: a running pair measured at 0.7 is kept (bonus at its GPU), one at 0.2 is
    /// refused where it runs (it migrates), untried pairs all weigh 1 whatever the prediction.
    #[test]
    fn gandiva_keeps_what_pays_and_migrates_the_rest() {
        let mut good = job("good", "a", 1000);
        good.feedback.measured_normalized = Some(0.7);
        let mut bad = job("bad", "a", 1000);
        bad.feedback.measured_normalized = Some(0.2);
        let fresh = job("fresh", "a", 1000);
        let cur = [Some(0), Some(1), None];
        let slots = [slot("V100"), slot("V100"), slot("T4")];
        let s = shape(Policy::Gandiva, &slots, &[good, bad, fresh], 1, &|_, _| 0.4, &|j| cur[j]).unwrap();
        assert_eq!(s.weight(0, 0, 0.4), 2.0);
        assert_eq!(s.weight(2, 0, 0.9), 1.0);
        assert_eq!(s.weight(1, 1, 0.4), FORBIDDEN);
        assert_eq!(s.weight(2, 1, 0.4), 1.0);
        assert_eq!(s.weight(2, 2, 0.1), 1.0);
    }
}
