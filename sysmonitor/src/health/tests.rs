use super::*;
use proptest::prelude::*;

/// Overlimit at once (sustain 0): the tests of the hold, window and Disabled paths.
fn cfg() -> MachineConfig {
    MachineConfig {
        overlimit_sustain_ms: 0,
        hold_base_ms: 100,
        hold_factor: 2.0,
        hold_max_ms: 1_000,
        overlimit_window_ms: 10_000,
        nvml_error_limit: 2,
        nvml_recover_samples: 2,
        xid_disable_ms: 500,
        ..MachineConfig::default()
    }
}

// Default thresholds: util 80/90/98, sm 70/85/95, clock(below) 85/75/60, mem 80/90/95.
const CALM: Metrics = Metrics {
    gpu_util: 10.0,
    sm_activity: 10.0,
    sm_clock_pct: 100.0,
    mem_used_pct: 10.0,
    offline_only: false,
    colocated: false,
    sm_spatial: false,
    offline_sm_cap_pct: 0.0,
};
const BAND: Metrics = Metrics {
    gpu_util: 85.0,
    ..CALM
};
const UNHEALTHY: Metrics = Metrics {
    sm_activity: 90.0,
    ..CALM
};
const OVER: Metrics = Metrics {
    gpu_util: 99.0,
    ..CALM
};

fn s(m: Metrics) -> Input {
    Input::Sample(m)
}

/// Runs `(time_ms, input, expected state after)` rows through a fresh machine.
fn run(rows: &[(u64, Input, State)]) -> Machine {
    let c = cfg();
    let mut m = Machine::new();
    for (i, (t, input, want)) in rows.iter().enumerate() {
        m.step(&c, *t, *input);
        assert_eq!(m.state(), *want, "row {i}: t={t} input={input:?}");
    }
    m
}

fn healthy_at(t: u64) -> Vec<(u64, Input, State)> {
    vec![(t, s(CALM), State::Healthy)]
}

#[test]
fn init_to_healthy_on_first_good_sample() {
    run(&[(0, s(CALM), State::Healthy)]);
}

#[test]
fn init_to_healthy_then_straight_on_when_the_first_sample_is_bad() {
    let c = cfg();
    let mut m = Machine::new();
    let st = m.step(&c, 0, s(UNHEALTHY));
    assert_eq!(
        st.transitions.iter().map(|t| t.to).collect::<Vec<_>>(),
        vec![State::Healthy, State::Unhealthy]
    );
    let mut m = Machine::new();
    let st = m.step(&c, 0, s(OVER));
    assert_eq!(
        st.transitions.iter().map(|t| t.to).collect::<Vec<_>>(),
        vec![State::Healthy, State::Overlimit]
    );
    assert_eq!(st.actions.len(), 1);
}

#[test]
fn init_stays_init_on_errors_below_the_limit() {
    run(&[
        (0, Input::SampleError, State::Init),
        (1, s(CALM), State::Healthy),
    ]);
}

#[test]
fn healthy_stays_healthy_in_the_hysteresis_band() {
    let mut rows = healthy_at(0);
    rows.push((1, s(BAND), State::Healthy));
    run(&rows);
}

#[test]
fn healthy_to_unhealthy_for_each_metric() {
    let cases = [
        Metrics {
            gpu_util: 90.0,
            ..CALM
        },
        Metrics {
            sm_activity: 85.0,
            ..CALM
        },
        Metrics {
            sm_clock_pct: 75.0,
            ..CALM
        },
        Metrics {
            mem_used_pct: 92.0,
            ..CALM
        },
    ];
    for bad in cases {
        let mut rows = healthy_at(0);
        rows.push((1, s(bad), State::Unhealthy));
        run(&rows);
    }
}

#[test]
fn healthy_to_overlimit_for_each_metric_and_evicts() {
    let cases = [
        Metrics {
            gpu_util: 98.5,
            ..CALM
        },
        Metrics {
            sm_activity: 96.0,
            ..CALM
        },
        Metrics {
            sm_clock_pct: 59.0,
            ..CALM
        },
        Metrics {
            mem_used_pct: 96.0,
            ..CALM
        },
    ];
    let c = cfg();
    for bad in cases {
        let mut m = Machine::new();
        m.step(&c, 0, s(CALM));
        let st = m.step(&c, 1, s(bad));
        assert_eq!(m.state(), State::Overlimit, "{bad:?}");
        assert!(matches!(
            st.actions.as_slice(),
            [Action::EvictOffline { .. }]
        ));
    }
}

#[test]
fn unhealthy_holds_in_band_and_returns_to_healthy_only_when_all_calm() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, s(UNHEALTHY), State::Unhealthy),
        (2, s(BAND), State::Unhealthy),
        (
            3,
            s(Metrics {
                sm_activity: 75.0,
                ..CALM
            }),
            State::Unhealthy,
        ),
        (4, s(CALM), State::Healthy),
    ]);
}

#[test]
fn unhealthy_to_overlimit() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, s(UNHEALTHY), State::Unhealthy),
        (2, s(OVER), State::Overlimit),
    ]);
}

#[test]
fn overlimit_waits_the_hold_then_goes_to_unhealthy_never_straight_to_healthy() {
    run(&[
        (0, s(CALM), State::Healthy),
        (10, s(OVER), State::Overlimit),
        (20, s(CALM), State::Overlimit), // hold (100 ms) starts here
        (119, s(CALM), State::Overlimit),
        (120, s(CALM), State::Unhealthy),
        (121, s(CALM), State::Healthy),
    ]);
}

#[test]
fn overlimit_hold_restarts_when_a_metric_goes_over_again() {
    run(&[
        (0, s(CALM), State::Healthy),
        (10, s(OVER), State::Overlimit),
        (20, s(UNHEALTHY), State::Overlimit), // under overlimit: hold runs from 20
        (100, s(OVER), State::Overlimit),     // over again: hold reset
        (150, s(CALM), State::Overlimit),     // runs from 150
        (249, s(CALM), State::Overlimit),
        (250, s(UNHEALTHY), State::Unhealthy),
    ]);
}

#[test]
fn hold_grows_exponentially_with_entries_in_window_and_is_capped() {
    let c = cfg();
    assert_eq!(
        (1..=6).map(|n| c.hold_ms(n)).collect::<Vec<_>>(),
        vec![100, 200, 400, 800, 1000, 1000]
    );

    let mut m = Machine::new();
    let mut t = 0;
    m.step(&c, t, s(CALM));
    for expected_hold in [100, 200, 400, 800, 1000] {
        t += 1;
        m.step(&c, t, s(OVER));
        assert_eq!(m.state(), State::Overlimit);
        assert_eq!(m.current_hold_ms(), expected_hold);
        t += 1;
        m.step(&c, t, s(CALM));
        m.step(&c, t + expected_hold - 1, s(CALM));
        assert_eq!(
            m.state(),
            State::Overlimit,
            "left before the {expected_hold} ms hold"
        );
        t += expected_hold;
        m.step(&c, t, s(CALM));
        assert_eq!(
            m.state(),
            State::Unhealthy,
            "still held after {expected_hold} ms"
        );
    }
}

#[test]
fn entries_older_than_the_window_stop_counting() {
    let c = cfg();
    let mut m = Machine::new();
    m.step(&c, 0, s(CALM));
    m.step(&c, 1, s(OVER));
    m.step(&c, 2, s(CALM));
    m.step(&c, 102, s(CALM));
    assert_eq!(m.state(), State::Unhealthy);
    // Second entry inside the window: doubled.
    m.step(&c, 5_000, s(OVER));
    assert_eq!(m.current_hold_ms(), 200);
    m.step(&c, 5_001, s(CALM));
    m.step(&c, 5_201, s(CALM));
    assert_eq!(m.state(), State::Unhealthy);
    // At 10_001 the first entry (t=1) has left the 10 s window; at 15_000 so has the second.
    m.step(&c, 15_000, s(OVER));
    assert_eq!(m.current_hold_ms(), 100);
    assert_eq!(m.overlimit_entries().count(), 1);
}

#[test]
fn history_survives_a_restart() {
    let c = cfg();
    let mut m = Machine::with_history([0, 1]);
    m.step(&c, 2, s(CALM));
    m.step(&c, 3, s(OVER));
    assert_eq!(m.current_hold_ms(), 400);
}

#[test]
fn nvml_errors_disable_from_every_state_after_the_limit() {
    for pre in [
        vec![],
        vec![s(CALM)],
        vec![s(CALM), s(UNHEALTHY)],
        vec![s(CALM), s(OVER)],
    ] {
        let c = cfg();
        let mut m = Machine::new();
        for (i, p) in pre.iter().enumerate() {
            m.step(&c, i as u64, *p);
        }
        let before = m.state();
        m.step(&c, 10, Input::SampleError);
        assert_eq!(m.state(), before, "one error is below the limit of 2");
        let st = m.step(&c, 11, Input::SampleError);
        assert_eq!(m.state(), State::Disabled);
        assert_eq!(m.disabled_by(), Some(DisableCause::Nvml));
        assert!(matches!(
            st.actions.as_slice(),
            [Action::EvictOffline { .. }]
        ));
    }
}

#[test]
fn an_error_streak_is_broken_by_a_good_sample() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, Input::SampleError, State::Healthy),
        (2, s(CALM), State::Healthy),
        (3, Input::SampleError, State::Healthy),
        (4, Input::SampleError, State::Disabled),
    ]);
}

#[test]
fn disabled_by_nvml_recovers_through_init_after_good_samples() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, Input::SampleError, State::Healthy),
        (2, Input::SampleError, State::Disabled),
        (3, s(CALM), State::Disabled),
        (4, s(CALM), State::Init),
        (5, s(CALM), State::Healthy),
    ]);
}

#[test]
fn xid_disables_and_clears_after_its_quiet_time() {
    run(&[
        (0, s(CALM), State::Healthy),
        (10, Input::Xid(31), State::Disabled),
        (400, s(CALM), State::Disabled),
        (510, s(CALM), State::Init),
        (520, s(OVER), State::Overlimit),
    ]);
}

#[test]
fn xid_with_zero_quiet_time_waits_for_the_operator() {
    let c = MachineConfig {
        xid_disable_ms: 0,
        ..cfg()
    };
    let mut m = Machine::new();
    m.step(&c, 0, s(CALM));
    m.step(&c, 1, Input::Xid(79));
    m.step(&c, 1_000_000, s(CALM));
    assert_eq!(m.state(), State::Disabled);
    m.step(&c, 1_000_001, Input::OperatorEnable);
    assert_eq!(m.state(), State::Init);
}

#[test]
fn operator_disable_is_not_undone_by_good_samples_or_xid_timeouts() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, Input::OperatorDisable, State::Disabled),
        (2, s(CALM), State::Disabled),
        (3, s(CALM), State::Disabled),
        (4, Input::Xid(31), State::Disabled),
        (10_000, s(CALM), State::Disabled),
        // The XID seen meanwhile holds it until its own quiet time (long over) has passed.
        (10_001, Input::OperatorEnable, State::Disabled),
        (10_002, s(CALM), State::Init),
        (10_003, s(CALM), State::Healthy),
    ]);
}

/// A critical XID under an operator's Disabled, or before it, is not forgotten: the operator's
/// enable leaves the GPU Disabled by the XID (with `xid_disable_ms: 0`, until a second enable,
/// as `sysmonitor enable --help` says), never Init -> Healthy with a double-bit ECC error on it.
#[test]
fn an_xid_before_or_during_an_operator_disable_outlasts_the_operators_enable() {
    let c = MachineConfig { xid_disable_ms: 0, ..cfg() };
    for inputs in [
        [Input::OperatorDisable, Input::Xid(48), Input::OperatorEnable],
        [Input::Xid(48), Input::OperatorDisable, Input::OperatorEnable],
    ] {
        let mut m = Machine::new();
        m.step(&c, 0, s(CALM));
        for (t, i) in (1..).zip(inputs) {
            m.step(&c, t, i);
        }
        assert_eq!((m.state(), m.disabled_by()), (State::Disabled, Some(DisableCause::Xid(48))), "{inputs:?}");
        assert_eq!(m.xid_under_operator(), None);
        m.step(&c, 1_000_000, s(CALM));
        assert_eq!(m.state(), State::Disabled, "{inputs:?}: no quiet time ends it");
        m.step(&c, 1_000_001, Input::OperatorEnable);
        assert_eq!(m.state(), State::Init, "{inputs:?}: the second enable ends it");
    }
    // Kept with the machine's state (a restarted monitor reads it from the state file).
    let mut m = Machine::new();
    m.step(&c, 1, Input::OperatorDisable);
    m.step(&c, 2, Input::Xid(48));
    assert_eq!(m.xid_under_operator(), Some((48, 2)));
}

#[test]
fn operator_enable_outside_disabled_changes_nothing() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, Input::OperatorEnable, State::Healthy),
    ]);
}

#[test]
fn a_disabled_metric_is_never_judged() {
    let mut c = cfg();
    c.gpu_util.enabled = false;
    let mut m = Machine::new();
    m.step(&c, 0, s(CALM));
    m.step(
        &c,
        1,
        s(Metrics {
            gpu_util: 100.0,
            ..CALM
        }),
    );
    assert_eq!(m.state(), State::Healthy);
}

#[test]
fn nan_readings_count_as_overlimit() {
    let c = cfg();
    let mut m = Machine::new();
    m.step(&c, 0, s(CALM));
    m.step(
        &c,
        1,
        s(Metrics {
            mem_used_pct: f64::NAN,
            ..CALM
        }),
    );
    assert_eq!(m.state(), State::Overlimit);
}

#[test]
fn config_validation_names_the_field() {
    let mut c = cfg();
    c.sm_clock.direction = Direction::Above;
    assert_eq!(c.validate().unwrap_err().0, "sm_clock");
    let c = MachineConfig {
        hold_max_ms: 1,
        ..cfg()
    };
    assert_eq!(c.validate().unwrap_err().0, "hold_max_ms");
    assert!(cfg().validate().is_ok());
}

fn arb_metrics() -> impl Strategy<Value = Metrics> {
    (
        0.0..100.0f64,
        0.0..100.0f64,
        0.0..100.0f64,
        0.0..100.0f64,
        any::<bool>(),
        (any::<bool>(), any::<bool>(), 0.0..100.0f64),
    )
        .prop_map(|(a, b, c, d, o, (co, sp, cap))| Metrics {
            gpu_util: a,
            sm_activity: b,
            sm_clock_pct: c,
            mem_used_pct: d,
            offline_only: o,
            colocated: co,
            sm_spatial: sp,
            offline_sm_cap_pct: cap,
        })
}

fn arb_input() -> impl Strategy<Value = Input> {
    prop_oneof![
        8 => arb_metrics().prop_map(Input::Sample),
        1 => Just(Input::SampleError),
        1 => (0u64..100).prop_map(Input::Xid),
        1 => Just(Input::OperatorDisable),
        1 => Just(Input::OperatorEnable),
    ]
}

proptest! {
    /// Only the paper's edges ever happen, every Overlimit/Disabled entry evicts, and
    /// Overlimit is never left before its hold has passed.
    #[test]
    fn only_paper_transitions(inputs in proptest::collection::vec((1u64..200, arb_input()), 1..200)) {
        let c = cfg();
        let mut m = Machine::new();
        let mut t = 0u64;
        let mut over_entered = 0u64;
        for (dt, input) in inputs {
            t += dt;
            let step = m.step(&c, t, input);
            for tr in &step.transitions {
                let ok = matches!((tr.from, tr.to),
                    (State::Init, State::Healthy)
                    | (State::Healthy, State::Unhealthy) | (State::Healthy, State::Overlimit)
                    | (State::Unhealthy, State::Healthy) | (State::Unhealthy, State::Overlimit)
                    | (State::Overlimit, State::Unhealthy)
                    | (State::Disabled, State::Init)
                    | (_, State::Disabled));
                prop_assert!(ok, "illegal edge {:?} -> {:?}", tr.from, tr.to);
                if tr.to == State::Overlimit { over_entered = t; }
                if tr.from == State::Overlimit && tr.to == State::Unhealthy {
                    prop_assert!(t - over_entered >= m.current_hold_ms());
                }
            }
            let evicting = step.transitions.iter().any(|tr| matches!(tr.to, State::Overlimit | State::Disabled));
            prop_assert_eq!(evicting, !step.actions.is_empty());
        }
    }
}

// ---- Overlimit must persist `overlimit_sustain_ms` (issue 8 obs. 1: throttle first) ----

fn sustain_cfg(ms: u64) -> MachineConfig {
    MachineConfig {
        overlimit_sustain_ms: ms,
        ..cfg()
    }
}

/// Runs `(time_ms, input, expected state, evictions expected from this step)` rows.
fn run_with(c: &MachineConfig, rows: &[(u64, Input, State, usize)]) -> Machine {
    let mut m = Machine::new();
    for (i, (t, input, want, ev)) in rows.iter().enumerate() {
        let st = m.step(c, *t, *input);
        assert_eq!(m.state(), *want, "row {i}: t={t} input={input:?}");
        assert_eq!(st.actions.len(), *ev, "row {i}: evictions at t={t}");
    }
    m
}

#[test]
fn shipped_default_waits_longer_than_the_throttle_settles() {
    let d = MachineConfig::default();
    assert!(
        d.overlimit_sustain_ms >= 1_000,
        "default sustain {} ms is shorter than the shim throttle's settling time",
        d.overlimit_sustain_ms
    );
    assert!(d.validate().is_ok());
}

#[test]
fn a_transient_overload_the_throttle_removes_is_never_evicted() {
    // An offline job starting on an idle GPU: full load for 350 ms, then throttled to below
    // the healthy threshold. With the old behaviour (Overlimit on the first sample) this
    // evicted at t=10 and the hold doubled on every restart of the job.
    let c = sustain_cfg(1_000);
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Unhealthy, 0),
            (200, s(OVER), State::Unhealthy, 0),
            (360, s(OVER), State::Unhealthy, 0),
            (370, s(BAND), State::Unhealthy, 0),
            (400, s(CALM), State::Healthy, 0),
        ],
    );
}

#[test]
fn a_sustained_overload_is_evicted_once_after_the_sustain_time() {
    let c = sustain_cfg(1_000);
    let m = run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Unhealthy, 0),
            (500, s(OVER), State::Unhealthy, 0),
            (1_009, s(OVER), State::Unhealthy, 0),
            (1_010, s(OVER), State::Overlimit, 1),
            (1_020, s(OVER), State::Overlimit, 0),
        ],
    );
    assert_eq!(m.overlimit_entries().count(), 1);
    assert_eq!(
        m.current_hold_ms(),
        c.hold_base_ms,
        "first entry: base hold, not doubled"
    );
}

#[test]
fn any_sample_under_overlimit_restarts_the_sustain_clock() {
    let c = sustain_cfg(1_000);
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Unhealthy, 0),
            (900, s(OVER), State::Unhealthy, 0),
            (950, s(UNHEALTHY), State::Unhealthy, 0),
            (960, s(OVER), State::Unhealthy, 0),
            (1_500, s(OVER), State::Unhealthy, 0),
            (1_959, s(OVER), State::Unhealthy, 0),
            (1_960, s(OVER), State::Overlimit, 1),
        ],
    );
}

#[test]
fn sample_errors_and_disable_do_not_carry_a_pending_overload_over() {
    let c = sustain_cfg(1_000);
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Unhealthy, 0),
            (20, Input::OperatorDisable, State::Disabled, 1),
            (30, Input::OperatorEnable, State::Init, 0),
            // Fresh start: the overload seen before the disable does not count.
            (1_100, s(OVER), State::Unhealthy, 0),
            (2_099, s(OVER), State::Unhealthy, 0),
            (2_100, s(OVER), State::Overlimit, 1),
        ],
    );
}

#[test]
fn sustain_zero_keeps_the_immediate_behaviour() {
    run_with(
        &sustain_cfg(0),
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Overlimit, 1),
        ],
    );
}

#[test]
fn sustain_longer_than_a_minute_is_a_config_error() {
    let c = sustain_cfg(MAX_SUSTAIN_MS + 1);
    assert_eq!(c.validate().unwrap_err().0, "overlimit_sustain_ms");
    assert!(sustain_cfg(MAX_SUSTAIN_MS).validate().is_ok());
}

#[test]
fn an_offline_only_overload_is_unhealthy_never_overlimit_memory_still_counts() {
    let c = sustain_cfg(0);
    let off = |m: Metrics| Metrics {
        offline_only: true,
        ..m
    };
    let mem_over = Metrics {
        mem_used_pct: 99.0,
        ..CALM
    };
    let clock_over = Metrics {
        sm_clock_pct: 10.0,
        ..CALM
    };
    let sm_over = Metrics {
        sm_activity: 99.0,
        ..CALM
    };
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(off(OVER)), State::Unhealthy, 0),
            (20, s(off(sm_over)), State::Unhealthy, 0),
            (30, s(off(clock_over)), State::Unhealthy, 0),
            (5_000, s(off(OVER)), State::Unhealthy, 0),
            // Memory past Overlimit is not the throttle's to fix.
            (5_010, s(off(mem_over)), State::Overlimit, 1),
        ],
    );
    // The same load with an online process present evicts.
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(OVER), State::Overlimit, 1),
        ],
    );
}

/// Issue 8, MuxFlow's scenario: a back-to-back offline job beside a 30 % online workload
/// saturates the busy-time metrics (utilization, and SM activity before Hopper) whatever the
/// online demand. Co-located, they count at most as Unhealthy; spatial SM activity is judged
/// as the online share of the SMs the offline cap leaves, so only the online workload's own
/// demand reaches Overlimit. Before the fix the first sample below entered Overlimit.
#[test]
fn colocated_busy_metrics_never_overlimit_online_demand_does() {
    let c = sustain_cfg(0);
    // T4: SM activity is the busy fraction; the GPU reads fully busy with a 30 % online client.
    let t4 = Metrics {
        gpu_util: 100.0,
        sm_activity: 98.6,
        colocated: true,
        offline_sm_cap_pct: 42.0,
        ..CALM
    };
    // H100 (GPM): 30 % online + the offline job at its 42 % cap.
    let h100_low = Metrics {
        sm_activity: 72.0,
        sm_spatial: true,
        ..t4
    };
    // H100: the online workload takes every SM it may have.
    let h100_burst = Metrics {
        sm_activity: 100.0,
        ..h100_low
    };
    let m = run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(t4), State::Unhealthy, 0),
            (5_000, s(t4), State::Unhealthy, 0),
            (5_010, s(h100_low), State::Unhealthy, 0),
            (10_000, s(h100_low), State::Unhealthy, 0),
        ],
    );
    assert_eq!(m.overlimit_entries().count(), 0);
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(h100_low), State::Unhealthy, 0),
            (20, s(h100_burst), State::Overlimit, 1),
        ],
    );
    // Co-located but below the busy thresholds: Healthy, whatever the offline side does.
    let quiet = Metrics {
        gpu_util: 60.0,
        sm_activity: 65.0,
        sm_spatial: true,
        colocated: true,
        offline_sm_cap_pct: 42.0,
        ..CALM
    };
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (10, s(quiet), State::Healthy, 0),
        ],
    );
    // With no cap known the whole spatial reading is online: fail closed.
    run_with(
        &c,
        &[
            (0, s(CALM), State::Healthy, 0),
            (
                10,
                s(Metrics {
                    offline_sm_cap_pct: 0.0,
                    sm_activity: 96.0,
                    ..h100_low
                }),
                State::Overlimit,
                1,
            ),
        ],
    );
    // The online workload's own demand past the SM-clock or memory limit still evicts.
    for over in [
        Metrics {
            sm_clock_pct: 50.0,
            ..t4
        },
        Metrics {
            mem_used_pct: 99.0,
            ..t4
        },
    ] {
        run_with(
            &c,
            &[
                (0, s(CALM), State::Healthy, 0),
                (10, s(over), State::Overlimit, 1),
            ],
        );
    }
}

#[test]
fn online_share_takes_the_offline_cap_off_and_fails_closed() {
    assert_eq!(online_share(72.0, 42.0).round(), 52.0);
    assert_eq!(online_share(100.0, 42.0), 100.0);
    assert_eq!(online_share(30.0, 42.0), 0.0);
    assert_eq!(online_share(96.0, 0.0), 96.0);
    assert_eq!(online_share(96.0, f64::NAN), 96.0);
    // A cap past 90 % takes off no more than 90 %.
    assert_eq!(online_share(95.0, 100.0), 50.0);
    assert!(online_share(f64::NAN, 42.0).is_nan());
}

/// A burst of NVML errors during an Overlimit hold disables the GPU; once sampling works
/// again the GPU stays Disabled until it has been calm for the hold: offline work is not
/// admitted before the hold is over.
#[test]
fn an_nvml_error_burst_does_not_end_an_overlimit_hold() {
    let mut rows = vec![
        (0, s(OVER), State::Overlimit),
        (1, Input::SampleError, State::Overlimit),
        (2, Input::SampleError, State::Disabled),
        (3, s(CALM), State::Disabled),
    ];
    // Two good samples end the NVML cause at t=4; the hold (100 ms) runs from there.
    for t in (4..104).step_by(10) {
        rows.push((t, s(CALM), State::Disabled));
    }
    // An overlimit sample in the hold starts it again.
    rows.push((104, s(OVER), State::Disabled));
    rows.push((110, s(CALM), State::Disabled));
    rows.push((209, s(CALM), State::Disabled));
    rows.push((210, s(CALM), State::Init));
    rows.push((211, s(CALM), State::Healthy));
    run(&rows);
}

/// An XID that disables the GPU in an Overlimit hold: the hold still applies once the XID's
/// quiet time is over.
#[test]
fn an_xid_in_an_overlimit_hold_leaves_the_hold_to_run() {
    run(&[
        (0, s(OVER), State::Overlimit),
        (10, Input::Xid(79), State::Disabled),
        (510, s(CALM), State::Disabled),
        (609, s(CALM), State::Disabled),
        (610, s(CALM), State::Init),
        (611, s(CALM), State::Healthy),
    ]);
}

/// Disabled from Healthy (no hold running) recovers as before.
#[test]
fn nvml_errors_outside_a_hold_recover_after_the_good_samples() {
    run(&[
        (0, s(CALM), State::Healthy),
        (1, Input::SampleError, State::Healthy),
        (2, Input::SampleError, State::Disabled),
        (3, s(CALM), State::Disabled),
        (4, s(CALM), State::Init),
        (5, s(CALM), State::Healthy),
    ]);
}

/// An XID in the middle of an Overlimit hold, then a restart: resumed Disabled by the XID
/// with the hold still to serve, the machine leaves Disabled only after the XID's quiet
/// time and then the metrics calm for the hold, as the earlier run would have.
#[test]
fn a_resumed_xid_disabled_machine_serves_the_hold_it_interrupted() {
    let cfg = MachineConfig { xid_disable_ms: 100, hold_base_ms: 300, hold_max_ms: 300, ..MachineConfig::default() };
    let calm = Metrics { gpu_util: 10.0, sm_activity: 10.0, sm_clock_pct: 100.0, mem_used_pct: 1.0, ..Default::default() };
    let mut m = Machine::with_history(vec![0]);
    m.resume_xid_disabled(48, 0);
    m.resume_interrupted_hold(&cfg);
    for t in (10..=390).step_by(10) {
        m.step(&cfg, t, Input::Sample(calm));
        assert_eq!(m.state(), State::Disabled, "left Disabled at {t} ms, inside the hold");
    }
    for t in (400..=420).step_by(10) {
        m.step(&cfg, t, Input::Sample(calm));
    }
    assert_ne!(m.state(), State::Disabled, "quiet and calm for the hold: back in service");
}

/// An operator's disable in an Overlimit hold, then enable: the enable puts the GPU back in
/// service and waives that hold. A later Disabled by NVML errors recovers after its good
/// samples, as any Disabled from Healthy does; before, the hold the operator's Disabled had
/// interrupted was still marked and was served then (Disabled until calm for it).
#[test]
fn an_operator_enable_waives_the_hold_its_disable_interrupted() {
    run(&[
        (0, s(OVER), State::Overlimit),
        (10, Input::OperatorDisable, State::Disabled),
        (20, Input::OperatorEnable, State::Init),
        (21, s(CALM), State::Healthy),
        (22, Input::SampleError, State::Healthy),
        (23, Input::SampleError, State::Disabled),
        (24, s(CALM), State::Disabled),
        (25, s(CALM), State::Init),
        (26, s(CALM), State::Healthy),
    ]);
}
