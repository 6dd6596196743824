//! A round of progress over many QPs and flows: what it reads first, which QP it starts at,
//! a full way out, a close waiting for its last ACK, the cost of a Write among hundreds of
//! QPs, a fork, and the figures a QP publishes.

use super::*;

/// A flow that hands out one datagram per call, as a DPDK ring
/// gives one burst at a time.
struct Trickle(MemFlow);

impl Flow for Trickle {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        let got: Vec<Vec<u8>> = {
            let mut q = self.0.rx.lock().unwrap();
            let n = q.len().min(1);
            q.drain(..n).collect()
        };
        let refs: Vec<&[u8]> = got.iter().map(|b| &b[..]).collect();
        if !refs.is_empty() {
            handle(&refs);
        }
        refs.len()
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        self.0.transmit(datagram, fill)
    }
}

#[test]
fn queued_acknowledgements_are_read_before_timers_fire() {
    let mut t = Bed::new();
    t.connect();
    // Rebuild A's flow as one that yields two datagrams per call.
    let flow = Trickle(MemFlow {
        rx: t.ba.clone(),
        tx: t.ab.clone(),
    });
    t.e.qps.get_mut(&A).unwrap().flow = Some(Box::new(flow));
    let mut rbuf = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut rbuf, Access::LOCAL_WRITE);
    for i in 0..16 {
        t.e.post_recv(
            B,
            i,
            &[Sge {
                addr: raddr,
                len: 64,
                lkey: 0x200,
            }],
        )
        .unwrap();
        t.e.post_send(A, &send(i, &[])).unwrap();
    }
    // A sends while B is away.
    let b_flow = t.e.qps.get_mut(&B).unwrap().flow.take();
    t.e.progress(t.now);
    assert!(t.e.qps[&A].conn.as_ref().unwrap().poll_timeout().is_some());
    // B receives and acknowledges while A is away.
    let a_flow = t.e.qps.get_mut(&A).unwrap().flow.take();
    t.e.qps.get_mut(&B).unwrap().flow = b_flow;
    for ms in 1..4 {
        t.e.progress(t.now + std::time::Duration::from_millis(ms));
    }
    assert!(t.ab.lock().unwrap().is_empty());
    // Other datagrams arrived before the ACK (here: malformed ones).
    {
        let mut q = t.ba.lock().unwrap();
        assert!(!q.is_empty(), "the ACK waits in A's ring");
        for _ in 0..5 {
            q.push_front(vec![0u8; 3]);
        }
    }
    // A comes back late, past its retransmission timer.
    t.e.qps.get_mut(&A).unwrap().flow = a_flow;
    // Well past the initial RTO (10 ms).
    let late = t.now + std::time::Duration::from_millis(100);
    let before = 0;
    t.e.progress(late);
    let after = t.ab.lock().unwrap().len();
    assert!(
        t.ba.lock().unwrap().is_empty(),
        "one round read the whole ring"
    );
    assert_eq!(
        before, after,
        "nothing retransmitted: the ACKs were read first"
    );
}

#[test]
fn a_round_reports_sends_before_receives_keeping_each_queue_in_order() {
    let c = |wr_id, queue| Completion {
        queue,
        ..flush(wr_id, queue, WcOpcode::Send)
    };
    let mut out: VecDeque<Completion> = [c(0, Queue::Recv)].into_iter().collect();
    out.extend([
        c(1, Queue::Recv),
        c(2, Queue::Send),
        c(3, Queue::Recv),
        c(4, Queue::Send),
    ]);
    sends_first(&mut out, 1);
    let got: Vec<_> = out.iter().map(|c| (c.wr_id, c.queue)).collect();
    assert_eq!(
        got,
        vec![
            (0, Queue::Recv),
            (2, Queue::Send),
            (4, Queue::Send),
            (1, Queue::Recv),
            (3, Queue::Recv)
        ]
    );
    // Already in that order: untouched.
    let mut out: VecDeque<Completion> =
        [c(5, Queue::Send), c(6, Queue::Recv)].into_iter().collect();
    sends_first(&mut out, 0);
    assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![5, 6]);
}

/// A flow that says when it is dropped and whether it heard of a fork, and has a slot of
/// figures when the test gives it one (as urdmad's table would).
struct Watched {
    inner: MemFlow,
    dropped: Arc<AtomicBool>,
    forked: Arc<AtomicBool>,
    slot: Option<Arc<urdma_shared::qpstats::Slot>>,
}

impl Flow for Watched {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        self.inner.receive(handle)
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        self.inner.transmit(datagram, fill)
    }
    fn forked(&mut self) {
        self.forked.store(true, Ordering::SeqCst);
    }
    fn figures(&self) -> Option<&urdma_shared::qpstats::Slot> {
        self.slot.as_deref()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
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

/// A flow that says which QP transmitted, in order, and can claim a full TX ring.
struct Recording {
    flow: MemFlow,
    key: QpKey,
    log: Arc<Mutex<Vec<QpKey>>>,
    full: bool,
}

impl Flow for Recording {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        self.flow.receive(handle)
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        self.log.lock().unwrap().push(self.key);
        if self.full {
            return 0;
        }
        self.flow.transmit(datagram, fill)
    }
    fn backlogged(&self) -> bool {
        self.full
    }
}

/// Replaces A's and B's flows with recording ones (B's claiming a full ring when `b_full`).
fn record(t: &mut Bed, b_full: bool) -> Arc<Mutex<Vec<QpKey>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    for (key, rx, tx, full) in [
        (A, t.ba.clone(), t.ab.clone(), false),
        (B, t.ab.clone(), t.ba.clone(), b_full),
    ] {
        t.e.qps.get_mut(&key).unwrap().flow = Some(Box::new(Recording {
            flow: MemFlow { rx, tx },
            key,
            log: log.clone(),
            full,
        }));
    }
    log
}

#[test]
fn each_round_of_progress_starts_at_another_qp() {
    // The QPs of a process share its TX ring: a fixed order would let the
    // first ones fill it every round and starve the rest.
    let mut t = Bed::new();
    t.connect();
    let log = record(&mut t, false);
    for _ in 0..4 {
        t.e.progress(t.now);
    }
    let order = log.lock().unwrap().clone();
    let firsts: Vec<QpKey> = order.chunks(2).map(|c| c[0]).collect();
    assert_eq!(firsts.len(), 4, "{order:?}");
    assert!(firsts.contains(&A) && firsts.contains(&B), "{order:?}");
}

#[test]
fn a_full_tx_ring_keeps_progress_coming_back() {
    // What is left in trp for want of ring room has no timer of its own:
    // the round must count as busy, or the helper would go to sleep on it.
    let mut t = Bed::new();
    t.connect();
    for _ in 0..4 {
        t.e.progress(t.now);
    }
    assert!(!t.e.progress(t.now).busy, "nothing to do yet");
    record(&mut t, true);
    assert!(t.e.progress(t.now).busy);
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

/// Host CPU time per 64-byte Write with `pairs` connected QP pairs in one engine, each
/// keeping `depth` Writes outstanding, for `total` Writes in all; every Write must complete.
/// Each post is followed by the round the provider makes for it (`data_verbs::post_list`: a round
/// over every QP), and each poll by a round as well.
/// Each post is followed by the round the provider makes for it: a full one when
/// `every_qp_on_post` (what the provider did first), else [`Engine::progress_after_post`].
fn write_cost(pairs: u32, depth: u32, total: u32, every_qp_on_post: bool) -> std::time::Duration {
    let mut e = Engine::new();
    e.create_cq(ACQ, 8192, None);
    e.create_cq(BCQ, 8192, None);
    let mut target = vec![0u8; 4096];
    let taddr = target.as_mut_ptr() as u64;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    e.mrs
        .insert(2, 0x300, Region::new(2, taddr, 4096, access), 0);
    let mut source = vec![7u8; 64];
    let saddr = source.as_mut_ptr() as u64;
    e.mrs
        .insert(1, 0x100, Region::new(1, saddr, 64, Access::NONE), 0);
    let mut now = Instant(1_000_000);
    let keys: Vec<(QpKey, QpKey)> = (0..pairs).map(|i| ((1, 100 + i), (2, 100 + i))).collect();
    for &(a, b) in &keys {
        e.create_qp(a, init(1, ACQ));
        e.create_qp(b, init(2, BCQ));
        let wires: (Wire, Wire) = Default::default();
        connect_pair(&mut e, a, b, (&wires.0, &wires.1), now);
    }
    let s = [Sge {
        addr: saddr,
        len: 64,
        lkey: 0x100,
    }];
    let write = write(1, &s, taddr, 0x300);
    // SAFETY: ibv_wc is plain C data (integers and a union of them).
    let mut wcs: Vec<ibv_wc> = vec![unsafe { std::mem::zeroed() }; 64];
    let (mut posted, mut done) = (0, 0);
    let after_post = |e: &mut Engine, key: QpKey, now: Instant| {
        if every_qp_on_post {
            e.progress(now);
        } else if e.progress_after_post(key, now, std::time::Duration::from_micros(200)) {
            e.full_round_ended(now);
        }
    };
    let start = std::time::Instant::now();
    for &(a, _) in &keys {
        for _ in 0..depth.min(total / pairs) {
            e.post_send(a, &write).unwrap();
            after_post(&mut e, a, now);
            posted += 1;
        }
    }
    while done < posted {
        now = now + std::time::Duration::from_micros(50);
        e.progress(now);
        e.full_round_ended(now);
        loop {
            let n = e.poll_cq(ACQ, &mut wcs, now).unwrap();
            for wc in &wcs[..n] {
                assert_eq!(wc.status, IBV_WC_SUCCESS);
                done += 1;
                if posted < total {
                    let qpn = wc.qp_num;
                    e.post_send((1, qpn), &write).unwrap();
                    after_post(&mut e, (1, qpn), now);
                    posted += 1;
                }
            }
            if n < wcs.len() {
                break;
            }
        }
    }
    start.elapsed() / total
}

/// Not a benchmark (absolute times here are noise) but a diagnostic of the engine alone: what
/// a Write costs in user space with 256 QP pairs against one, in the same run, with the
/// provider's rounds. Run it with
/// `cargo test --release -p liburdma -- --ignored --nocapture write_cost_at_scale`.
#[test]
#[ignore]
fn write_cost_at_scale() {
    let total = 25_600;
    for every_qp_on_post in [false, true] {
        let one = write_cost(1, 16, total, every_qp_on_post);
        let many = write_cost(256, 16, total, every_qp_on_post);
        println!(
            "engine alone, per 64-B Write{}: 1 pair {one:?}, 256 pairs {many:?}, ratio {:.2}",
            if every_qp_on_post {
                ", a round over every QP on each post"
            } else {
                ""
            },
            many.as_secs_f64() / one.as_secs_f64()
        );
    }
}

#[test]
fn a_post_takes_its_own_qp_and_every_qp_once_a_full_round_is_due() {
    // A round over every QP on each post made a message cost what all the QPs cost.
    let mut t = Bed::new();
    t.connect();
    let log = record(&mut t, false);
    let every = std::time::Duration::from_millis(1);
    t.e.progress(t.now);
    t.e.full_round_ended(t.now);
    log.lock().unwrap().clear();
    // Two QPs: the first post is A's alone, the second (as many posts as QPs) takes both.
    assert!(!t.e.progress_after_post(A, t.now, every));
    assert_eq!(*log.lock().unwrap(), vec![A]);
    assert!(t.e.progress_after_post(A, t.now, every));
    let order = log.lock().unwrap().clone();
    assert!(order.contains(&B), "{order:?}");
    // After a full round, a post that comes `every` after it ended takes every QP too.
    t.e.full_round_ended(t.now);
    log.lock().unwrap().clear();
    assert!(!t.e.progress_after_post(B, t.now, every));
    assert_eq!(*log.lock().unwrap(), vec![B]);
    t.e.progress(t.now);
    t.e.full_round_ended(t.now);
    log.lock().unwrap().clear();
    assert!(t.e.progress_after_post(B, t.now + every, every));
    assert!(log.lock().unwrap().contains(&A));
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

/// QP `key`'s flow (A's or B's) replaced by a watched one with a figures slot of its own.
fn with_slot(t: &mut Bed, key: QpKey) -> Arc<urdma_shared::qpstats::Slot> {
    let (rx, tx) = if key == A {
        (t.ba.clone(), t.ab.clone())
    } else {
        (t.ab.clone(), t.ba.clone())
    };
    let slot = Arc::new(urdma_shared::qpstats::Slot::default());
    t.e.qps.get_mut(&key).unwrap().flow = Some(Box::new(Watched {
        inner: MemFlow { rx, tx },
        dropped: Default::default(),
        forked: Default::default(),
        slot: Some(slot.clone()),
    }));
    slot
}

#[test]
fn a_qps_figures_follow_its_traffic_and_losses_and_its_last_word_is_its_end() {
    use urdma_shared::qpstats::Counter;
    let mut t = Bed::new();
    t.connect();
    let slot = with_slot(&mut t, A);
    let at = |c: Counter| slot.read()[c as usize];
    let mut rbuf = vec![0u8; 64];
    let r = region(&mut t, 2, 0x300, &mut rbuf, 64);
    for wr in [1, 3, 5] {
        t.e.post_recv(B, wr, &r).unwrap();
    }
    // A send: its round copies the figures; a second send's, within FIGURES_PERIOD, does not.
    t.e.post_send(A, &send(2, &[])).unwrap();
    t.e.progress(t.now);
    assert_eq!(at(Counter::TxPackets), 1, "{:?}", slot.read());
    t.e.post_send(A, &send(4, &[])).unwrap();
    t.e.progress(t.now);
    let conn = |t: &Bed| round::figures(t.e.qps[&A].conn.as_ref().unwrap());
    assert_eq!(conn(&t)[Counter::TxPackets as usize], 2);
    assert_eq!(at(Counter::TxPackets), 1, "{:?}", slot.read());
    // The ACKs come; a send after the period copies all there is, a round trip measured.
    t.run(40);
    t.now = t.now + FIGURES_PERIOD;
    t.e.post_send(A, &send(6, &[])).unwrap();
    t.e.progress(t.now);
    assert_eq!(slot.read(), conn(&t));
    assert!(at(Counter::RxPackets) >= 1, "the ACKs: {:?}", slot.read());
    assert!(at(Counter::SrttUs) > 0, "{:?}", slot.read());
    assert_eq!(at(Counter::Retransmissions), 0);
    // That send's datagram is lost: the round of the timer's first expiry (the tail probe,
    // not yet a timeout) copies at once.
    t.ab.lock().unwrap().clear();
    t.now = t.now + std::time::Duration::from_secs(3);
    t.e.progress(t.now);
    assert_eq!(at(Counter::Timeouts), 0, "{:?}", slot.read());
    assert_eq!(at(Counter::Retransmissions), 1, "{:?}", slot.read());
    t.run(40);
    // The retransmission's ACK came within the period of that copy: the next round after the
    // period copies it, though it moves no datagram of its own (the end of a burst is not
    // left out of the table).
    t.now = t.now + FIGURES_PERIOD;
    t.e.progress(t.now);
    assert_eq!(slot.read(), conn(&t));
    // Destroyed, the QP leaves its last figures for urdmad.
    let last = conn(&t);
    assert!(last[Counter::RxPackets as usize] >= 2, "{last:?}");
    assert_eq!(t.e.destroy_qp(A), Some(Unregister::Unqp));
    assert_eq!(slot.read(), last);
}

/// The round that receives a Send says how far B has received in its figures slot, before
/// the completion reaches B's CQ and though its ACK is held for a reply: an application
/// that exits on the completion leaves urdmad's Abort able to acknowledge the Send.
#[test]
fn what_a_qp_received_is_in_its_slot_before_the_application_can_see_it() {
    let mut t = Bed::new();
    t.connect();
    let slot = with_slot(&mut t, B);
    let mut rbuf = vec![0u8; 64];
    let r = region(&mut t, 2, 0x300, &mut rbuf, 64);
    t.e.post_recv(B, 1, &r).unwrap();
    let expected = |t: &Bed| t.e.qps[&B].conn.as_ref().unwrap().expected_psn();
    let before = expected(&t);
    t.e.post_send(A, &send(2, &[])).unwrap();
    t.e.progress(t.now);
    assert_eq!(slot.received(), None, "nothing received yet");
    t.e.progress(t.now);
    assert_ne!(expected(&t), before, "B received the Send");
    assert_eq!(slot.received(), Some(expected(&t)));
    assert!(t.e.qps[&B].conn.as_ref().unwrap().holds_ack());
    assert_eq!(t.poll(BCQ).len(), 1);
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
