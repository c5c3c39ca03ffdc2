//! The per-process token bucket plus the controller tick that sets its refill rate.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::*};

use crate::{clock_factor, gpu_load, Pid, Sample, ThrottleConfig};

/// Milli-waves per wave: token unit.
const MILLI: f64 = 1000.0;
/// Largest own MPS cap (fraction of the SMs) for which a low SM clock is taken as online
/// pressure ([`Throttle::pressure`]): a GPU keeps its full clock up to about half occupancy.
pub const HOLD_MAX_OWN_SHARE: f64 = 0.5;
/// Load target while the process's own MPS cap enforces the SM budget ([`Throttle::target_for`]).
pub const MPS_ENFORCED_TARGET: f64 = 1.0;
/// Token level while frozen: far below zero so that every launch waits.
const FROZEN_LEVEL: i64 = i64::MIN / 4;
/// The controller's ceiling over what a process took lately ([`Throttle::control_with_part`]).
const CEILING_OVER_USE: f64 = 1.125;
/// The longest refill the bucket holds, in controller periods ([`Throttle::depth`]).
const LATE_TICK_PERIODS: f64 = 10.0;

fn q16_per_block(sm_count: u32) -> u64 {
    (1000u64 << 16).div_ceil(u64::from(sm_count.max(1)))
}

/// The per-process token bucket plus controller state. Shared between the launching threads
/// ([`Throttle::take`], [`Throttle::must_wait`]: one atomic RMW on the fast path) and one
/// controller ([`Throttle::control_with_budget`] then [`Throttle::refill`] each period).
#[derive(Debug)]
pub struct Throttle {
    /// Whether launches are throttled: the configuration's, turned on for good by an
    /// operator's floor ([`Throttle::tighten`]). Read with one relaxed load per launch.
    enabled: AtomicBool,
    /// The load target, highest rate and fallback rate in force, `f64` bits: the
    /// configuration's, lowered for good by an operator's floor ([`Throttle::tighten`]).
    target_load: AtomicU64,
    max_rate: AtomicU64,
    fallback_rate: AtomicU64,
    tokens: AtomicI64,
    rate_milli: AtomicU64,
    /// Load target of the last tick, milli (configured, or lowered by a fresh SM budget).
    target_milli: AtomicU64,
    frozen: AtomicBool,
    /// Milli-waves per block in 16.16 fixed point (1000 / SM count): no division on launch.
    milli_per_block_q16: AtomicU64,
    /// This process's own SM cap (its MPS active-thread fraction), milli; 0 = none known.
    own_share_milli: AtomicU64,
    /// Online-pressure hold left, µs (0 = not held).
    hold_left_us: AtomicU64,
    /// Cost of a graph launch and bucket depth, milli-waves: the law's
    /// ([`Throttle::law`]); the launch path reads them with one relaxed load.
    graph_cost: AtomicI64,
    burst: AtomicI64,
    /// Tokens right after the last refill (controller only): what the process took since is
    /// that less the tokens now.
    after_refill: AtomicI64,
    /// What the process took lately, waves per second (`f64` bits; controller only): the
    /// highest per-tick figure, halving each second since ([`Throttle::recent_use`]).
    recent_use: AtomicU64,
    /// The configuration this throttle was built with (the process's own).
    cfg: ThrottleConfig,
    /// `cfg`'s control law held to the shipped one ([`ThrottleConfig::law_within`]), in force
    /// once `law_held` is set (an operator's floor requiring a throttle, [`Throttle::tighten`]),
    /// for the throttle's life.
    held_law: ThrottleConfig,
    law_held: AtomicBool,
    /// Launches that had to wait.
    pub delayed: AtomicU64,
    /// Launches issued (approximate under concurrent launches from several threads).
    pub launches: AtomicU64,
}

/// What [`Throttle::tighten`] changed: each field is set only where the floor made this
/// throttle tighter than it was (for the one log line saying the floor overrode the process's
/// own configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tightened {
    /// The throttle was off and is now on.
    pub turned_on: bool,
    /// The load target, lowered to this.
    pub target_load: Option<f64>,
    /// The highest rate, lowered to this.
    pub max_rate: Option<f64>,
    /// The fallback rate, lowered to this.
    pub fallback_rate: Option<f64>,
    /// The control law was looser than the shipped one and is now held to it
    /// ([`ThrottleConfig::law_within`]).
    pub law: bool,
}

impl Tightened {
    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.turned_on || self.target_load.is_some() || self.max_rate.is_some() || self.fallback_rate.is_some() || self.law
    }
}

/// Lowers the `f64` in `slot` to `limit` if it is above; the new value if it was.
fn lower(slot: &AtomicU64, limit: Option<f64>) -> Option<f64> {
    let limit = limit.filter(|l| *l > 0.0 && l.is_finite())?;
    let now = f64::from_bits(slot.load(Relaxed));
    // A value that is no number (a NaN no validation caught) is above every limit: the floor
    // lands on it rather than being compared away.
    (now.is_nan() || limit < now).then(|| {
        slot.store(limit.to_bits(), Relaxed);
        limit
    })
}

/// What the controller decided on one tick (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Launch budget, SM-waves per second.
    pub rate: f64,
    /// GPU load U_GPU the decision was made on (`None` when the sample was stale).
    pub load: Option<f64>,
    /// Whether monitor data were missing or stale (the fallback rate applies).
    pub stale: bool,
    /// Whether launches are held for online pressure (rate 0, for at most `hold_ms` after the
    /// last sample showing it).
    pub held: bool,
}

impl Throttle {
    /// A bucket starting full at the fallback rate, costing kernels for `sm_count` SMs.
    pub fn new(cfg: &ThrottleConfig, sm_count: u32) -> Self {
        let burst = (cfg.burst * MILLI) as i64;
        Self {
            enabled: AtomicBool::new(cfg.enabled),
            target_load: AtomicU64::new(cfg.target_load.to_bits()),
            max_rate: AtomicU64::new(cfg.max_rate.to_bits()),
            fallback_rate: AtomicU64::new(cfg.fallback_rate.to_bits()),
            tokens: AtomicI64::new(burst),
            rate_milli: AtomicU64::new((cfg.fallback_rate * MILLI) as u64),
            target_milli: AtomicU64::new((cfg.target_load * MILLI) as u64),
            frozen: AtomicBool::new(false),
            milli_per_block_q16: AtomicU64::new(q16_per_block(sm_count)),
            own_share_milli: AtomicU64::new(0),
            hold_left_us: AtomicU64::new(0),
            graph_cost: AtomicI64::new((cfg.graph_launch_waves * MILLI) as i64),
            burst: AtomicI64::new(burst),
            after_refill: AtomicI64::new(burst),
            recent_use: AtomicU64::new(0f64.to_bits()),
            cfg: cfg.clone(),
            held_law: cfg.law_within(&ThrottleConfig::default()),
            law_held: AtomicBool::new(false),
            delayed: AtomicU64::new(0),
            launches: AtomicU64::new(0),
        }
    }

    /// The settings this throttle was built with (before any floor: [`Throttle::tighten`]).
    pub fn config(&self) -> &ThrottleConfig {
        &self.cfg
    }

    /// The control law in force: the configuration's, or, once an operator's floor required
    /// a throttle ([`Throttle::tighten`]), the configuration's held to the shipped law
    /// ([`ThrottleConfig::law_within`]). Its switch, load target and rates are not the ones in
    /// force ([`Throttle::enabled`], [`Throttle::target_load`], [`Throttle::max_rate`],
    /// [`Throttle::fallback_rate`]). The controller reads its period and staleness here.
    pub fn law(&self) -> &ThrottleConfig {
        if self.law_held.load(Relaxed) {
            &self.held_law
        } else {
            &self.cfg
        }
    }

    /// Whether the control law is held to the shipped one ([`Throttle::law`]).
    pub fn law_held(&self) -> bool {
        self.law_held.load(Relaxed)
    }

    /// Holds this throttle to an operator's floor: turned on if `required`, its load target,
    /// highest rate and fallback rate lowered to the limits given (`None`, or anything not a
    /// positive finite number: no limit), and, if `required`, its control law held to the
    /// shipped one ([`Throttle::law`]; a process that may not turn its throttle off may not
    /// take it apart either: a bucket a million waves deep, a hold that never holds, gains of
    /// 0). Never loosens: what was tightened stays so for the throttle's life, whatever floor
    /// comes later (or none, a monitor gone quiet). Returns what changed. Called by the
    /// controller, never on the launch path.
    pub fn tighten(
        &self,
        required: bool,
        max_target_load: Option<f64>,
        max_rate: Option<f64>,
        max_fallback_rate: Option<f64>,
    ) -> Tightened {
        let turned_on = required && !self.enabled.swap(true, Relaxed);
        let law = required && !self.law_held.swap(true, Relaxed) && self.held_law != self.cfg;
        if law {
            let h = &self.held_law;
            let burst = (h.burst * MILLI) as i64;
            self.burst.fetch_min(burst, Relaxed);
            self.graph_cost.fetch_max((h.graph_launch_waves * MILLI) as i64, Relaxed);
            // A bucket filled to the process's own depth is emptied to the law's at once
            // (a frozen bucket, far below, stays so).
            self.tokens.fetch_min(burst, AcqRel);
            // Not taken by the process: not counted as its use at the next tick.
            self.after_refill.fetch_min(burst, Relaxed);
        }
        let max_rate = lower(&self.max_rate, max_rate);
        // The fallback rate stays within the highest rate.
        let fallback_cap = max_fallback_rate.into_iter().chain(Some(self.max_rate())).reduce(f64::min);
        Tightened {
            turned_on,
            target_load: lower(&self.target_load, max_target_load),
            max_rate,
            fallback_rate: lower(&self.fallback_rate, fallback_cap),
            law,
        }
    }

    /// Whether launches are throttled (the configuration's, or turned on by a floor).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// The load target in force before any SM budget: the configuration's, or a floor's lower one.
    pub fn target_load(&self) -> f64 {
        f64::from_bits(self.target_load.load(Relaxed))
    }

    /// The highest rate in force, SM-waves per second.
    pub fn max_rate(&self) -> f64 {
        f64::from_bits(self.max_rate.load(Relaxed))
    }

    /// The fallback rate in force, SM-waves per second.
    pub fn fallback_rate(&self) -> f64 {
        f64::from_bits(self.fallback_rate.load(Relaxed))
    }

    /// Cost of a kernel of `blocks` thread blocks, in milli-waves (a wave = one block per SM).
    #[inline]
    pub fn kernel_cost(&self, blocks: u64) -> i64 {
        let q = self.milli_per_block_q16.load(Relaxed);
        (blocks.saturating_mul(q) >> 16).clamp(1, 1 << 40) as i64
    }

    /// Cost of a graph launch, milli-waves.
    pub fn graph_cost(&self) -> i64 {
        self.graph_cost.load(Relaxed)
    }

    /// Takes `cost` milli-waves for one launch (counted in [`Throttle::launches`]). Under
    /// budget this is one atomic RMW and returns `true`: launch now. Otherwise the debt is
    /// recorded, the launch counted in [`Throttle::delayed`], and it returns `false`: the
    /// caller must hold the launch while [`Throttle::must_wait`].
    #[inline]
    pub fn take(&self, cost: i64) -> bool {
        // Statistics only: a plain load+store (no locked RMW); concurrent launches from several
        // threads may lose an increment.
        self.launches
            .store(self.launches.load(Relaxed).wrapping_add(1), Relaxed);
        if !self.enabled.load(Relaxed) && !self.frozen.load(Relaxed) {
            return true;
        }
        // Freezing parks the bucket far below zero, so one RMW also answers "frozen?".
        let before = self.tokens.fetch_sub(cost, AcqRel);
        if before >= cost {
            return true;
        }
        self.delayed.fetch_add(1, Relaxed);
        false
    }

    /// Whether a launch that [`Throttle::take`] held must keep waiting: frozen, or the bucket
    /// still in debt (and the throttle enabled).
    pub fn must_wait(&self) -> bool {
        let frozen = self.frozen.load(Acquire);
        frozen || (self.enabled.load(Relaxed) && self.tokens.load(Acquire) < 0)
    }

    /// Depth of the bucket at `rate` milli-waves a second for a refill after `dt` seconds: the
    /// burst, or the refill's worth at the rate where that is more, the refill counted as one
    /// controller period at least and [`LATE_TICK_PERIODS`] at most (a controller thread woken
    /// late, in a container whose CPU quota ran out, gives the process what the rate allowed
    /// meanwhile: at 100 ms instead of 10, 109 of 1000 launches went in a second).
    fn depth(&self, rate: f64, dt: f64) -> i64 {
        let period_s = self.law().period_ms as f64 / 1000.0;
        let window = dt.max(period_s).min(LATE_TICK_PERIODS * period_s);
        self.burst.load(Relaxed).max((rate * window) as i64)
    }

    /// Refills for `dt` seconds at the current rate (controller), capped at the bucket's
    /// depth (`Throttle::depth`): the burst, or the refill's worth at the current rate
    /// where that is more. The bucket is refilled once a period, so a depth below a period's worth would cap
    /// the rate at burst/period whatever the controller decided (the shipped 4 waves every
    /// 10 ms: 400 waves/s against a highest rate of 100,000; on an H200, 1-block kernels held
    /// to 57k launches/s on an idle GPU where they ran at 242k/s direct).
    pub fn refill(&self, dt: f64) {
        if self.frozen.load(Acquire) {
            return;
        }
        let rate = self.rate_milli.load(Relaxed) as f64;
        let add = (rate * dt) as i64;
        let depth = self.depth(rate, dt);
        let after = match self.tokens.fetch_update(AcqRel, Acquire, |t| Some(t.saturating_add(add).min(depth))) {
            Ok(before) | Err(before) => before.saturating_add(add).min(depth),
        };
        self.after_refill.store(after, Relaxed);
    }

    /// What the process took lately, waves per second: the tokens taken since the last refill
    /// over `dt`, or the figure before halved for each second since, whichever is more (a
    /// pause for data loading or a hold does not make the process look idle at once). At most
    /// what the rate and the bucket's depth allowed (a freeze, a floor emptying the bucket).
    /// Called once a tick, by the controller, before it refills.
    fn recent_use(&self, dt: f64) -> f64 {
        let dt = dt.max(1e-4);
        let decayed = f64::from_bits(self.recent_use.load(Relaxed)) * 0.5f64.powf(dt);
        if self.frozen.load(Acquire) {
            self.recent_use.store(decayed.to_bits(), Relaxed);
            return decayed;
        }
        let rate = self.rate_milli.load(Relaxed) as f64;
        let depth = self.depth(rate, dt);
        let tokens = self.tokens.load(Acquire);
        let taken = self.after_refill.load(Relaxed).saturating_sub(tokens).max(0) as f64;
        let mut now = taken.min(rate * dt + depth as f64) / MILLI / dt;
        if tokens < 0 {
            // In debt: a launch waits for the refills (one costing more than the bucket holds
            // waits several ticks, taking nothing meanwhile). The process wants at least its
            // whole rate; counted idle, its ceiling fell to the fallback rate and a kernel of
            // 100,000 blocks on 132 SMs could run a few times a minute.
            now = now.max(rate / MILLI);
        }
        let used = now.max(decayed);
        self.recent_use.store(used.to_bits(), Relaxed);
        used
    }

    /// Tokens in the bucket, milli-waves (negative: launches owe that much).
    pub fn tokens(&self) -> i64 {
        self.tokens.load(Acquire)
    }

    /// Stops every launch (signal path). Async-signal-safe: atomics only.
    pub fn freeze(&self) {
        self.frozen.store(true, Release);
        self.tokens.store(FROZEN_LEVEL, Release);
    }

    /// Lets launches go again.
    /// The bucket is filled to the burst, also during an online-pressure hold: the shim
    /// unfreezes after the application's own handler of SIGTERM/SIGINT ran, and a launch left
    /// waiting through a hold (seconds, while the online workload keeps the clock down) kept
    /// the application from reaching its exit (an evicted job that could not leave until its
    /// SIGKILL: e2e `node_colocated`). At most the burst goes; the next tick empties the
    /// bucket again while the hold lasts.
    pub fn unfreeze(&self) {
        let level = self.burst.load(Relaxed);
        self.tokens.store(level, Release);
        self.after_refill.store(level, Relaxed);
        self.frozen.store(false, Release);
    }

    /// Whether launches are frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Acquire)
    }

    /// Current budget, waves per second.
    pub fn rate(&self) -> f64 {
        self.rate_milli.load(Relaxed) as f64 / MILLI
    }

    /// Updates the SM count used to cost kernels.
    pub fn set_sm_count(&self, n: u32) {
        if n > 0 {
            self.milli_per_block_q16.store(q16_per_block(n), Relaxed);
        }
    }

    /// One controller tick: `sample` is `None` when monitor data are missing or stale.
    pub fn control(&self, pid: &mut Pid, sample: Option<Sample>, dt: f64) -> Decision {
        self.control_with_budget(pid, sample, None, dt)
    }

    /// Records this process's own SM cap, the MPS active-thread fraction (0..1] it started
    /// with (real MPS fixes it at client start). Until called, none is known (1.0).
    pub fn set_own_share(&self, fraction: f64) {
        if fraction.is_finite() && fraction > 0.0 {
            self.own_share_milli
                .store((fraction.min(1.0) * MILLI).round() as u64, Relaxed);
        }
    }

    /// This process's own SM cap (1.0 when none is known).
    pub fn own_share(&self) -> f64 {
        self.own_cap().unwrap_or(1.0)
    }

    /// This process's own SM cap, if one was recorded.
    pub fn own_cap(&self) -> Option<f64> {
        match self.own_share_milli.load(Relaxed) {
            0 => None,
            m => Some(m as f64 / MILLI),
        }
    }

    /// The load target for a fresh offline SM budget (`budget`: fraction of the SMs, 0..1) or
    /// none (`None`: stale or absent): the configured target, lowered to the budget, never
    /// raised, while the budget is below this process's own MPS cap
    /// ([`Throttle::set_own_share`]). A budget at or above that cap is already enforced by MPS
    /// itself, in space; the PID then aims at [`MPS_ENFORCED_TARGET`] (or the configured target
    /// if higher): U_GPU = U_SM * a_C passes 1 only when the SM clock is below T_SM (eq. 2),
    /// so the PID steps in only to bring the clock back, and online protection in time is the
    /// online-pressure hold's. (Before Hopper U_SM is the GPU's busy fraction, 1 whenever the
    /// capped offline job runs: any target under 1 would throttle it for any clock dip.)
    pub fn target_for(&self, budget: Option<f64>) -> f64 {
        self.target_for_part(budget, 1.0)
    }

    /// [`Throttle::target_for`] for a process whose job has `part` (0..=1) of the offline
    /// budget, other offline jobs sharing the GPU holding the rest. Whether the process's own
    /// MPS cap already enforces what it may take is judged on its job's part of the budget;
    /// when it does not, the target is the whole budget, not the part: the load the PID
    /// measures is the GPU's, so every job aiming at the budget holds all of them to it
    /// (aiming at a part would hold the whole GPU to that part).
    pub fn target_for_part(&self, budget: Option<f64>, part: f64) -> f64 {
        let t = self.target_load();
        let part = if part.is_finite() { part.clamp(0.0, 1.0) } else { 0.0 };
        match budget {
            Some(b) if b.is_finite() && self.own_cap().is_some_and(|cap| b * part + 1e-9 >= cap) => {
                t.max(MPS_ENFORCED_TARGET)
            }
            Some(b) if b.is_finite() => t.min(b.max(0.0)),
            _ => t,
        }
    }

    /// Online pressure in a sample: the SM clock below `hold_below_clock` of the highest clock
    /// while this process's own MPS cap is at most [`HOLD_MAX_OWN_SHARE`] of the SMs. The
    /// clock falls only when the SMs are nearly all demanded, which such a process cannot do
    /// alone: the online workload is running beside it, and any offline kernel in flight
    /// slows it (MPS does not preempt). A process with a larger (or unknown) cap could be the
    /// cause itself, so it is left to the PID.
    pub fn pressure(&self, s: &Sample) -> bool {
        let c = self.law();
        let c_h = self.highest_clock(s);
        c.hold_below_clock > 0.0
            && c_h > 0.0
            && s.c_sm < c.hold_below_clock * c_h
            && self.own_share() <= HOLD_MAX_OWN_SHARE
    }

    /// Whether launches were held for online pressure at the last controller tick.
    pub fn is_held(&self) -> bool {
        self.hold_left_us.load(Relaxed) > 0
    }

    /// One controller tick carrying the dynamic SM budget: real MPS fixes a client's SM
    /// percentage at its start, so a running offline process follows the budget here. The PID
    /// aims at [`Throttle::target_for`]; without monitor data the fallback rate is scaled down
    /// by the same ratio (target / configured target, never above 1), so a lower budget always
    /// means fewer launches, and a stale or absent budget means exactly the static behaviour.
    ///
    /// Online pressure ([`Throttle::pressure`]) holds every launch at once (fast attack: the
    /// bucket is emptied and the rate is 0) until `hold_ms` after the last sample showing it
    /// (slow release); the PID is not stepped while held. Stale data never start a hold, and
    /// a running hold expires on time whatever the data.
    pub fn control_with_budget(
        &self,
        pid: &mut Pid,
        sample: Option<Sample>,
        budget: Option<f64>,
        dt: f64,
    ) -> Decision {
        self.control_with_part(pid, sample, budget, 1.0, dt)
    }

    /// [`Throttle::control_with_budget`] for a process whose job has `part` of the offline
    /// budget (several offline jobs on one GPU): the PID aims at
    /// [`Throttle::target_for_part`]; without monitor data (open loop, one rate per process)
    /// the fallback rate is scaled to the job's part of the budget.
    pub fn control_with_part(
        &self,
        pid: &mut Pid,
        sample: Option<Sample>,
        budget: Option<f64>,
        part: f64,
        dt: f64,
    ) -> Decision {
        let c = self.law();
        if self.law_held() {
            pid.hold_gains(c);
        }
        // The configuration's, or an operator's floor's where tighter.
        let (max_rate, fallback_rate, configured_target) = (self.max_rate(), self.fallback_rate(), self.target_load());
        // A lowest rate above the fallback rate in force (a process's own `min_rate`) would
        // lift a floor's fallback rate: it is held to that.
        let min_rate = c.min_rate.min(fallback_rate).min(max_rate);
        pid.cap(max_rate, fallback_rate);
        pid.lower_floor(min_rate);
        let target = self.target_for_part(budget, part);
        let open_loop_target = match budget {
            Some(b) if b.is_finite() && target < MPS_ENFORCED_TARGET => {
                target.min((b * part.clamp(0.0, 1.0)).max(0.0))
            }
            _ => target,
        };
        self.target_milli.store((target * MILLI) as u64, Relaxed);
        let left = if sample.is_some_and(|s| self.pressure(&s)) {
            c.hold_ms.saturating_mul(1000)
        } else {
            let dt_us = (dt.max(0.0) * 1e6) as u64;
            self.hold_left_us.load(Relaxed).saturating_sub(dt_us)
        };
        self.hold_left_us.store(left, Relaxed);
        if left > 0 {
            // Held: what the process used before is no measure of what the GPU has room for
            // now, so the controller's ceiling starts again from the fallback rate and the
            // release ramps back (an eighth a tick) instead of jumping to the rate before.
            self.recent_use.store(0f64.to_bits(), Relaxed);
            self.rate_milli.store(0, Relaxed);
            let _ = self
                .tokens
                .fetch_update(AcqRel, Acquire, |t| Some(t.min(0)));
            return Decision {
                rate: 0.0,
                load: sample.map(|s| self.load_of(&s)),
                stale: sample.is_none(),
                held: true,
            };
        }
        // The controller's ceiling: an eighth above what the process took lately (never below
        // the fallback rate), so that its rate never winds up past what is used and binds
        // within a fraction of a second when the load comes ([`Pid::step_within`]). A process
        // taking all its rate lifts the ceiling by 1/8 each tick (17 doublings a second at
        // 10 ms), far quicker than the controller climbs (1.6 a second at the shipped gains).
        let ceiling = (CEILING_OVER_USE * self.recent_use(dt)).max(fallback_rate).min(max_rate);
        let (rate, load) = match sample {
            None => {
                pid.reset();
                let scale = if configured_target > 0.0 {
                    (open_loop_target / configured_target).min(1.0)
                } else {
                    1.0
                };
                (fallback_rate * scale, None)
            }
            Some(s) => {
                let load = self.load_of(&s);
                (pid.step_within(target - load, dt, ceiling), Some(load))
            }
        };
        let rate = rate.clamp(min_rate, max_rate);
        self.rate_milli.store((rate * MILLI) as u64, Relaxed);
        Decision {
            rate,
            load,
            stale: sample.is_none(),
            held: false,
        }
    }

    /// Eq. 1-2 on a sample: U_GPU = U_SM * a_C.
    pub fn load_of(&self, s: &Sample) -> f64 {
        let c = self.law();
        let c_h = self.highest_clock(s);
        gpu_load(s.u_sm, clock_factor(s.c_sm, c.t_sm_mhz, c_h, c.a_l, c.a_h))
    }

    /// C_H for sample `s`: the configured `c_h_mhz`, else the monitor's highest clock; with the
    /// law held, never below the monitor's (a lower C_H reads a lower load and holds later).
    fn highest_clock(&self, s: &Sample) -> f64 {
        let own = self.law().c_h_mhz;
        match (own > 0.0, self.law_held()) {
            (true, true) => own.max(s.c_h),
            (true, false) => own,
            (false, _) => s.c_h,
        }
    }

    /// The load target of the last controller tick (for logs and tests).
    pub fn target(&self) -> f64 {
        self.target_milli.load(Relaxed) as f64 / MILLI
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A throttle built from values no validation checked (a NaN target or highest rate) is
    /// still held to an operator's floor: `NaN > limit` is false, and the floor used to be
    /// compared away.
    #[test]
    fn a_floor_lands_on_a_value_that_is_no_number() {
        let cfg = ThrottleConfig { target_load: f64::NAN, max_rate: f64::NAN, ..ThrottleConfig::default() };
        let t = Throttle::new(&cfg, 40);
        let got = t.tighten(true, Some(0.4), Some(100.0), None);
        assert_eq!((got.target_load, got.max_rate), (Some(0.4), Some(100.0)));
        assert_eq!((t.target_load(), t.max_rate()), (0.4, 100.0));
    }

    fn cfg() -> ThrottleConfig {
        ThrottleConfig::default()
    }

    /// One controller tick as the shim's makes it (decision, then refill) for a process that
    /// takes all its rate: the bucket emptied in 1-milli-wave launches.
    fn tick_taking_all(t: &Throttle, decide: impl FnOnce() -> Decision, dt: f64) -> f64 {
        let d = decide();
        t.refill(dt);
        let n = t.tokens().max(0);
        assert!(n == 0 || t.take(n), "a full bucket gives what it holds");
        d.rate
    }

    #[test]
    fn stale_data_gives_fixed_rate_never_unlimited() {
        let t = Throttle::new(&cfg(), 100);
        let mut pid = Pid::new(&cfg());
        let d = t.control(&mut pid, None, 0.01);
        assert!(d.stale);
        assert_eq!(d.rate, cfg().fallback_rate);
        assert!(t.rate() < cfg().max_rate);
    }

    #[test]
    fn high_load_lowers_rate_low_load_raises_it() {
        // The PID alone (the online-pressure hold has its own test).
        let c = ThrottleConfig {
            hold_below_clock: 0.0,
            ..cfg()
        };
        let t = Throttle::new(&c, 100);
        let mut pid = Pid::new(&c);
        let busy = Sample {
            u_sm: 1.0,
            c_sm: 900.0,
            c_h: 1500.0,
        };
        let mut r = c.fallback_rate;
        for _ in 0..100 {
            r = tick_taking_all(&t, || t.control(&mut pid, Some(busy), 0.01), 0.01);
        }
        assert!(r < c.fallback_rate / 2.0, "rate {r}");
        let idle = Sample {
            u_sm: 0.1,
            c_sm: 1500.0,
            c_h: 1500.0,
        };
        for _ in 0..300 {
            r = tick_taking_all(&t, || t.control(&mut pid, Some(idle), 0.01), 0.01);
        }
        assert!(r > c.fallback_rate * 2.0, "rate {r}");
        assert!(r <= c.max_rate);
    }

    /// Closed loop against a toy plant (load proportional to launch rate): settles near target.
    #[test]
    fn pid_settles_on_target_for_any_sm_count() {
        for sms in [20u32, 80, 132] {
            let c = cfg();
            let t = Throttle::new(&c, sms);
            let mut pid = Pid::new(&c);
            let base = 0.2;
            // Each kernel: `sms` blocks (one wave) lasting 1 ms => load share = rate * 1e-3.
            let mut load = base;
            for _ in 0..2000 {
                let s = Sample { u_sm: load, c_sm: 1400.0, c_h: 1500.0 };
                let r = tick_taking_all(&t, || t.control(&mut pid, Some(s), 0.01), 0.01);
                load = (base + r * 1e-3).min(1.0);
            }
            let a_c = clock_factor(1400.0, c.t_sm_mhz, 1500.0, c.a_l, c.a_h);
            let settled = load * a_c;
            assert!(
                (settled - c.target_load).abs() < 0.03,
                "sms {sms}: load {settled}"
            );
            assert_eq!(
                t.kernel_cost(u64::from(sms)),
                1000,
                "one wave whatever the SM count"
            );
        }
    }

    /// Observation 10: with a fresh budget the same measurements give a lower launch rate at a
    /// low budget than at a high one (so launches wait more), with or without monitor data;
    /// a budget above the configured target, or a stale one (None), is exactly the static case.
    #[test]
    fn sm_budget_lowers_the_target_never_raises_it() {
        let c = cfg();
        let run = |budget: Option<f64>, sample: Option<Sample>| {
            let t = Throttle::new(&c, 100);
            let mut pid = Pid::new(&c);
            let mut d = None;
            for _ in 0..200 {
                d = Some(t.control_with_budget(&mut pid, sample, budget, 0.01));
            }
            (d.unwrap().rate, t.target())
        };
        let s = Some(Sample {
            u_sm: 0.3,
            c_sm: 1400.0,
            c_h: 1500.0,
        });
        for sample in [s, None] {
            let (low, t_low) = run(Some(0.1), sample);
            let (high, t_high) = run(Some(0.6), sample);
            let (stat, t_stat) = run(None, sample);
            let (above, t_above) = run(Some(1.0), sample);
            assert!(
                low < high,
                "{sample:?}: low budget {low} vs high budget {high}"
            );
            assert!(high <= stat, "{sample:?}: never looser than configured");
            assert_eq!(
                (above, t_above),
                (stat, t_stat),
                "budget above the target changes nothing"
            );
            assert_eq!(t_stat, c.target_load);
            assert!((t_low - 0.1).abs() < 1e-9 && (t_high - 0.6).abs() < 1e-9);
        }
        // Delays as a mechanism: same launches, more of them wait at the low budget.
        let delayed = |budget: f64| {
            let mut c = cfg();
            c.burst = 1.0;
            let t = Throttle::new(&c, 10);
            let mut pid = Pid::new(&c);
            let mut waits = 0;
            for _ in 0..50 {
                t.control_with_budget(&mut pid, None, Some(budget), 0.01);
                t.refill(0.01);
                let before = t.tokens.load(Relaxed);
                if before < 1000 {
                    waits += 1;
                } else {
                    t.tokens.fetch_sub(1000, Relaxed);
                }
            }
            waits
        };
        assert!(
            delayed(0.05) > delayed(0.8),
            "{} vs {}",
            delayed(0.05),
            delayed(0.8)
        );
    }

    #[test]
    fn bucket_allows_burst_then_waits_for_refill() {
        let mut c = cfg();
        c.burst = 2.0;
        let t = Throttle::new(&c, 10);
        assert!(t.take(1000));
        assert!(t.take(1000));
        assert_eq!(t.delayed.load(Relaxed), 0);
        assert_eq!(t.tokens(), 0);
        assert!(!t.must_wait());
        assert!(!t.take(1000), "empty bucket: the third launch is held");
        assert_eq!(t.delayed.load(Relaxed), 1);
        assert!(t.must_wait());
        t.refill(1.0);
        assert_eq!(t.tokens(), 5000, "capped at the depth: ten periods' worth at 50 waves/s, above the burst");
        assert!(!t.must_wait());
    }

    /// The bucket, refilled once a controller period, delivers the rate the controller
    /// decided however shallow its burst: over 100 periods at 1000 waves/s, 1-wave launches
    /// get about 1000 through, never more than the rate and the burst allow. Fails when the
    /// depth is the burst alone: 4 waves a 10 ms period, 400 launches.
    #[test]
    fn a_shallow_bucket_still_delivers_the_controllers_rate() {
        let c = ThrottleConfig { burst: 4.0, period_ms: 10, fallback_rate: 1000.0, ..cfg() };
        let t = Throttle::new(&c, 10);
        let mut pid = Pid::new(&c);
        assert_eq!(t.control(&mut pid, None, 0.01).rate, 1000.0, "stale: the fallback rate");
        // A launch `take` refuses is held (its cost already owed) until `must_wait` lets it go.
        let (mut l, mut through) = (Launcher::default(), 0);
        for _ in 0..100 {
            t.refill(0.01);
            through += l.tick(&t, 1000, u64::MAX);
        }
        assert!(through >= 990, "the rate is reached: {through} of 1000 launches in 1 s");
        assert!(through <= 1000 + 4, "never past rate x time + burst: {through}");
        t.refill(10.0);
        assert_eq!(t.tokens(), 100_000, "a long gap refills ten periods' worth at most, not ten seconds'");
        // A controller woken every 100 ms instead of every 10 (a container out of CPU quota)
        // still gives the process its rate: 10 ticks of 100 ms, 1000 launches in 1 s (109
        // before the depth counted the late tick).
        let t = Throttle::new(&c, 10);
        let mut pid = Pid::new(&c);
        let (mut l, mut through) = (Launcher::default(), 0);
        for _ in 0..10 {
            t.control(&mut pid, None, 0.1);
            t.refill(0.1);
            through += l.tick(&t, 1000, u64::MAX);
        }
        assert!(through >= 990, "1 s at 1000 waves/s ticked every 100 ms: {through} launches");
    }

    /// A launcher as the shim's: takes 1-wave launches up to `demand` a tick, and a launch the
    /// bucket refuses waits (its cost owed) until `must_wait` lets it go.
    #[derive(Default)]
    struct Launcher {
        held: bool,
    }

    impl Launcher {
        /// Launches of this tick (after the controller's decision and refill).
        fn tick(&mut self, t: &Throttle, cost: i64, demand: u64) -> u64 {
            if self.held && t.must_wait() {
                return 0;
            }
            let mut n = u64::from(std::mem::take(&mut self.held));
            while !self.held && n < demand {
                if t.take(cost) {
                    n += 1;
                } else {
                    self.held = true;
                }
            }
            n
        }
    }

    /// A process using 5,000 waves a second of an idle GPU (1 % of its load): its rate stays
    /// near what it uses instead of winding up to the highest rate, so that once the online
    /// workload's load passes the target (no online-pressure hold: the clock stays high) its
    /// launches are held within a second, and within a second of its budget being lowered.
    /// Fails without the ceiling of `Pid::step_within`: the first launch held after 16 s and
    /// 3.2 s (a review's simulation, 2026-11-29).
    #[test]
    fn a_rate_wound_up_on_an_idle_gpu_binds_within_a_second_of_the_load() {
        let run = |own_share: Option<f64>, busy: Sample, budget: (f64, f64)| {
            let c = cfg();
            let t = Throttle::new(&c, 132);
            if let Some(s) = own_share {
                t.set_own_share(s);
            }
            let mut pid = Pid::new(&c);
            let mut l = Launcher::default();
            let idle = Sample { u_sm: 0.25, c_sm: 1980.0, c_h: 1980.0 };
            for _ in 0..1000 {
                t.control_with_budget(&mut pid, Some(idle), Some(budget.0), 0.01);
                t.refill(0.01);
                l.tick(&t, 1000, 50);
            }
            for tick in 0..10_000 {
                let d = t.control_with_budget(&mut pid, Some(busy), Some(budget.1), 0.01);
                assert!(!d.held, "no online-pressure hold in this scenario");
                t.refill(0.01);
                if l.tick(&t, 1000, 50) < 50 {
                    return tick as f64 * 0.01;
                }
            }
            f64::INFINITY
        };
        let over_target = run(None, Sample { u_sm: 1.0, c_sm: 1500.0, c_h: 1980.0 }, (1.0, 1.0));
        assert!(over_target <= 1.0, "load over the target: first launch held after {over_target} s");
        let lowered = run(Some(0.4), Sample { u_sm: 0.9, c_sm: 1750.0, c_h: 1980.0 }, (0.4, 0.2));
        assert!(lowered <= 1.0, "budget lowered to 20 %: first launch held after {lowered} s");
    }

    /// After an online-pressure hold the rate ramps back from the fallback rate (by an eighth
    /// over what the process takes, a tick) instead of jumping to where it was before the hold
    /// (83,000 waves/s, 840 waves in one period onto the online workload, in a review's
    /// simulation): a release starts at most an eighth above the fallback rate.
    #[test]
    fn a_released_hold_ramps_back_from_the_fallback_rate() {
        let c = cfg();
        let t = Throttle::new(&c, 132);
        t.set_own_share(0.4);
        let mut pid = Pid::new(&c);
        let mut l = Launcher::default();
        for _ in 0..1000 {
            t.control(&mut pid, Some(Sample { u_sm: 0.3, c_sm: 1980.0, c_h: 1980.0 }), 0.01);
            t.refill(0.01);
            l.tick(&t, 1000, 100);
        }
        let rate_before = t.rate();
        assert!(rate_before > 10.0 * c.fallback_rate, "climbed: {rate_before}");
        // One sample of online pressure (the clock pulled down): held for hold_ms, then the
        // GPU quiet again.
        assert!(t.control(&mut pid, Some(Sample { u_sm: 0.9, c_sm: 990.0, c_h: 1980.0 }), 0.01).held);
        t.refill(0.01);
        l.tick(&t, 1000, 100);
        let quiet = Sample { u_sm: 0.3, c_sm: 1980.0, c_h: 1980.0 };
        let mut rates = Vec::new();
        while rates.len() < 20 {
            let d = t.control(&mut pid, Some(quiet), 0.01);
            t.refill(0.01);
            l.tick(&t, 1000, 100);
            if !d.held {
                rates.push(d.rate);
            }
        }
        assert!(rates[0] <= c.fallback_rate * CEILING_OVER_USE + 1e-6, "released at {} waves/s (before the hold {rate_before})", rates[0]);
        assert!(rates.windows(2).all(|w| w[1] >= w[0]) && rates[19] > rates[0], "ramping back: {rates:?}");
        assert!(rates[19] < rate_before / 5.0, "no jump back: {rates:?}, before the hold {rate_before}");
    }

    /// An operator's floor holds the controller's lowest rate to the law's too: a process's own
    /// `min_rate` of 50 (its fallback rate) or 10^5 (with a floor whose fallback rate is its
    /// highest) stayed the controller's lowest rate, 10 to 20,000 times the shipped 5, however
    /// loaded the GPU.
    #[test]
    fn a_floor_holds_the_controllers_lowest_rate_to_the_laws() {
        for (own_min, floor_fallback) in [(50.0, 50.0), (1e5, 1e5)] {
            let own = ThrottleConfig { min_rate: own_min, fallback_rate: own_min, max_rate: own_min.max(1e5), ..cfg() };
            let t = Throttle::new(&own, 132);
            let mut pid = Pid::new(&own);
            assert!(t.tighten(true, Some(0.8), Some(1e5), Some(floor_fallback)).law);
            let busy = Sample { u_sm: 1.0, c_sm: 900.0, c_h: 1500.0 };
            let mut r = 0.0;
            for _ in 0..3000 {
                r = tick_taking_all(&t, || t.control(&mut pid, Some(busy), 0.01), 0.01);
            }
            assert!(r < 2.0 * ThrottleConfig::default().min_rate, "own min_rate {own_min}: rate {r} at load 1.5");
        }
    }

    /// An offline job alone on an idle GPU whose kernels have big grids of short blocks (a
    /// 65,536-block elementwise kernel of 28 us on an H200: 496 waves) reaches its target: the
    /// highest rate binds only as "never unlimited". Fails at the former highest rate of
    /// 100,000 waves a second: 201 kernels a second, the GPU 0.6 % busy.
    ///
    /// And a kernel costing more than the bucket holds (262,144 blocks on 132 SMs: 1,986
    /// waves; 65,536 on a T4's 40 SMs), whose launch waits several ticks in debt: the wait is
    /// counted as use, else the controller's ceiling fell to the fallback rate and such a job
    /// ran a kernel or two a minute (a review's simulation of the first ceiling).
    #[test]
    fn a_big_grid_job_alone_on_an_idle_gpu_reaches_its_target() {
        for (blocks, sms) in [(65_536u64, 132u32), (262_144, 132), (65_536, 40)] {
            let c = cfg();
            let t = Throttle::new(&c, sms);
            let mut pid = Pid::new(&c);
            let mut l = Launcher::default();
            // 28 us for 65,536 blocks on an H200's 132 SMs, in proportion elsewhere.
            let kernel_s = 28e-6 * blocks as f64 / 65_536.0 * 132.0 / f64::from(sms);
            let cost = t.kernel_cost(blocks);
            let capacity = ((0.01 / kernel_s) as u64).max(1);
            let (mut u, mut busy) = (0.0, 0.0);
            for tick in 0..3000 {
                t.control(&mut pid, Some(Sample { u_sm: u, c_sm: 1980.0, c_h: 1980.0 }), 0.01);
                t.refill(0.01);
                u = (l.tick(&t, cost, capacity) as f64 * kernel_s / 0.01).min(1.0);
                if tick >= 2900 {
                    busy += u / 100.0;
                }
            }
            assert!(busy >= 0.5, "{blocks} blocks on {sms} SMs alone on an idle GPU after 30 s: busy {busy:.4}, rate {}", t.rate());
        }
    }

    /// A highest rate lowered by a floor while the rate sat at the old one: once the load is
    /// over the target the rate comes below the new highest at once (the integral is taken
    /// back to it), not after the controller unwound what it had integrated above it (25 s).
    #[test]
    fn a_lowered_highest_rate_leaves_no_wound_up_rate() {
        let c = cfg();
        let t = Throttle::new(&c, 132);
        let mut pid = Pid::new(&c);
        let idle = Sample { u_sm: 0.2, c_sm: 1980.0, c_h: 1980.0 };
        for _ in 0..1000 {
            tick_taking_all(&t, || t.control(&mut pid, Some(idle), 0.01), 0.01);
        }
        assert!(t.rate() > 10_000.0, "climbed on an idle GPU: {}", t.rate());
        t.tighten(false, None, Some(1000.0), None);
        let busy = Sample { u_sm: 1.0, c_sm: 1500.0, c_h: 1980.0 };
        let mut ticks = 0;
        while tick_taking_all(&t, || t.control(&mut pid, Some(busy), 0.01), 0.01) >= 1000.0 - 1e-6 {
            ticks += 1;
            assert!(ticks < 100, "pinned at the lowered highest rate for {ticks} ticks");
        }
    }

    /// An operator's floor holds a process that turned its throttle off or loosened it: the
    /// throttle is turned on (launches past the burst wait, counted in `delayed`), the load
    /// target, highest and fallback rates are lowered to the floor's, and nothing a later
    /// floor says (looser, or none) loosens them again. Fails without `tighten`: the disabled
    /// throttle lets every launch through and the stale rate is the process's own 1e6.
    #[test]
    fn a_floor_turns_a_throttle_on_lowers_its_limits_and_never_loosens() {
        let own = ThrottleConfig { enabled: false, target_load: 5.0, max_rate: 1e9, fallback_rate: 1e6, min_rate: 1e6, ..cfg() };
        let t = Throttle::new(&own, 10);
        let mut pid = Pid::new(&own);
        for _ in 0..10 {
            assert!(t.take(1 << 20), "its own configuration: never held");
        }
        let d = t.tighten(true, Some(0.8), Some(1e5), Some(50.0));
        assert_eq!(
            d,
            Tightened { turned_on: true, target_load: Some(0.8), max_rate: Some(1e5), fallback_rate: Some(50.0), law: true }
        );
        assert!(t.enabled() && d.any());
        let stale = t.control(&mut pid, None, 0.01);
        assert_eq!(stale.rate, 50.0, "the floor's fallback rate, not the process's 1e6");
        assert_eq!(t.target_for(None), 0.8);
        let idle = Sample { u_sm: 0.0, c_sm: 1500.0, c_h: 1500.0 };
        for _ in 0..500 {
            let r = t.control(&mut pid, Some(idle), 0.01).rate;
            assert!(r <= 1e5, "never above the floor's highest rate: {r}");
        }
        t.refill(0.0);
        let delayed = t.delayed.load(Relaxed);
        while t.take(1000) {}
        assert_eq!(t.delayed.load(Relaxed), delayed + 1, "turned on: a launch past the bucket waits");
        // A looser floor, or none (a stale or stopped monitor): nothing loosens.
        assert_eq!(t.tighten(false, Some(1.0), Some(1e6), Some(100.0)), Tightened::default());
        assert_eq!(t.tighten(false, None, None, None), Tightened::default());
        assert!(t.enabled());
        assert_eq!((t.target_load(), t.max_rate(), t.fallback_rate()), (0.8, 1e5, 50.0));
        assert_eq!(t.control(&mut pid, None, 0.01).rate, 50.0);
        // A tighter one still tightens; nonsense limits limit nothing.
        assert_eq!(t.tighten(false, Some(0.5), None, None).target_load, Some(0.5));
        assert_eq!(t.tighten(true, Some(f64::NAN), Some(-1.0), Some(0.0)), Tightened::default());
    }

    /// A floor requiring a throttle holds the process's control law to the shipped one: a
    /// bucket a million waves deep is emptied to the shipped depth at once, a hold turned off
    /// (`hold_below_clock: 0`) and a C_H set low hold again for online pressure, gains of 0
    /// (a rate frozen at the start) move again, and a graph launch costs the shipped waves.
    /// Without the law held, the same throttle lets a million waves through and never holds.
    #[test]
    fn a_required_floor_holds_the_control_law_to_the_shipped_one() {
        let shipped = ThrottleConfig::default();
        let own = ThrottleConfig {
            burst: 1e6,
            hold_below_clock: 0.0,
            c_h_mhz: 100.0,
            kp: 0.0,
            ki: 0.0,
            graph_launch_waves: 0.001,
            ..shipped.clone()
        };
        let pressure = Sample { u_sm: 0.3, c_sm: 1000.0, c_h: 1500.0 };
        let busy = Sample { u_sm: 1.0, c_sm: 1300.0, c_h: 1500.0 };
        let (loose, held) = (Throttle::new(&own, 10), Throttle::new(&own, 10));
        loose.set_own_share(0.4);
        held.set_own_share(0.4);
        // A floor that does not require a throttle leaves the law alone.
        assert!(!loose.tighten(false, None, None, None).law);
        assert_eq!(loose.tokens(), 1_000_000_000, "the process's own bucket");
        assert!(!loose.pressure(&pressure), "its own law never holds");
        let t = held.tighten(true, None, None, None);
        assert!(t.law && t.any() && held.law_held());
        assert_eq!(held.tokens(), (shipped.burst * MILLI) as i64, "emptied to the shipped depth");
        assert_eq!(held.graph_cost(), (shipped.graph_launch_waves * MILLI) as i64);
        assert!(held.pressure(&pressure), "held for online pressure again");
        let mut pid = Pid::new(&own);
        assert!(held.control(&mut pid, Some(pressure), 0.01).held);
        // Past the hold, a GPU over target brings the rate down: the shipped gains act.
        let mut pid = Pid::new(&own);
        let fresh = Throttle::new(&own, 10);
        fresh.tighten(true, None, None, None);
        let first = fresh.control(&mut pid, Some(busy), 0.01).rate;
        let mut last = first;
        for _ in 0..50 {
            last = fresh.control(&mut pid, Some(busy), 0.01).rate;
        }
        assert!(last < first, "the shipped gains move the rate: {first} -> {last}");
        let mut frozen_pid = Pid::new(&own);
        let first = loose.control(&mut frozen_pid, Some(busy), 0.01).rate;
        for _ in 0..50 {
            assert_eq!(loose.control(&mut frozen_pid, Some(busy), 0.01).rate, first, "gains of 0: the rate never moves");
        }
        // Held for good: a later floor without the requirement changes nothing.
        assert!(!held.tighten(false, None, None, None).any() && held.law_held());
        // A law already within the shipped one is held, and says nothing changed.
        let fine = Throttle::new(&shipped, 10);
        assert!(!fine.tighten(true, None, None, None).any() && fine.law_held());
    }

    #[test]
    fn frozen_holds_even_a_disabled_throttle() {
        let mut c = cfg();
        c.enabled = false;
        let t = Throttle::new(&c, 10);
        assert!(t.take(1 << 30), "disabled: never held");
        t.freeze();
        assert!(!t.take(1) && t.must_wait(), "frozen: held");
        t.refill(10.0);
        assert!(t.must_wait(), "refill does not thaw");
        t.unfreeze();
        assert!(!t.must_wait() && t.take(1));
    }

    /// Fast attack: one sample with the clock below `hold_below_clock` of the top clock holds
    /// the next launch at once (bucket emptied, rate 0); slow release: launches stay held until
    /// `hold_ms` after the last such sample, then the PID takes over again. Stale data never
    /// start a hold. (Fails without the hold: the busy sample alone would leave a full bucket.)
    #[test]
    fn online_pressure_holds_at_once_and_releases_slowly() {
        let c = cfg();
        let t = Throttle::new(&c, 10);
        let mut pid = Pid::new(&c);
        t.set_own_share(0.45);
        let calm = Sample {
            u_sm: 0.5,
            c_sm: 0.9 * 1500.0,
            c_h: 1500.0,
        };
        let busy = Sample {
            u_sm: 0.5,
            c_sm: 0.8 * 1500.0,
            c_h: 1500.0,
        };
        assert!(!t.pressure(&calm) && t.pressure(&busy));
        let d = t.control_with_budget(&mut pid, Some(calm), None, 0.01);
        assert!(!d.held && d.rate > 0.0 && t.tokens() > 0);
        let d = t.control_with_budget(&mut pid, Some(busy), None, 0.01);
        assert!(d.held && t.is_held());
        assert_eq!((d.rate, t.rate()), (0.0, 0.0));
        t.refill(1.0);
        assert!(!t.take(1), "held: even the smallest launch waits");
        assert!(t.must_wait());
        // Release only after hold_ms of calm samples.
        let ticks = (c.hold_ms / 10) as usize;
        for i in 0..ticks - 1 {
            let d = t.control_with_budget(&mut pid, Some(calm), None, 0.01);
            assert!(d.held, "tick {i}: released before hold_ms");
        }
        let d = t.control_with_budget(&mut pid, Some(calm), None, 0.01);
        assert!(
            !d.held && d.rate >= c.min_rate,
            "released after hold_ms: {d:?}"
        );
        t.refill(0.01 * 1000.0);
        assert!(!t.must_wait());
        // Stale data never start a hold; a hold runs out even while the data are stale.
        let t2 = Throttle::new(&c, 10);
        t2.set_own_share(0.45);
        assert!(!t2.control_with_budget(&mut pid, None, None, 0.01).held);
        t2.control_with_budget(&mut pid, Some(busy), None, 0.01);
        let d = t2.control_with_budget(&mut pid, None, None, c.hold_ms as f64 / 1000.0);
        assert!(!d.held && d.stale && d.rate == c.fallback_rate);
        // Off when hold_below_clock is 0.
        let off = Throttle::new(
            &ThrottleConfig {
                hold_below_clock: 0.0,
                ..cfg()
            },
            10,
        );
        off.set_own_share(0.45);
        assert!(
            !off.control_with_budget(&mut pid, Some(busy), None, 0.01)
                .held
        );
        // A process whose own cap is unknown or above half the SMs could cause the low clock
        // itself: no hold.
        let big = Throttle::new(&c, 10);
        assert!(!big.pressure(&busy));
        big.set_own_share(0.9);
        assert!(
            !big.control_with_budget(&mut pid, Some(busy), None, 0.01)
                .held
        );
    }

    /// A budget the process's own MPS cap already enforces leaves the PID to the clock
    /// threshold (target 1); one below the cap lowers the target to the budget (observation
    /// 10). Without the own-cap rule the first assertion fails (the target would be 0.45).
    /// Several offline jobs on one GPU: whether a job's own MPS cap enforces its share is
    /// judged on its job's part of the budget (a job at 40 % beside one at 10 %, budget 40 %:
    /// part 32 %, under its cap: throttled, where the whole budget would have said enforced);
    /// the closed-loop target stays the budget (the PID measures the whole GPU), and the
    /// open-loop fallback rate follows the part.
    #[test]
    fn a_jobs_part_of_the_budget_decides_whether_mps_enforces_it() {
        let c = cfg();
        let t = Throttle::new(&c, 10);
        t.set_own_share(0.4);
        assert_eq!(t.target_for_part(Some(0.4), 1.0), MPS_ENFORCED_TARGET, "alone");
        assert_eq!(t.target_for_part(Some(0.4), 0.8), c.target_load.min(0.4), "beside another job");
        t.set_own_share(0.1);
        assert_eq!(t.target_for_part(Some(0.4), 0.3), c.target_load.max(MPS_ENFORCED_TARGET), "its cap is within its part");
        let open = |part: f64| {
            let mut pid = Pid::new(&c);
            let t = Throttle::new(&c, 10);
            t.set_own_share(0.4);
            t.control_with_part(&mut pid, None, Some(0.4), part, 0.01).rate
        };
        assert!(open(0.5) < open(1.0) - 1e-9, "open loop: half the part, a lower rate ({} vs {})", open(0.5), open(1.0));
    }

    #[test]
    fn budget_enforced_by_the_own_mps_cap_leaves_the_pid_to_the_clock() {
        let c = cfg();
        let t = Throttle::new(&c, 10);
        assert_eq!(t.own_share(), 1.0);
        t.set_own_share(0.45);
        assert_eq!(t.own_share(), 0.45);
        assert_eq!(t.target_for(Some(0.45)), MPS_ENFORCED_TARGET);
        assert_eq!(t.target_for(Some(0.6)), MPS_ENFORCED_TARGET);
        assert_eq!(t.target_for(Some(0.3)), 0.3);
        assert_eq!(
            t.target_for(None),
            c.target_load,
            "stale: the configured target"
        );
        // Same measurements (busy GPU at full clock, as T4's utilization-based U_SM reads a
        // capped job running back-to-back): the enforced budget does not throttle, a lower
        // one does.
        let full_clock = Sample {
            u_sm: 1.0,
            c_sm: 1500.0,
            c_h: 1500.0,
        };
        let rate = |budget: f64| {
            let mut pid = Pid::new(&c);
            let mut r = 0.0;
            for _ in 0..100 {
                r = tick_taking_all(&t, || t.control_with_budget(&mut pid, Some(full_clock), Some(budget), 0.01), 0.01);
            }
            r
        };
        assert!(rate(0.45) >= c.fallback_rate, "enforced: {}", rate(0.45));
        assert!(rate(0.3) < c.fallback_rate / 2.0, "lower: {}", rate(0.3));
        t.set_own_share(f64::NAN);
        t.set_own_share(0.0);
        assert_eq!(t.own_share(), 0.45, "nonsense caps are ignored");
    }
}
