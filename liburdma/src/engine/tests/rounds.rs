//! A round of progress over many QPs and flows: what it reads first, which QP it starts at,
//! a full way out, the cost of a Write among hundreds of QPs, and the figures a QP
//! publishes.

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
        t.recv_at(B, i, raddr, 64, 0x200);
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
