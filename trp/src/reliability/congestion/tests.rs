use super::*;

/// Sends `n` segments in the round under way; returns the round.
fn send(c: &mut Congestion, n: u32) -> u32 {
    let mut round = c.round;
    for _ in 0..n {
        round = c.on_sent();
    }
    round
}

/// A sender with window `cwnd` after `rounds` rounds whose least RTT
/// was `rtt`; returns it and the next transmission number.
fn settled(cwnd: u32, rtt: u64, rounds: u64) -> (Congestion, u64) {
    let mut c = Congestion::new(cwnd, 1024);
    c.ssthresh = cwnd;
    let mut xmit = 0;
    for _ in 0..rounds {
        let r = send(&mut c, 10);
        c.on_rtt(rtt, r);
        xmit += 10;
        c.on_progress(xmit, xmit, 0);
    }
    (c, xmit)
}

#[test]
fn random_loss_keeps_the_window() {
    let (mut c, _) = settled(40, 100_000, 8);
    let r = send(&mut c, 40);
    c.on_rtt(105_000, r);
    for _ in 0..4 {
        assert_eq!(c.on_loss(r, 100), LossResponse::Random);
    }
    assert_eq!(c.cwnd(), 40);
    assert!(!c.in_recovery());
    c.on_delivered(40);
    assert_eq!(c.cwnd(), 41, "the window still grows");
}

/// Queued datagrams show in every RTT of a round: a loss then is the
/// queue's, and halves the window once per window of data.
#[test]
fn loss_with_a_queue_halves_once_per_window() {
    let (mut c, xmit) = settled(40, 100_000, 8);
    let r = send(&mut c, 40);
    c.on_rtt(120_000, r);
    c.on_progress(xmit + 10, xmit + 10, 0);
    c.on_rtt(125_000, r);
    assert_eq!(c.on_loss(r, 100), LossResponse::Cut);
    assert_eq!(c.cwnd(), 20);
    assert_eq!(c.on_loss(r, 100), LossResponse::InRecovery);
    assert_eq!(c.cwnd(), 20);
    // Everything sent before the cut acknowledged: recovery ends; the
    // round that cut does not cut again, a later one with the queue
    // still there does.
    c.on_progress(xmit + 10, xmit + 10, 100);
    assert_eq!(c.on_loss(r, 150), LossResponse::Random);
    let r = send(&mut c, 20);
    assert_eq!(c.on_loss(r, 150), LossResponse::Cut);
    assert_eq!(c.cwnd(), 10);
}

/// Losses that were not (delivered after all, before their resend)
/// undo the cut they made; a cut the round's other losses still justify
/// stands, and a timeout ends the chance.
#[test]
fn a_cut_made_by_spurious_losses_is_undone() {
    let queued = |c: &mut Congestion, xmit: u64| {
        let r = send(c, 40);
        for _ in 0..ROUND_SAMPLES {
            c.on_rtt(130_000, r);
        }
        c.on_progress(xmit + 40, xmit + 40, 0);
        r
    };
    let (mut c, xmit) = settled(40, 100_000, 8);
    let r = queued(&mut c, xmit);
    assert_eq!(c.on_loss(r, 100), LossResponse::Cut, "a clean path's first");
    assert_eq!(c.cwnd(), 20);
    assert!(c.on_spurious(r));
    assert_eq!((c.cwnd(), c.in_recovery()), (40, false));

    let (mut c, xmit) = settled(40, 100_000, 8);
    c.loss_rate = ONE / 10;
    let r = queued(&mut c, xmit);
    for _ in 0..10 {
        assert_eq!(c.on_loss(r, 200), LossResponse::Random);
    }
    assert_eq!(c.on_loss(r, 200), LossResponse::Cut, "11 of 40");
    for _ in 0..2 {
        assert_eq!(c.on_loss(r, 200), LossResponse::InRecovery);
    }
    assert!(!c.on_spurious(r), "12 of 40 still cut");
    assert!(!c.on_spurious(r), "11 of 40 still cut");
    assert_eq!(c.cwnd(), 20);
    assert!(c.on_spurious(r), "10 of 40 is the path's");
    assert_eq!(c.cwnd(), 40);

    let (mut c, xmit) = settled(40, 100_000, 8);
    let r = queued(&mut c, xmit);
    assert_eq!(c.on_loss(r, 100), LossResponse::Cut);
    c.on_timeout(20, 100);
    assert!(!c.on_spurious(r));
    assert_eq!(c.cwnd(), 2);
}

/// A loss is counted against the round that sent the segment, however
/// late it is found: one round's losses found together with another's
/// are not one round's.
#[test]
fn losses_count_against_the_round_that_sent_them() {
    let (mut c, mut xmit) = settled(40, 100_000, 8);
    c.loss_rate = ONE / 10;
    let early = send(&mut c, 40);
    xmit += 40;
    c.on_progress(xmit, xmit, 0);
    let late = send(&mut c, 40);
    for _ in 0..ROUND_SAMPLES {
        c.on_rtt(130_000, late);
    }
    // At a tenth's rate 5 of 40 is usual (the mean and a half of its
    // deviation), 11 of 40 is not (beyond three, and the tail's 1/300).
    for _ in 0..5 {
        assert_eq!(c.on_loss(early, 200), LossResponse::Random);
        assert_eq!(c.on_loss(late, 200), LossResponse::Random);
    }
    for _ in 0..5 {
        assert_eq!(c.on_loss(late, 200), LossResponse::Random);
    }
    assert_eq!(c.on_loss(late, 200), LossResponse::Cut, "11 of 40");
}

/// One round trip of `cwnd` segments whose least RTT is `rtt` and of
/// which `lost` are lost; `psn` counts what was sent. Returns whether
/// the window was cut.
fn round(c: &mut Congestion, xmit: &mut u64, psn: &mut u32, rtt: u64, lost: u32) -> bool {
    let w = c.cwnd();
    let r = send(c, w);
    for _ in 0..ROUND_SAMPLES {
        c.on_rtt(rtt, r);
    }
    c.on_delivered(w - lost.min(w));
    let mut cut = false;
    for _ in 0..lost {
        cut |= c.on_loss(r, *psn + w) == LossResponse::Cut;
    }
    *xmit += u64::from(w);
    *psn += w;
    c.on_progress(*xmit, *xmit, *psn);
    cut
}

/// A link that loses a tenth at random, then a queue that stands in two
/// rounds of three without overflowing (a busy receiver, a host that
/// delays datagrams): with the path's rate learnt from the rounds
/// without a queue, the losses of those with one cut no more and the
/// window grows; a round losing well beyond it still cuts.
#[test]
fn a_standing_queue_with_random_loss_keeps_the_window() {
    let (mut c, mut xmit) = settled(40, 100_000, 8);
    let mut psn = 0;
    // The first rounds see no queue; then two in three do.
    let rtt = |i: u32| {
        if i < 40 || i.is_multiple_of(3) {
            100_000
        } else {
            130_000
        }
    };
    // Every tenth segment sent is lost.
    let mut sent = 0;
    let mut tenth = |w: u32| {
        let lost = (sent + w) / 10 - sent / 10;
        sent += w;
        lost
    };
    for i in 0..90 {
        let lost = tenth(c.cwnd());
        round(&mut c, &mut xmit, &mut psn, rtt(i), lost);
    }
    assert!((80..=110).contains(&c.loss_rate), "{}", c.loss_rate);
    let before = c.cwnd;
    for i in 0..60 {
        let lost = tenth(c.cwnd());
        assert!(
            !round(&mut c, &mut xmit, &mut psn, rtt(90 + i), lost),
            "round {i}"
        );
    }
    // The field: `cwnd()` halves while a round drains.
    assert!(c.cwnd > before + 20, "{before} -> {}", c.cwnd);
    let w = c.cwnd;
    assert!(round(&mut c, &mut xmit, &mut psn, 130_000, w / 4));
    assert_eq!(c.cwnd, w / 2);
}

/// A clean path's first overflow cuts at once: nothing is excused.
#[test]
fn a_clean_path_cuts_on_its_first_queue_loss() {
    let (mut c, mut xmit) = settled(40, 100_000, 8);
    let mut psn = 0;
    for _ in 0..20 {
        assert!(!round(&mut c, &mut xmit, &mut psn, 130_000, 0));
    }
    assert_eq!(c.loss_rate, 0);
    assert!(round(&mut c, &mut xmit, &mut psn, 130_000, 1));
}

/// The ordered copy of the last rounds' least RTTs stays the ring's,
/// sorted, through every removal and insertion.
#[test]
fn the_sorted_minima_follow_the_ring() {
    let mut c = Congestion::new(10, 1024);
    let mut x: u64 = 7;
    for _ in 0..1000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        c.push_min((x >> 33) % 50);
        let mut ring = c.mins[..c.mins_len].to_vec();
        ring.sort_unstable();
        assert_eq!(ring, &c.sorted_mins[..c.mins_len]);
    }
    assert_eq!(c.mins_len, BASE_ROUNDS);
}

/// One slow sample is not a queue: the round's least RTT decides.
#[test]
fn one_slow_sample_is_not_a_queue() {
    let (mut c, _) = settled(40, 100_000, 8);
    let r = send(&mut c, 40);
    c.on_rtt(300_000, r);
    c.on_rtt(101_000, r);
    assert_eq!(c.on_loss(r, 100), LossResponse::Random);
}

/// A round that loses more than a third of what it sent cuts even
/// without a queue in sight (a policer); a quarter does not.
#[test]
fn a_round_losing_a_third_cuts() {
    let (mut c, mut xmit) = settled(40, 100_000, 8);
    let r = send(&mut c, 40);
    for _ in 0..10 {
        assert_eq!(c.on_loss(r, 100), LossResponse::Random, "10 of 40");
    }
    xmit += 40;
    c.on_progress(xmit, xmit, 0);
    let r = send(&mut c, 14);
    for _ in 0..4 {
        assert_eq!(c.on_loss(r, 100), LossResponse::Random, "4 of 14");
    }
    assert_eq!(c.on_loss(r, 100), LossResponse::Cut, "5 of 14");
    assert_eq!(c.cwnd(), 20);
}

/// A timeout restarts from two; without a queue slow start returns to
/// the window the path carried, with one to half of what was in flight.
#[test]
fn timeout_returns_to_the_window_unless_queued() {
    let (mut c, _) = settled(40, 100_000, 8);
    c.on_timeout(30, 100);
    assert_eq!((c.cwnd(), c.ssthresh), (2, 40));
    c.on_timeout(1, 100);
    assert_eq!(c.ssthresh, 40, "a second timeout keeps it");
    c.on_delivered(38);
    assert_eq!(c.cwnd(), 40);

    let (mut c, xmit) = settled(40, 100_000, 8);
    c.on_rtt(150_000, c.round);
    c.on_progress(xmit + 10, xmit + 10, 0);
    c.on_rtt(150_000, c.round);
    c.on_timeout(30, 100);
    assert_eq!((c.cwnd(), c.ssthresh), (2, 15));
}

/// Window growth over a run of deliveries equals growth one delivery
/// at a time (RFC 5681: +1 per segment in slow start, +1 per window in
/// congestion avoidance), from any starting state.
#[test]
fn window_growth_per_run_matches_per_segment() {
    for max_cwnd in [1, 2, 7, 64] {
        for ssthresh in [1, 2, 3, 10, 64, 100] {
            for cwnd in [1, 2, 5, 9, 63, 64] {
                for acc in [0, 1, 4, 8, 70] {
                    for n in [0, 1, 2, 3, 17, 200] {
                        let mut s = Congestion::new(4, max_cwnd);
                        (s.cwnd, s.ssthresh, s.cwnd_acc) = (cwnd, ssthresh, acc);
                        let (mut c, mut a) = (cwnd, acc);
                        for _ in 0..n {
                            if c < ssthresh {
                                c += 1;
                            } else {
                                a += 1;
                                if a >= c {
                                    a = 0;
                                    c += 1;
                                }
                            }
                            c = c.min(max_cwnd);
                        }
                        s.on_delivered(n);
                        assert_eq!(
                            (s.cwnd, s.cwnd_acc),
                            (c, a),
                            "max {max_cwnd} ssthresh {ssthresh} cwnd {cwnd} acc {acc} n {n}"
                        );
                    }
                }
            }
        }
    }
}
