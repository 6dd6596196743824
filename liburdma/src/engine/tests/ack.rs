//! The ACK a Send asks for, held for the reply until B's application has polled the
//! Send's completion (`trp::Connection::hold_ack_for_reader`).

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
