//! How connections end, as the engine sees it: a graceful close, one that waits for its
//! last ACK or for a shut way out, a QP destroyed while it closes (it lingers), urdmad lost,
//! and a fork.

use super::*;

#[test]
fn graceful_close_reaches_both_sides() {
    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::PeerClosed(B)), "{n:?}");
    // B closes in turn when told (EVENT DISCONNECT status=0).
    t.e.close(B);
    t.run(20);
    let n2 = t.e.take_notices();
    let all: Vec<_> = n.iter().chain(&n2).collect();
    assert!(all.contains(&&Notice::Closed(A, 0)), "{all:?}");
    assert!(all.contains(&&Notice::Closed(B, 0)), "{all:?}");
    assert_eq!(t.e.deadline(), None, "closed connections keep no timers");
}

#[test]
fn losing_urdmad_flushes_every_qp_wakes_armed_cqs_and_drops_the_flows() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let mut t = Bed::new();
    let fired = Arc::new(AtomicUsize::new(0));
    let f = fired.clone();
    t.e.destroy_cq(ACQ);
    t.e.create_cq(
        ACQ,
        16,
        Some(Box::new(move || {
            f.fetch_add(1, Ordering::SeqCst);
        })),
    );
    t.connect();
    // A's flow, replaced by one that reports its drop (the same wires).
    let dropped = Arc::new(AtomicBool::new(false));
    t.e.drop_flow(A);
    t.e.qps.get_mut(&A).unwrap().flow = Some(Box::new(Watched {
        inner: MemFlow {
            rx: t.ba.clone(),
            tx: t.ab.clone(),
        },
        dropped: dropped.clone(),
        forked: Default::default(),
        slot: None,
    }));
    // A third QP that never connected, with a receive waiting.
    const C: QpKey = (1, 11);
    t.e.create_qp(C, init(1, ACQ));
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(1, 0x200, 1, &mut rbuf, Access::LOCAL_WRITE);
    let r = [Sge {
        addr: raddr,
        len: 64,
        lkey: 0x200,
    }];
    t.e.post_recv(A, 1, &r).unwrap();
    t.e.post_recv(C, 2, &r).unwrap();
    // A send the peer never acknowledges: the wire to B is cut.
    t.e.post_send(A, &send(3, &[])).unwrap();
    t.e.progress(t.now);
    t.ab.lock().unwrap().clear();
    assert!(
        t.e.arm_cq(ACQ, true),
        "a solicited-only arm: errors fire it"
    );
    assert!(t.e.deadline().is_some(), "the send's retransmission timer");

    t.e.fail_all(t.now);
    assert!(dropped.load(Ordering::SeqCst), "the flow is let go at once");
    assert_eq!(t.e.deadline(), None, "no timer without a flow");
    assert!(t.e.take_notices().is_empty(), "nobody to tell");
    assert_eq!(fired.load(Ordering::SeqCst), 1, "the armed CQ was woken");
    let mut got: Vec<_> = t
        .poll(ACQ)
        .iter()
        .map(|w| (w.wr_id, w.status, w.qp_num))
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        vec![
            (1, IBV_WC_WR_FLUSH_ERR, 10),
            (2, IBV_WC_WR_FLUSH_ERR, 11),
            (3, IBV_WC_WR_FLUSH_ERR, 10)
        ]
    );

    // Later posts complete with a flush error too (or are refused), and
    // nothing more goes out.
    for key in [A, C] {
        let posted = t.e.post_send(key, &send(4, &[]));
        assert_ne!(posted, Err(Error::NotConnected), "post_send after the loss");
        t.e.post_recv(key, 5, &r).unwrap();
    }
    t.run(100);
    assert!(
        t.ab.lock().unwrap().is_empty(),
        "nothing sent after the loss"
    );
    let later = t.poll(ACQ);
    assert!(!later.is_empty());
    assert!(later.iter().all(|w| w.status == IBV_WC_WR_FLUSH_ERR));
}

/// A flow whose way out shuts, as a process's full TX ring shuts it, once it has received
/// something (`shut` set) and opens again when `shut` is cleared.
struct Gated {
    flow: MemFlow,
    shut: Arc<AtomicBool>,
    armed: bool,
}

impl Flow for Gated {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        let n = self.flow.receive(handle);
        if n > 0 && std::mem::take(&mut self.armed) {
            self.shut.store(true, Ordering::Relaxed);
        }
        n
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        if self.backlogged() {
            return 0;
        }
        self.flow.transmit(datagram, fill)
    }
    fn backlogged(&self) -> bool {
        self.shut.load(Ordering::Relaxed)
    }
}

/// Closes A, whose way out shuts at the first answer from B: B's FIN then ends A's
/// connection while A cannot send its ACK, and urdmad is not told yet. Returns the flag,
/// which opens A's way out when cleared, and the notices of the close so far.
fn close_a_with_its_way_out_shut(t: &mut Bed) -> (Arc<AtomicBool>, Vec<Notice>) {
    let shut = Arc::new(AtomicBool::new(false));
    t.e.qps.get_mut(&A).unwrap().flow = Some(Box::new(Gated {
        flow: MemFlow {
            rx: t.ba.clone(),
            tx: t.ab.clone(),
        },
        shut: shut.clone(),
        armed: true,
    }));
    t.e.close(A);
    t.run(20);
    assert!(shut.load(Ordering::Relaxed));
    assert_eq!(
        t.e.qp_state(A),
        Some(trp::QpState::Closed),
        "B's FIN arrived"
    );
    let n = t.e.take_notices();
    assert!(
        !n.contains(&Notice::Closed(A, 0)),
        "told while its ACK waits: {n:?}"
    );
    (shut, n)
}

#[test]
fn a_closed_connection_keeps_its_flow_until_its_last_ack_is_out() {
    // urdmad closes a flow when it hears Closed: told while A's ACK of B's FIN still
    // waited for room, that ACK would never leave, and B, its FIN unacknowledged, would
    // end in RetryExceeded after trp's give-up time instead of closing.
    let mut t = Bed::new();
    t.connect();
    let (shut, n) = close_a_with_its_way_out_shut(&mut t);
    assert!(n.contains(&Notice::PeerClosed(B)), "{n:?}");
    assert!(!n.contains(&Notice::Closed(B, 0)), "{n:?}");
    assert!(t.e.qps.get(&A).unwrap().flow.is_some());
    assert!(
        t.e.progress(t.now).busy,
        "the waiting ACK keeps progress coming"
    );
    shut.store(false, Ordering::Relaxed);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::Closed(A, 0)), "{n:?}");
    assert!(
        n.contains(&Notice::Closed(B, 0)),
        "B's FIN acknowledged: {n:?}"
    );
    assert!(t.e.qps.get(&A).unwrap().flow.is_none());
}

/// urdmad forgets a QP when it hears the QP's connection closed: once `QPCLOSED` is out,
/// destroying the QP tells it nothing more (no `UNQP`, no wake-up of urdmad).
#[test]
fn a_qp_whose_close_urdmad_heard_is_destroyed_without_a_word() {
    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::Closed(A, 0)), "{n:?}");
    assert!(n.contains(&Notice::Closed(B, 0)), "{n:?}");
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Nothing));
    assert_eq!(t.e.destroy_qp(B), Some(Unregister::Nothing));
    assert!(t.e.take_notices().is_empty());
}

/// The owner's SQD ended the connection for the kernel: its end is news for urdmad's
/// clean-up only, whether a round or the QP's destroy reports it; the peer's is not.
#[test]
fn an_end_the_kernel_heard_of_from_its_owner_is_reported_as_ended() {
    let mut t = Bed::new();
    t.connect();
    t.e.kernel_ended(A);
    t.e.close(A);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::Ended(A, 0)), "{n:?}");
    assert!(n.contains(&Notice::Closed(B, 0)), "{n:?}");
    let mut t = Bed::new();
    t.connect();
    t.e.kernel_ended(A);
    close_a_with_its_way_out_shut(&mut t);
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Nothing));
    assert_eq!(t.e.take_notices(), [Notice::Ended(A, 0)]);
}

#[test]
fn a_qp_destroyed_while_its_last_ack_waits_reports_its_close() {
    let mut t = Bed::new();
    t.connect();
    close_a_with_its_way_out_shut(&mut t);
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Nothing));
    assert_eq!(t.e.take_notices(), [Notice::Closed(A, 0)]);
}

#[test]
fn a_way_out_that_stays_shut_holds_the_close_back_for_a_bounded_time() {
    let mut t = Bed::new();
    t.connect();
    close_a_with_its_way_out_shut(&mut t);
    t.now = t.now + FINAL_SEND_LIMIT;
    t.e.progress(t.now);
    assert!(t.e.take_notices().contains(&Notice::Closed(A, 0)));
    assert!(t.e.qps.get(&A).unwrap().flow.is_none());
}

#[test]
fn a_forked_child_forgets_the_parents_qps_and_keeps_its_cqs_and_mrs() {
    let mut t = Bed::new();
    t.connect();
    let (told, dropped) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    t.e.qps.get_mut(&A).unwrap().flow = Some(Box::new(Watched {
        inner: MemFlow {
            rx: t.ba.clone(),
            tx: t.ab.clone(),
        },
        dropped: dropped.clone(),
        forked: told.clone(),
        slot: None,
    }));
    let mut buf = vec![0u8; 64];
    let addr = t.reg(1, 0x300, 1, &mut buf, Access::LOCAL_WRITE);
    let s = [Sge {
        addr,
        len: 64,
        lkey: 0x300,
    }];
    // Work in flight in the parent: a send not yet acknowledged, a receive posted.
    t.e.post_recv(A, 1, &s).unwrap();
    t.e.post_send(A, &send(2, &s)).unwrap();
    t.e.progress(t.now);
    t.ab.lock().unwrap().clear();

    t.e.forked();
    // Told, then dropped: a flow dropped first could not have been told.
    assert!(told.load(Ordering::SeqCst), "each flow hears of the fork");
    assert!(dropped.load(Ordering::SeqCst), "and is let go");
    assert!(!t.e.has_qp(A) && !t.e.has_qp(B));
    assert_eq!(t.e.deadline(), None, "no timer of the parent's runs on");
    assert!(t.e.take_notices().is_empty(), "nothing to tell urdmad");
    assert_eq!(
        t.e.post_send(A, &send(3, &s)).map_err(|e| e.errno()),
        Err(libc::EINVAL)
    );
    t.run(100);
    assert!(
        t.ab.lock().unwrap().is_empty(),
        "nothing sent for the parent"
    );
    assert!(t.poll(ACQ).is_empty(), "no completion of the parent's work");
    // The child's own QP, on the CQ and with the MR it inherited, works.
    const C: QpKey = (1, 30);
    t.e.create_qp(C, init(1, ACQ));
    t.e.post_recv(C, 4, &s).unwrap();
    assert!(t.e.cq(ACQ).is_some());
    t.e.create_qp(B, init(2, BCQ));
    connect_pair(&mut t.e, C, B, (&t.ab, &t.ba), t.now);
    t.e.post_send(B, &send(5, &[])).unwrap();
    t.run(20);
    let got: Vec<_> = t.poll(ACQ).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(4, IBV_WC_SUCCESS)]);
}

#[test]
fn a_closed_connection_s_flow_is_dropped_only_once_urdmad_is_told() {
    // Dropping it unmaps its rings: that waits until QPCLOSED is on its way.
    let mut t = Bed::new();
    t.connect();
    let dropped = Arc::new(AtomicBool::new(false));
    t.e.qps.get_mut(&A).unwrap().flow = Some(Box::new(Watched {
        inner: MemFlow {
            rx: t.ba.clone(),
            tx: t.ab.clone(),
        },
        dropped: dropped.clone(),
        forked: Arc::new(AtomicBool::new(false)),
        slot: None,
    }));
    t.e.close(A);
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::Closed(A, 0)), "{n:?}");
    assert!(t.e.qps.get(&A).unwrap().flow.is_none());
    assert!(
        !dropped.load(Ordering::SeqCst),
        "dropped before urdmad was told"
    );
    t.e.release_closed_flow(A);
    assert!(dropped.load(Ordering::SeqCst));
}

/// The flow of A's connection in [`Bed::connect`].
const FLOW_A: u32 = 1;

#[test]
fn a_qp_destroyed_while_it_closes_finishes_its_close_without_it() {
    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.e.progress(t.now);
    assert_eq!(
        t.e.qp_state(A),
        Some(trp::QpState::Closing),
        "A's FIN is out"
    );
    // Destroyed at once, as after a DISCONNECTED that did not wait for the peer.
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Linger));
    assert!(!t.e.has_qp(A));
    // The kernel may give its number to a new QP meanwhile: the two do not meet.
    t.e.create_qp(A, init(1, ACQ));
    t.run(20);
    let n = t.e.take_notices();
    assert!(n.contains(&Notice::PeerClosed(B)), "{n:?}");
    assert!(
        n.contains(&Notice::Closed(B, 0)),
        "B's close completed, its FIN acknowledged: {n:?}"
    );
    assert!(
        !n.iter()
            .any(|x| matches!(x, Notice::Closed(A, _) | Notice::PeerClosed(A))),
        "nothing more is said of A: {n:?}"
    );
    assert_eq!(t.e.take_lingered(), [(A, FLOW_A)]);
    assert!(t.e.has_qp(A) && !t.e.is_connected(A));
    assert_eq!(t.e.deadline(), None, "nothing lingers");
}

/// What `exit()` waits for (`process::at_exit`): a close from either side, and a
/// destroyed QP's lingering one, until the last datagram of each has left.
#[test]
fn closing_lasts_from_the_close_to_its_last_datagram() {
    let mut t = Bed::new();
    t.connect();
    assert!(!t.e.closing(), "open connections are urdmad's to abort");
    t.e.close(A);
    assert!(t.e.closing());
    t.run(20);
    assert!(t.e.take_notices().contains(&Notice::Closed(A, 0)));
    assert!(!t.e.closing(), "both closes are over");

    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.e.progress(t.now);
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Linger));
    assert!(t.e.closing(), "A lingers");
    t.run(20);
    assert_eq!(t.e.take_lingered(), [(A, FLOW_A)]);
    assert!(!t.e.closing());
}

#[test]
fn a_lingering_connection_whose_peer_is_silent_gives_up_in_bounded_time() {
    let mut t = Bed::new();
    t.connect();
    t.e.close(A);
    t.e.progress(t.now);
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Linger));
    // B is gone: nothing it would say arrives.
    t.e.destroy_qp(B);
    for _ in 0..100 {
        t.ab.lock().unwrap().clear();
        t.now = t.now + LINGER_LIMIT / 50;
        t.e.progress(t.now);
        if !t.e.lingered.is_empty() {
            break;
        }
    }
    assert_eq!(t.e.take_lingered(), [(A, FLOW_A)]);
    assert_eq!(t.e.deadline(), None);
}

#[test]
fn a_qp_destroyed_before_it_closes_does_not_linger() {
    let mut t = Bed::new();
    t.connect();
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Unqp));
    assert_eq!(t.e.destroy_qp(A), None);
    t.run(5);
    assert!(t.e.take_lingered().is_empty());
}
