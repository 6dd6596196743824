use super::*;

const T: Tuning = Tuning::DEFAULT;

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
    // Also while the application polls without pause: urdma.ko leaves the frames between
    // its calls to the next one, and wakes the helper for a frame none read in time.
    let steady = Activity {
        streak: STEADY_CALLS,
        ..app(0, 99_990)
    };
    let s = T.sleep(steady, now, true, true, || None);
    assert!(s.watching && s.look);
    // Also when some connection's frames come through urdmad, which follows the hush for
    // them: the helper asks urdmad to wake it (ARM), once.
    let r = Round {
        hushed: true,
        needs_arm: true,
        ..round(false, 0)
    };
    let (step, _) = T.after_round(r, app(0, 99_900), now, || None);
    assert!(matches!(step, Step::Sleep { sleep, arm: true } if sleep.watching && sleep.look));
    let r = Round { armed: true, ..r };
    let (step, _) = T.after_round(r, app(0, 99_900), now, || None);
    assert!(matches!(step, Step::Sleep { sleep, arm: false } if sleep.watching));
    // Not when some connection's frames wake the helper without a hush.
    let r = Round {
        hushed: false,
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
    let (step, idle) = T.after_round(round(true, 7), ASLEEP, at(50_000), || Some(at(1_000_000)));
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

/// Only an application that polls without pause says when its next call is due; one that
/// calls now and then, or goes to sleep, has every frame wake the helper at once.
#[test]
fn only_a_steady_poller_has_its_next_call_awaited() {
    let end = at(5_000);
    let steady = Activity {
        streak: STEADY_CALLS,
        ..app(1, 4_990)
    };
    assert_eq!(T.next_call_by(steady, end), Some(end + STEADY_GAP));
    let paused = Activity {
        streak: STEADY_CALLS - 1,
        ..steady
    };
    assert_eq!(T.next_call_by(paused, end), None);
    let going_to_sleep = Activity {
        last_call: Instant::ZERO,
        ..steady
    };
    assert_eq!(
        T.next_call_by(going_to_sleep, end),
        None,
        "ibv_req_notify_cq: the helper watches for what comes"
    );
    let every_call = Tuning {
        steady_calls: 0,
        ..T
    };
    assert_eq!(every_call.next_call_by(paused, end), Some(end + STEADY_GAP));
}
