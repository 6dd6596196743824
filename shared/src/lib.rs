//! The contract between urdmad (the DPDK primary) and the processes it serves, apart from
//! both, so that the provider carries nothing of the daemon and both compile one definition
//! of each fact:
//!
//! | module | what |
//! |---|---|
//! | [`proto`] | the control protocol: requests, replies, events, their encoding |
//! | [`client`] | its client side: connect, greet, send, read replies and events |
//! | [`frame`] | the Ethernet/IPv4/UDP framing of TRP datagrams |
//! | [`direct`] | a connection's own packet socket (the direct path): its filter and rings |
//! | [`fdpass`] | descriptors sent with the control socket's lines (`SCM_RIGHTS`) |
//! | [`doorbell`] | waking an idle urdmad after a frame is put on a TX ring |
//! | [`qpstats`] | each connected QP's transport figures, kept by its process for urdmad |
//! | [`lending`] | the two rings through which a process borrows the mbufs it sends (`secondary`) |
//! | [`secondary`] | attaching as a DPDK secondary process (`secondary`) |
//! | [`status`] | urdmad's status report, typed |
//!
//! `lending` and `secondary` need DPDK, behind the `secondary` feature.

pub mod bell;
pub mod client;
pub mod direct;
pub mod doorbell;
pub mod fdpass;
pub mod frame;
pub mod proto;
pub mod qpstats;

#[cfg(feature = "secondary")]
pub mod lending;
#[cfg(feature = "secondary")]
pub mod secondary;
pub mod status;
