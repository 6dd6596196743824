//! Per-connection settings.

use core::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Protection domain of the QP: tagged access must name regions of it.
    pub pd: u32,
    /// Largest UDP payload we send or accept (path MTU minus IP and UDP
    /// headers: 1472 for a 1500-byte IPv4 MTU). The smaller of both ends'
    /// values is used.
    pub max_datagram: u16,
    /// PSNs beyond the cumulative ACK this end accepts and tracks.
    pub recv_window: u16,
    /// Upper bound of the congestion window, in segments.
    pub max_cwnd: u32,
    pub initial_cwnd: u32,
    /// Longest time an ACK is held back waiting for a second segment.
    pub ack_delay: Duration,
    /// Longest time the ACK a segment asks for (the last of a message) is held for data of
    /// ours to carry it, if it is not every second segment's anyway. A latency test's
    /// reply, an RPC's answer, a Read Response's next request usually follows within it,
    /// and then the peer gets one datagram instead of an ACK and the data. Measured in the
    /// emulated bed (`ib_write_lat`, 64 B): the reply was posted 60-150 us after the
    /// separate ACK went out. The ACK also ended the peer's wait for its completion while
    /// the reply was still on its way, so that a peer waiting on its memory rather than
    /// its CQ needed its helper thread scheduled to place the reply. Zero: no hold.
    /// [`crate::Connection::release_held_ack`] ends the hold where no reply can come;
    /// [`crate::Connection::set_ack_hold`] lengthens it for an application measured to
    /// take longer to reply.
    pub ack_hold: Duration,
    /// The retransmission timeout until the first RTT sample. Every packet of a connection's
    /// first flight is timed by it, and a short run over many connections at once is mostly
    /// first flight: 256 connections of 25 Writes each, on a link that lost nothing, under
    /// emulation, had 4,120 timeouts at 10 ms, 1,268 at 200 ms and 1,128 at 1 s (the rest
    /// come after the first samples). It costs only a tail loss before the first sample (a
    /// loss inside the flight is found by the SACKs); RFC 6298 takes 1 s.
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
    /// Consecutive retransmission timeouts before the connection fails...
    pub max_retries: u32,
    /// ...and the least time, from the first of them, before it does. The
    /// count alone gives up after about a second of silence, which a
    /// briefly overloaded host (or an emulated one) exceeds while both
    /// ends are alive; a dead peer is still noticed within this bound.
    pub min_give_up: Duration,
    /// Silence after which an idle connection (nothing of ours
    /// unacknowledged) probes the peer, so that a receiver notices a peer
    /// that vanished (its host gone, or its Abort lost) within this plus
    /// `min_give_up`. Every probe costs a datagram each way.
    pub keepalive: Duration,
    /// Inbound RDMA Read Requests we serve concurrently.
    pub ird: u16,
    /// Outbound RDMA Read Requests we keep outstanding.
    pub ord: u16,
    pub max_send_wr: usize,
    pub max_recv_wr: usize,
    /// Take the fast paths for the common datagrams (see
    /// `wire::predict`). Off, every datagram goes through the general
    /// paths: the same behaviour, byte for byte, more slowly; tests compare
    /// the two.
    pub header_prediction: bool,
    /// Ask for the CRC32C trailer (`wire::crc`) on every datagram of the
    /// connection. It is used when either end asks, as MPA's CRC is.
    pub crc: bool,
    /// Receives come from a shared receive queue ([`crate::Memory::srq`]),
    /// not from `post_recv`.
    pub srq: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pd: 0,
            max_datagram: 1472,
            recv_window: 1024,
            max_cwnd: 1024,
            initial_cwnd: 16,
            ack_delay: Duration::from_micros(200),
            ack_hold: Duration::from_micros(100),
            initial_rto: Duration::from_millis(200),
            min_rto: Duration::from_millis(1),
            max_rto: Duration::from_millis(500),
            max_retries: 7,
            min_give_up: Duration::from_secs(10),
            keepalive: Duration::from_secs(2),
            ird: 16,
            ord: 16,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            header_prediction: true,
            crc: true,
            srq: false,
        }
    }
}

/// Smallest datagram that carries a header and some payload.
pub const MIN_DATAGRAM: u16 = 128;
