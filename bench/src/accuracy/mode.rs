//! The accuracy run's modes: which rule each judges, its limit, the load it offers (its
//! schedule, and how it is dealt to the Envoys) and its names in the report.

use super::{BURST, BURST_20X, OFFERED, RATE, RATE_20X, UNEVEN_MULTIPLE};

/// One mode of the accuracy run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    GlobalExact,
    GlobalLeased,
    GlobalLeased20x,
    GlobalIdleThenBurst,
    Local,
    /// Twice the limit, 90 % of it on one of the two Envoys (issue 35): a membership split
    /// of the limit under-admits there, a central count does not.
    GlobalExactUneven,
    GlobalLeasedUneven,
    /// Twice the limit, all of it on one of the two Envoys.
    GlobalExactOneEnvoy,
    GlobalLeasedOneEnvoy,
}

/// A stretch of a run's schedule: `rps` requests per second (0: silence) for `secs`.
#[derive(Clone, Copy, Debug)]
pub struct Phase {
    pub rps: f64,
    pub secs: f64,
}

impl Mode {
    pub const ALL: [Mode; 9] = [
        Mode::GlobalExact,
        Mode::GlobalLeased,
        Mode::GlobalLeased20x,
        Mode::GlobalIdleThenBurst,
        Mode::Local,
        Mode::GlobalExactUneven,
        Mode::GlobalLeasedUneven,
        Mode::GlobalExactOneEnvoy,
        Mode::GlobalLeasedOneEnvoy,
    ];

    /// The loads the peers are offered ([`crate::peer_accuracy`]): 5× and 20× spread
    /// evenly, and 2× unevenly (their path and rule are weir's, and unused).
    pub const PEERS: [Mode; 4] = [
        Mode::GlobalExact,
        Mode::GlobalLeased20x,
        Mode::GlobalExactUneven,
        Mode::GlobalExactOneEnvoy,
    ];

    /// How the load is dealt to the Envoys of the run: thread `g` goes to Envoy `i` in
    /// proportion to these weights (an Envoy beyond the list gets none).
    pub fn envoy_weights(self) -> &'static [usize] {
        match self {
            Mode::GlobalExactUneven | Mode::GlobalLeasedUneven => &[9, 1],
            Mode::GlobalExactOneEnvoy | Mode::GlobalLeasedOneEnvoy => &[1],
            _ => &[1, 1],
        }
    }

    /// The load, without the limiter: what a peer's run is labelled by.
    pub fn load_label(self) -> &'static str {
        match self {
            Mode::GlobalExactUneven | Mode::GlobalLeasedUneven => "2×, 90 % on one Envoy",
            Mode::GlobalExactOneEnvoy | Mode::GlobalLeasedOneEnvoy => "2×, all on one Envoy",
            Mode::GlobalLeased20x => "20×",
            Mode::GlobalIdleThenBurst => "2×, idle, burst",
            _ => "5×",
        }
    }

    pub fn is_global(self) -> bool {
        self != Mode::Local
    }

    pub fn path(self) -> &'static str {
        match self {
            Mode::GlobalExact | Mode::GlobalExactUneven | Mode::GlobalExactOneEnvoy => "/exact",
            Mode::GlobalLeased
            | Mode::GlobalIdleThenBurst
            | Mode::GlobalLeasedUneven
            | Mode::GlobalLeasedOneEnvoy => "/leased",
            Mode::GlobalLeased20x => "/leased-20x",
            Mode::Local => "/local",
        }
    }

    /// The rule the mode's path matches: `acc-` and the path's name.
    pub fn rule(self) -> String {
        format!("acc-{}", self.path().trim_start_matches('/'))
    }

    /// The limit's rate and burst.
    pub fn limit(self) -> (u64, u64) {
        match self {
            Mode::GlobalLeased20x => (RATE_20X, BURST_20X),
            _ => (RATE, BURST),
        }
    }

    /// How many times its rate the key is offered while load runs.
    pub fn multiple(self) -> f64 {
        match self {
            Mode::GlobalIdleThenBurst => 2.0,
            m if m.is_uneven() => UNEVEN_MULTIPLE,
            _ => OFFERED / self.limit().0 as f64,
        }
    }

    /// The schedule of a run of `seconds`: steady load, or (idle then burst) twice the
    /// rate for most of it, silence for 0.5 s (longer than the key's tolerance of
    /// `(b + 1) / rate` = 0.1 s, shorter than a lease could have lived before leases were
    /// bounded by their hold), then every thread at once for 0.2 s.
    pub fn schedule(self, seconds: u64) -> Vec<Phase> {
        let total = seconds as f64;
        match self {
            Mode::GlobalIdleThenBurst => {
                let warm = (total - 0.7).max(0.5);
                vec![
                    Phase {
                        rps: 2.0 * RATE as f64,
                        secs: warm,
                    },
                    Phase {
                        rps: 0.0,
                        secs: 0.5,
                    },
                    Phase {
                        rps: 50_000.0,
                        secs: 0.2,
                    },
                ]
            }
            m if m.is_uneven() => vec![Phase {
                rps: UNEVEN_MULTIPLE * RATE as f64,
                secs: total,
            }],
            _ => vec![Phase {
                rps: OFFERED,
                secs: total,
            }],
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Mode::GlobalExact => "global, exact (lease 1), 5×, 2 Envoys × 2 workers",
            Mode::GlobalLeased => {
                "global, leases (max 50, ttl 20ms, horizon 100ms), 5×, 2 Envoys × 2 workers"
            }
            Mode::GlobalLeased20x => "global, leases, 20× (250/s burst 24), 2 Envoys × 2 workers",
            Mode::GlobalIdleThenBurst => {
                "global, leases, 2× then 0.5 s idle then a burst on both Envoys"
            }
            Mode::Local => "local, 5×, 1 Envoy × 4 workers",
            Mode::GlobalExactUneven => {
                "global, exact, 2× with 90 % of it on one Envoy, 2 Envoys × 2 workers"
            }
            Mode::GlobalLeasedUneven => {
                "global, leases, 2× with 90 % of it on one Envoy, 2 Envoys × 2 workers"
            }
            Mode::GlobalExactOneEnvoy => "global, exact, 2× all on one of 2 Envoys",
            Mode::GlobalLeasedOneEnvoy => "global, leases, 2× all on one of 2 Envoys",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::GlobalExact => "global exact 5×",
            Mode::GlobalLeased => "global leased 5×",
            Mode::GlobalLeased20x => "global leased 20×",
            Mode::GlobalIdleThenBurst => "global idle then burst",
            Mode::Local => "local 5×, 4 workers",
            Mode::GlobalExactUneven => "global exact 2×, 90 % on one Envoy",
            Mode::GlobalLeasedUneven => "global leased 2×, 90 % on one Envoy",
            Mode::GlobalExactOneEnvoy => "global exact 2×, all on one Envoy",
            Mode::GlobalLeasedOneEnvoy => "global leased 2×, all on one Envoy",
        }
    }

    /// Offered twice the limit, not evenly over the two Envoys.
    pub fn is_uneven(self) -> bool {
        self.envoy_weights() != [1, 1]
    }
}
