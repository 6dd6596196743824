//! The progress policy: when the helper thread makes progress, when it sleeps, what wakes
//! it, and when an application call must wake it or move its alarm. Deterministic: no
//! clock, no lock, no descriptor of its own; `runtime` passes the time and what the
//! application's threads did, and carries out the answer.
//!
//! The application's own calls make progress while it polls; the helper covers the time
//! it spends elsewhere (docs/architecture.md, "Processes and threads"). On a host whose
//! cores are shared, every wake-up of the helper is a context switch, and a helper that
//! spins takes the CPU of the application it serves: the rules below keep both to what a
//! frame needs.

use std::time::Duration;

use trp::Instant;

/// An application thread that made a data verb call this recently is taken to be polling
/// (its own calls make progress), and the helper stays out of its way: it neither spins
/// nor wakes for frames, only for this long at a time to see whether the application has
/// stopped. On a host whose cores are shared, a helper woken for every frame the
/// application is about to take itself costs a context switch per message, and a helper
/// preempted while it holds the engine lock stalls the application's next call for a time
/// slice.
pub const APP_ACTIVE: Duration = Duration::from_micros(200);

/// The helper spins only after the application has made no data verb call for this long:
/// it is then the only one making progress (a bandwidth test's passive side, a server
/// blocked elsewhere). An application that calls now and then (a latency test polling its
/// CQ between waits on its memory) gains nothing from it: the spin takes the CPU it runs
/// on, and the helper that used CPU time loses the scheduler's preference for threads that
/// wake after sleeping, so its next wake-up waits for a time slice to end.
pub const APP_QUIET: Duration = Duration::from_millis(10);

/// Longest the helper sleeps while an application thread keeps polling, before it looks
/// again whether the application has stopped. It starts at [`APP_ACTIVE`] and doubles
/// each time it finds the application still polling. A look every [`APP_ACTIVE`] woke the
/// helper 1,200 times a second during an `ib_write_bw` in the emulated bed, each time
/// taking the CPU from the spinning application (114 us of CPU per look, 13 % of the
/// run's CPU per helper). The cost of a longer look: an application that stops calling
/// after a long poll to wait on its memory (a one-sided Write's target) has its first
/// Write placed up to this late; later ones find the helper watching.
pub const LOOK_MAX: Duration = Duration::from_millis(2);

/// Rounds the helper keeps going after the last useful one, as long as the CPU is its own
/// to spin on (`runtime`'s yield tells).
pub const SPIN_ROUNDS: u32 = 64;

/// The policy's knobs (`URDMA_APP_ACTIVE_US` and `URDMA_SPIN_ROUNDS` set two of them).
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub app_active: Duration,
    pub app_quiet: Duration,
    pub look_max: Duration,
    pub spin_rounds: u32,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            app_active: APP_ACTIVE,
            app_quiet: APP_QUIET,
            look_max: LOOK_MAX,
            spin_rounds: SPIN_ROUNDS,
        }
    }
}

/// What the application's threads did, as the helper sees it (read without the lock).
#[derive(Clone, Copy, Debug)]
pub struct Activity {
    /// Application threads inside a verb call now.
    pub in_calls: u32,
    /// When one last made a data verb call; [`Instant::ZERO`] once it said it goes to
    /// sleep (`ibv_req_notify_cq`).
    pub last_call: Instant,
    /// When one last armed a CQ ([`Instant::ZERO`]: never).
    pub last_arm: Instant,
    /// Calls in a row, each begun within [`STEADY_GAP`] of the last one's end: an
    /// application polling without pause has many ([`Tuning::steady`]).
    pub streak: u32,
}

/// Calls that follow each other this closely are one stretch of polling
/// ([`Activity::streak`]). A busy poll's calls follow each other within microseconds;
/// an application that polls its memory between calls makes two or three (a post, the
/// reap of its completions) and then none until a frame comes.
pub const STEADY_GAP: Duration = Duration::from_micros(50);

/// An application that made this many calls in a row polls without pause
/// ([`Tuning::steady`]).
pub const STEADY_CALLS: u32 = 8;

/// How the helper sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sleep {
    /// Its alarm (None: none).
    pub until: Option<Instant>,
    /// Whether a frame wakes it: the direct connections' sockets are in its poll set and
    /// urdmad is asked to wake it (`ARM`) for the rest.
    pub watching: bool,
    /// Its alarm is a look at an application that polls (whose calls run the timers), not
    /// a trp timer: woken by it alone while the application still polls, it sleeps again
    /// ([`Tuning::look_again`]).
    pub look: bool,
}

/// What the helper does after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Another round at once (after a yield): traffic flows and nobody else makes progress.
    Again,
    /// Spin, yielding: without the lock, on the descriptors, when `on_descriptors` (every
    /// connection has one that says when something comes); else with rounds.
    Spin { on_descriptors: bool },
    /// Sleep as `sleep`, asking urdmad first for an `EVENT WAKE` when `arm`.
    Sleep { sleep: Sleep, arm: bool },
}

/// What a round of the helper found.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    /// It received, transmitted or handled urdmad's events.
    pub worked: bool,
    /// Rounds since the last one that worked, this one not counted.
    pub idle: u32,
    /// The helper's last yield found the CPU free.
    pub cpu_free: bool,
    /// Some connection's frames come through urdmad, which must be asked to wake the helper.
    pub needs_arm: bool,
    /// urdmad was asked already and has not woken the helper since.
    pub armed: bool,
    /// Some flow's way out was full (more to send, and no descriptor says when).
    pub backlogged: bool,
    /// Every flow's frames wake nobody while an application thread is in a call that reads
    /// every socket ([`Tuning::sleep`]).
    pub hushed: bool,
}

impl Tuning {
    /// Whether an application thread is taken to be polling: it is inside a call, or made
    /// one within [`Tuning::app_active`]. (A round that transmits a 64-KiB message holds
    /// the lock for a millisecond under emulation: judged by the time of its start alone,
    /// the application looked gone during its own calls.)
    pub fn polling(&self, a: Activity, now: Instant) -> bool {
        a.in_calls > 0 || now < a.last_call + self.app_active
    }

    /// Whether the application polls without pause ([`STEADY_CALLS`] calls in a row): its
    /// next call comes within microseconds and takes what arrives. Hushed, the helper then
    /// does not watch: the frames that fall between two calls would wake it, and a helper
    /// woken on a shared CPU takes it from the application (poll-send in the emulated bed,
    /// a quarter slower with a helper that watched while the application polled).
    pub fn steady(&self, a: Activity, now: Instant) -> bool {
        a.streak >= STEADY_CALLS && self.polling(a, now)
    }

    /// Whether the application waits on completion events: it armed a CQ within
    /// [`Tuning::app_quiet`]. Between its waits it polls (the usual
    /// "arm, poll, sleep"), and it is the frames that come while it sleeps that matter.
    pub fn waits_on_events(&self, a: Activity, now: Instant) -> bool {
        a.last_arm != Instant::ZERO && now < a.last_arm + self.app_quiet
    }

    /// Whether the application has been away long enough for the helper to spin.
    pub fn quiet(&self, a: Activity, now: Instant) -> bool {
        now >= a.last_call + self.app_quiet
    }

    /// The wait before the helper looks again at an application that still polls, after
    /// waiting `d`: twice as long, from [`Tuning::app_active`] up to [`Tuning::look_max`].
    pub fn next_look(&self, d: Duration) -> Duration {
        (d * 2).min(self.look_max).max(self.app_active)
    }

    /// The helper's sleep: watching for frames, to the earliest trp timer; or, while the
    /// application polls (its calls receive and run the timers), not watching, until it
    /// may have stopped. `deadline` gives the earliest trp timer, a look at every
    /// connection: asked only when it is needed.
    ///
    /// `direct`: every connection is on the direct path, whose socket wakes a watching
    /// helper by itself. The helper then watches also while an application that waits on
    /// events polls: the frames it waits for come while it sleeps, and a helper that
    /// stopped watching at every poll had to be kicked back at every arm, a wake-up per
    /// message on top of the frame's.
    ///
    /// `hushed`: besides, urdma.ko wakes nobody for a frame that comes while an application
    /// thread is in a call that reads every socket (`urdma_shared::bell::Hush`). The helper
    /// then watches also while the application polls, unless it polls without pause
    /// ([`Tuning::steady`]): a frame wakes it only when no call will take the frame, such
    /// as a Write to an application that polls its memory between calls, which waited for
    /// the helper's next look otherwise. Its alarm is the
    /// earliest trp timer, not before the application may have stopped, and taken for a
    /// look: the calls run the timers, so the alarm moves for a timer that comes earlier
    /// but not for every call (a system call each), and wakes nobody where none is due.
    pub fn sleep(
        &self,
        a: Activity,
        now: Instant,
        direct: bool,
        hushed: bool,
        deadline: impl FnOnce() -> Option<Instant>,
    ) -> Sleep {
        if self.polling(a, now) && !(direct && self.waits_on_events(a, now)) {
            if hushed && direct && !self.steady(a, now) {
                return Sleep {
                    until: self.watching_until(a, now, deadline),
                    watching: true,
                    look: true,
                };
            }
            Sleep {
                until: Some(a.last_call + self.app_active),
                watching: false,
                look: true,
            }
        } else {
            Sleep {
                until: self.watching_until(a, now, deadline),
                watching: true,
                look: false,
            }
        }
    }

    /// The alarm of a helper that watches: the earliest trp timer; while the application
    /// polls (between its waits on events, on the direct path), not before it may have stopped,
    /// since its calls run the timers until then. The ACK a receive holds for the reply
    /// then leaves with the reply, or at most [`Tuning::app_active`] after the
    /// application's last call, and its timer wakes nobody: due 100 us after the receive,
    /// it woke the helper for about every third message of a completion-channel ping-pong
    /// in the emulated bed, whose applications take about that long to reply.
    fn watching_until(
        &self,
        a: Activity,
        now: Instant,
        deadline: impl FnOnce() -> Option<Instant>,
    ) -> Option<Instant> {
        let d = deadline();
        if self.polling(a, now) {
            d.map(|d| d.max(a.last_call + self.app_active))
        } else {
            d
        }
    }

    /// The helper's next step after round `r` (and the idle count to carry on with).
    pub fn after_round(
        &self,
        r: Round,
        a: Activity,
        now: Instant,
        deadline: impl FnOnce() -> Option<Instant>,
    ) -> (Step, u32) {
        let polling = self.polling(a, now);
        let mut idle = r.idle;
        if r.worked {
            idle = 0;
            if !polling && !r.needs_arm && !r.backlogged && !self.quiet(a, now) {
                // Every connection's socket wakes a watching helper, and nothing is left
                // to send: it sleeps at once. A round served a frame of an application
                // that waits (on its channel, its memory) and is about to reply; another
                // round after a yield finds nothing but takes the CPU the application
                // was woken for, and costs system calls of its own. A frame that came
                // meanwhile ends the sleep at once.
                let sleep = self.sleep(a, now, true, r.hushed, deadline);
                return (Step::Sleep { sleep, arm: false }, idle);
            }
            if !polling {
                return (Step::Again, idle);
            }
        }
        idle += 1;
        if idle < self.spin_rounds && r.cpu_free && self.quiet(a, now) {
            // Rounds under the lock would hold off the application's calls (and a helper
            // preempted while holding it stalls them for a time slice): where the
            // descriptors can tell, spin on them instead.
            let on_descriptors = !r.needs_arm;
            return (Step::Spin { on_descriptors }, idle);
        }
        let sleep = self.sleep(a, now, !r.needs_arm, r.hushed, deadline);
        let arm = !r.armed && sleep.watching && r.needs_arm;
        (Step::Sleep { sleep, arm }, idle)
    }

    /// Whether a helper spinning on its descriptors goes on (none was readable).
    pub fn keep_spinning(&self, idle: u32, cpu_free: bool, a: Activity, now: Instant) -> bool {
        idle < self.spin_rounds && cpu_free && self.quiet(a, now)
    }

    /// A helper that slept as `s` was woken by its alarm alone: whether it sleeps again
    /// without a round, because the application still polls and its calls make the
    /// progress (a round would only take the lock from them).
    pub fn look_again(&self, s: Sleep, a: Activity, now: Instant) -> bool {
        s.look && self.polling(a, now)
    }

    /// An application call ended while the helper sleeps as `s`: the alarm to move it to,
    /// when that is earlier: a trp timer the call made due sooner or, while the
    /// application polls, when it may have stopped. (Left at the trp timer for a helper
    /// that watches for frames, an application waiting on its channel's fd was slower in
    /// every round of one boot: lat.c fd-send one-way 2.1-2.6 ms against 1.3-1.7 ms.)
    ///
    /// `direct`: every connection's socket wakes a watching helper by itself. A helper
    /// that watches then keeps watching through the calls, its alarm following the timers
    /// later as well as earlier (`watching_until`): the look would wake it once per message
    /// of an application that waits on its channel between calls, and so would a timer the
    /// call ended (the ACK a receive held, which the reply took along). An application that
    /// goes on polling takes it out of watching at the first frame that wakes it
    /// ([`Tuning::after_round`]).
    pub fn alarm_after_call(
        &self,
        s: Sleep,
        a: Activity,
        now: Instant,
        direct: bool,
        deadline: impl FnOnce() -> Option<Instant>,
    ) -> Option<Option<Instant>> {
        if direct && s.watching && !s.look {
            let d = self.watching_until(a, now, deadline);
            // While the application polls, its bound moves with every call: an alarm up to
            // half of it later than needed stands, and a moved one is set that much later,
            // so that the calls that follow leave it. Moved at every call, it took two to
            // three system calls per message of lat.c chan-send, most of the application's
            // system calls beyond rxe's.
            let polling = self.polling(a, now);
            let slack = if polling {
                self.app_active / 2
            } else {
                Duration::ZERO
            };
            let stands = match (d, s.until) {
                (Some(d), Some(u)) => d <= u && u <= d + slack,
                (None, u) => u.is_none(),
                (Some(_), None) => false,
            };
            if stands {
                return None;
            }
            let bound = polling && d == Some(a.last_call + self.app_active);
            return Some(d.map(|d| if bound { d + slack } else { d }));
        }
        // Only a hushed helper watches while it looks. Its alarm, once set, comes while the
        // application may still poll (it looks again) or after it stopped (it runs the
        // timers): it is moved only when it has none, and the timers are not looked at on
        // every call of a busy poll (a look at every connection each).
        let hushed = s.watching && s.look;
        if hushed && s.until.is_some() {
            return None;
        }
        let d = self.sleep(a, now, direct, hushed, deadline).until;
        let earlier = match (d, s.until) {
            (Some(d), Some(u)) => d < u,
            (Some(_), None) => true,
            _ => false,
        };
        earlier.then_some(d)
    }

    /// The application goes to sleep (`ibv_req_notify_cq`) while the helper sleeps as `s`
    /// (None: it is awake): whether to kick it. Also when it watches already: the kicked
    /// helper finds the application away for good and spins on its descriptors while the
    /// CPU is free ([`Tuning::after_round`]), and a spinning helper takes the peer's reply
    /// without being woken from sleep, which in the emulated bed costs up to a scheduler
    /// tick. Left asleep, an application waiting on its completion channel was slower in
    /// every round (lat.c chan-send, one-way: 3.4, 5.0 and 6.0 ms against 1.6, 3.0 and
    /// 1.5 ms kicked, in one boot).
    ///
    /// `direct`: every connection's socket wakes a watching helper by itself. Only a
    /// helper that does not watch is kicked then, so that it watches: one that does is
    /// woken by the reply's frame, and a spin on a shared CPU takes the time of the
    /// application it serves (and of the peer's, in the emulated bed).
    pub fn kick_on_sleep(&self, s: Option<Sleep>, direct: bool) -> bool {
        match s {
            Some(s) => !direct || !s.watching,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Tuning = Tuning {
        app_active: APP_ACTIVE,
        app_quiet: APP_QUIET,
        look_max: LOOK_MAX,
        spin_rounds: SPIN_ROUNDS,
    };

    fn at(us: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(us)
    }

    fn app(in_calls: u32, last_call_us: u64) -> Activity {
        Activity {
            in_calls,
            last_call: at(last_call_us),
            last_arm: Instant::ZERO,
            streak: 0,
        }
    }

    /// Asleep in `ibv_get_cq_event`: no call since `ibv_req_notify_cq`.
    const ASLEEP: Activity = Activity {
        in_calls: 0,
        last_call: Instant::ZERO,
        last_arm: Instant::ZERO,
        streak: 0,
    };

    fn round(worked: bool, idle: u32) -> Round {
        Round {
            worked,
            idle,
            cpu_free: true,
            needs_arm: false,
            armed: false,
            backlogged: false,
            hushed: false,
        }
    }

    #[test]
    fn a_polling_application_keeps_the_helper_from_watching() {
        let now = at(100_000);
        // Inside a call, however long ago it began.
        assert!(T.polling(app(1, 0), now));
        // Within APP_ACTIVE of its last call.
        assert!(T.polling(app(0, 99_900), now));
        assert!(!T.polling(app(0, 99_800), now));
        let s = T.sleep(app(0, 99_900), now, false, false, || Some(at(500_000)));
        assert_eq!(
            s,
            Sleep {
                until: Some(at(100_100)),
                watching: false,
                look: true
            }
        );
    }

    #[test]
    fn an_application_asleep_has_the_helper_watch_until_the_next_timer() {
        let s = T.sleep(ASLEEP, at(5_000), false, false, || Some(at(9_000)));
        assert_eq!(
            s,
            Sleep {
                until: Some(at(9_000)),
                watching: true,
                look: false
            }
        );
        assert_eq!(
            T.sleep(ASLEEP, at(5_000), false, false, || None),
            Sleep {
                until: None,
                watching: true,
                look: false
            }
        );
    }

    /// A call while the helper sleeps watching: the application polls again, so the
    /// helper is to look when it may have stopped; a trp timer due sooner comes first.
    #[test]
    fn an_application_call_moves_a_watching_helpers_alarm_to_its_next_look() {
        let s = T.sleep(ASLEEP, at(1_000), false, false, || Some(at(50_000)));
        assert!(s.watching);
        assert_eq!(
            T.alarm_after_call(s, app(0, 1_200), at(1_200), false, || Some(at(50_000))),
            Some(Some(at(1_400)))
        );
        assert_eq!(
            T.alarm_after_call(s, app(0, 1_200), at(1_200), false, || Some(at(1_300))),
            Some(Some(at(1_400))),
            "while it polls, its calls run the timers"
        );
        let quiet = T.sleep(ASLEEP, at(1_000), false, false, || Some(at(50_000)));
        assert_eq!(
            T.alarm_after_call(quiet, ASLEEP, at(1_200), false, || Some(at(2_000))),
            Some(Some(at(2_000)))
        );
        assert_eq!(
            T.alarm_after_call(quiet, ASLEEP, at(1_200), false, || None),
            None
        );
    }

    #[test]
    fn a_sleeping_helper_is_kicked_when_the_application_goes_to_sleep() {
        let s = T.sleep(app(0, 1_000), at(1_000), false, false, || None);
        assert!(!s.watching);
        assert!(T.kick_on_sleep(Some(s), false));
        // Watching already: kicked all the same, to spin for the reply (kick_on_sleep).
        assert!(T.kick_on_sleep(
            Some(T.sleep(ASLEEP, at(1_000), false, false, || None)),
            false
        ));
        assert!(
            !T.kick_on_sleep(None, false),
            "an awake helper sees it by itself"
        );
    }

    /// On the direct path, an application that arms its CQ between its polls keeps the
    /// helper watching; one that polls and never arms does not.
    #[test]
    fn on_the_direct_path_the_helper_watches_through_the_polls_of_an_application_that_arms() {
        let now = at(100_000);
        let polled = |last_arm_us| Activity {
            in_calls: 0,
            last_call: at(99_950),
            last_arm: if last_arm_us == 0 {
                Instant::ZERO
            } else {
                at(last_arm_us)
            },
            streak: 0,
        };
        assert!(T.sleep(polled(99_900), now, true, false, || None).watching);
        assert!(
            !T.sleep(polled(99_900), now, false, false, || None).watching,
            "not direct"
        );
        assert!(
            !T.sleep(polled(0), now, true, false, || None).watching,
            "never armed"
        );
        let long_ago = 100_000 - 10_000;
        assert!(
            !T.sleep(polled(long_ago), now, true, false, || None)
                .watching,
            "armed long ago"
        );
    }

    /// Hushed, the helper watches also while the application polls (in a call or between
    /// calls); its alarm is then a look at whether the application still polls, whose calls
    /// run the timers, and an alarm alone does not make it take the lock.
    #[test]
    fn hushed_the_helper_always_watches() {
        let now = at(100_000);
        for a in [app(1, 0), app(0, 99_900), ASLEEP] {
            let s = T.sleep(a, now, true, true, || Some(at(100_050)));
            assert!(s.watching, "{a:?}");
            assert!(!T.kick_on_sleep(Some(s), true));
        }
        let polling = T.sleep(app(0, 99_900), now, true, true, || Some(at(100_050)));
        assert_eq!(
            polling,
            Sleep {
                until: Some(at(100_100)),
                watching: true,
                look: true
            },
            "the held ACK waits for the reply"
        );
        assert!(T.look_again(polling, app(0, 99_950), at(100_100)));
        assert!(!T.look_again(polling, app(0, 99_900), at(100_200)));
        let later = || Some(at(100_150));
        assert_eq!(
            T.alarm_after_call(polling, app(0, 100_100), at(100_100), true, later),
            None,
            "a call does not move the alarm later"
        );
        let sooner = || -> Option<Instant> { panic!("the timers are not looked at") };
        assert_eq!(
            T.alarm_after_call(polling, app(0, 100_100), at(100_100), true, sooner),
            None,
            "nor sooner: the helper looks again or runs the timers then"
        );
        let idle = T.sleep(app(0, 99_900), now, true, true, || None);
        assert_eq!(idle.until, None, "no timer, no alarm");
        assert_eq!(
            T.alarm_after_call(idle, app(0, 100_100), at(100_100), true, later),
            Some(Some(at(100_300))),
            "a timer the call started: the helper runs it once the application may have stopped"
        );
        let asleep = T.sleep(ASLEEP, now, true, true, || Some(at(100_050)));
        assert_eq!(asleep.until, Some(at(100_050)));
        assert!(!asleep.look);
        // After a round, while the application polls.
        let r = Round {
            hushed: true,
            ..round(false, 0)
        };
        let (step, _) = T.after_round(r, app(0, 99_900), now, || None);
        assert!(matches!(step, Step::Sleep { sleep, arm: false } if sleep.watching && sleep.look));
        // Nor while the application polls without pause: its next call takes the frame.
        let steady = Activity {
            streak: STEADY_CALLS,
            ..app(0, 99_990)
        };
        let s = T.sleep(steady, now, true, true, || None);
        assert!(!s.watching && s.look);
        let paused = Activity {
            streak: STEADY_CALLS - 1,
            ..steady
        };
        assert!(T.sleep(paused, now, true, true, || None).watching);
        // Not when some connection's frames come through urdmad.
        let r = Round {
            hushed: true,
            needs_arm: true,
            ..round(false, 0)
        };
        let (step, _) = T.after_round(r, app(0, 99_900), now, || None);
        assert!(matches!(step, Step::Sleep { sleep, .. } if !sleep.watching));
    }

    /// On the direct path, the helper is kicked only to start watching, and a watching
    /// helper's alarm is left to the trp timers.
    #[test]
    fn on_the_direct_path_a_watching_helper_sleeps_through_the_application_s_calls() {
        let watching = T.sleep(ASLEEP, at(1_000), false, false, || Some(at(50_000)));
        assert!(!T.kick_on_sleep(Some(watching), true));
        let not_watching = T.sleep(app(0, 1_000), at(1_000), false, false, || None);
        assert!(T.kick_on_sleep(Some(not_watching), true));
        assert!(!T.kick_on_sleep(None, true));
        // An application that arms between its polls.
        let armed = |last_call_us| Activity {
            in_calls: 0,
            last_call: at(last_call_us),
            last_arm: at(1_000),
            streak: 0,
        };
        let moved =
            |s, a, now_us, d: Option<u64>| T.alarm_after_call(s, a, at(now_us), true, || d.map(at));
        assert_eq!(
            moved(watching, armed(1_200), 1_200, Some(50_000)),
            None,
            "no look while it watches"
        );
        assert_eq!(
            moved(watching, armed(1_200), 1_200, Some(1_300)),
            Some(Some(at(1_500))),
            "a timer the call made due sooner, left to the calls while they go on"
        );
        // The calls that follow within half the bound leave that alarm, the first after it
        // moves it again.
        let bounded = Sleep {
            until: Some(at(1_500)),
            ..watching
        };
        for call in [1_210, 1_250, 1_300] {
            assert_eq!(
                moved(bounded, armed(call), call, Some(1_300)),
                None,
                "{call}"
            );
        }
        assert_eq!(
            moved(bounded, armed(1_310), 1_310, Some(1_300)),
            Some(Some(at(1_610)))
        );
        assert_eq!(
            moved(bounded, armed(1_250), 1_250, Some(1_460)),
            None,
            "a trp timer inside the slack"
        );
        assert_eq!(
            moved(bounded, armed(1_250), 1_250, Some(1_600)),
            Some(Some(at(1_600))),
            "a trp timer past the slack: its own time"
        );
        let held = Sleep {
            until: Some(at(1_400)),
            ..watching
        };
        assert_eq!(
            moved(held, armed(1_250), 1_250, Some(40_000)),
            Some(Some(at(40_000))),
            "the reply took the held ACK along: its timer is gone"
        );
        assert_eq!(moved(held, armed(1_250), 1_250, None), Some(None));
        // Gone to sleep (`ibv_req_notify_cq` cleared the stamp): the timer itself.
        let asleep = Activity {
            last_call: Instant::ZERO,
            ..armed(0)
        };
        assert_eq!(
            moved(held, asleep, 1_250, Some(1_300)),
            Some(Some(at(1_300)))
        );
        // Polling without ever arming: the same (a frame then takes the helper out of
        // watching).
        assert_eq!(
            moved(watching, app(0, 1_200), 1_200, Some(1_300)),
            Some(Some(at(1_500)))
        );
        // Not watching: as off the direct path.
        assert_eq!(
            T.alarm_after_call(not_watching, app(0, 1_100), at(1_100), true, || None),
            None
        );
    }

    #[test]
    fn a_polling_application_moves_a_non_watching_helpers_alarm_only_earlier() {
        let s = T.sleep(app(0, 1_000), at(1_000), false, false, || None);
        assert_eq!(s.until, Some(at(1_200)));
        // Later calls push the time the application may have stopped further out: the
        // alarm stays, and the helper looks again when it rings.
        assert_eq!(
            T.alarm_after_call(s, app(0, 1_100), at(1_100), false, || None),
            None
        );
        // A timer due before it moves it.
        assert_eq!(
            T.alarm_after_call(s, app(0, 1_100), at(1_100), false, || Some(at(1_150))),
            None,
            "the look comes first: the application's calls run the timers meanwhile"
        );
    }

    #[test]
    fn woken_by_its_alarm_while_the_application_polls_the_helper_looks_again_later() {
        let s = T.sleep(app(0, 1_000), at(1_000), false, false, || None);
        assert!(T.look_again(s, app(1, 1_000), at(1_200)));
        assert!(T.look_again(s, app(0, 1_150), at(1_200)));
        assert!(
            !T.look_again(s, app(0, 1_000), at(1_200)),
            "stopped: a round"
        );
        let watching = T.sleep(ASLEEP, at(1_000), false, false, || None);
        assert!(!T.look_again(watching, app(1, 1_000), at(1_200)));
        let mut d = T.app_active;
        let mut looks = vec![];
        for _ in 0..6 {
            d = T.next_look(d);
            looks.push(d.as_micros());
        }
        assert_eq!(looks, [400, 800, 1_600, 2_000, 2_000, 2_000]);
    }

    #[test]
    fn work_keeps_the_helper_going_only_while_the_application_is_away() {
        let (step, idle) =
            T.after_round(round(true, 7), ASLEEP, at(50_000), || Some(at(1_000_000)));
        assert_eq!((step, idle), (Step::Again, 0));
        // The application polls: its calls take over from here.
        let (step, idle) = T.after_round(round(true, 7), app(1, 49_990), at(50_000), || {
            Some(at(1_000_000))
        });
        assert_eq!(idle, 1);
        assert!(matches!(step, Step::Sleep { sleep, .. } if !sleep.watching));
    }

    #[test]
    fn the_helper_spins_only_when_the_application_is_quiet_and_the_cpu_free() {
        let now = at(50_000);
        let (step, _) = T.after_round(round(false, 0), ASLEEP, now, || Some(at(1_000_000)));
        assert_eq!(
            step,
            Step::Spin {
                on_descriptors: true
            }
        );
        let mut r = round(false, 0);
        r.needs_arm = true;
        assert_eq!(
            T.after_round(r, ASLEEP, now, || Some(at(1_000_000))).0,
            Step::Spin {
                on_descriptors: false
            }
        );
        r.cpu_free = false;
        assert!(matches!(
            T.after_round(r, ASLEEP, now, || Some(at(1_000_000))).0,
            Step::Sleep { arm: true, .. }
        ));
        // Called 5 ms ago: not quiet, no spin.
        assert!(matches!(
            T.after_round(round(false, 0), app(0, 45_000), now, || Some(at(1_000_000)))
                .0,
            Step::Sleep { .. }
        ));
        // The spin ends after SPIN_ROUNDS idle rounds.
        let (step, idle) = T.after_round(round(false, SPIN_ROUNDS - 1), ASLEEP, now, || {
            Some(at(1_000_000))
        });
        assert_eq!(idle, SPIN_ROUNDS);
        assert!(matches!(step, Step::Sleep { .. }));
        assert!(T.keep_spinning(SPIN_ROUNDS - 1, true, ASLEEP, now));
        assert!(!T.keep_spinning(SPIN_ROUNDS, true, ASLEEP, now));
        assert!(!T.keep_spinning(1, false, ASLEEP, now));
    }

    #[test]
    fn urdmad_is_asked_to_wake_the_helper_only_when_it_must() {
        let now = at(50_000);
        let mut r = round(false, SPIN_ROUNDS);
        r.needs_arm = true;
        assert!(matches!(
            T.after_round(r, ASLEEP, now, || Some(at(1_000_000))).0,
            Step::Sleep { arm: true, sleep } if sleep.watching
        ));
        r.armed = true;
        assert!(matches!(
            T.after_round(r, ASLEEP, now, || Some(at(1_000_000))).0,
            Step::Sleep { arm: false, .. }
        ));
        // While the application polls the helper does not watch: nobody to wake.
        r.armed = false;
        assert!(matches!(
            T.after_round(r, app(1, 49_999), now, || Some(at(1_000_000)))
                .0,
            Step::Sleep { arm: false, .. }
        ));
        // Every connection's socket wakes it by itself.
        r.needs_arm = false;
        assert!(matches!(
            T.after_round(r, ASLEEP, now, || Some(at(1_000_000))).0,
            Step::Sleep { arm: false, .. }
        ));
    }

    /// On the direct path, a round that served a frame of an application that waits (its
    /// last call 500 us ago: neither polling nor away) sleeps watching at once; traffic
    /// left in a full way out, frames that come through urdmad, or an application away
    /// for good keep the helper going.
    #[test]
    fn a_round_that_served_a_waiting_application_sleeps_at_once_on_the_direct_path() {
        let now = at(50_000);
        let waiting = app(0, 49_500);
        let r = round(true, 3);
        let (step, idle) = T.after_round(r, waiting, now, || Some(at(60_000)));
        assert_eq!(
            (step, idle),
            (
                Step::Sleep {
                    sleep: Sleep {
                        until: Some(at(60_000)),
                        watching: true,
                        look: false
                    },
                    arm: false
                },
                0
            )
        );
        let mut full = r;
        full.backlogged = true;
        assert_eq!(T.after_round(full, waiting, now, || None).0, Step::Again);
        let mut forwarded = r;
        forwarded.needs_arm = true;
        assert_eq!(
            T.after_round(forwarded, waiting, now, || None).0,
            Step::Again
        );
        assert_eq!(
            T.after_round(r, ASLEEP, now, || None).0,
            Step::Again,
            "away for good: the helper is the only one making progress"
        );
    }
}
