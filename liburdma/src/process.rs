//! The provider's process-wide state: the [`Engine`] behind one lock, the
//! connection to urdmad, the DPDK attachment, and the helper thread that
//! makes progress while the application sleeps.
//!
//! | room | what it holds |
//! |---|---|
//! | [`attach`] | attaching to urdmad (the first `create_qp`), and letting go of it after `fork()` |
//! | [`helper`] | the helper thread's loop: progress while the application is elsewhere |
//! | [`control`] | requests to urdmad and its events (`EVENT CONNECTED` hands a connection over) |
//! | [`at_exit`] | `exit()` waits for the connections still closing to finish their close |
//!
//! This file holds the lock, the clock and what the application's calls tell the helper.

mod at_exit;
mod attach;
mod control;
mod helper;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use trp::Instant;
use urdma_shared::bell::Hush;
use urdma_shared::client::Connection as Control;

pub use control::unregister_qp;

use crate::dpdk::Rings;
use crate::engine::{Engine, QpKey, SendReq};
use crate::error::Error;
use crate::log;
use crate::progress::{Activity, Sleep, Tuning};
use crate::qp_table::QpTable;
use helper::{kick_helper, set_alarm};

/// A whole number from the environment variable `name`; `default` when it is unset, and,
/// with one logged line, when it is not a number.
fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            log::error(format_args!(
                "{name}={v:?} is not a whole number: using {default}"
            ));
            default
        }),
    }
}

/// A time in whole microseconds from environment variable `name` ([`env_number`]).
fn env_micros(name: &str, default: Duration) -> Duration {
    let us = u64::try_from(default.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(env_number(name, us))
}

/// The progress policy's knobs: `URDMA_APP_ACTIVE_US`, `URDMA_STEADY_GAP_US`,
/// `URDMA_STEADY_CALLS` and `URDMA_SPIN_ROUNDS` override [`crate::progress::APP_ACTIVE`],
/// [`crate::progress::STEADY_GAP`], [`crate::progress::STEADY_CALLS`] and
/// [`crate::progress::SPIN_ROUNDS`].
fn tuning() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(|| {
        let d = Tuning::default();
        let spin = env_number("URDMA_SPIN_ROUNDS", u64::from(d.spin_rounds));
        Tuning {
            app_active: env_micros("URDMA_APP_ACTIVE_US", d.app_active),
            spin_rounds: u32::try_from(spin).unwrap_or(u32::MAX).max(1),
            steady_gap: env_micros("URDMA_STEADY_GAP_US", d.steady_gap),
            steady_calls: u32::try_from(env_number(
                "URDMA_STEADY_CALLS",
                u64::from(d.steady_calls),
            ))
            .unwrap_or(u32::MAX),
            ..d
        }
    })
}

/// How often an application polling its CQs reads urdmad's socket itself. The helper reads
/// it when urdmad writes, under the lock: with a thread per connection spinning in
/// `ibv_poll_cq` the lock is hardly ever free (a thread that lets it go takes it again
/// before a waiter wakes), and an `EVENT CONNECTED` that waited there for the helper left
/// the peer's Accept unacknowledged until the peer gave the connection up (10 s). One read
/// is one system call, which a poll every few microseconds must not pay each time.
const EVENT_LOOK: Duration = Duration::from_millis(1);

/// When an application thread last made a data verb call (ns on [`now`]'s clock; 0 after
/// `ibv_req_notify_cq`). Read by the helper without the lock.
static APP_LAST: AtomicU64 = AtomicU64::new(0);

/// When an application thread last armed a CQ (ns on [`now`]'s clock; 0: never). Read by
/// the helper without the lock.
static APP_ARM: AtomicU64 = AtomicU64::new(0);

/// The helper has left its sleep and not yet taken the lock to clear `Shared::helper_sleep`
/// ([`Shared::sleeping_helper`]). Set by the helper without the lock.
static HELPER_WOKEN: AtomicBool = AtomicBool::new(false);

/// Times an application call moved the helper's alarm ([`Shared::after_app_call`]),
/// counted before the call sets the timer. Read by the helper, which sets its alarm
/// after it lets the lock go (`helper_loop` says why and how).
static ALARM_MOVES: AtomicU64 = AtomicU64::new(0);

/// Application threads inside a verb call now (waiting for the lock or holding it).
/// Read by the helper without the lock.
static IN_CALLS: AtomicU32 = AtomicU32::new(0);

/// The process's hush word ([`Hush`]) once urdmad passed it; null before (and in a forked
/// child, whose calls do not read the parent's sockets). Never unmapped.
static HUSH: AtomicPtr<urdma_shared::bell::HushValue> = AtomicPtr::new(std::ptr::null_mut());

/// The hush word, if urdma.ko reads one for this process's frames.
fn hush() -> Option<Hush> {
    let p = HUSH.load(Ordering::Acquire);
    // SAFETY: only ever set to a word of `Hush::map`, mapped for the process's life.
    (!p.is_null()).then(|| unsafe { Hush::from_raw(p) })
}

/// Takes the map of the hush word that came with connection `c`: the first is mapped, the
/// same process's later ones are the same map. Whether urdma.ko reads it for the
/// connection's frames ([`crate::engine::Flow::hushed`]).
fn adopt_hush(map: std::os::fd::OwnedFd, c: &urdma_shared::proto::Connected) -> bool {
    if hush().is_some() {
        return true;
    }
    match Hush::map(map) {
        Ok(h) => {
            HUSH.store(h.into_raw(), Ordering::Release);
            true
        }
        Err(e) => {
            log::info(format_args!("QP {}/{}: no hush word: {e}", c.dev, c.qpn));
            false
        }
    }
}

/// Forgets the hush word in a forked child: it counts the parent's calls.
fn forget_hush() {
    HUSH.store(std::ptr::null_mut(), Ordering::Release);
}

/// Calls in a row, each begun within [`Tuning::steady_gap`] of the last one's end.
/// Updated by the application's threads without the lock (a lost update only shortens it).
static APP_STREAK: AtomicU32 = AtomicU32::new(0);

/// What the application's threads did, for the policy.
fn activity() -> Activity {
    Activity {
        in_calls: IN_CALLS.load(Ordering::Relaxed),
        last_call: Instant(APP_LAST.load(Ordering::Relaxed)),
        last_arm: Instant(APP_ARM.load(Ordering::Relaxed)),
        streak: APP_STREAK.load(Ordering::Relaxed),
    }
}

/// A call begins at `now`: one more in the streak, or the first of a new one.
fn count_streak(now: Instant) {
    let last = Instant(APP_LAST.load(Ordering::Relaxed));
    let streak = if last != Instant::ZERO && now < last + tuning().steady_gap {
        APP_STREAK.load(Ordering::Relaxed).saturating_add(1)
    } else {
        0
    };
    APP_STREAK.store(streak, Ordering::Relaxed);
}

/// A request or a verb that takes this long (milliseconds) is logged (`URDMA_LOG=info`).
const SLOW_MS: u64 = 500;

/// Whole milliseconds from `from` to `to` (0 if `to` is earlier).
fn ms_between(from: Instant, to: Instant) -> u64 {
    to.as_nanos().saturating_sub(from.as_nanos()) / 1_000_000
}

/// How long urdmad may take to answer a request.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// The monotonic clock trp runs on, in nanoseconds.
pub fn now() -> Instant {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Instant(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The attachment to one urdmad.
struct Attached {
    /// The control socket path it was found at.
    path: PathBuf,
    /// The devices (their sysfs paths) found served by it: a QP of one of them is created
    /// without reading sysfs again (four system calls).
    devices: Vec<PathBuf>,
    /// None once urdmad has closed the connection.
    ctl: Option<Control>,
    rings: Rings,
}

pub struct Shared {
    pub engine: Engine,
    attached: Option<Attached>,
    /// Why attaching failed for good (EAL can be initialised only once).
    attach_failed: Option<Error>,
    /// How the helper sleeps (None: it is awake).
    helper_sleep: Option<Sleep>,
    /// Every connection was on the direct path when the helper went to sleep (none needed
    /// urdmad's `ARM`). Kept, not looked up at every call: a flow comes only with urdmad's
    /// `EVENT CONNECTED`, and the read that brings it ends `helper_sleep` (`pump`).
    helper_direct: bool,
    /// `ARM` was posted and no `EVENT WAKE` has come since: urdmad will
    /// send one when a frame comes.
    armed: bool,
    /// When an application's round next reads urdmad's socket ([`EVENT_LOOK`]).
    event_look: Instant,
    /// `PEERCLOSED`s held for the next write to urdmad (`Shared::deliver_notices`).
    peer_closed: Vec<urdma_shared::proto::Request>,
    /// The application's QPs (`*mut ibv_qp`) by key, from `create_qp` until `destroy_qp`
    /// begins: the ones the provider may still name to the kernel itself.
    pub(crate) handles: QpTable<usize>,
}

struct Runtime {
    state: Mutex<Shared>,
    /// Signalled when closes end while [`at_exit`] waits for them.
    closes: Condvar,
    /// Wakes the helper out of its poll().
    kick: OnceLock<OwnedFd>,
    /// The helper's alarm: a timerfd on the clock of [`now`].
    alarm: OnceLock<OwnedFd>,
    /// The sockets of the connections on the direct path, which the helper sleeps on.
    sockets: OnceLock<OwnedFd>,
}

fn rt() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        crate::fork::watch();
        Runtime {
            state: Mutex::new(Shared {
                engine: Engine::new(),
                attached: None,
                attach_failed: None,
                helper_sleep: None,
                helper_direct: false,
                armed: false,
                event_look: Instant::ZERO,
                peer_closed: Vec::new(),
                handles: QpTable::default(),
            }),
            closes: Condvar::new(),
            kick: OnceLock::new(),
            alarm: OnceLock::new(),
            sockets: OnceLock::new(),
        }
    })
}

pub(crate) fn lock() -> MutexGuard<'static, Shared> {
    // A panic under the lock (caught at the C boundary) leaves the state
    // as it was at that point; keep going rather than fail every verb.
    rt().state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` under the engine lock for an application call, then delivers
/// what urdmad must hear and wakes the helper if its sleep is too long
/// now.
#[track_caller]
pub fn with<R>(f: impl FnOnce(&mut Shared, Instant) -> R) -> R {
    /// Counts the call in [`IN_CALLS`] and in the hush word until it returns or unwinds.
    struct InCall(Option<Hush>);
    impl Drop for InCall {
        fn drop(&mut self) {
            IN_CALLS.fetch_sub(1, Ordering::Relaxed);
            // Still counted: the call unwound before its last round. Whatever came
            // meanwhile is the helper's.
            if let Some(h) = self.0.take() {
                h.abandon();
                kick_helper();
            }
        }
    }
    IN_CALLS.fetch_add(1, Ordering::Relaxed);
    // A thread in here reads every socket before it leaves (`leave_hushed`), so urdma.ko
    // need not wake the helper for the frames that come meanwhile.
    let hush = hush();
    if let Some(h) = hush {
        h.enter();
    }
    let mut in_call = InCall(hush);
    // Uncontended, the lock costs no clock reading; contended, the wait is timed: threads
    // spinning in verbs take the lock back as soon as they let it go, and one that waits
    // for it long enough stalls its QPs as surely as a holder does.
    let (mut g, asked) = match rt().state.try_lock() {
        Ok(g) => (g, None),
        Err(std::sync::TryLockError::Poisoned(p)) => (p.into_inner(), None),
        Err(std::sync::TryLockError::WouldBlock) => {
            let asked = now();
            (lock(), Some(asked))
        }
    };
    let now = now();
    if let Some(asked) = asked {
        let waited = ms_between(asked, now);
        if waited >= SLOW_MS {
            log::info(format_args!(
                "the call at {} waited {waited} ms for the provider's lock",
                std::panic::Location::caller()
            ));
        }
    }
    count_streak(now);
    APP_LAST.store(now.as_nanos(), Ordering::Relaxed);
    let r = f(&mut g, now);
    // Again at the end: a call that took long (a round over hundreds of QPs under
    // emulation) must not look to the helper like an application that stopped polling.
    // Unless the call said it goes to sleep (`app_going_to_sleep` cleared the stamp): then
    // the helper takes over at once.
    let end = self::now();
    let held = ms_between(now, end);
    if held >= SLOW_MS {
        log::info(format_args!(
            "the call at {} held the provider's lock for {held} ms",
            std::panic::Location::caller()
        ));
    }
    let _ = APP_LAST.compare_exchange(
        now.as_nanos(),
        end.as_nanos(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    g.after_app_call();
    if let Some(h) = in_call.0.take() {
        h.next_call_by(
            tuning()
                .next_call_by(activity(), end)
                .map(Instant::as_nanos),
        );
        g.leave_hushed(h);
    }
    r
}
/// Runs `f` under the lock for a control verb (no progress, no timers).
pub fn with_engine<R>(f: impl FnOnce(&mut Engine) -> R) -> R {
    f(&mut lock().engine)
}

impl Shared {
    /// A round over every QP, for an application call that polls a CQ (which any QP may
    /// complete into).
    pub fn full_round(&mut self, now: Instant) -> crate::engine::Progress {
        if let Some(h) = hush() {
            h.clear();
        }
        if now >= self.event_look {
            self.event_look = now + EVENT_LOOK;
            self.pump(now);
        }
        let p = self.engine.progress(now);
        self.engine.full_round_ended(self::now());
        p
    }

    /// The helper's round over every QP. An application that called within
    /// [`crate::progress::APP_QUIET`] may be waiting on its memory for what this round
    /// places, and reply at once ([`Engine::progress_for_app`]); one that has been away
    /// longer, or went to sleep in `ibv_get_cq_event`, is not about to reply
    /// ([`Engine::progress_unattended`]).
    fn helper_round(&mut self, now: Instant) -> crate::engine::Progress {
        if let Some(h) = hush() {
            h.clear();
        }
        let p = if tuning().quiet(activity(), now) {
            self.engine.progress_unattended(now)
        } else {
            self.engine.progress_for_app(now)
        };
        self.engine.full_round_ended(self::now());
        p
    }

    /// The round of a post on QP `key` ([`Engine::progress_after_post`]).
    pub fn progress_after_post(&mut self, key: QpKey, now: Instant) {
        if self
            .engine
            .progress_after_post(key, now, tuning().app_active)
        {
            self.engine.full_round_ended(self::now());
        }
    }

    /// `ibv_post_send`'s request on QP `key`. A QP without a connection may
    /// only be missing urdmad's `EVENT CONNECTED`, which comes before the
    /// application hears `ESTABLISHED`: then catch up and try once more.
    pub fn post_send(&mut self, key: QpKey, req: &SendReq<'_>, now: Instant) -> Result<(), Error> {
        let r = match self.engine.post_send(key, req) {
            Err(Error::NotConnected) => {
                self.catch_up(now);
                self.engine.post_send(key, req)
            }
            r => r,
        };
        if r.is_ok() {
            self.engine.request_posted(key, now);
        }
        r
    }

    /// The application is about to block (`ibv_req_notify_cq`, then
    /// `ibv_get_cq_event`): the helper must watch for frames from now on
    /// ([`Tuning::kick_on_sleep`]).
    pub fn app_going_to_sleep(&mut self) {
        APP_LAST.store(0, Ordering::Relaxed);
        APP_ARM.store(now().as_nanos(), Ordering::Relaxed);
        let sleeping = self.sleeping_helper();
        let direct = sleeping.is_some_and(|s| s.watching) && self.helper_direct;
        if tuning().kick_on_sleep(sleeping, direct) {
            self.helper_sleep = None;
            kick_helper();
        }
    }

    /// How the helper sleeps, if it still does: one that has woken is left alone (no kick,
    /// no alarm to move, no look at every QP for it) before it has taken the lock to say so.
    fn sleeping_helper(&self) -> Option<Sleep> {
        self.helper_sleep
            .filter(|_| !HELPER_WOKEN.load(Ordering::Relaxed))
    }

    /// An application call leaves: the last one out reads every socket again if urdma.ko
    /// left a frame to the calls since their last round ([`Hush::leave`]).
    fn leave_hushed(&mut self, h: Hush) {
        while h.leave() {
            self.full_round(now());
            self.after_app_call();
        }
    }

    /// Moves the helper's alarm forward where the call made that necessary
    /// ([`Tuning::alarm_after_call`]).
    fn after_app_call(&mut self) {
        let now = now();
        self.deliver_notices();
        if let Some(sleep) = self.sleeping_helper() {
            let engine = &self.engine;
            let direct = sleep.watching && self.helper_direct;
            if let Some(d) =
                tuning().alarm_after_call(sleep, activity(), now, direct, || engine.deadline())
            {
                self.helper_sleep = Some(Sleep { until: d, ..sleep });
                ALARM_MOVES.fetch_add(1, Ordering::SeqCst);
                set_alarm(d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_nanoseconds() {
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        let b = now();
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(2));
    }
}
