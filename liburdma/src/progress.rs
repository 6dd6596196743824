//! The progress policy: when the helper thread makes progress, when it sleeps, what wakes
//! it, and when an application call must wake it or move its alarm. Deterministic: no
//! clock, no lock, no descriptor of its own; `process` passes the time and what the
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
/// to spin on (`process`'s yield tells).
pub const SPIN_ROUNDS: u32 = 64;

/// The policy's knobs (`URDMA_APP_ACTIVE_US`, `URDMA_STEADY_GAP_US`, `URDMA_STEADY_CALLS` and
/// `URDMA_SPIN_ROUNDS` set four of them).
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub app_active: Duration,
    pub app_quiet: Duration,
    pub look_max: Duration,
    pub steady_gap: Duration,
    pub steady_calls: u32,
    pub spin_rounds: u32,
}

impl Tuning {
    /// The constants above.
    pub const DEFAULT: Tuning = Tuning {
        app_active: APP_ACTIVE,
        app_quiet: APP_QUIET,
        look_max: LOOK_MAX,
        steady_gap: STEADY_GAP,
        steady_calls: STEADY_CALLS,
        spin_rounds: SPIN_ROUNDS,
    };
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning::DEFAULT
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
    /// Calls in a row, each begun within [`Tuning::steady_gap`] of the last one's end: an
    /// application polling without pause has many ([`Tuning::next_call_by`]).
    pub streak: u32,
}

/// Calls that follow each other this closely are one stretch of polling
/// ([`Activity::streak`]). A busy poll's calls follow each other within microseconds;
/// an application that polls its memory between calls makes two or three (a post, the
/// reap of its completions) and then none until a frame comes.
pub const STEADY_GAP: Duration = Duration::from_micros(50);

/// An application that made this many calls in a row polls without pause
/// ([`Tuning::next_call_by`]).
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

    /// As a call ends at `now`: by when the next one is due, for an application that polls
    /// without pause ([`Tuning::steady_calls`] calls in a row, each begun within
    /// [`Tuning::steady_gap`] of the last one's end): within the same gap. A frame that falls between the two wakes
    /// nobody then, and one that no call has read by that time wakes the helper (urdma.ko's
    /// hush, `urdma_shared::bell::Hush::next_call_by`): a helper woken on a shared CPU for a
    /// frame the next call takes anyway only takes the CPU from the application. An
    /// application that polls its CQ and then waits on its memory (the initiator of a
    /// ping-pong of Writes) has a frame that comes after its last call placed at most that
    /// gap late. None for an application that calls now and then, or goes to sleep
    /// (`last_call` cleared): a frame for it wakes the helper at once.
    pub fn next_call_by(&self, a: Activity, now: Instant) -> Option<Instant> {
        (a.last_call != Instant::ZERO && a.streak >= self.steady_calls)
            .then(|| now + self.steady_gap)
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
    /// `hushed`: urdma.ko (urdmad, for the frames it puts on the rings) wakes nobody for a
    /// frame that comes while an application thread is in a call that reads every socket, or
    /// between the calls of one that polls without pause ([`Tuning::next_call_by`]). The helper then watches also while the
    /// application polls: a frame wakes it only when no call will take the frame, such
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
            if hushed {
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
mod tests;
