//! The device model, as pure functions over [`State`]: SM sharing, clock curve, time advance.
//!
//! * A kernel of `B` blocks spinning `c` cycles is `B * c` SM-cycles of work and demands
//!   `min(B, SMs)` SMs (one resident block per SM).
//! * Processor sharing: each client's demand is first capped by its MPS active-thread percentage
//!   (`SMs * pct / 100`, MPS on only); if the capped demands exceed the SMs, every kernel is scaled
//!   by `SMs / demand`. A kernel with `s` SMs at clock `f` MHz retires `s * f` SM-cycles per µs.
//! * SM clock: full boost up to 50% SM occupancy, then linear down to 80% of boost at full
//!   occupancy, and a further 10% (to 70%) as demand grows to twice the SMs — a stand-in for the
//!   power/thermal throttling that MuxFlow's clock factor reacts to.
//! * While MPS is poisoned (a client died holding a context), kernels of MPS clients make no
//!   progress: the server is hung.

use crate::layout::{kstate, Header, State, MAX_CLIENTS, RING_LEN};

/// Minimum gap between two utilization samples.
pub const SAMPLE_EVERY_NS: u64 = 5_000_000;

/// The driver refreshes the counters a GPM sample copies about once a second, device-wide
/// (seen on an H200, driver 580: at 10 ms sampling under full load 1 reading in ~100 gave
/// 99.8 %, the rest 0). The model keeps the counters at the last multiple of this it crossed
/// ([`Header::gpm_at_ns`]): every process sampling within one period copies that snapshot.
pub const GPM_REFRESH_NS: u64 = 1_000_000_000;

/// The last GPM refresh boundary at or before `t`.
pub fn gpm_boundary(t: u64) -> u64 {
    t - t % GPM_REFRESH_NS
}

/// SM clock (MHz) for a given occupancy (granted SMs / SMs) and demand ratio (wanted / SMs).
pub fn clock_mhz(max_mhz: f64, occupancy: f64, demand_ratio: f64) -> f64 {
    let load_drop = 0.2 * ((occupancy - 0.5) / 0.5).clamp(0.0, 1.0);
    let oversub_drop = 0.1 * (demand_ratio - 1.0).clamp(0.0, 1.0);
    max_mhz * (1.0 - load_drop - oversub_drop)
}

/// Effective MPS percentage of client `c` (100 when MPS is off or the client is not an MPS client).
pub fn client_pct(st: &State, c: usize) -> u32 {
    let h = &st.header;
    let cl = &st.clients[c];
    if h.mps_enabled == 0 || cl.mps_gen == 0 || cl.mps_gen != h.mps_generation {
        return 100;
    }
    let p = if cl.pct != 0 { cl.pct } else { h.mps_default_pct };
    p.clamp(1, 100)
}

fn frozen(st: &State, c: usize) -> bool {
    let h = &st.header;
    h.mps_poisoned != 0 && st.clients[c].mps_gen != 0 && st.clients[c].mps_gen == h.mps_generation
}

/// Recomputes every running kernel's SM share and the SM clock; returns total granted SMs.
pub fn compute_shares(st: &mut State) -> f64 {
    let sms = f64::from(st.header.sm_count.max(1));
    let mut client_demand = [0.0f64; MAX_CLIENTS];
    for k in st.live().iter().filter(|k| k.state == kstate::RUNNING) {
        if let Some(d) = client_demand.get_mut(k.client as usize) {
            *d += k.demand;
        }
    }
    let mut factor = [0.0f64; MAX_CLIENTS];
    let mut capped_total = 0.0;
    let mut raw_total = 0.0;
    for c in 0..MAX_CLIENTS {
        if client_demand[c] <= 0.0 {
            continue;
        }
        raw_total += client_demand[c];
        if frozen(st, c) {
            continue;
        }
        let cap = sms * f64::from(client_pct(st, c)) / 100.0;
        factor[c] = (cap / client_demand[c]).min(1.0);
        capped_total += client_demand[c] * factor[c];
    }
    let scale = if capped_total > sms { sms / capped_total } else { 1.0 };
    let mut granted = 0.0;
    for k in st.live_mut().iter_mut() {
        if k.state == kstate::RUNNING {
            let f = factor.get(k.client as usize).copied().unwrap_or(0.0);
            k.share = k.demand * f * scale;
            granted += k.share;
        } else {
            k.share = 0.0;
        }
    }
    let h = &mut st.header;
    h.sm_demand = raw_total;
    h.sm_in_use = granted;
    h.sm_clock_mhz = if raw_total > 0.0 {
        clock_mhz(f64::from(h.max_sm_clock_mhz), granted / sms, raw_total / sms)
    } else {
        // Nothing runs: the card idles its clock down, as real ones do (nvidia-smi shows an
        // idle H100/H200 at 345 of 1980 MHz); work brings the boost clock back.
        f64::from(h.idle_sm_clock_mhz.clamp(1, h.max_sm_clock_mhz.max(1)))
    };
    granted
}

fn activate_ready(st: &mut State, t: u64) {
    if !st.live().iter().any(|k| k.state == kstate::QUEUED) {
        return;
    }
    // Tickets still in flight; a queued kernel waits while its predecessor is among them.
    let mut busy: Vec<u64> = st
        .live()
        .iter()
        .filter(|k| k.state == kstate::QUEUED || k.state == kstate::RUNNING)
        .map(|k| k.ticket)
        .collect();
    busy.sort_unstable();
    for k in st.live_mut().iter_mut() {
        if k.state == kstate::QUEUED && (k.dep_ticket == 0 || busy.binary_search(&k.dep_ticket).is_err()) {
            k.state = kstate::RUNNING;
            k.start_ns = t.max(k.enq_ns);
        }
    }
}

/// Advances the model from `header.last_ns` to `now`, event by event (each kernel completion
/// re-plans the shares), integrating utilization and per-client SM time.
pub fn advance(st: &mut State, now: u64) {
    let mut t = st.header.last_ns;
    if now < t {
        return;
    }
    let sms = f64::from(st.header.sm_count.max(1));
    loop {
        activate_ready(st, t);
        let granted = compute_shares(st);
        let rate_per_sm = st.header.sm_clock_mhz / 1000.0; // cycles per ns
        let mut next_done = f64::INFINITY;
        let mut any_running = false;
        for k in st.live().iter().filter(|k| k.state == kstate::RUNNING) {
            any_running = true;
            if k.share > 0.0 {
                next_done = next_done.min(k.work_left / (k.share * rate_per_sm));
            }
        }
        let remaining = (now - t) as f64;
        let step = next_done.min(remaining).max(0.0);
        let step_ns = if step >= remaining { now - t } else { (step.ceil() as u64).min(now - t) };
        // A GPM refresh within this step: the counters at that instant, with the arithmetic a
        // reader that takes no lock extrapolates them with (`extrapolated`), so both agree.
        let b = gpm_boundary(t + step_ns);
        if b > t && b > st.header.gpm_at_ns {
            let h = &mut st.header;
            let g = if any_running { granted } else { 0.0 };
            let (_, busy, sm) = extrapolated(t, h.busy_ns, h.sm_active_ns, g, h.sm_count, b);
            (h.gpm_at_ns, h.gpm_busy_ns, h.gpm_sm_active_ns, h.gpm_sm_clock_mhz) = (b, busy, sm, h.sm_clock_mhz);
        }
        if any_running && step_ns > 0 {
            let dt = step_ns as f64;
            if granted > 0.0 {
                st.header.busy_ns += dt;
                st.header.sm_active_ns += dt * granted / sms;
            }
            for i in 0..st.live().len() {
                let k = st.kernels[i];
                if k.state != kstate::RUNNING || k.share <= 0.0 {
                    continue;
                }
                st.kernels[i].work_left = (k.work_left - k.share * rate_per_sm * dt).max(0.0);
                if let Some(c) = st.clients.get_mut(k.client as usize) {
                    c.sm_time_ns += dt * k.share / sms;
                }
            }
        }
        t += step_ns;
        let mut finished = false;
        for k in st.live_mut().iter_mut().filter(|k| k.state == kstate::RUNNING) {
            if k.work_left <= 1e-9 * k.work_total.max(1.0) || k.work_left < 0.5 {
                k.state = kstate::DONE;
                k.end_ns = t;
                k.share = 0.0;
                finished = true;
            }
        }
        if t >= now && !finished {
            break;
        }
        if t >= now {
            activate_ready(st, t);
            compute_shares(st);
            break;
        }
    }
    st.header.last_ns = now;
    maybe_sample(st, now);
}

fn maybe_sample(st: &mut State, now: u64) {
    let h = &mut st.header;
    if h.ring_count > 0 && now < h.last_sample_ns + SAMPLE_EVERY_NS {
        return;
    }
    let idx = h.ring_head as usize % RING_LEN;
    st.ring[idx] = crate::layout::Sample {
        t_ns: now,
        busy_ns: h.busy_ns,
        sm_active_ns: h.sm_active_ns,
        sm_clock_mhz: h.sm_clock_mhz,
    };
    h.ring_head = ((idx + 1) % RING_LEN) as u32;
    h.ring_count = (h.ring_count + 1).min(RING_LEN as u32);
    h.last_sample_ns = now;
}

/// Samples in time order (oldest first).
pub fn samples(st: &State) -> Vec<crate::layout::Sample> {
    samples_iter(st).collect()
}

/// Samples in time order (oldest first), read in place (no copy of the ring).
pub fn samples_iter(st: &State) -> impl DoubleEndedIterator<Item = crate::layout::Sample> + '_ {
    ring_iter(&st.header, |i| st.ring[i])
}

/// The samples of a ring described by header `h` (its head and count), oldest first, each
/// read by `at(index)`: the ring in place under the lock, or one entry at a time from a
/// lock-free view.
pub fn ring_iter<'a>(
    h: &Header,
    at: impl Fn(usize) -> crate::layout::Sample + 'a,
) -> impl DoubleEndedIterator<Item = crate::layout::Sample> + 'a {
    let n = (h.ring_count as usize).min(RING_LEN);
    let head = h.ring_head as usize % RING_LEN;
    (0..n).map(move |i| at((head + RING_LEN - n + i) % RING_LEN))
}

/// GPU utilization and SM activity (both 0..=1) over roughly the last `window_ns`, ending at the
/// state's current time (cumulative integrals, so sparse samples stay exact).
pub fn utilization(st: &State, window_ns: u64) -> (f64, f64) {
    utilization_of(&st.header, |i| st.ring[i], window_ns)
}

/// [`utilization`] of the state whose header is `h` and whose ring entries `at` reads.
pub fn utilization_of(h: &Header, at: impl Fn(usize) -> crate::layout::Sample + Copy, window_ns: u64) -> (f64, f64) {
    let now = h.last_ns;
    let from = now.saturating_sub(window_ns);
    // Newest first: at one sample per `SAMPLE_EVERY_NS` the base is a few entries back (the
    // ring is read in place, not copied: NVML asks for this at every monitor sample).
    let base = ring_iter(h, at)
        .rev()
        .find(|s| s.t_ns <= from)
        .or_else(|| ring_iter(h, at).next())
        .unwrap_or(crate::layout::Sample { t_ns: h.created_ns, ..Default::default() });
    let span = now.saturating_sub(base.t_ns) as f64;
    if span <= 0.0 {
        return (if h.sm_in_use > 0.0 { 1.0 } else { 0.0 }, h.sm_in_use / f64::from(h.sm_count.max(1)));
    }
    (
        ((h.busy_ns - base.busy_ns) / span).clamp(0.0, 1.0),
        ((h.sm_active_ns - base.sm_active_ns) / span).clamp(0.0, 1.0),
    )
}

/// True when [`advance`] to `now` would write no utilization sample (the ring stays as it is).
pub fn sample_due(h: &Header, now: u64) -> bool {
    h.ring_count == 0 || now >= h.last_sample_ns.saturating_add(SAMPLE_EVERY_NS)
}

/// Brings the state to the point the next [`advance`] starts from (ready kernels started,
/// shares and clock planned: both are pure functions of the state, so doing it now changes
/// nothing that advance would not do first) and returns until when the model then runs on
/// unchanged: the last instant before a running kernel could finish, or `reap_at` (when dead
/// clients are next due to be released) if earlier. Up to that time, advancing only grows the
/// time integrals at the rates the header holds ([`extrapolate`]).
pub fn quiet_until(st: &mut State, reap_at: u64) -> u64 {
    let t = st.header.last_ns;
    activate_ready(st, t);
    compute_shares(st);
    let rate_per_sm = st.header.sm_clock_mhz / 1000.0; // cycles per ns
    let mut q = reap_at;
    for k in st.live().iter().filter(|k| k.state == kstate::RUNNING && k.share > 0.0) {
        // `advance` marks a kernel done once its work left drops to this (see its loop); stop
        // short of that by a margin for rounding (1 cycle plus 1e-12 of the work).
        let done_at = (1e-9 * k.work_total.max(1.0)).max(0.5);
        let slack = k.work_left - done_at - 1.0 - 1e-12 * k.work_left;
        let ns = slack / (k.share * rate_per_sm);
        // NaN too (a rate of zero or a damaged slot): no horizon, readers take the lock.
        if ns.is_nan() || ns < 2.0 {
            return t;
        }
        q = q.min(t.saturating_add(ns as u64 - 1));
    }
    q
}

/// Advances header `h` to `now` as [`advance`] would while nothing but time passes (`now` no
/// later than the state's [`quiet_until`]): one step of `now - last_ns` at the planned shares,
/// the same arithmetic, so the integrals come out exactly as a locked advance would leave them.
/// Writes no utilization sample; an earlier `now` leaves `h` as it is (its time is later).
pub fn extrapolate(h: &mut Header, now: u64) {
    (h.last_ns, h.busy_ns, h.sm_active_ns) =
        extrapolated(h.last_ns, h.busy_ns, h.sm_active_ns, h.sm_in_use, h.sm_count, now);
}

/// [`extrapolate`] on the header fields it reads: `(last_ns, busy_ns, sm_active_ns)` at `now`.
pub fn extrapolated(last_ns: u64, busy_ns: f64, sm_active_ns: f64, sm_in_use: f64, sm_count: u32, now: u64) -> (u64, f64, f64) {
    if now <= last_ns {
        return (last_ns, busy_ns, sm_active_ns);
    }
    let dt = (now - last_ns) as f64;
    let granted = sm_in_use;
    if granted > 0.0 {
        let sms = f64::from(sm_count.max(1));
        (now, busy_ns + dt, sm_active_ns + dt * granted / sms)
    } else {
        (now, busy_ns, sm_active_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::*;

    fn state(sms: u32) -> Box<State> {
        // SAFETY: State is plain integers/floats; all-zero is a valid value.
        let mut st: Box<State> = unsafe { Box::new(std::mem::zeroed()) };
        st.header.sm_count = sms;
        st.header.max_sm_clock_mhz = 1000;
        st.header.mps_default_pct = 100;
        st
    }

    fn dup(st: &State) -> Box<State> {
        let mut b = state(0);
        // SAFETY: State is plain data; copying one whole value into another box.
        unsafe { std::ptr::copy_nonoverlapping(st, &mut *b, 1) };
        b
    }

    fn launch(st: &mut State, client: u32, blocks: u32, cycles: f64, t: u64, dep: u64) -> usize {
        let i = st.kernels.iter().position(|k| k.state == kstate::FREE).unwrap();
        st.header.ticket_counter += 1;
        let demand = f64::from(blocks.min(st.header.sm_count));
        st.header.kernel_hwm = st.header.kernel_hwm.max(i as u32 + 1);
        st.kernels[i] = KernelSlot {
            state: kstate::QUEUED,
            client,
            ticket: st.header.ticket_counter,
            dep_ticket: dep,
            demand,
            work_left: f64::from(blocks) * cycles,
            work_total: f64::from(blocks) * cycles,
            enq_ns: t,
            ..Default::default()
        };
        i
    }

    #[test]
    fn clock_curve_is_monotone_and_bounded() {
        assert_eq!(clock_mhz(1000.0, 0.3, 0.3), 1000.0);
        assert!((clock_mhz(1000.0, 1.0, 1.0) - 800.0).abs() < 1e-9);
        assert!((clock_mhz(1000.0, 1.0, 3.0) - 700.0).abs() < 1e-9);
        let mut last = f64::INFINITY;
        for i in 0..=20 {
            let o = f64::from(i) / 20.0;
            let c = clock_mhz(1000.0, o, o);
            assert!(c <= last);
            last = c;
        }
    }

    #[test]
    fn lone_small_kernel_takes_cycles_over_clock() {
        let mut st = state(40);
        st.clients[0].used = 1;
        let i = launch(&mut st, 0, 10, 1_000_000.0, 0, 0); // 10 of 40 SMs: full clock, 1 ms
        advance(&mut st, 2_000_000);
        assert_eq!(st.kernels[i].state, kstate::DONE);
        assert!((st.kernels[i].end_ns as i64 - 1_000_000).abs() <= 2, "{}", st.kernels[i].end_ns);
    }

    #[test]
    fn contention_slows_both_in_proportion() {
        let mut st = state(40);
        st.clients[0].used = 1;
        st.clients[1].used = 1;
        // Each wants all 40 SMs; together demand 80 -> each gets 20, clock 70%.
        let a = launch(&mut st, 0, 40, 1_000_000.0, 0, 0);
        let b = launch(&mut st, 1, 40, 1_000_000.0, 0, 0);
        advance(&mut st, 100_000_000);
        let alone = 1_000_000.0 / 0.8; // alone: full occupancy -> 80% clock
        let shared = 2.0 * 1_000_000.0 / 0.7;
        for i in [a, b] {
            let d = st.kernels[i].end_ns as f64;
            assert!((d - shared).abs() < 10.0, "{d} vs {shared}");
            assert!(d / alone > 1.7);
        }
    }

    #[test]
    fn mps_percentage_caps_a_client() {
        let mut st = state(40);
        st.header.mps_enabled = 1;
        st.header.mps_generation = 1;
        st.clients[0] = ClientSlot { used: 1, mps_gen: 1, pct: 25, ..Default::default() };
        let i = launch(&mut st, 0, 40, 1_000_000.0, 0, 0);
        advance(&mut st, 1);
        assert!((st.kernels[i].share - 10.0).abs() < 1e-9);
        advance(&mut st, 100_000_000);
        // 40 blocks * 1e6 cycles over 10 SMs at full clock (25% occupancy) = 4 ms.
        assert!((st.kernels[i].end_ns as f64 - 4_000_000.0).abs() < 10.0);
    }

    #[test]
    fn stream_order_is_kept() {
        let mut st = state(40);
        st.clients[0].used = 1;
        let a = launch(&mut st, 0, 1, 1_000_000.0, 0, 0);
        let ta = st.kernels[a].ticket;
        let b = launch(&mut st, 0, 1, 1_000_000.0, 0, ta);
        advance(&mut st, 10_000_000);
        assert_eq!(st.kernels[b].start_ns, st.kernels[a].end_ns);
        assert!((st.kernels[b].end_ns as i64 - 2_000_000).abs() <= 4);
    }

    #[test]
    fn poisoned_mps_freezes_mps_clients_only() {
        let mut st = state(40);
        st.header.mps_enabled = 1;
        st.header.mps_generation = 1;
        st.header.mps_poisoned = 1;
        st.clients[0] = ClientSlot { used: 1, mps_gen: 1, ..Default::default() };
        st.clients[1] = ClientSlot { used: 1, mps_gen: 0, ..Default::default() };
        let a = launch(&mut st, 0, 1, 1000.0, 0, 0);
        let b = launch(&mut st, 1, 1, 1000.0, 0, 0);
        advance(&mut st, 50_000_000);
        assert_eq!(st.kernels[a].state, kstate::RUNNING);
        assert_eq!(st.kernels[b].state, kstate::DONE);
    }

    #[test]
    fn utilization_integrates_busy_time() {
        let mut st = state(40);
        st.clients[0].used = 1;
        advance(&mut st, 0);
        launch(&mut st, 0, 20, 10_000_000.0, 0, 0); // 10 ms on 20 SMs (50%: full clock)
        advance(&mut st, 20_000_000);
        let (util, sm) = utilization(&st, 20_000_000);
        assert!((util - 0.5).abs() < 0.01, "{util}");
        assert!((sm - 0.25).abs() < 0.01, "{sm}");
    }

    proptest::proptest! {
        /// Up to the quiet horizon, advancing changes nothing but the integrals, and exactly
        /// as `extrapolate` computes them (what lock-free readers report); just past the first
        /// kernel's end, advancing does change the kernels (the horizon is never too late).
        #[test]
        fn extrapolation_is_advance_until_the_horizon(
            kernels in proptest::collection::vec((0u32..3, 1u32..120, 1_000u32..5_000_000), 1..12),
            before in 0u64..3_000_000,
            frac in 0.0f64..=1.0,
            mps in proptest::bool::ANY,
        ) {
            let mut st = state(40);
            st.header.mps_enabled = u32::from(mps);
            st.header.mps_generation = 1;
            for c in 0..3usize {
                st.clients[c] = ClientSlot { used: 1, mps_gen: 1, pct: 30 + 30 * c as u32, ..Default::default() };
            }
            let mut prev = 0;
            for (i, (c, blocks, cycles)) in kernels.iter().enumerate() {
                // Every third kernel queued behind the previous one (stream order).
                let dep = if i % 3 == 2 { prev } else { 0 };
                let k = launch(&mut st, *c, *blocks, f64::from(*cycles), 0, dep);
                prev = st.kernels[k].ticket;
            }
            advance(&mut st, before);
            let q = quiet_until(&mut st, u64::MAX);
            let t = st.header.last_ns;
            proptest::prop_assert!(q >= t);
            if q < u64::MAX {
                let now = t + ((q - t) as f64 * frac) as u64;
                let mut copy = dup(&st);
                let mut h = st.header;
                extrapolate(&mut h, now);
                advance(&mut copy, now);
                for (a, b) in copy.kernels.iter().zip(st.kernels.iter()) {
                    proptest::prop_assert_eq!(a.state, b.state);
                }
                proptest::prop_assert_eq!(copy.header.busy_ns, h.busy_ns);
                proptest::prop_assert_eq!(copy.header.sm_active_ns, h.sm_active_ns);
                proptest::prop_assert_eq!(copy.header.sm_clock_mhz, h.sm_clock_mhz);
                proptest::prop_assert_eq!(copy.header.last_ns, h.last_ns);
                // The first end: a little after the horizon some kernel is done.
                let running = st.kernels.iter().filter(|k| k.state == kstate::RUNNING && k.share > 0.0).count();
                if running > 0 {
                    let mut later = dup(&st);
                    let rate = st.header.sm_clock_mhz / 1000.0;
                    let first = st.kernels.iter().filter(|k| k.state == kstate::RUNNING && k.share > 0.0)
                        .map(|k| k.work_left / (k.share * rate)).fold(f64::INFINITY, f64::min);
                    advance(&mut later, t + first.ceil() as u64 + 1);
                    proptest::prop_assert!(later.kernels.iter().any(|k| k.state == kstate::DONE));
                    proptest::prop_assert!(q < t + first.ceil() as u64 + 1);
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn shares_never_exceed_sms_or_demand(
            demands in proptest::collection::vec((0u32..4, 1u32..200), 1..20),
            pcts in proptest::collection::vec(0u32..=100, 4),
            mps in proptest::bool::ANY,
        ) {
            let mut st = state(40);
            st.header.mps_enabled = u32::from(mps);
            st.header.mps_generation = 1;
            for (c, p) in pcts.iter().enumerate() {
                st.clients[c] = ClientSlot { used: 1, mps_gen: 1, pct: *p, ..Default::default() };
            }
            for (c, blocks) in &demands {
                launch(&mut st, *c, *blocks, 1000.0, 0, 0);
            }
            activate_ready(&mut st, 0);
            let granted = compute_shares(&mut st);
            proptest::prop_assert!(granted <= 40.0 + 1e-9);
            for c in 0..4usize {
                let cap = 40.0 * f64::from(client_pct(&st, c)) / 100.0;
                let got: f64 = st.kernels.iter().filter(|k| k.client as usize == c).map(|k| k.share).sum();
                proptest::prop_assert!(got <= cap + 1e-9);
            }
            for k in st.kernels.iter().filter(|k| k.state == kstate::RUNNING) {
                proptest::prop_assert!(k.share <= k.demand + 1e-9);
                proptest::prop_assert!(k.share > 0.0);
            }
        }
    }
}
