//! urdmad, the DPDK primary process of urdma, as a library (for its binary, its tools and
//! its tests).
//!
//! What urdmad shares with the processes it serves (the control protocol, the framing, the
//! direct path, the doorbell, the mbuf rings, attaching as a secondary) is the
//! `urdma-shared` crate's, re-exported here under the same names so that the daemon's code
//! reads `crate::proto` as before.

pub use urdma_shared::{bell, client, direct, doorbell, fdpass, frame, proto, qpstats, secondary};

pub mod access;
pub mod cm;
pub mod cm_channel;
pub mod config;
pub mod daemon;
pub mod demux;
pub mod eal;
pub mod ebpf;
pub mod filter_pool;
pub mod flowfilter;
pub mod holder;
pub mod hwflow;
pub mod lending;
pub mod logging;
pub mod netlink;
pub mod port;
pub mod portfilter;
pub mod ringbell;
pub mod service;
pub mod socket_keeper;
pub mod status;
