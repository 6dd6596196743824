//! What a flow is told for urdma.ko's bell (`Flow::ring_for`): after every round and every
//! posted receive, the PSN whose arrival completes a receive, or none.

use super::*;

/// A flow that keeps what it was last told.
struct Told {
    flow: MemFlow,
    told: Arc<Mutex<Vec<Option<u32>>>>,
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
        self.flow.transmit(datagram, fill)
    }
    fn ring_for(&mut self, next: Option<u32>) {
        self.told.lock().unwrap().push(next);
    }
}

#[test]
fn the_flow_hears_which_psn_completes_a_receive_after_each_round_and_post() {
    let mut t = Bed::new();
    t.connect();
    let told = Arc::new(Mutex::new(Vec::new()));
    t.e.qps.get_mut(&B).unwrap().flow = Some(Box::new(Told {
        flow: MemFlow {
            rx: t.ab.clone(),
            tx: t.ba.clone(),
        },
        told: told.clone(),
    }));
    let last = |told: &Arc<Mutex<Vec<Option<u32>>>>| *told.lock().unwrap().last().unwrap();
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
