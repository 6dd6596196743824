//! urdmad's half of the direct path ([`crate::direct`]): which ports offer it, the sockets
//! of the connections on it, and the filter that keeps their frames off urdmad's own
//! sockets.

use super::Daemon;
use crate::direct::{self, Geometry};
use crate::filter_pool::{self, FilterPool};
use crate::flowfilter::FlowFilter;
use crate::netlink::Netlink;
use crate::portfilter::{PortFilter, MAX_DIRECT};
use crate::proto::FlowSpec;
use crate::socket_keeper::{Ready, SocketKeeper};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// A port on which connections may take the direct path.
pub(super) struct DirectPort {
    ifindex: i32,
    /// On the af_packet PMD's sockets on the interface, urdmad's own: what they leave out.
    filter: PortFilter,
    /// The connections on the direct path, by flow: (local, remote).
    flows: BTreeMap<u32, (SocketAddrV4, SocketAddrV4)>,
    /// Most connections on the direct path at once (the port's `direct_max`).
    max: usize,
    /// Makes the sockets ready and closes them (urdmad's one keeper, shared by its ports).
    keeper: Arc<SocketKeeper<Prepared>>,
    /// The filters of closed connections, until the keeper uses them again.
    filters: Arc<Filters>,
}

/// The filters of connections that ended, used again once their sockets are gone.
pub(super) type Filters = FilterPool<FlowFilter>;

/// Filters loaded at start, so that the first connections of a burst load none. Each holds
/// five descriptors (its program and four maps).
pub(super) const FILTER_STOCK: usize = 32;

/// What urdmad's socket keeper makes ready for a connection: the socket with its rings and
/// the filter with its program loaded, the two parts of a hand-over that wait (grace
/// periods; the verifier).
pub(super) struct Prepared {
    sock: OwnedFd,
    /// The filter, with the connection's bell word; why there is none: the connection then
    /// has the classic filter and no bell.
    filter: std::io::Result<FlowFilter>,
}

impl Ready for Prepared {
    fn into_socket(self) -> OwnedFd {
        self.sock
    }
}

/// Makes a socket with rings of `geo` and a filter ready. The socket keeper's threads
/// (`filters` given) take a filter of `filters` if one is free, renewed, else load one to
/// be used again; both wait for a grace period. urdmad's thread loads one that serves one
/// connection, without that wait.
pub(super) fn prepare(geo: Geometry, filters: Option<&Filters>) -> std::io::Result<Prepared> {
    Ok(Prepared {
        sock: direct::prepare_socket(geo)?,
        filter: filter(filters),
    })
}

fn filter(filters: Option<&Filters>) -> std::io::Result<FlowFilter> {
    let Some(filters) = filters else {
        return FlowFilter::new(false);
    };
    let taken = filters.take(
        || Netlink::sock_diag()?.packet_cookies(),
        filter_pool::grace_period,
    );
    match taken {
        Some(mut f) => {
            f.renew()?;
            Ok(f)
        }
        None => FlowFilter::new(true),
    }
}

/// A connection put on the direct path, for its hand-over.
pub(super) struct OnDirect {
    /// Its socket, for the process (urdmad keeps it with the flow).
    pub(super) socket: RawFd,
    /// Frames of each of its rings.
    pub(super) frames: u32,
    /// With a bell: its verdicts map, for urdma.ko, and its word, for the process (urdmad
    /// keeps both with the flow).
    pub(super) bell: Option<(RawFd, RawFd)>,
}

/// Why a connection does not take the direct path.
enum NotDirect {
    /// The port has `direct_max` connections on it: an expected outcome, not a fault.
    Full(usize),
    Failed(String),
}

/// A direct connection's socket, as urdmad keeps it (for its counters).
pub(super) struct DirectSock {
    fd: OwnedFd,
    /// Its filter (and maps) while the connection lasts; with the socket's cookie, to use
    /// the filter again once the socket is gone.
    filter: Option<FlowFilter>,
    cookie: Option<u64>,
    /// Frames it received and frames its receive ring had no room for, so far.
    rx_packets: Cell<u64>,
    rx_drops: Cell<u64>,
}

impl DirectSock {
    /// (received, dropped) since the connection began.
    pub(super) fn counters(&self) -> (u64, u64) {
        let (p, d) = direct::take_stats(self.fd.as_raw_fd());
        self.rx_packets.set(self.rx_packets.get() + p);
        self.rx_drops.set(self.rx_drops.get() + d);
        (self.rx_packets.get(), self.rx_drops.get())
    }
}

/// The `iface=` of an af_packet device string.
fn af_packet_iface(device: &str) -> Option<&str> {
    if !crate::port::may_echo(device) {
        return None;
    }
    device.split(',').find_map(|kv| kv.strip_prefix("iface="))
}

/// The sockets the af_packet PMD opened for a port whose device is `device` (DPDK owns
/// them), with the interface's index; why none, for another kind of port.
pub(super) fn port_sockets(device: &str) -> Result<(i32, Vec<RawFd>), String> {
    let Some(iface) = af_packet_iface(device) else {
        return Err("not an af_packet port".into());
    };
    let ifindex = direct::ifindex(iface).map_err(|e| format!("interface {iface}: {e}"))?;
    let own: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| format!("/proc/self/fd: {e}"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .filter(|&fd| direct::bound_ifindex(fd) == ifindex)
        .collect();
    if own.is_empty() {
        return Err(format!("no socket of the port on {iface} found"));
    }
    Ok((ifindex, own))
}

impl DirectPort {
    /// The direct path of a port whose own sockets are `sockets` ([`port_sockets`], found
    /// once the port is up); why not, when it has none.
    pub(super) fn new(
        sockets: &Result<(i32, Vec<RawFd>), String>,
        enabled: bool,
        max: u32,
        keeper: &Result<Arc<SocketKeeper<Prepared>>, String>,
        filters: &Arc<Filters>,
    ) -> Result<DirectPort, String> {
        if !enabled {
            return Err("direct = false".into());
        }
        let keeper = keeper.as_ref().map_err(Clone::clone)?;
        let (ifindex, own) = sockets.as_ref().map_err(Clone::clone)?;
        let ifindex = *ifindex;
        let filter = PortFilter::new().map_err(|e| e.to_string())?;
        for &fd in own {
            filter
                .attach(fd)
                .map_err(|e| format!("cannot filter the port's sockets: {e}"))?;
        }
        Ok(DirectPort {
            ifindex,
            filter,
            flows: BTreeMap::new(),
            max: max.min(MAX_DIRECT) as usize,
            keeper: Arc::clone(keeper),
            filters: Arc::clone(filters),
        })
    }

    /// Opens the socket of connection `flow`, then stops urdmad's sockets taking its frames.
    /// Until then urdmad still receives them (onto the flow's ring, which the process
    /// drains too), so none is lost in between. With the socket, its filter's maps for
    /// urdma.ko's bell, unless the filter could not be loaded (then the socket has the
    /// classic one, and no bell).
    fn open(
        &mut self,
        flow: u32,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        geo: Geometry,
    ) -> Result<(OwnedFd, Option<FlowFilter>), NotDirect> {
        if self.flows.len() >= self.max {
            return Err(NotDirect::Full(self.max));
        }
        let Prepared { sock: fd, filter } = match self.keeper.take(geo) {
            Some(p) => p,
            // None ready (the first connection, or more at once than the keeper holds):
            // made here, waiting for the grace periods and the verifier, and not for the
            // keeper's threads, which may hold the filters.
            None => prepare(geo, None)
                .map_err(|e| NotDirect::Failed(format!("cannot open its socket: {e}")))?,
        };
        let bell = match filter.and_then(|mut f| f.aim(&local, &remote).map(|()| f)) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(flow, "no bell for this connection: {e}");
                None
            }
        };
        match &bell {
            Some(f) => direct::hand_over_with(&fd, self.ifindex, |fd| f.attach(fd)),
            None => direct::hand_over(&fd, self.ifindex, &local, &remote),
        }
        .map_err(|e| NotDirect::Failed(format!("cannot bind its socket: {e}")))?;
        self.filter
            .insert(&local, &remote)
            .map_err(|e| NotDirect::Failed(format!("cannot filter the port's sockets: {e}")))?;
        self.flows.insert(flow, (local, remote));
        Ok((fd, bell))
    }

    fn close(&mut self, flow: u32, sock: DirectSock) {
        if let Some((local, remote)) = self.flows.remove(&flow) {
            if let Err(e) = self.filter.remove(&local, &remote) {
                tracing::warn!(flow, "cannot filter the port's sockets: {e}");
            }
        }
        if let (Some(filter), Some(cookie)) = (sock.filter, sock.cookie) {
            if filter.can_renew() {
                self.filters.retire(cookie, filter);
            }
        }
        self.keeper.close(sock.fd);
    }

    pub(super) fn len(&self) -> usize {
        self.flows.len()
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }
}

impl Daemon {
    /// Puts the connection of the just opened `flow` on the direct path if its port offers
    /// it and the peer is on the wire (not this node). None: the process uses the flow's
    /// ring.
    pub(super) fn direct_open(
        &mut self,
        flow: u32,
        spec: &FlowSpec,
        datagram: u16,
    ) -> Option<OnDirect> {
        let frames = self.cfg.daemon.direct_frames;
        let p = self.ports.get_mut(usize::from(spec.port))?;
        let dp = p.direct.as_mut()?;
        let (remote, mac) = (spec.remote?, spec.remote_mac?);
        if mac == p.port.mac {
            return None;
        }
        let rec = self.flows.get_mut(&flow)?;
        let geo = Geometry::new(datagram, frames);
        match dp.open(flow, spec.local, remote, geo) {
            Ok((fd, bell)) => {
                let raw = fd.as_raw_fd();
                let maps = bell
                    .as_ref()
                    .map(|f| (f.verdicts.as_raw_fd(), f.word().as_raw_fd()));
                // Without it, the filter is not used again.
                let cookie = direct::socket_cookie(raw).ok();
                rec.direct = Some(DirectSock {
                    fd,
                    filter: bell,
                    cookie,
                    rx_packets: Cell::new(0),
                    rx_drops: Cell::new(0),
                });
                Some(OnDirect {
                    socket: raw,
                    frames: geo.frames,
                    bell: maps,
                })
            }
            Err(NotDirect::Full(max)) => {
                tracing::debug!(flow, local = %spec.local, %remote, "through urdmad: {max} connections on the direct path already (direct_max)");
                None
            }
            Err(NotDirect::Failed(why)) => {
                tracing::warn!(flow, local = %spec.local, %remote, "not on the direct path: {why}");
                None
            }
        }
    }

    /// Takes a closing flow off the direct path; its socket is closed off urdmad's path
    /// ([`SocketKeeper::close`]).
    pub(super) fn direct_close(&mut self, flow: u32, port: u16, sock: DirectSock) {
        match self
            .ports
            .get_mut(usize::from(port))
            .and_then(|p| p.direct.as_mut())
        {
            Some(dp) => dp.close(flow, sock),
            None => drop(sock),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_af_packet_devices_name_an_interface() {
        assert_eq!(
            af_packet_iface("net_af_packet0,iface=veth0,qdisc_bypass=0"),
            Some("veth0")
        );
        assert_eq!(af_packet_iface("net_af_packet1,qdisc_bypass=0"), None);
        assert_eq!(af_packet_iface("net_tap0,iface=dtap0"), None);
        assert_eq!(af_packet_iface("0000:03:00.0"), None);
        let keeper = SocketKeeper::new(0, Box::new(|geo| prepare(geo, None))).map(Arc::new);
        let keeper = keeper.map_err(|e| e.to_string());
        let filters = Arc::new(Filters::default());
        assert!(DirectPort::new(&Ok((1, vec![3])), false, 16, &keeper, &filters).is_err());
    }
}
