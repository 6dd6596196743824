//! The direct path's packet sockets, made ready before a connection needs one and closed after
//! nobody uses them, on threads of urdmad's own.
//!
//! Giving a packet socket its rings (`PACKET_RX_RING`, `PACKET_TX_RING`) makes the kernel wait
//! for an RCU grace period per ring, and the last close of a socket with rings waits for
//! three (one per ring, one in `packet_release`). Under emulation a grace period is tens of
//! milliseconds, and on the connection's path those waits were most of a connect–disconnect
//! cycle. Here they are paid ahead of need and after use:
//!
//! - [`SocketKeeper::take`] hands out a socket whose rings are set and which is neither
//!   filtered nor bound: it receives nothing until the hand-over (`direct::hand_over`) locks
//!   its filter and binds it, which waits for nothing. A socket is handed out once; none
//!   that a process ever held comes back into the pool.
//! - [`SocketKeeper::close`] takes a socket urdmad no longer uses, urdmad's own copy or the
//!   one a process gave back (`GIVEBACK`), and closes it [`LINGER`] later. A process closes
//!   its copy right after giving it back; the delay lets that close come first, so that the
//!   last one, which waits, is the keeper's.
//!
//! The threads make sockets through the function they are given, so the policy is tested here
//! with descriptors of any kind; what they make may hold more than the socket ([`Ready`]:
//! urdmad's also holds the connection's filter, loaded ahead too).

use crate::direct::Geometry;
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a socket to close is kept (see the module's comment). Its rings stay allocated
/// meanwhile; the connection's path never waits for it.
pub const LINGER: Duration = Duration::from_millis(200);
/// After a socket could not be made, how long before the next try.
const RETRY: Duration = Duration::from_secs(1);
/// Geometries kept ready at once: a port's connections all have the same one, so this is
/// one per port with a direct path, with room to spare.
const KINDS: usize = 4;
/// Threads that make sockets. Each one waits for the grace periods of its socket, and waits
/// that overlap end together: after a burst of connections took every ready socket, this
/// many are ready again in the time one takes.
const MAKERS: usize = 8;
/// After a connection found no socket ready, the keeper keeps more ready: as many again as
/// its target, doubling at each further miss up to this many more, until [`BURST_HOLD`]
/// passes without a miss; the surplus is then closed. A burst of connections (a job
/// connecting its ranks) so finds most of its sockets ready, and an idle urdmad holds no
/// more than `direct_ready` (each socket's rings take `2 × direct_frames` frames of memory).
const BURST_MAX: usize = 28;
const BURST_HOLD: Duration = Duration::from_secs(2);

/// What the keeper makes ready: a socket, with whatever else a connection takes with it.
pub trait Ready: Send + 'static {
    /// The socket, to close after [`LINGER`] when the rest is no longer wanted.
    fn into_socket(self) -> OwnedFd;
}

impl Ready for OwnedFd {
    fn into_socket(self) -> OwnedFd {
        self
    }
}

/// How a ready socket is made (`daemon::direct::prepare` outside tests).
pub type Make<T> = dyn Fn(Geometry) -> io::Result<T> + Send + Sync;

/// Its methods are urdmad's thread's, which never waits for the keeper's threads: they run at
/// the idle policy, and on a host whose CPUs are busy one can sit runnable for seconds while
/// it holds their lock (10–20 s in the overload test, which then lost connections). A call
/// that finds the lock taken does without it (see each).
pub struct SocketKeeper<T: Ready = OwnedFd> {
    shared: Arc<Shared<T>>,
    threads: Vec<JoinHandle<()>>,
    /// What calls that found the lock taken left for the next call that finds it free to
    /// pass on. Only urdmad's thread takes this lock.
    deferred: Mutex<Deferred>,
    /// Takes that found no socket ready, and of them those that found the lock taken.
    missed: AtomicU64,
    missed_busy: AtomicU64,
}

/// Left by calls that found the keeper's lock taken.
#[derive(Default)]
struct Deferred {
    /// Sockets to close.
    closes: Vec<(Instant, OwnedFd)>,
    /// Geometries asked for: a `take` that found the lock taken still asks for its
    /// geometry, or the keeper would make none before urdmad's next `take` (at start, when
    /// the keeper's threads hold the lock in turn, that was never for a process that
    /// connected once).
    wants: Vec<Geometry>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
}

struct State<T> {
    /// Ready sockets, each with the geometry of its rings.
    ready: Vec<(Geometry, T)>,
    /// The geometries of the sockets being made.
    making: Vec<Geometry>,
    /// The geometries asked for, most recent first, at most [`KINDS`].
    wanted: VecDeque<Geometry>,
    /// Sockets to keep ready of each wanted geometry.
    target: usize,
    /// How many more while a burst lasts, and until when.
    burst: usize,
    burst_until: Option<Instant>,
    /// Sockets to close, with when they came.
    closing: VecDeque<(Instant, OwnedFd)>,
    /// No socket is made before this (a failure was seen).
    pause_until: Option<Instant>,
    /// Failures to make a socket so far.
    failures: u64,
    stop: bool,
}

impl<T> Default for State<T> {
    fn default() -> State<T> {
        State {
            ready: Vec::new(),
            making: Vec::new(),
            wanted: VecDeque::new(),
            target: 0,
            burst: 0,
            burst_until: None,
            closing: VecDeque::new(),
            pause_until: None,
            failures: 0,
            stop: false,
        }
    }
}

/// What the keeper's figures say, for `urdmad status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub ready: usize,
    pub closing: usize,
    pub failures: u64,
}

/// Takes that found no socket ready (each connection then had urdmad's thread make its
/// own), and of them those that found a keeper's thread holding the lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Misses {
    pub missed: u64,
    pub busy: u64,
}

/// The thread's next step, decided under the lock.
enum Step {
    Close(Vec<OwnedFd>),
    Make(Geometry),
    Wait(Option<Duration>),
    Stop,
}

impl<T: Ready> State<T> {
    /// Sockets of `geo` ready or being made.
    fn count(&self, geo: Geometry) -> usize {
        self.ready.iter().filter(|(g, _)| *g == geo).count()
            + self.making.iter().filter(|&&g| g == geo).count()
    }

    /// Sockets to keep ready of each wanted geometry now.
    fn goal(&self, now: Instant) -> usize {
        match self.burst_until {
            Some(t) if now < t => self.target + self.burst,
            _ => self.target,
        }
    }

    /// `geo` is asked for: the most recent of the geometries kept ready, whose oldest
    /// beyond [`KINDS`] is forgotten with its ready sockets.
    fn want(&mut self, geo: Geometry) {
        if let Some(i) = self.wanted.iter().position(|&g| g == geo) {
            self.wanted.remove(i);
        }
        self.wanted.push_front(geo);
        while self.wanted.len() > KINDS {
            let old = self.wanted.pop_back().expect("not empty");
            self.ready.retain(|(g, _)| *g != old);
        }
    }

    /// A connection found no socket ready: a burst, or a longer one.
    fn missed(&mut self, now: Instant) {
        if self.target == 0 {
            return;
        }
        self.burst = (self.burst * 2).clamp(self.target, BURST_MAX);
        self.burst_until = Some(now + BURST_HOLD);
    }

    fn next(&mut self, now: Instant) -> Step {
        if self.stop {
            return Step::Stop;
        }
        if self.burst_until.is_some_and(|t| now >= t) {
            // The burst is over: what was made for it and is still ready goes.
            self.burst = 0;
            self.burst_until = None;
            let mut surplus = Vec::new();
            for geo in self.wanted.clone() {
                let mut extra = self.count(geo).saturating_sub(self.target);
                while extra > 0 {
                    let Some(i) = self.ready.iter().position(|(g, _)| *g == geo) else {
                        break;
                    };
                    surplus.push(self.ready.swap_remove(i).1.into_socket());
                    extra -= 1;
                }
            }
            if !surplus.is_empty() {
                return Step::Close(surplus);
            }
        }
        let mut due = Vec::new();
        while self
            .closing
            .front()
            .is_some_and(|(t, _)| now >= *t + LINGER)
        {
            due.push(self.closing.pop_front().expect("front").1);
        }
        if !due.is_empty() {
            return Step::Close(due);
        }
        let close_in = self.closing.front().map(|(t, _)| *t + LINGER - now);
        let paused = self.pause_until.filter(|&t| t > now);
        let goal = self.goal(now);
        if paused.is_none() {
            if let Some(&geo) = self.wanted.iter().find(|&&g| self.count(g) < goal) {
                return Step::Make(geo);
            }
        }
        let resume_in = paused
            .filter(|_| self.wanted.iter().any(|&g| self.count(g) < goal))
            .map(|t| t - now);
        let burst_ends_in = self.burst_until.map(|t| t - now);
        Step::Wait(
            [close_in, resume_in, burst_ends_in]
                .into_iter()
                .flatten()
                .min(),
        )
    }
}

impl<T: Ready> SocketKeeper<T> {
    /// A keeper holding `target` ready sockets of each geometry asked for, made by `make`.
    pub fn new(target: usize, make: Box<Make<T>>) -> io::Result<SocketKeeper<T>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                target,
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let make: Arc<Make<T>> = Arc::from(make);
        let mut keeper = SocketKeeper {
            shared,
            threads: Vec::with_capacity(MAKERS),
            deferred: Mutex::new(Deferred::default()),
            missed: AtomicU64::new(0),
            missed_busy: AtomicU64::new(0),
        };
        for _ in 0..MAKERS {
            let (s, m) = (Arc::clone(&keeper.shared), Arc::clone(&make));
            // On failure the keeper (its Drop) stops the threads already started.
            keeper.threads.push(
                std::thread::Builder::new()
                    .name("urdmad-sockets".into())
                    .spawn(move || run(&s, &*m))?,
            );
        }
        Ok(keeper)
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock if it is free, with the deferred closes passed on.
    fn try_lock(&self) -> Option<MutexGuard<'_, State<T>>> {
        let mut s = match self.shared.state.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        if !d.closes.is_empty() {
            s.closing.extend(d.closes.drain(..));
            self.shared.changed.notify_one();
        }
        if !d.wants.is_empty() {
            // As `take`: every keeper's thread may have a socket to make.
            for geo in d.wants.drain(..) {
                s.want(geo);
            }
            self.shared.changed.notify_all();
        }
        Some(s)
    }

    /// A ready socket with rings of `geo`, if one is; either way the keeper keeps some of
    /// that geometry ready from now on. None too while a keeper's thread holds the lock
    /// (the geometry is then asked for by the next call that finds it free).
    pub fn take(&self, geo: Geometry) -> Option<T> {
        let Some(mut s) = self.try_lock() else {
            self.missed.fetch_add(1, Ordering::Relaxed);
            self.missed_busy.fetch_add(1, Ordering::Relaxed);
            let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            if !d.wants.contains(&geo) {
                d.wants.push(geo);
            }
            return None;
        };
        s.want(geo);
        let got = s
            .ready
            .iter()
            .position(|(g, _)| *g == geo)
            .map(|i| s.ready.swap_remove(i).1);
        if got.is_none() {
            self.missed.fetch_add(1, Ordering::Relaxed);
            s.missed(Instant::now());
        }
        drop(s);
        self.shared.changed.notify_all();
        got
    }

    /// Closes `fd` [`LINGER`] from now, on the keeper's thread; if a keeper's thread holds
    /// the lock, once the next call has passed it on.
    pub fn close(&self, fd: OwnedFd) {
        let at = (Instant::now(), fd);
        match self.try_lock() {
            Some(mut s) => s.closing.push_back(at),
            None => self
                .deferred
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .closes
                .push(at),
        }
        self.shared.changed.notify_one();
    }

    /// Takes that found no socket ready so far (read without the lock).
    pub fn misses(&self) -> Misses {
        Misses {
            missed: self.missed.load(Ordering::Relaxed),
            busy: self.missed_busy.load(Ordering::Relaxed),
        }
    }

    /// What the keeper holds; None while a keeper's thread holds the lock.
    pub fn figures(&self) -> Option<Figures> {
        let s = self.try_lock()?;
        Some(Figures {
            ready: s.ready.len(),
            closing: s.closing.len(),
            failures: s.failures,
        })
    }
}

impl<T: Ready> Drop for SocketKeeper<T> {
    /// Closes what the keeper holds and ends its threads (urdmad is stopping: the waits no
    /// longer hold anyone up).
    fn drop(&mut self) {
        self.lock().stop = true;
        self.shared.changed.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Puts the calling thread at the idle policy, where the work done ahead of need (the
/// keeper's, the filters' stock) never takes the CPU from urdmad's forwarding thread.
pub fn idle_policy(who: &str) {
    let idle = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param; 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &idle) } != 0 {
        tracing::debug!(
            "{who} stays at the normal policy: {}",
            io::Error::last_os_error()
        );
    }
}

fn run<T: Ready>(shared: &Shared<T>, make: &Make<T>) {
    // The keeper's work is waiting for grace periods. At the idle policy its wake-ups (a
    // socket taken, one given back) never take the CPU from urdmad's forwarding thread,
    // which is in the middle of a hand-over when it takes a socket.
    idle_policy("socket keeper");
    let mut s = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match s.next(Instant::now()) {
            Step::Stop => return,
            Step::Close(fds) => {
                drop(s);
                drop(fds);
            }
            Step::Make(geo) => {
                s.making.push(geo);
                drop(s);
                let made = make(geo);
                let mut g = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(i) = g.making.iter().position(|&m| m == geo) {
                    g.making.swap_remove(i);
                }
                match made {
                    // Kept only while still wanted.
                    Ok(fd) if g.wanted.contains(&geo) => g.ready.push((geo, fd)),
                    Ok(_) => {}
                    Err(e) => {
                        g.failures += 1;
                        g.pause_until = Some(Instant::now() + RETRY);
                        if g.failures.is_power_of_two() {
                            tracing::warn!("cannot make a socket ready for the direct path: {e} ({} times so far)", g.failures);
                        }
                    }
                }
                s = g;
                continue;
            }
            Step::Wait(None) => {
                s = shared.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            Step::Wait(Some(d)) => {
                s = shared
                    .changed
                    .wait_timeout(s, d)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
        }
        s = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: a valid array of two descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors we own.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    fn pipe_end() -> io::Result<OwnedFd> {
        Ok(pipe().0)
    }

    /// Whether the read end of the pipe whose write end is `w` was closed everywhere.
    fn reader_gone(w: &OwnedFd) -> bool {
        let mut p = libc::pollfd {
            fd: w.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) };
        p.revents & libc::POLLERR != 0
    }

    /// The figures, once no keeper's thread holds the lock.
    fn figures<T: Ready>(k: &SocketKeeper<T>) -> Figures {
        loop {
            if let Some(f) = k.figures() {
                return f;
            }
            std::thread::yield_now();
        }
    }

    /// A socket of `geo` once a take finds one: a take returns None while a keeper's
    /// thread holds the lock, which it may still do for a burst's sockets after the
    /// figures said they were ready.
    fn take_soon<T: Ready>(k: &SocketKeeper<T>, geo: Geometry) -> T {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(t) = k.take(geo) {
                return t;
            }
            assert!(Instant::now() < until, "no socket within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn wait_for(what: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !what() {
            assert!(Instant::now() < until, "not within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_geometry_asked_for_is_kept_ready_and_each_socket_handed_out_once() {
        let made = Arc::new(Mutex::new(Vec::new()));
        let m = Arc::clone(&made);
        let k = SocketKeeper::new(
            2,
            Box::new(move |geo| {
                m.lock().unwrap().push(geo);
                pipe_end()
            }),
        )
        .unwrap();
        let made_of = |geo| made.lock().unwrap().iter().filter(|&&g| g == geo).count();
        let geo = Geometry::new(1472, 64);
        // Nothing is made before a geometry is asked for.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(made_of(geo), 0);
        // A miss: the keeper keeps 2 ready, and as many again while the burst lasts.
        assert!(k.take(geo).is_none());
        wait_for(|| figures(&k).ready >= 2);
        let a = take_soon(&k, geo);
        let b = take_soon(&k, geo);
        assert_ne!(a.as_raw_fd(), b.as_raw_fd());
        wait_for(|| figures(&k).ready >= 2);
        assert!(made_of(geo) <= 2 + 2 + 2, "{} made", made_of(geo));
        // Another geometry gets its own.
        let other = Geometry::new(8972, 64);
        assert!(k.take(other).is_none());
        wait_for(|| made_of(other) >= 2);
    }

    #[test]
    fn a_socket_to_close_is_closed_after_the_linger_and_not_before() {
        let k = SocketKeeper::new(0, Box::new(|_| pipe_end())).unwrap();
        let (r, w) = pipe();
        let t = Instant::now();
        k.close(r);
        assert_eq!(figures(&k).closing, 1);
        wait_for(|| reader_gone(&w));
        assert!(t.elapsed() >= LINGER, "closed after {:?}", t.elapsed());
        assert_eq!(figures(&k).closing, 0);
    }

    #[test]
    fn urdmad_s_thread_never_waits_for_a_keeper_s_thread_holding_the_lock() {
        let k = SocketKeeper::new(1, Box::new(|_| pipe_end())).unwrap();
        let geo = Geometry::new(1472, 64);
        assert!(k.take(geo).is_none());
        wait_for(|| figures(&k).ready >= 1);
        let (r, w) = pipe();
        {
            // As a keeper's thread left without the CPU while it holds the lock.
            let _held = k.shared.state.lock().unwrap();
            let t = Instant::now();
            assert!(
                k.take(geo).is_none(),
                "a socket came out of a locked keeper"
            );
            k.close(r);
            assert_eq!(k.figures(), None);
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "waited {:?}",
                t.elapsed()
            );
        }
        // The next call passes the close on, and the ready socket is still there.
        assert_eq!(figures(&k).closing, 1);
        wait_for(|| reader_gone(&w));
        take_soon(&k, geo);
    }

    #[test]
    fn a_take_that_finds_the_lock_taken_still_asks_for_its_geometry() {
        let k = SocketKeeper::new(1, Box::new(|_| pipe_end())).unwrap();
        let geo = Geometry::new(1472, 64);
        {
            let _held = k.shared.state.lock().unwrap();
            assert!(k.take(geo).is_none());
            assert!(k.take(geo).is_none());
        }
        wait_for(|| figures(&k).ready >= 1);
        take_soon(&k, geo);
    }

    #[test]
    fn a_failure_to_make_one_pauses_the_keeper_rather_than_spinning() {
        let tries = Arc::new(AtomicUsize::new(0));
        let t = Arc::clone(&tries);
        let k = SocketKeeper::<OwnedFd>::new(
            3,
            Box::new(move |_| {
                t.fetch_add(1, Ordering::SeqCst);
                Err(io::Error::from_raw_os_error(libc::EPERM))
            }),
        )
        .unwrap();
        assert!(k.take(Geometry::new(1472, 64)).is_none());
        wait_for(|| figures(&k).failures >= 1);
        // The makers that had started fail too; none starts again within RETRY.
        std::thread::sleep(Duration::from_millis(50));
        let first = tries.load(Ordering::SeqCst);
        assert!((1..=3).contains(&first), "{first} tries for 3 sockets");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            tries.load(Ordering::SeqCst),
            first,
            "retried within {RETRY:?}"
        );
        assert_eq!(figures(&k).ready, 0);
    }

    #[test]
    fn sockets_are_made_several_at_once() {
        // Each make waits until another is under way too (or 5 s): one maker at a time
        // would take 5 s per socket.
        let inflight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (i, m) = (Arc::clone(&inflight), Arc::clone(&most));
        let k = SocketKeeper::new(
            MAKERS,
            Box::new(move |_| {
                let n = i.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(n, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(5);
                while m.load(Ordering::SeqCst) < 2 && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                i.fetch_sub(1, Ordering::SeqCst);
                pipe_end()
            }),
        )
        .unwrap();
        let t = Instant::now();
        assert!(k.take(Geometry::new(1472, 64)).is_none());
        wait_for(|| figures(&k).ready >= MAKERS);
        assert!(most.load(Ordering::SeqCst) >= 2);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    #[test]
    fn the_policy_closes_what_is_due_first_and_waits_for_the_next() {
        let now = Instant::now();
        let geo = Geometry::new(1472, 64);
        let mut s = State {
            target: 1,
            ..State::default()
        };
        assert!(matches!(s.next(now), Step::Wait(None)));
        s.wanted.push_front(geo);
        assert!(matches!(s.next(now), Step::Make(g) if g == geo));
        s.ready.push((geo, pipe_end().unwrap()));
        assert!(matches!(s.next(now), Step::Wait(None)));
        s.closing.push_back((now, pipe_end().unwrap()));
        assert!(matches!(s.next(now), Step::Wait(Some(d)) if d == LINGER));
        assert!(matches!(s.next(now + LINGER), Step::Close(v) if v.len() == 1));
        s.ready.clear();
        s.pause_until = Some(now + RETRY);
        assert!(matches!(s.next(now), Step::Wait(Some(d)) if d == RETRY));
        assert!(matches!(s.next(now + RETRY), Step::Make(_)));
        s.stop = true;
        assert!(matches!(s.next(now), Step::Stop));
    }

    #[test]
    fn a_miss_keeps_more_ready_until_the_burst_is_over() {
        let now = Instant::now();
        let geo = Geometry::new(1472, 64);
        let mut s = State {
            target: 2,
            ..State::default()
        };
        s.wanted.push_front(geo);
        s.ready.push((geo, pipe_end().unwrap()));
        s.ready.push((geo, pipe_end().unwrap()));
        assert!(matches!(s.next(now), Step::Wait(None)));
        // A miss: as many again, and more at each further miss, up to BURST_MAX more.
        s.missed(now);
        assert_eq!(s.goal(now), 4);
        assert!(matches!(s.next(now), Step::Make(_)));
        s.missed(now);
        assert_eq!(s.goal(now), 6);
        for _ in 0..10 {
            s.missed(now);
        }
        assert_eq!(s.goal(now), 2 + BURST_MAX);
        // Ready up to the goal: the keeper waits for the burst's end, then closes the surplus.
        while s.ready.len() < 2 + BURST_MAX {
            s.ready.push((geo, pipe_end().unwrap()));
        }
        assert!(matches!(s.next(now), Step::Wait(Some(d)) if d == BURST_HOLD));
        match s.next(now + BURST_HOLD) {
            Step::Close(v) => assert_eq!(v.len(), BURST_MAX),
            _ => panic!("the surplus is not closed"),
        }
        assert_eq!(s.ready.len(), 2);
        assert_eq!(s.goal(now + BURST_HOLD), 2);
        // With no sockets to keep ready, a miss changes nothing.
        let mut off = State::<OwnedFd>::default();
        off.missed(now);
        assert_eq!(off.goal(now), 0);
    }
}
