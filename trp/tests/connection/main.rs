//! Connection life cycle and error paths through the simulator, one module per subject.

mod lifecycle;
mod liveness;
mod ordering;
mod refusals;
mod srq;
mod trailer;
mod wakes;

use trp::sim::{Endpoint, LinkConfig, Pair};
use trp::terminate::{Cause, OperationCode, TaggedCode, UntaggedCode};
use trp::wire::crc;
use trp::{
    Access, Completion, Config, Event, FailReason, Incoming, Memory, QpState, Queue, RecvWr,
    Region, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};

/// A Send that neither invalidates nor asks for a solicited event.
const PLAIN_SEND: SendOp = SendOp::Send {
    invalidate: None,
    solicited: false,
};

/// Both ends get `trp::sim::memory`: STag 1 for the lower half, local;
/// STag 2 for the upper half (from `1 << 19`), remote.
fn pair(cfg_a: Config, cfg_b: Config) -> Pair {
    Pair::builder()
        .configs(cfg_a, cfg_b)
        .seed(7)
        .connect()
        .unwrap()
}

fn drain(c: &mut trp::Connection) -> Vec<Completion> {
    std::iter::from_fn(|| c.poll_completion()).collect()
}

fn events(c: &mut trp::Connection) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn sge(addr: u64, len: u32) -> [Sge; 1] {
    [Sge { addr, len, lkey: 1 }]
}

fn send(p: &mut Pair, wr_id: u64, op: SendOp, s: &[Sge]) {
    p.a.conn
        .post_send(
            &p.a.mem,
            &SendWr {
                wr_id,
                op,
                sges: s,
                signaled: true,
            },
        )
        .unwrap();
}

fn post_recv(e: &mut Endpoint, wr_id: u64, addr: u64, len: u32) {
    e.conn
        .post_recv(
            &e.mem,
            &RecvWr {
                wr_id,
                sges: &sge(addr, len),
            },
        )
        .unwrap();
}

/// Runs until a's connection is closed, at `limit` at the latest; checks
/// that it failed for `why` and returns its completions.
fn a_fails(p: &mut Pair, limit: trp::Instant, why: FailReason) -> Vec<Completion> {
    assert!(p.run_until(limit, |p| p.a.conn.state() == QpState::Closed));
    assert_eq!(events(&mut p.a.conn), vec![Event::Failed(why)]);
    drain(&mut p.a.conn)
}
