//! Sans-IO protocol core of urdma: RDMAP (RFC 5040, RFC 7306) over DDP
//! (RFC 5041) over TRP, a small reliability shim over UDP. The bytes on the
//! wire are specified in `docs/protocol.md`.
//!
//! Nothing here performs I/O or reads a clock. The caller feeds datagrams
//! (UDP payloads) and the current time in, and takes datagrams to send,
//! completions, events and the next timer deadline out. Application memory
//! and its region table stay with the caller, reached through
//! [`mr::Memory`]; every remote access is checked against it before a byte
//! moves.
//!
//! A driver's progress loop looks like this:
//!
//! ```
//! use trp::{Connection, Instant, Memory};
//!
//! fn progress<M: Memory>(
//!     conn: &mut Connection,
//!     mem: &mut M,
//!     now: Instant,
//!     received: &[&[u8]],
//!     send: &mut dyn FnMut(&[u8]),
//! ) -> Option<Instant> {
//!     for d in received {
//!         let _ = conn.handle_datagram(now, mem, d); // malformed: counted, dropped
//!     }
//!     if conn.poll_timeout().is_some_and(|t| t <= now) {
//!         conn.handle_timeout(now);
//!     }
//!     let mut buf = [0u8; 1472];
//!     while let Some(n) = conn.poll_transmit(now, mem, &mut buf) {
//!         send(&buf[..n]);
//!     }
//!     while let Some(c) = conn.poll_completion() {
//!         let _ = c; // to the CQ
//!     }
//!     while let Some(e) = conn.poll_event() {
//!         let _ = e; // to the connection manager
//!     }
//!     conn.poll_timeout() // sleep until then or until a datagram arrives
//! }
//! ```
//!
//! Connection setup: [`Connecting`] (active side) and [`Incoming`] (passive
//! side) are consumed into a [`Connection`]. QP state changes inside a
//! connection go through [`state::Transition`], implemented only for legal
//! edges:
//!
//! ```compile_fail
//! fn step<F: trp::state::Transition<T>, T: trp::state::State>() {}
//! step::<trp::state::Error, trp::state::Rts>(); // no way back from Error
//! ```
//!
//! ```
//! fn step<F: trp::state::Transition<T>, T: trp::state::State>() {}
//! step::<trp::state::Rts, trp::state::Closing>();
//! ```
//!
//! Test scaffolding sits behind cargo features, off in a normal build:
//! `sim` adds `trp::sim`, a deterministic network simulator with its
//! fixtures; `fuzzing` adds `trp::fuzzing`, the entry points of the fuzz
//! targets. trp's own tests, benches and examples turn both on.

// No unsafe code: the fuzz targets run without a sanitizer (scripts/test), which relies on it.
#![forbid(unsafe_code)]

pub mod config;
pub mod conn;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod mr;
pub mod reliability;
pub mod setup;
#[cfg(feature = "sim")]
pub mod sim;
pub mod state;
pub mod terminate;
pub mod time;
pub mod verbs;
pub mod wire;

pub use config::Config;
pub use conn::srq::Srq;
pub use conn::{Connection, Event, FailReason};
pub use mr::{Access, Memory, Region, VecMemory};
pub use setup::{ConnectOutcome, Connecting, Incoming, SetupError};
pub use state::QpState;
pub use time::Instant;
pub use verbs::{
    AtomicOp, Completion, LocalOp, PostError, Queue, RecvWr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
