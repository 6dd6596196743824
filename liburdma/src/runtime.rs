//! The provider's process-wide state: the [`Engine`] behind one lock, the
//! connection to urdmad, the DPDK attachment, and the helper thread that
//! makes progress while the application sleeps.
//!
//! # Attachment
//! Nothing DPDK happens before the first `create_qp` of a process (a
//! process that opened the device and then forked works in the child).
//! That call finds the device's urdmad in sysfs
//! (`/sys/class/infiniband/<dev>/urdmad`), connects, sends `ATTACH`, starts
//! the helper thread, which initialises EAL as urdmad's secondary, and
//! registers the QP (`QP dev= qpn=`). A process attaches once, to one
//! urdmad: it may use devices served by that urdmad only.
//!
//! # fork()
//! An attachment belongs to the process that made it. The child of an
//! attached process ([`crate::fork`]) lets go of its copy at once: the QPs
//! (which stay the parent's), the control connection, and the helper's
//! eventfd, timerfd and epoll set (shared objects after fork, replaced by
//! fresh ones under the same descriptor numbers). Its first `create_qp`
//! attaches it as a process of its own: a new control connection and
//! `ATTACH`, so new rings, and a helper thread of its own. EAL is not
//! initialised again: the child has the parent's, whose memory is urdmad's
//! shared memory mapped at the same addresses, and its threads are not
//! needed to use the rings.
//!
//! # Progress
//! The application's own calls drive progress: `poll_cq` receives, runs
//! timers and transmits for every connection; `post_send` and `post_recv` for
//! the QP posted to, and for every connection once a full round is due
//! ([`Engine::progress_after_post`]: a round over hundreds of QPs on every post
//! made a message cost what all of them cost).
//! The helper thread covers the time the application spends elsewhere
//! (blocked in `ibv_get_cq_event`, `rdma_get_cm_event`, polling its own
//! memory, ...). While an application thread polls (it is in a data verb or
//! made one within [`crate::progress::APP_ACTIVE`]; `ibv_req_notify_cq` ends
//! that at once) the helper stays out of its way: it sleeps without watching
//! for frames and looks again when the application may have stopped, less
//! often the longer it polls ([`crate::progress::LOOK_MAX`]). Its rounds leave
//! the ACKs peers asked for to the application's reply while the application
//! may still post one (`Shared::helper_round`), as the application's own rounds
//! do. Otherwise, while traffic flows it keeps going (yielding the CPU between
//! rounds); once the application has been away for
//! [`crate::progress::APP_QUIET`] it may spin on for
//! [`crate::progress::SPIN_ROUNDS`] idle rounds while its yields find the CPU
//! free ([`YIELD_FREE`]); then it posts `ARM` to urdmad (unless it
//! is armed already, or every connection is on the direct path, whose socket
//! wakes it by itself) and sleeps in `poll()` on the
//! control socket, its own eventfd, its alarm (a timerfd) and the epoll set
//! of the direct connections' sockets until an event (`EVENT WAKE`,
//! `EVENT CONNECTED`, `EVENT DISCONNECT`), a frame on a direct connection,
//! the earliest trp timer, or a kick. An application call that makes a timer
//! due earlier than the helper's alarm moves the alarm forward (one system
//! call) rather than waking the helper to go back to sleep with a shorter
//! timeout: almost every message does that (the delayed ACK, the
//! retransmission timer), and on a host whose cores are shared each of
//! those wake-ups was a context switch on the message's path. These rules
//! are [`crate::progress`]'s, tested there; this module carries them out.
//!
//! `ARM`'s reply is not waited for: urdmad looks at the process's rings
//! when it takes the `ARM` and sends `EVENT WAKE` at once if a frame is
//! there, so a frame that came after the last round and before the `ARM`
//! took effect still wakes the helper. The reply itself wakes it once; it
//! finds nothing and sleeps again, armed. Waiting for the reply would hold
//! the lock, and so every application thread in a verb, until urdmad got
//! round to the control socket (it reads it every couple of milliseconds
//! while it forwards traffic).
//! The helper takes the lock with `try_lock` and never holds it while it
//! sleeps or waits for urdmad. It blocks every signal.
//!
//! Nor do application calls wait for urdmad under the lock, but for the
//! first `create_qp` (attaching) and the rare `SYNC` of a post that finds its
//! QP not yet connected: `QP` and `UNQP` are sent and their replies waited
//! for with the lock released ([`ask`]), and `PEERCLOSED` and `QPCLOSED` are
//! posted.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Duration;

use trp::Instant;
use urdma_shared::client::Connection as Control;
use urdma_shared::proto::{Event, Request, Response};

use crate::direct::SocketFlow;
use crate::dpdk::{self, DpdkFlow, Rings};
use crate::engine::{Engine, Flow, Notice, PostFail, QpKey, SendReq};
use crate::log;
use crate::progress::{Activity, Round, Sleep, Step, Tuning};

/// A yield that returns within this found no other thread wanting the CPU. One that took
/// longer gave the CPU to another thread, the application's very likely: the helper then
/// stops spinning and sleeps until a frame or a timer wakes it. A helper that spins on a
/// shared CPU delays the application it serves, and by using CPU time it loses the
/// scheduler's preference for threads that wake after sleeping, so that its next wake-up
/// waits for a time slice to end (measured in the emulated two-vCPU bed: `ib_write_lat`
/// 2.9 ms with a 64-round spin, 0.8 ms without; docs/performance.md).
const YIELD_FREE: Duration = Duration::from_micros(100);

/// Gives up the CPU; whether nobody else took it ([`YIELD_FREE`]).
fn yield_cpu() -> bool {
    let t = std::time::Instant::now();
    std::thread::yield_now();
    t.elapsed() < YIELD_FREE
}

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

/// The progress policy's knobs: `URDMA_APP_ACTIVE_US` and `URDMA_SPIN_ROUNDS` override
/// [`crate::progress::APP_ACTIVE`] and [`crate::progress::SPIN_ROUNDS`].
fn tuning() -> &'static Tuning {
    static T: OnceLock<Tuning> = OnceLock::new();
    T.get_or_init(|| {
        let d = Tuning::default();
        let spin = env_number("URDMA_SPIN_ROUNDS", u64::from(d.spin_rounds));
        Tuning {
            app_active: Duration::from_micros(env_number(
                "URDMA_APP_ACTIVE_US",
                d.app_active.as_micros() as u64,
            )),
            spin_rounds: u32::try_from(spin).unwrap_or(u32::MAX).max(1),
            ..d
        }
    })
}

/// How often an application polling its CQs reads urdmad's socket itself. The helper reads
/// it when urdmad writes, but takes the lock only when no application thread holds it
/// (`try_lock`): with a thread per connection spinning in `ibv_poll_cq` the lock is hardly
/// ever free, and an `EVENT CONNECTED` that waited there for the helper left the peer's
/// Accept unacknowledged until the peer gave the connection up (10 s). One read is one
/// system call, which a poll every few microseconds must not pay each time.
const EVENT_LOOK: Duration = Duration::from_millis(1);

/// When an application thread last made a data verb call (ns on [`now`]'s clock; 0 after
/// `ibv_req_notify_cq`). Read by the helper without the lock.
static APP_LAST: AtomicU64 = AtomicU64::new(0);

/// Application threads inside a verb call now (waiting for the lock or holding it).
/// Read by the helper without the lock.
static IN_CALLS: AtomicU32 = AtomicU32::new(0);

/// What the application's threads did, for the policy.
fn activity() -> Activity {
    Activity {
        in_calls: IN_CALLS.load(Ordering::Relaxed),
        last_call: Instant(APP_LAST.load(Ordering::Relaxed)),
    }
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
    /// None once urdmad has closed the connection.
    ctl: Option<Control>,
    rings: Rings,
}

pub struct Shared {
    pub engine: Engine,
    attached: Option<Attached>,
    /// Why attaching failed for good (EAL can be initialised only once).
    attach_failed: Option<i32>,
    /// How the helper sleeps (None: it is awake).
    helper_sleep: Option<Sleep>,
    /// `ARM` was posted and no `EVENT WAKE` has come since: urdmad will
    /// send one when a frame comes.
    armed: bool,
    /// When an application's round next reads urdmad's socket ([`EVENT_LOOK`]).
    event_look: Instant,
}

struct Runtime {
    state: Mutex<Shared>,
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
                armed: false,
                event_look: Instant::ZERO,
            }),
            kick: OnceLock::new(),
            alarm: OnceLock::new(),
            sockets: OnceLock::new(),
        }
    })
}

pub(crate) fn lock() -> MutexGuard<'static, Shared> {
    lock_of(&rt().state)
}

fn lock_of(state: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic under the lock (caught at the C boundary) leaves the state
    // as it was at that point; keep going rather than fail every verb.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` under the engine lock for an application call, then delivers
/// what urdmad must hear and wakes the helper if its sleep is too long
/// now.
#[track_caller]
pub fn with<R>(f: impl FnOnce(&mut Shared, Instant) -> R) -> R {
    /// Counts the call in [`IN_CALLS`] until it returns or unwinds.
    struct InCall;
    impl Drop for InCall {
        fn drop(&mut self) {
            IN_CALLS.fetch_sub(1, Ordering::Relaxed);
        }
    }
    IN_CALLS.fetch_add(1, Ordering::Relaxed);
    let _in_call = InCall;
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
    r
}

/// Sends `req` to urdmad and waits for an `OK`, without holding the lock while urdmad gets
/// round to answering: the helper and the process's other threads make progress meanwhile.
/// (urdmad answers between its forwarding rounds, and when it is short of CPU that takes
/// a second or more; a process whose threads each created a QP under the lock stood still
/// for all of their waits in a row, long enough for its peers to give its connections up.)
/// The reply is read by whichever thread reads the socket first.
fn ask(req: &Request) -> Result<(), String> {
    ask_on(&rt().state, req)
}

fn ask_on(state: &Mutex<Shared>, req: &Request) -> Result<(), String> {
    let asked = now();
    let (ticket, fd) = {
        let mut g = lock_of(state);
        let Some(ctl) = g.control() else {
            return Err("not attached to urdmad".into());
        };
        (ctl.send(req)?, ctl.as_raw_fd())
    };
    let deadline = asked + CONTROL_TIMEOUT;
    // Time spent waiting for this process's own lock, which a slow answer's log line tells
    // apart from urdmad's: under overload a thread preempted while it holds the lock delays
    // every look at the socket, and the answer with it.
    let mut lock_wait_ns = 0u64;
    let mut wait_ms = ASK_POLL_MS;
    loop {
        {
            let before = now();
            let mut g = lock_of(state);
            let now = now();
            lock_wait_ns += now.as_nanos().saturating_sub(before.as_nanos());
            g.pump(now);
            let Some(ctl) = g.control() else {
                return Err("urdmad closed the connection".into());
            };
            if let Some(r) = ctl.answer(ticket) {
                let took = ms_between(asked, now);
                if took >= SLOW_MS {
                    log::info(format_args!(
                        "urdmad took {took} ms to answer {} ({} ms of it waiting for the provider's lock)",
                        req.encode().trim_end(),
                        lock_wait_ns / 1_000_000
                    ));
                }
                return match r? {
                    Response::Ok => Ok(()),
                    other => Err(urdma_shared::client::refusal(other)),
                };
            }
            if now >= deadline {
                ctl.abandon(ticket);
                return Err(format!("urdmad did not answer within {CONTROL_TIMEOUT:?}"));
            }
        }
        // Woken by the reply, or by anything else on the socket; a reply another thread read
        // first (between the look above and this poll) is found at the next look.
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. The descriptor stays open while the control connection
        // does, which the look above checks after every wait.
        unsafe { libc::poll(&mut p, 1, wait_ms) };
        wait_ms = (wait_ms * 2).min(ASK_POLL_MAX_MS);
    }
}

/// How long [`ask`] first waits on the socket before looking again (milliseconds). The
/// wait ends early when anything comes on the socket; its timeout is for the reply that
/// another thread read first.
const ASK_POLL_MS: i32 = 2;
/// ... doubling up to this. Every look takes the lock: in the overload test each of a
/// process's 32 threads waited seconds in `rdma_create_qp` for urdmad's answer; looking
/// every 2 ms, they would take the lock up to 16,000 times a second between them, and the
/// CPU with it, from the threads that had work to do.
const ASK_POLL_MAX_MS: i32 = 32;

/// `QP dev= qpn=`: the QP is this process's.
pub fn register_qp(key: QpKey) -> Result<(), String> {
    ask(&Request::Qp {
        dev: key.0,
        qpn: key.1,
    })
}

/// `UNQP dev= qpn=`, when urdmad is still there.
pub fn unregister_qp(key: QpKey) {
    {
        let mut g = lock();
        if g.control().is_none() {
            return;
        }
        // The QP's own QPCLOSED, if destroying it made one, goes first (urdmad takes
        // requests in order).
        g.deliver_notices();
    }
    if let Err(e) = ask(&Request::Unqp {
        dev: key.0,
        qpn: key.1,
    }) {
        log::error(format_args!("UNQP {key:?}: {e}"));
    }
}

/// Runs `f` under the lock for a control verb (no progress, no timers).
pub fn with_engine<R>(f: impl FnOnce(&mut Engine) -> R) -> R {
    f(&mut lock().engine)
}

/// Sets the helper's alarm to `at` (None: no alarm).
fn set_alarm(at: Option<Instant>) {
    let Some(fd) = rt().alarm.get() else { return };
    // An all-zero value disarms; a deadline of 0 ns is long past anyway.
    let ns = at.map_or(0, |t| t.as_nanos().max(1));
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        },
    };
    // SAFETY: our timerfd; a valid itimerspec; no old value wanted.
    unsafe {
        libc::timerfd_settime(
            fd.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME,
            &spec,
            std::ptr::null_mut(),
        )
    };
}

fn kick_helper() {
    if let Some(fd) = rt().kick.get() {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// The urdmad control socket of the device at `ibdev_path`, from sysfs.
pub fn urdmad_socket(ibdev_path: &Path) -> Result<PathBuf, String> {
    let f = ibdev_path.join("urdmad");
    let s = std::fs::read_to_string(&f).map_err(|e| {
        format!(
            "cannot read {}: {e} (is urdma.ko new enough to name the device's urdmad?)",
            f.display()
        )
    })?;
    let s = s.trim();
    if s.is_empty() {
        return Err(format!(
            "no urdmad serves device {} ({} is empty): start urdmad for its interface",
            ibdev_path.display(),
            f.display()
        ));
    }
    Ok(PathBuf::from(s))
}

impl Shared {
    /// Attaches the process to the urdmad at `path` unless it is attached
    /// already (to the same one).
    pub fn ensure_attached(&mut self, path: &Path) -> Result<(), i32> {
        if let Some(a) = &self.attached {
            if a.path != path {
                log::error(format_args!(
                    "a process may use the devices of one urdmad only: attached to {}, device served by {}",
                    a.path.display(),
                    path.display()
                ));
                return Err(libc::EINVAL);
            }
            if a.ctl.is_none() {
                log::error(format_args!("urdmad has gone away"));
                return Err(libc::ENOTCONN);
            }
            return Ok(());
        }
        if let Some(e) = self.attach_failed {
            return Err(e);
        }
        let r = attach(path);
        match r {
            Ok(a) => {
                self.attached = Some(a);
                Ok(())
            }
            Err((e, permanent)) => {
                if permanent {
                    self.attach_failed = Some(e);
                    log::fatal(format_args!(
                        "cannot attach to urdmad at {} ({}): this process cannot use urdma devices",
                        path.display(),
                        std::io::Error::from_raw_os_error(e)
                    ));
                }
                Err(e)
            }
        }
    }

    /// In the child of a fork(), before fork() returns there, with the lock taken before
    /// the fork (no thread can have held it then): lets go of the parent's attachment,
    /// keeping nothing that the parent still uses (see the module's comment).
    pub(crate) fn forked(&mut self) {
        if !renew_descriptors() {
            log::error(format_args!(
                "forked: cannot make the progress thread's descriptors: this process cannot attach to urdmad"
            ));
            self.attach_failed.get_or_insert(libc::EMFILE);
        }
        self.engine.forked();
        if let Some(a) = self.attached.take() {
            if a.ctl.is_none() {
                // The parent lost urdmad and let go of EAL's memory: nothing to attach with.
                self.attach_failed.get_or_insert(libc::ENOTCONN);
            }
            // Dropping closes the child's copies of the control socket, of the packet
            // sockets urdmad passed and of the doorbell's socket; the parent's stay open.
            drop(a);
        }
        self.helper_sleep = None;
        self.armed = false;
        self.event_look = Instant::ZERO;
        IN_CALLS.store(0, Ordering::Relaxed);
    }

    /// urdmad's control connection, while it lasts.
    fn control(&mut self) -> Option<&mut Control> {
        self.attached.as_mut().and_then(|a| a.ctl.as_mut())
    }

    /// One request to urdmad, waited for under the lock; events it meets are handled. Only
    /// where waiting is rare: see [`ask`].
    fn request(&mut self, req: &Request, now: Instant) -> Result<Response, String> {
        let Some(ctl) = self.control() else {
            return Err("not attached to urdmad".into());
        };
        let r = ctl.request(req);
        self.pump(now);
        r
    }

    /// Posts `req`, whose outcome nothing waits for (a refusal is logged when its reply is
    /// read).
    fn post(&mut self, req: &Request) {
        if let Some(ctl) = self.control() {
            if let Err(e) = ctl.post(req) {
                log::error(format_args!("{}: {e}", req.encode().trim_end()));
            }
        }
    }

    /// Posts `ARM` (see the module's comment on progress).
    fn arm(&mut self) {
        let Some(ctl) = self.control() else {
            return;
        };
        match ctl.post(&Request::Arm) {
            Ok(()) => self.armed = true,
            Err(e) => log::error(format_args!("ARM: {e}")),
        }
    }

    fn expect_ok(&mut self, req: &Request, now: Instant) -> Result<(), String> {
        match self.request(req, now)? {
            Response::Ok => Ok(()),
            other => Err(urdma_shared::client::refusal(other)),
        }
    }

    /// Reads and handles urdmad's events (never blocks). When urdmad has
    /// closed the connection every QP fails.
    pub fn pump(&mut self, now: Instant) -> bool {
        let Some(ctl) = self.control() else {
            return false;
        };
        let polled = ctl.poll_events();
        for r in ctl.take_refusals() {
            log::error(format_args!("{r}"));
        }
        match polled {
            Ok(events) => {
                let any = !events.is_empty();
                if any && self.helper_sleep.is_some() {
                    // Read by an application thread while the helper sleeps:
                    // it must re-arm (a WAKE is one-shot).
                    self.helper_sleep = None;
                    kick_helper();
                }
                for e in events {
                    self.handle_event(e, now);
                }
                any
            }
            Err(e) => {
                log::error(format_args!("{e}: every QP fails"));
                if let Some(a) = self.attached.as_mut() {
                    a.ctl = None;
                }
                self.engine.fail_all(now);
                // No flow is left and no EVENT CONNECTED can come: nothing
                // touches urdmad's memory any more.
                dpdk::detach();
                true
            }
        }
    }

    fn handle_event(&mut self, e: Event, now: Instant) {
        match e {
            Event::Wake => self.armed = false,
            Event::Disconnect { dev, qpn, status } => {
                if status == 0 {
                    log::debug(format_args!("QP {dev}/{qpn}: disconnect"));
                    self.engine.close((dev, qpn));
                } else {
                    // Not the application's doing: say so, as for a failure of trp's.
                    log::info(format_args!(
                        "QP {dev}/{qpn}: aborted by the connection manager (status {status})"
                    ));
                    self.engine.abort((dev, qpn), now);
                }
            }
            Event::Connected(c) => {
                let key = (c.dev, c.qpn);
                let Some(a) = self.attached.as_mut() else {
                    return;
                };
                let sock = a.ctl.as_mut().and_then(|ctl| ctl.take_socket(c.dev, c.qpn));
                let r = a
                    .rings
                    .flow(c.port, &c.rx_ring, c.local, c.remote, c.mac.0, c.stats)
                    .and_then(|flow| make_flow(flow, &c, sock))
                    .and_then(|flow| self.engine.connected(key, &c, flow, now));
                match r {
                    Ok(()) => log::debug(format_args!(
                        "QP {}/{} connected {} -> {} ({:?})",
                        c.dev, c.qpn, c.local, c.remote, c.role
                    )),
                    Err(e) => {
                        log::error(format_args!("QP {}/{}: {e}", c.dev, c.qpn));
                        self.engine.drop_flow(key);
                        self.post(&Request::QpClosed {
                            dev: c.dev,
                            qpn: c.qpn,
                            status: -libc::ECONNRESET,
                        });
                    }
                }
            }
        }
    }

    /// A round over every QP, for an application call that polls a CQ (which any QP may
    /// complete into).
    pub fn full_round(&mut self, now: Instant) -> crate::engine::Progress {
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
    /// places, and reply at once (a ping-pong of Writes): an ACK its peer asked for waits for that reply as in the
    /// application's own rounds (`trp::Config::ack_hold`). Were it sent alone, it would
    /// end the peer's wait for its completion before the reply came, and the peer's
    /// helper would have to be scheduled to place the reply in turn, message after
    /// message. An application that has been away longer, or went to sleep in
    /// `ibv_get_cq_event`, is not about to reply ([`Engine::progress_unattended`]).
    fn helper_round(&mut self, now: Instant) -> crate::engine::Progress {
        let p = if tuning().quiet(activity(), now) {
            self.engine.progress_unattended(now)
        } else {
            self.engine.progress(now)
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

    /// Tells urdmad what the engine found (PEERCLOSED, QPCLOSED), and urdma.ko which SRQs
    /// fell below their limit. Posted: nothing here
    /// depends on the reply, and urdmad takes requests in order, so a later request of this
    /// process (`UNQP`) finds them done.
    pub fn deliver_notices(&mut self) {
        crate::srq::report_limits(self.engine.take_srq_limits());
        for n in self.engine.take_notices() {
            self.post(&match n {
                Notice::PeerClosed((dev, qpn)) => Request::PeerClosed { dev, qpn },
                Notice::Closed((dev, qpn), status) => Request::QpClosed { dev, qpn, status },
            });
        }
    }

    /// `ibv_post_send`'s request on QP `key`. A QP without a connection may
    /// only be missing urdmad's `EVENT CONNECTED`, which comes before the
    /// application hears `ESTABLISHED`: then catch up and try once more.
    pub fn post_send(
        &mut self,
        key: QpKey,
        req: &SendReq<'_>,
        now: Instant,
    ) -> Result<(), PostFail> {
        match self.engine.post_send(key, req) {
            Err(PostFail::NotConnected) => {
                self.catch_up(now);
                self.engine.post_send(key, req)
            }
            r => r,
        }
    }

    /// Reads the socket, and if that brings nothing asks for the rest of
    /// urdmad's events with `SYNC`.
    fn catch_up(&mut self, now: Instant) {
        if self.pump(now) {
            return;
        }
        if let Err(e) = self.expect_ok(&Request::Sync, now) {
            log::error(format_args!("SYNC: {e}"));
        }
    }

    /// The application is about to block (`ibv_req_notify_cq`, then
    /// `ibv_get_cq_event`): the helper must watch for frames from now on
    /// ([`Tuning::kick_on_sleep`]).
    pub fn app_going_to_sleep(&mut self) {
        APP_LAST.store(0, Ordering::Relaxed);
        if tuning().kick_on_sleep(self.helper_sleep) {
            self.helper_sleep = None;
            kick_helper();
        }
    }

    /// Moves the helper's alarm forward where the call made that necessary
    /// ([`Tuning::alarm_after_call`]).
    fn after_app_call(&mut self) {
        let now = now();
        self.deliver_notices();
        if let Some(sleep) = self.helper_sleep {
            let engine = &self.engine;
            if let Some(d) = tuning().alarm_after_call(sleep, activity(), now, || engine.deadline())
            {
                self.helper_sleep = Some(Sleep { until: d, ..sleep });
                set_alarm(d);
            }
        }
    }
}

/// The flow of a connection urdmad handed over: on the direct path when it passed the
/// connection's socket, through urdmad's rings otherwise.
fn make_flow(
    ring: DpdkFlow,
    c: &urdma_shared::proto::Connected,
    sock: Option<OwnedFd>,
) -> Result<Box<dyn Flow>, String> {
    if c.direct == 0 {
        return Ok(Box::new(ring));
    }
    // urdmad no longer takes the connection's frames: without the socket nothing arrives.
    let sock = sock.ok_or("urdmad put the connection on the direct path but passed no socket")?;
    let epoll = rt()
        .sockets
        .get()
        .ok_or("no epoll set for the direct path")?
        .as_raw_fd();
    let ep = ring.endpoints();
    let geo = urdma_shared::direct::Geometry::new(c.datagram, c.direct);
    Ok(Box::new(SocketFlow::new(ring, sock, geo, ep, epoll)?))
}

/// Connects, attaches, starts the helper (which initialises EAL) and looks
/// up the rings. The error says whether trying again is pointless.
fn attach(path: &Path) -> Result<Attached, (i32, bool)> {
    let mut ctl = Control::connect(path, CONTROL_TIMEOUT).map_err(|e| {
        log::error(format_args!("{e}"));
        (libc::ECONNREFUSED, false)
    })?;
    let a = match ctl.request(&Request::Attach) {
        Ok(Response::Attached(a)) => a,
        Ok(other) => {
            log::error(format_args!(
                "ATTACH: {}",
                urdma_shared::client::refusal(other)
            ));
            return Err((libc::EPERM, false));
        }
        Err(e) => {
            log::error(format_args!("ATTACH: {e}"));
            return Err((libc::ECONNREFUSED, false));
        }
    };
    // The first attachment makes them; a forked child's attachment finds them renewed.
    for (cell, make) in helper_descriptors() {
        if cell.get().is_none() {
            let fd = make();
            if fd < 0 {
                return Err((crate::guard::errno(), false));
            }
            // SAFETY: a fresh descriptor we own.
            let _ = cell.set(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let attachment = a.clone();
    let started = std::time::Instant::now();
    spawn_blocking_signals(move || {
        let r = dpdk::eal_init(&attachment);
        let ok = r.is_ok();
        let _ = tx.send(r);
        if ok {
            helper_loop();
        }
    })
    .map_err(|e| {
        log::error(format_args!("cannot start the progress thread: {e}"));
        (libc::EAGAIN, false)
    })?;
    match rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            log::error(format_args!("{e}"));
            return Err((libc::EIO, true));
        }
        Err(_) => return Err((libc::EIO, true)),
    }
    let rings = Rings::lookup(&a, path).map_err(|e| {
        log::error(format_args!("{e}"));
        (libc::EIO, true)
    })?;
    log::info(format_args!(
        "attached to urdmad at {} (client {}, {} port(s), DPDK up in {} ms)",
        path.display(),
        a.client,
        a.ports.len(),
        started.elapsed().as_millis()
    ));
    Ok(Attached {
        path: path.to_owned(),
        ctl: Some(ctl),
        rings,
    })
}

/// A new descriptor for one of the helper's three, or -1 (`errno` says why).
type MakeFd = fn() -> i32;

/// The helper's descriptors, each with how to make it: the kick (an eventfd), the alarm (a
/// timerfd on the clock of [`now`]) and the epoll set of the direct path's sockets.
fn helper_descriptors() -> [(&'static OnceLock<OwnedFd>, MakeFd); 3] {
    fn kick() -> i32 {
        // SAFETY: plain eventfd creation.
        unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) }
    }
    fn alarm() -> i32 {
        // SAFETY: plain timerfd creation.
        unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        }
    }
    fn sockets() -> i32 {
        // SAFETY: plain epoll creation.
        unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }
    }
    let r = rt();
    [(&r.kick, kick), (&r.alarm, alarm), (&r.sockets, sockets)]
}

/// In a forked child: the helper's descriptors name objects the parent still uses (a kick
/// would wake the parent's helper, an alarm set would move its alarm, a socket taken out of
/// the epoll set would leave the parent's). Each is replaced by a fresh one under the same
/// number, so that nothing holding the number needs to hear of it. False if one could not
/// be made (the number then names /dev/null, and the child must not attach).
fn renew_descriptors() -> bool {
    let mut all = true;
    for (cell, make) in helper_descriptors() {
        let Some(old) = cell.get() else { continue };
        let fresh = make();
        // SAFETY: `fresh` is ours; `old` is the cell's descriptor, which keeps its number
        // and now names the fresh object (or /dev/null's, if none could be made).
        unsafe {
            if fresh >= 0 && libc::dup3(fresh, old.as_raw_fd(), libc::O_CLOEXEC) >= 0 {
                libc::close(fresh);
                continue;
            }
            if fresh >= 0 {
                libc::close(fresh);
            }
            all = false;
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup3(null, old.as_raw_fd(), libc::O_CLOEXEC);
                libc::close(null);
            }
        }
    }
    all
}

/// Starts a thread with every signal blocked (set around the spawn, so
/// there is no moment when it could take one of the application's).
fn spawn_blocking_signals(f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    // SAFETY: sigset manipulation on local storage; pthread_sigmask on the
    // calling thread, restored right after the spawn.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let r = std::thread::Builder::new()
            .name("urdma-progress".into())
            .spawn(move || crate::guard::catch((), f));
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r.map(|_| ())
    }
}

fn helper_loop() {
    let kick = rt().kick.get().map(|f| f.as_raw_fd()).unwrap_or(-1);
    let alarm = rt().alarm.get().map(|f| f.as_raw_fd()).unwrap_or(-1);
    let sockets = rt().sockets.get().map(|f| f.as_raw_fd()).unwrap_or(-1);
    let t = tuning();
    let mut idle = 0u32;
    // The last yield found the CPU free: spinning costs nobody.
    let mut free = true;
    // Spinning without the lock: every flow has a descriptor that says when
    // something comes, and the alarm is set to the earliest timer.
    let mut quiet = false;
    let mut ctl = -1;
    // How long to stay away from a lock the application holds.
    let mut busy = t.app_active;
    loop {
        if quiet {
            let woken = readable_any([ctl, kick, alarm, sockets]);
            if !woken && t.keep_spinning(idle, free, activity(), now()) {
                idle += 1;
                free = yield_cpu();
                continue;
            }
            quiet = false;
            drain([kick, alarm]);
        }
        let mut g = match rt().state.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) if readable_any([ctl, kick, -1, -1]) => {
                // A kick (the application goes to sleep) or urdmad's word came during the
                // call: the helper's round follows it.
                lock()
            }
            Err(TryLockError::WouldBlock) => {
                // The application is in a verb, which makes progress itself: look again
                // when it may have stopped, as while it polls, backing off the same way.
                // (Every 50 µs, the helper of a process with 256 QPs, whose calls hold the
                // lock for long, took a quarter of a CPU in the bed for nothing.)
                sleep_on_for([ctl, kick, -1, -1], busy);
                busy = t.next_look(busy);
                continue;
            }
        };
        busy = t.app_active;
        let Some(fd) = g
            .attached
            .as_ref()
            .and_then(|a| a.ctl.as_ref())
            .map(|c| c.as_raw_fd())
        else {
            // urdmad is gone: nothing more will arrive.
            return;
        };
        ctl = fd;
        let now = now();
        let events = readable(fd) && g.pump(now);
        let p = g.helper_round(now);
        g.deliver_notices();
        let round = Round {
            worked: p.busy || events,
            idle,
            cpu_free: free,
            needs_arm: g.engine.needs_arm(),
            armed: g.armed,
        };
        let (step, next_idle) = t.after_round(round, activity(), now, || g.engine.deadline());
        idle = next_idle;
        let sleep = match step {
            Step::Again => {
                drop(g);
                free = yield_cpu();
                continue;
            }
            Step::Spin { on_descriptors } => {
                quiet = on_descriptors;
                if quiet {
                    set_alarm(g.engine.deadline());
                }
                drop(g);
                free = yield_cpu();
                continue;
            }
            Step::Sleep { sleep, arm } => {
                if arm {
                    g.arm();
                }
                sleep
            }
        };
        g.helper_sleep = Some(sleep);
        set_alarm(sleep.until);
        drop(g);
        let mut look = t.app_active;
        loop {
            sleep_on([fd, kick, alarm, if sleep.watching { sockets } else { -1 }]);
            // Woken by its alarm while the application still calls: the calls make the
            // progress, and a round here would only take the lock from them (under
            // emulation, a quarter of a CPU per helper at 256 QPs). Look again when the
            // application may have stopped. urdmad's messages and kicks take their round.
            // The longer it has polled, the longer the helper stays away.
            if !readable_any([fd, kick, -1, -1]) && t.look_again(sleep, activity(), self::now()) {
                drain([-1, alarm]);
                look = t.next_look(look);
                set_alarm(Some(self::now() + look));
                continue;
            }
            break;
        }
        lock().helper_sleep = None;
        drain([kick, alarm]);
        // One round to see what woke it: anything to do starts the spin
        // again, nothing (ARM's reply, a timer with nothing due) sleeps.
        idle = t.spin_rounds - 1;
        free = true;
    }
}

/// Empties the helper's eventfd and timerfd.
fn drain(fds: [i32; 2]) {
    for f in fds {
        let mut v = 0u64;
        // SAFETY: reading our non-blocking eventfd or timerfd into a local.
        unsafe { libc::read(f, (&mut v as *mut u64).cast(), 8) };
    }
}

/// Whether any of `fds` (-1: none) has something to read, without waiting.
fn readable_any(fds: [i32; 4]) -> bool {
    wait_readable(fds, Some(Duration::ZERO))
}

/// Whether `fd` has something to read (one poll() that does not wait).
fn readable(fd: i32) -> bool {
    readable_any([fd, -1, -1, -1])
}

/// Sleeps until one of `fds` is readable or `d` has passed.
fn sleep_on_for(fds: [i32; 4], d: Duration) {
    wait_readable(fds, Some(d));
}

/// Sleeps until one of `fds` is readable.
fn sleep_on(fds: [i32; 4]) {
    wait_readable(fds, None);
}

/// Waits until one of `fds` (-1: none) is readable, for at most `timeout` (`None`: no
/// bound); whether one is.
fn wait_readable(fds: [i32; 4], timeout: Option<Duration>) -> bool {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let t = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let tp = t
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a valid pollfd array and timespec (or none); no signal mask change.
    unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            tp,
            std::ptr::null(),
        ) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urdmad_socket_comes_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("urdma-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(urdmad_socket(&dir).unwrap_err().contains("cannot read"));
        std::fs::write(dir.join("urdmad"), "\n").unwrap();
        assert!(urdmad_socket(&dir)
            .unwrap_err()
            .contains("no urdmad serves"));
        std::fs::write(dir.join("urdmad"), "/run/urdma/A.sock\n").unwrap();
        assert_eq!(
            urdmad_socket(&dir).unwrap(),
            PathBuf::from("/run/urdma/A.sock")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writing_to_a_closed_socket_does_not_raise_sigpipe() {
        use std::io::Write;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(b);
        // The default action, as in a C application (Rust's runtime
        // ignores SIGPIPE). std's socket writes pass MSG_NOSIGNAL, so a
        // write to a urdmad that has gone away fails with EPIPE instead of
        // killing the application; this would kill the test otherwise.
        // SAFETY: changing the disposition for the test, restored below.
        let prev = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let _ = a.write_all(b"x");
        let r = a.write_all(b"ARM\n");
        // SAFETY: restoring what was there.
        unsafe { libc::signal(libc::SIGPIPE, prev) };
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        // SAFETY: reading the calling thread's pending set and mask.
        unsafe {
            let mut p: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut p);
            assert_eq!(libc::sigismember(&p, libc::SIGPIPE), 0);
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut p);
            assert_eq!(libc::sigismember(&p, libc::SIGPIPE), 0);
        }
    }

    /// A fake urdmad on a socket that answers HELLO; the connection and the
    /// daemon's end of it.
    fn fake_urdmad(dir: &Path) -> (Control, std::os::unix::net::UnixStream) {
        use std::io::{BufRead, Write};
        let path = dir.join("urdmad.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let daemon = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&s).read_line(&mut line).unwrap();
            assert!(line.starts_with("HELLO "), "{line}");
            let hello = Response::Hello {
                version: urdma_shared::proto::VERSION,
                daemon: "fake".into(),
            };
            (&s).write_all(hello.encode().as_bytes()).unwrap();
            s
        });
        let ctl = Control::connect(&path, Duration::from_secs(5)).unwrap();
        (ctl, daemon.join().unwrap())
    }

    #[test]
    fn losing_urdmad_fails_every_qp_and_ends_the_attachment() {
        use crate::engine::QpInit;
        let dir = std::env::temp_dir().join(format!("urdma-lost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, daemon) = attached_to_fake(&dir);
        let path = dir.join("urdmad.sock");
        let mut sh = state.into_inner().unwrap();
        let key = (1, 7);
        sh.engine.create_cq((1, 1), 8, None);
        sh.engine.create_qp(
            key,
            QpInit {
                pd: 1,
                send_cq: (1, 1),
                recv_cq: (1, 1),
                sig_all: false,
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
                srq: None,
            },
        );
        sh.engine.post_recv(key, 42, &[]).unwrap();
        let t = now();
        assert!(!sh.pump(t), "nothing from a live urdmad yet");
        assert_eq!(sh.ensure_attached(&path), Ok(()));

        drop(daemon); // kill -9
        assert!(sh.pump(t));
        assert!(sh.attached.as_ref().unwrap().ctl.is_none());
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wc = [unsafe { std::mem::zeroed::<rdma_core_sys::ibv_wc>() }; 4];
        assert_eq!(sh.engine.poll_cq((1, 1), &mut wc), Some(1));
        assert_eq!(wc[0].wr_id, 42);
        assert_eq!(wc[0].status, rdma_core_sys::IBV_WC_WR_FLUSH_ERR);
        // Posts after the loss flush too; nothing asks urdmad anything.
        sh.engine.post_recv(key, 43, &[]).unwrap();
        sh.engine.progress(t);
        assert_eq!(sh.engine.poll_cq((1, 1), &mut wc), Some(1));
        assert_eq!(wc[0].status, rdma_core_sys::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(sh.ensure_attached(&path), Err(libc::ENOTCONN));
        assert!(sh.control().is_none());
        assert!(sh.expect_ok(&Request::Sync, t).is_err());
        assert!(!sh.pump(t));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A process's state attached to a fake urdmad; the daemon's end.
    fn attached_to_fake(dir: &Path) -> (Mutex<Shared>, std::os::unix::net::UnixStream) {
        let (ctl, daemon) = fake_urdmad(dir);
        let sh = Shared {
            engine: Engine::new(),
            attached: Some(Attached {
                path: dir.join("urdmad.sock"),
                ctl: Some(ctl),
                rings: Rings::none(),
            }),
            attach_failed: None,
            helper_sleep: None,
            armed: false,
            event_look: Instant::ZERO,
        };
        (Mutex::new(sh), daemon)
    }

    #[test]
    fn an_application_polling_reads_urdmads_events_now_and_then() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("urdma-look-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, daemon) = attached_to_fake(&dir);
        let mut sh = state.into_inner().unwrap();
        // What urdmad wrote waits until a round looks: the helper may not get the lock.
        let wake = |sh: &mut Shared| {
            sh.armed = true;
            (&daemon).write_all(b"EVENT WAKE\n").unwrap();
            std::thread::sleep(Duration::from_millis(20));
        };
        let t = now();
        wake(&mut sh);
        sh.full_round(t);
        assert!(!sh.armed, "read by the application's round");
        // Not on every poll: the next look is EVENT_LOOK later.
        wake(&mut sh);
        sh.full_round(t + EVENT_LOOK / 2);
        assert!(sh.armed, "a poll within EVENT_LOOK reads nothing");
        sh.full_round(t + EVENT_LOOK);
        assert!(!sh.armed);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_request_waits_for_urdmad_without_the_lock() {
        use std::io::{BufRead, Write};
        let dir = std::env::temp_dir().join(format!("urdma-ask-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (state, daemon) = attached_to_fake(&dir);
        let mut from = std::io::BufReader::new(daemon.try_clone().unwrap());
        std::thread::scope(|s| {
            let asking = s.spawn(|| ask_on(&state, &Request::Qp { dev: 0, qpn: 5 }));
            let mut line = String::new();
            from.read_line(&mut line).unwrap();
            assert_eq!(line, "QP dev=0 qpn=5\n");
            // While urdmad has not answered, the lock is free for the process's other
            // threads, which post and read what comes meanwhile.
            {
                let mut g = (0..200)
                    .find_map(|_| {
                        let g = state.try_lock().ok();
                        if g.is_none() {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        g
                    })
                    .expect("the lock is free while urdmad has not answered");
                g.post(&Request::Arm);
                (&daemon).write_all(b"EVENT WAKE\n").unwrap();
                std::thread::sleep(Duration::from_millis(20));
                assert!(g.pump(now()), "the event is read by the thread that looks");
            }
            std::thread::sleep(Duration::from_millis(20));
            assert!(!asking.is_finished());
            // The QP's reply, read by another thread first, still reaches its asker.
            (&daemon).write_all(b"OK\nOK\n").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            lock_of(&state).pump(now());
            assert_eq!(asking.join().unwrap(), Ok(()));
            // A refusal is the asker's error.
            let asking = s.spawn(|| ask_on(&state, &Request::Unqp { dev: 0, qpn: 5 }));
            (&daemon)
                .write_all(b"ERROR code=EEXIST message=taken\n")
                .unwrap();
            let e = asking.join().unwrap().unwrap_err();
            assert!(e.contains("taken"), "{e}");
            // urdmad gone while a request waits: an error, not a hang.
            let asking = s.spawn(|| ask_on(&state, &Request::Qp { dev: 0, qpn: 6 }));
            std::thread::sleep(Duration::from_millis(20));
            daemon.shutdown(std::net::Shutdown::Both).unwrap();
            assert!(asking.join().unwrap().is_err());
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn renewed_descriptors_keep_their_numbers_and_leave_the_parents_objects_alone() {
        for (cell, make) in helper_descriptors() {
            if cell.get().is_none() {
                // SAFETY: a fresh descriptor we own.
                let _ = cell.set(unsafe { OwnedFd::from_raw_fd(make()) });
            }
        }
        let kick = rt().kick.get().unwrap().as_raw_fd();
        // What the parent keeps: the same eventfd under another number.
        // SAFETY: duplicating our own descriptor.
        let parents = unsafe { OwnedFd::from_raw_fd(libc::dup(kick)) };
        let read = |fd: i32| {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes of a non-blocking eventfd into a local.
            let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
            (n == 8).then_some(v)
        };
        kick_helper();
        assert!(renew_descriptors());
        assert_eq!(rt().kick.get().unwrap().as_raw_fd(), kick);
        assert_eq!(read(kick), None, "the number names a fresh eventfd");
        kick_helper();
        assert_eq!(
            read(parents.as_raw_fd()),
            Some(1),
            "the parent's saw one kick"
        );
        assert_eq!(read(kick), Some(1));
        // The fresh ones keep close-on-exec.
        for (cell, _) in helper_descriptors() {
            // SAFETY: querying our own descriptor's flags.
            let flags = unsafe { libc::fcntl(cell.get().unwrap().as_raw_fd(), libc::F_GETFD) };
            assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        }
    }

    #[test]
    fn clock_is_monotonic_nanoseconds() {
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        let b = now();
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(2));
    }

    #[test]
    fn helper_thread_blocks_every_signal() {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_blocking_signals(move || {
            // SAFETY: reading the calling thread's mask into local storage.
            let blocked = unsafe {
                let mut cur: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
                [
                    libc::SIGINT,
                    libc::SIGTERM,
                    libc::SIGUSR1,
                    libc::SIGALRM,
                    libc::SIGCHLD,
                ]
                .iter()
                .all(|&s| libc::sigismember(&cur, s) == 1)
            };
            tx.send(blocked).unwrap();
        })
        .unwrap();
        assert!(rx.recv().unwrap());
        // The spawning thread's mask is back as it was.
        // SAFETY: a sigset on the stack, queried for the calling thread.
        let mine = unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, libc::SIGUSR1)
        };
        assert_eq!(mine, 0);
    }
}
