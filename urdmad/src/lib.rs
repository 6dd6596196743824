//! urdmad, the DPDK primary process of urdma, as a library.
//!
//! [`proto`] (the control protocol), [`client`] (its client side), [`frame`] (the
//! Ethernet/IPv4/UDP framing of TRP datagrams) and [`direct`] (a connection's own packet
//! socket) need only `std` and `libc` and are what other crates use: depend on `urdmad` with
//! `default-features = false`. [`secondary`] (attaching to urdmad as a DPDK secondary
//! process) needs DPDK and is behind the `secondary` feature, which the provider turns on,
//! and so are [`doorbell`] (waking an idle urdmad) and [`lending`] (the mbufs a process
//! sends). The daemon's modules are behind the
//! `daemon` feature (on by default).

pub mod client;
pub mod direct;
pub mod frame;
pub mod proto;

#[cfg(feature = "daemon")]
pub mod access;
#[cfg(feature = "daemon")]
pub mod cm_channel;
#[cfg(feature = "daemon")]
pub mod config;
#[cfg(feature = "daemon")]
pub mod daemon;
#[cfg(feature = "daemon")]
pub mod demux;
#[cfg(feature = "secondary")]
pub mod doorbell;
#[cfg(feature = "daemon")]
pub mod eal;
#[cfg(feature = "daemon")]
pub mod holder;
#[cfg(feature = "daemon")]
pub mod hwflow;
#[cfg(feature = "secondary")]
pub mod lending;
#[cfg(feature = "daemon")]
pub mod logging;
#[cfg(feature = "daemon")]
pub mod port;
#[cfg(feature = "daemon")]
pub mod portfilter;
#[cfg(feature = "secondary")]
pub mod secondary;
#[cfg(feature = "daemon")]
pub mod service;
