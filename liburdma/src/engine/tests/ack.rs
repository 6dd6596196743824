//! The ACK a Send asks for, held for the reply until B's application has polled the
//! Send's completion, and the ACK a Write asks for, held until B's application's next call
//! (`trp::Connection::hold_ack_for_reader`).

use super::*;
use std::time::Duration;

const US: Duration = Duration::from_micros(1);

/// A's Send of 8 bytes received by B's attended round at `t.now`: its completion waits in
/// B's CQ, its ACK is held. Returns the two registered buffers, which must outlive the
/// connection's use of them.
fn a_send_received(t: &mut Bed) -> (Vec<u8>, Vec<u8>) {
    let mut rbuf = vec![0u8; 64];
    let mut sbuf = vec![7u8; 64];
    let r = region(t, 2, 0x200, &mut rbuf, 64);
    t.e.post_recv(B, 5, &r).unwrap();
    t.connect();
    let s = region(t, 1, 0x100, &mut sbuf, 8);
    t.e.post_send(A, &send(1, &s)).unwrap();
    // One round sends, the next receives.
    t.e.progress(t.now);
    t.e.progress(t.now);
    assert_eq!(t.ab.lock().unwrap().len(), 0, "the Send was taken");
    (rbuf, sbuf)
}

fn acks(t: &Bed) -> u64 {
    t.e.qps[&B].conn.as_ref().unwrap().stats().tx_acks
}

fn rounds_until(t: &mut Bed, at: Instant) {
    while t.now < at {
        t.now = (t.now + 10 * US).min(at);
        t.e.progress(t.now);
    }
}

#[test]
fn a_held_ack_waits_for_the_application_to_poll_what_it_answers() {
    for reply in [true, false] {
        let mut t = Bed::new();
        let _bufs = a_send_received(&mut t);
        let arrived = t.now;
        let rto = t.e.qps[&B].conn.as_ref().unwrap().rto();
        assert!(
            rto / 4 >= 250 * US,
            "the bound leaves room for the test: {rto:?}"
        );
        // Past the hold (100 us) while the completion waits to be polled: still held.
        rounds_until(&mut t, arrived + 120 * US);
        assert_eq!(acks(&t), 0, "held while unpolled");
        let wcs = t.poll(BCQ);
        assert_eq!((wcs.len(), wcs[0].opcode), (1, IBV_WC_RECV));
        let polled = t.now;
        rounds_until(&mut t, polled + 50 * US);
        assert_eq!(acks(&t), 0, "within the hold from the poll");
        if reply {
            let mut b = vec![3u8; 8];
            let s = region(&mut t, 2, 0x300, &mut b, 8);
            t.e.post_send(B, &send(2, &s)).unwrap();
            t.e.progress(t.now);
            rounds_until(&mut t, polled + 300 * US);
            assert_eq!(acks(&t), 0, "the reply carried the ACK");
        } else {
            rounds_until(&mut t, polled + 110 * US);
            assert_eq!(acks(&t), 1, "no reply within the hold: an ACK of its own");
        }
        let wcs = t.poll(ACQ);
        assert_eq!(wcs.len(), 1, "A's Send completed (reply {reply})");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, IBV_WC_SUCCESS));
    }
}

#[test]
fn a_completion_never_polled_holds_its_ack_a_quarter_of_the_rto_at_most() {
    let mut t = Bed::new();
    let _bufs = a_send_received(&mut t);
    let arrived = t.now;
    let rto = t.e.qps[&B].conn.as_ref().unwrap().rto();
    let bound = (rto / 4).min(Duration::from_millis(2));
    rounds_until(&mut t, arrived + (bound - 10 * US));
    assert_eq!(acks(&t), 0, "held while unpolled");
    rounds_until(&mut t, arrived + bound + 10 * US);
    assert_eq!(acks(&t), 1, "the bound ends the wait");
    assert_eq!(t.poll(ACQ).len(), 1);
}

#[test]
fn an_unattended_round_sends_the_ack_at_once_though_unpolled() {
    let mut t = Bed::new();
    let _bufs = a_send_received(&mut t);
    t.e.progress_unattended(t.now);
    assert_eq!(acks(&t), 1);
}

/// B's application reads A's Send and ends its connection at once, as perftest does after
/// its closing handshake: it destroys the QP, or destroys its rdma_cm id first (the kernel
/// moves the QP to ERR: an abort). The held ACK leaves before urdmad's Abort, or in B's own
/// Abort, and A's Send completes, delivered; an abort fails only what was left.
#[test]
fn a_qp_destroyed_or_aborted_sends_the_ack_it_holds_first() {
    for destroyed in [true, false] {
        let mut t = Bed::new();
        let _bufs = a_send_received(&mut t);
        assert_eq!(t.poll(BCQ).len(), 1);
        assert!(t.e.qps[&B].conn.as_ref().unwrap().holds_ack());
        if destroyed {
            t.e.send_held_ack(B, t.now);
            assert_eq!(t.e.destroy_qp(B), Some(Unregister::Unqp));
        } else {
            t.e.abort(B, t.now);
        }
        t.e.progress(t.now);
        t.e.progress(t.now);
        let wcs = t.poll(ACQ);
        assert_eq!(wcs.len(), 1, "A's Send completed (destroyed {destroyed})");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, IBV_WC_SUCCESS));
    }
}

/// B answers each of A's Sends 200 us after reading it, twice trp's hold: its first answer
/// comes after an ACK of its own; once its answer time is measured
/// (`Engine::request_posted`), every answer carries the ACK.
#[test]
fn the_application_s_answer_time_is_measured_and_its_answers_carry_the_acks() {
    let mut t = Bed::new();
    let (mut ar, mut br) = (vec![0u8; 64], vec![0u8; 64]);
    let (mut asb, mut bsb) = (vec![1u8; 64], vec![2u8; 64]);
    let a_recv = region(&mut t, 1, 0x110, &mut ar, 64);
    let b_recv = region(&mut t, 2, 0x210, &mut br, 64);
    let a_send = region(&mut t, 1, 0x120, &mut asb, 8);
    let b_send = region(&mut t, 2, 0x220, &mut bsb, 8);
    t.e.post_recv(B, 1000, &b_recv).unwrap();
    t.connect();
    let mut alone = Vec::new();
    for i in 0..10u64 {
        t.e.post_recv(A, 2000 + i, &a_recv).unwrap();
        t.e.post_send(A, &send(i, &a_send)).unwrap();
        t.e.request_posted(A, t.now);
        // One round sends, the next receives.
        t.e.progress(t.now);
        t.e.progress(t.now);
        // B's last answer completes with the ACK that A's Send carried.
        let wcs = t.poll(BCQ);
        let recvs = wcs.iter().filter(|w| w.opcode == IBV_WC_RECV).count();
        assert_eq!(
            (wcs.len(), recvs),
            (1 + usize::from(i > 0), 1),
            "exchange {i}"
        );
        t.e.post_recv(B, 1001 + i, &b_recv).unwrap();
        let read = t.now;
        let before = acks(&t);
        rounds_until(&mut t, read + 200 * US);
        t.e.post_send(B, &send(100 + i, &b_send)).unwrap();
        t.e.request_posted(B, t.now);
        t.e.progress(t.now);
        alone.push(acks(&t) - before);
        t.e.progress(t.now);
        let wcs = t.poll(ACQ);
        assert_eq!(wcs.len(), 2, "A's Send and B's answer, exchange {i}");
    }
    assert_eq!(
        alone[0], 1,
        "the first answer is later than the hold: {alone:?}"
    );
    assert!(
        alone[1..].iter().all(|&n| n == 0),
        "measured, the answers carry the ACKs: {alone:?}"
    );
}

/// A measured hold is never shorter than trp's own (`trp::Config::ack_hold`, 100 us), nor
/// longer than the wait for an unread completion (`trp::Connection::reader_bound`).
#[test]
fn a_measured_hold_is_kept_between_trp_s_and_the_reader_s_bound() {
    for measured in [US, Duration::from_millis(10)] {
        let mut t = Bed::new();
        let _bufs = a_send_received(&mut t);
        let conn = t.e.qps.get_mut(&B).unwrap().conn.as_mut().unwrap();
        conn.set_ack_hold(measured);
        let hold = if measured == US {
            100 * US
        } else {
            conn.reader_bound()
        };
        assert_eq!(t.poll(BCQ).len(), 1);
        let read = t.now;
        rounds_until(&mut t, read + (hold - 10 * US));
        assert_eq!(acks(&t), 0, "held for {measured:?}");
        rounds_until(&mut t, read + hold + 10 * US);
        assert_eq!(acks(&t), 1, "{measured:?} is held for {hold:?}");
    }
}

/// How B's application goes on after the helper placed A's Write in its memory.
#[derive(Clone, Copy, Debug)]
enum After {
    /// It writes back (a ping-pong of Writes).
    Replies,
    /// It makes a call that is no reply.
    Calls,
    /// It makes no call.
    Stays,
}

/// A helper's round: [`Engine::progress_for_app`] or [`Engine::progress_unattended`].
type HelperRound = fn(&mut Engine, Instant) -> Progress;

/// A's signaled Write of 8 bytes, placed in B's memory by two of the helper's rounds
/// `round` at `t.now`. Returns A's and B's memory and their addresses.
fn a_write_placed_by(t: &mut Bed, round: HelperRound) -> (Vec<u8>, Vec<u8>, u64, u64) {
    t.connect();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mut a_mem = vec![1u8; 64];
    let a_addr = t.reg(1, 0x100, 1, &mut a_mem, access);
    let mut b_mem = vec![2u8; 64];
    let b_addr = t.reg(2, 0x200, 2, &mut b_mem, access);
    let sge = [Sge {
        addr: a_addr,
        len: 8,
        lkey: 0x100,
    }];
    t.e.post_send(A, &write(1, &sge, b_addr + 8, 0x200))
        .unwrap();
    // One round sends the Write, the next places it.
    round(&mut t.e, t.now);
    round(&mut t.e, t.now);
    assert_eq!(t.ab.lock().unwrap().len(), 0, "the Write was taken");
    assert_eq!(b_mem[8..16], [1; 8], "placed");
    (a_mem, b_mem, a_addr, b_addr)
}

fn helper_rounds_until(t: &mut Bed, at: Instant) {
    while t.now < at {
        t.now = (t.now + 10 * US).min(at);
        t.e.progress_for_app(t.now);
    }
}

#[test]
fn an_ack_held_for_a_placed_write_waits_for_the_application_s_next_call() {
    for after in [After::Replies, After::Calls, After::Stays] {
        let mut t = Bed::new();
        let (a_mem, _b_mem, a_addr, b_addr) = a_write_placed_by(&mut t, Engine::progress_for_app);
        let placed = t.now;
        let bound = t.e.qps[&B].conn.as_ref().unwrap().reader_bound();
        assert!(bound >= 250 * US, "the bound leaves room for the test");
        // Past the hold (100 us), the application spinning on its memory: still held.
        helper_rounds_until(&mut t, placed + 120 * US);
        assert_eq!(acks(&t), 0, "held ({after:?})");
        match after {
            After::Replies => {
                let sge = [Sge {
                    addr: b_addr,
                    len: 8,
                    lkey: 0x200,
                }];
                t.e.post_send(B, &write(2, &sge, a_addr + 8, 0x100))
                    .unwrap();
                t.e.progress(t.now);
                helper_rounds_until(&mut t, placed + bound + 10 * US);
                assert_eq!(acks(&t), 0, "the reply carried the ACK");
                assert_eq!(a_mem[8..16], [2; 8]);
            }
            After::Calls => {
                assert!(t.poll(BCQ).is_empty());
                t.e.progress(t.now);
                let called = t.now;
                helper_rounds_until(&mut t, called + 90 * US);
                assert_eq!(acks(&t), 0, "within the hold from the call");
                helper_rounds_until(&mut t, called + 110 * US);
                assert!(t.now < placed + bound, "before the bound");
                assert_eq!(acks(&t), 1, "no reply within the hold: an ACK of its own");
            }
            After::Stays => {
                helper_rounds_until(&mut t, placed + (bound - 10 * US));
                assert_eq!(acks(&t), 0, "held while the application makes no call");
                helper_rounds_until(&mut t, placed + bound + 10 * US);
                assert_eq!(acks(&t), 1, "the bound ends the wait");
            }
        }
        t.e.progress_for_app(t.now);
        let wcs = t.poll(ACQ);
        assert_eq!(wcs.len(), 1, "A's Write completed ({after:?})");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, IBV_WC_SUCCESS));
    }
}

#[test]
fn an_unattended_round_sends_the_ack_of_a_write_at_once() {
    let mut t = Bed::new();
    let _mem = a_write_placed_by(&mut t, Engine::progress_unattended);
    assert_eq!(acks(&t), 1);
    t.e.progress_unattended(t.now);
    assert_eq!(t.poll(ACQ).len(), 1);
}
