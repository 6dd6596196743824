//! Sans-IO protocol core of urdma: RDMAP (RFC 5040, RFC 7306) over DDP
//! (RFC 5041) over TRP, a small reliability shim over UDP.
//!
//! Nothing here performs I/O or reads a clock. The caller feeds datagrams
//! and the current time in, and takes datagrams to send, completions and
//! the next timer deadline out. Memory is reached through [`mr::Memory`].

pub mod config;
pub mod conn;
pub mod mr;
pub mod reliability;
pub mod setup;
pub mod state;
pub mod time;
pub mod verbs;
pub mod wire;

pub use config::Config;
pub use conn::{Connection, Event, FailReason};
pub use mr::{Access, Memory, Region, VecMemory};
pub use setup::{ConnectOutcome, Connecting, Incoming, SetupError};
pub use state::QpState;
pub use time::Instant;
pub use verbs::{Completion, PostError, Queue, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
pub mod fuzzing;
pub mod sim;
