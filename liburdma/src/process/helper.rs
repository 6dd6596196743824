//! The helper thread: progress while the application is elsewhere.
//!
//! # Progress
//! The application's own calls drive progress: `poll_cq` receives, runs
//! timers and transmits for every connection; `post_send` and `post_recv` for
//! the QP posted to, and for every connection once a full round is due
//! ([`crate::engine::Engine::progress_after_post`]: a round over hundreds of QPs on every post
//! made a message cost what all of them cost).
//! The helper thread covers the time the application spends elsewhere
//! (blocked in `ibv_get_cq_event`, `rdma_get_cm_event`, polling its own
//! memory, ...). While an application thread polls (it is in a data verb or
//! made one within [`crate::progress::APP_ACTIVE`]; `ibv_req_notify_cq` ends
//! that at once) the helper stays out of its way: it sleeps without watching
//! for frames and looks again when the application may have stopped, less
//! often the longer it polls ([`crate::progress::LOOK_MAX`]). Where urdma.ko
//! (or urdmad, for the frames it puts on the rings) hushes every connection's
//! frames (a frame that comes while an application thread is in a call wakes
//! nobody, `urdma_shared::bell::Hush`), it watches all the same: only a frame
//! no call will read wakes it. Its rounds leave
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
//! The helper waits for the lock when a call holds it, and never holds it
//! while it sleeps or waits for urdmad. It blocks every signal.
//!

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use trp::Instant;

use super::{activity, lock, now, rt, tuning, ALARM_MOVES, HELPER_WOKEN};
use crate::progress::{Round, Step};

/// A yield that returns within this found no other thread wanting the CPU. One that took
/// longer gave the CPU to another thread, the application's very likely: the helper then
/// stops spinning and sleeps until a frame or a timer wakes it. A helper that spins on a
/// shared CPU delays the application it serves, and by using CPU time it loses the
/// scheduler's preference for threads that wake after sleeping, so that its next wake-up
/// waits for a time slice to end (measured in the emulated two-vCPU bed: `ib_write_lat`
/// 2.9 ms with a 64-round spin, 0.8 ms without).
const YIELD_FREE: Duration = Duration::from_micros(100);

/// Gives up the CPU; whether nobody else took it ([`YIELD_FREE`]).
fn yield_cpu() -> bool {
    let t = std::time::Instant::now();
    std::thread::yield_now();
    t.elapsed() < YIELD_FREE
}

/// Sets the helper's alarm to `at` (None: no alarm). An expiry not read yet is taken back:
/// the alarm's descriptor is readable again only once `at` has passed.
pub(super) fn set_alarm(at: Option<Instant>) {
    if let Some(fd) = rt().alarm.get() {
        arm(fd.as_raw_fd(), at);
    }
}

/// A new alarm: a timerfd on the clock of [`now`], or -1 (`errno` says why).
pub(super) fn new_alarm() -> i32 {
    // SAFETY: plain timerfd creation.
    unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    }
}

/// Sets timerfd `fd` to expire at `at` on [`now`]'s clock (None: never).
fn arm(fd: i32, at: Option<Instant>) {
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
    // SAFETY: a timerfd; a valid itimerspec; no old value wanted.
    unsafe { libc::timerfd_settime(fd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) };
}

pub(super) fn kick_helper() {
    if let Some(fd) = rt().kick.get() {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

pub(super) fn helper_loop() {
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
    // What the last wait found readable (`Ready`), for the round that follows it: a
    // second look at the same descriptors is a system call for nothing.
    let mut woke: Option<Ready> = None;
    loop {
        if quiet {
            let r = readable_any([ctl, kick, alarm, sockets]);
            if r.none() && t.keep_spinning(idle, free, activity(), now()) {
                idle += 1;
                free = yield_cpu();
                continue;
            }
            quiet = false;
            drain_kick(r, kick);
            woke = Some(r);
        }
        // Only for the round that follows the wait at once.
        let first = woke.take();
        // An application thread in a call makes progress only for the QP it posts to (a
        // post) or for every one (a poll): the round follows the call, however long it
        // holds the lock. A helper that backed off instead, for the application's next
        // look, left the frame that woke it unread for up to a look's length.
        let mut g = lock();
        g.helper_sleep = None;
        HELPER_WOKEN.store(false, Ordering::Relaxed);
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
        let ctl_ready = match first {
            Some(r) => r.has(0),
            None => readable(fd),
        };
        let events = ctl_ready && g.pump(now);
        let p = g.helper_round(now);
        g.deliver_notices();
        let wakes = g.engine.flow_wakes();
        let needs_arm = wakes.needs_arm;
        let hushed = super::hush().is_some() && wakes.all_hushed;
        let round = Round {
            worked: p.busy || events,
            idle,
            cpu_free: free,
            needs_arm,
            armed: g.armed,
            backlogged: p.backlogged,
            hushed,
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
        g.helper_direct = !needs_arm;
        // The alarm is set after the lock is let go: the application may be waiting for the
        // lock to answer what this round placed (a Write to its memory), and a thread that
        // waits for the lock gives up its CPU, which on a shared host it may not get back
        // for a time slice. A call that moved the alarm in between has the last word: a
        // count changed since the lock was held means the call's time may have been
        // overwritten, and it is set again, under the lock.
        let moves = ALARM_MOVES.load(Ordering::SeqCst);
        drop(g);
        set_alarm(sleep.until);
        if ALARM_MOVES.load(Ordering::SeqCst) != moves {
            let g = lock();
            set_alarm(g.helper_sleep.and_then(|s| s.until));
        }
        let mut look = t.app_active;
        let r = loop {
            let r = sleep_on([fd, kick, alarm, if sleep.watching { sockets } else { -1 }]);
            // Woken by its alarm alone while the application still calls: the calls make the
            // progress, and a round here would only take the lock from them (under
            // emulation, a quarter of a CPU per helper at 256 QPs). Look again when the
            // application may have stopped. urdmad's messages and kicks take their round.
            // The longer it has polled, the longer the helper stays away.
            if !r.has(0) && !r.has(1) && !r.has(3) && t.look_again(sleep, activity(), self::now()) {
                look = t.next_look(look);
                set_alarm(Some(self::now() + look));
                continue;
            }
            break r;
        };
        // Awake, but not taking the lock to say so: an application in a call would make
        // it wait for the call to end, and then wake it again. The flag tells the
        // application's calls until the next round clears `helper_sleep`.
        HELPER_WOKEN.store(true, Ordering::Relaxed);
        drain_kick(r, kick);
        woke = Some(r);
        // One round to see what woke it: anything to do starts the spin
        // again, nothing (a timer with nothing due) sleeps.
        idle = t.spin_rounds - 1;
        free = true;
    }
}

/// Which of the four descriptors of a wait were readable, by their place in it.
#[derive(Clone, Copy)]
struct Ready(u8);

impl Ready {
    fn has(self, i: usize) -> bool {
        self.0 & (1 << i) != 0
    }
    fn any(self) -> bool {
        self.0 != 0
    }
    fn none(self) -> bool {
        self.0 == 0
    }
}

/// Empties the helper's eventfd (`kick`, at place 1 of the wait that found `r`) if it was
/// readable: a read of one that was not is a system call for nothing. One that became
/// readable since wakes the next wait at once. The alarm is not read: every wait on it
/// follows a `set_alarm`, which takes back an expiry not yet read (`timerfd_settime`
/// clears the count), so a read of it would be a system call in the runs it wakes for
/// nothing else.
fn drain_kick(r: Ready, kick: i32) {
    if kick < 0 || !r.has(1) {
        return;
    }
    let mut v = 0u64;
    // SAFETY: reading our non-blocking eventfd into a local.
    unsafe { libc::read(kick, (&mut v as *mut u64).cast(), 8) };
}

/// Which of `fds` (-1: none) have something to read, without waiting.
fn readable_any(fds: [i32; 4]) -> Ready {
    wait_readable(fds, Some(Duration::ZERO))
}

/// Whether `fd` has something to read (one poll() that does not wait).
fn readable(fd: i32) -> bool {
    readable_any([fd, -1, -1, -1]).any()
}

/// Sleeps until one of `fds` is readable; which are.
fn sleep_on(fds: [i32; 4]) -> Ready {
    wait_readable(fds, None)
}

/// Waits until one of `fds` (-1: none) is readable, for at most `timeout` (`None`: no
/// bound); which are.
fn wait_readable(fds: [i32; 4], timeout: Option<Duration>) -> Ready {
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
    let n = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            tp,
            std::ptr::null(),
        )
    };
    if n <= 0 {
        return Ready(0);
    }
    // Only POLLIN was asked for: any other event (an error, a hang-up) is also news for
    // the round, as it was when a positive count alone woke it.
    Ready(
        p.iter()
            .enumerate()
            .filter(|(_, q)| q.fd >= 0 && q.revents != 0)
            .fold(0, |m, (i, _)| m | 1 << i),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The helper never reads its alarm ([`drain_kick`]): setting it again must take back an
    /// expiry nobody read, or the next wait would end at once, with nothing due.
    #[test]
    fn setting_the_alarm_again_takes_back_an_unread_expiry() {
        let fd = new_alarm();
        assert!(fd >= 0);
        let readable = |d| wait_readable([fd, -1, -1, -1], Some(d)).any();
        arm(fd, Some(now()));
        assert!(readable(Duration::from_secs(1)), "expired");
        assert!(readable(Duration::ZERO), "still readable: nobody read it");
        arm(fd, Some(now() + Duration::from_secs(60)));
        assert!(!readable(Duration::ZERO), "set again");
        arm(fd, Some(now()));
        assert!(readable(Duration::from_secs(1)));
        arm(fd, None);
        assert!(!readable(Duration::ZERO), "disarmed");
        // SAFETY: ours, closed once.
        unsafe { libc::close(fd) };
    }
}
