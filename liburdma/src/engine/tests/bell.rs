//! What a flow is told for urdma.ko's bell: after every round and every posted receive, the
//! PSN whose arrival completes a receive, or none (`Flow::ring_for`); before every transmit,
//! whether an ACK can wait (`Flow::acks_can_wait`).

use super::*;

/// The PSNs a flow was told, in order.
type Psns = Arc<Mutex<Vec<Option<u32>>>>;

/// A flow that keeps what it was last told.
struct Told {
    flow: MemFlow,
    told: Psns,
    acks: Arc<Mutex<Acks>>,
}

/// What a flow heard of ACKs: what it was told last, and what it had been told when each
/// datagram left.
#[derive(Default)]
struct Acks {
    can_wait: bool,
    at_sends: Vec<bool>,
}

impl Flow for Told {
    fn receive(&mut self, handle: &mut dyn FnMut(&[&[u8]])) -> usize {
        self.flow.receive(handle)
    }
    fn transmit(
        &mut self,
        datagram: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        let n = self.flow.transmit(datagram, fill);
        let mut a = self.acks.lock().unwrap();
        let told = a.can_wait;
        a.at_sends.extend(std::iter::repeat_n(told, n));
        n
    }
    fn ring_for(&mut self, next: Option<u32>) {
        self.told.lock().unwrap().push(next);
    }
    fn acks_can_wait(&mut self, yes: bool) {
        self.acks.lock().unwrap().can_wait = yes;
    }
}

/// Puts a [`Told`] flow on QP `key` of `t`, the side that sends on `(rx, tx)`.
fn told(t: &mut Bed, key: QpKey, rx: Wire, tx: Wire) -> (Psns, Arc<Mutex<Acks>>) {
    let told = Arc::new(Mutex::new(Vec::new()));
    let acks = Arc::new(Mutex::new(Acks::default()));
    t.e.qps.get_mut(&key).unwrap().flow = Some(Box::new(Told {
        flow: MemFlow { rx, tx },
        told: told.clone(),
        acks: acks.clone(),
    }));
    (told, acks)
}

#[test]
fn the_flow_hears_which_psn_completes_a_receive_after_each_round_and_post() {
    let mut t = Bed::new();
    t.connect();
    let (rx, tx) = (t.ab.clone(), t.ba.clone());
    let (told, _) = told(&mut t, B, rx, tx);
    let last = |told: &Psns| *told.lock().unwrap().last().unwrap();
    t.run(2);
    assert_eq!(last(&told), None, "no receive posted");
    let mut rbuf = vec![0u8; 64];
    let mut sbuf = vec![7u8; 64];
    let r = region(&mut t, 2, 0x200, &mut rbuf, 64);
    t.e.post_recv(B, 5, &r).unwrap();
    let expected = t.e.qps[&B].conn.as_ref().unwrap().expected_psn();
    assert_eq!(last(&told), Some(expected), "told at the post");
    let s = region(&mut t, 1, 0x100, &mut sbuf, 8);
    t.e.post_send(A, &send(1, &s)).unwrap();
    t.run(3);
    assert_eq!(t.poll(BCQ).len(), 1, "the Send arrived");
    assert_eq!(last(&told), None, "its receive was taken");
    t.e.post_recv(B, 6, &r).unwrap();
    assert_eq!(last(&told), Some(expected.wrapping_add(1)));
}

/// A request whose completion waits for its ACK leaves while the flow says ACKs cannot
/// wait, so that urdma.ko's bell wakes the process for that ACK; an unsignaled Write's ACK
/// can wait once the Write is on the wire.
#[test]
fn no_frame_that_needs_its_ack_read_leaves_while_acks_can_wait() {
    let mut t = Bed::new();
    t.connect();
    let (rx, tx) = (t.ba.clone(), t.ab.clone());
    let (_, acks) = told(&mut t, A, rx, tx);
    let mut target = vec![0u8; 64];
    let raddr = t.reg(2, 0x200, 2, &mut target, Access::REMOTE_WRITE);
    let mut sbuf = vec![7u8; 64];
    let s = region(&mut t, 1, 0x100, &mut sbuf, 8);
    let sent = |acks: &Arc<Mutex<Acks>>| acks.lock().unwrap().at_sends.clone();
    t.run(2);
    assert!(acks.lock().unwrap().can_wait, "an idle connection");
    let quiet = SendReq {
        signaled: false,
        ..write(1, &s, raddr, 0x200)
    };
    t.e.post_send(A, &quiet).unwrap();
    t.run(1);
    assert!(
        acks.lock().unwrap().can_wait,
        "an unsignaled Write on the wire needs no ACK soon"
    );
    t.run(5);
    assert!(acks.lock().unwrap().can_wait);
    acks.lock().unwrap().at_sends.clear();
    t.e.post_send(A, &write(2, &s, raddr, 0x200)).unwrap();
    t.run(1);
    assert_eq!(sent(&acks), [false], "a signaled Write waits for its ACK");
    assert!(!acks.lock().unwrap().can_wait);
    t.run(5);
    assert_eq!(t.poll(ACQ).len(), 1);
    assert!(acks.lock().unwrap().can_wait, "acknowledged");
}
