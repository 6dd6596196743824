//! urdmad's half of the direct path ([`crate::direct`]): which ports offer it, the sockets
//! of the connections on it, and the filter that keeps their frames off urdmad's own
//! sockets.
//!
//! A socket whose filter urdmad can aim again is not closed when its connection ends while
//! its process lives: it waits on the process's shelf ([`Daemon::shelves`]) until the
//! process says it parked its copy (`PARK`, rings still mapped) or gave it back
//! (`GIVEBACK`). A parked socket serves the process's next connection on its port, once the
//! connection it served is closed (`QPCLOSED`, which urdmad follows with the kernel's
//! `CLOSED`: urdma.ko then no longer watches it) or its QP destroyed: urdmad aims its filter at
//! the new connection and names it in `CONNECTED`'s `reuse`. It never goes to another
//! process.

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
    /// Not 0: the socket is one the process parked, this its cookie; it is not passed.
    pub(super) reuse: u64,
    /// The process may park the socket when the connection ends.
    pub(super) park: bool,
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
    /// The QP it serves (or served, on a shelf), its port and the geometry of its rings.
    qp: (u32, u32),
    port: u16,
    geo: Geometry,
    /// What its process did with its own copy.
    owner: Owner,
    /// Frames it received and frames its receive ring had no room for, so far.
    rx_packets: Cell<u64>,
    rx_drops: Cell<u64>,
}

/// What a process did with its copy of a direct connection's socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// Uses it, or has not said yet.
    Holds,
    /// Keeps it, rings mapped, for its next connection (`PARK`).
    Parked,
    /// Gave it back (`GIVEBACK`): it closes with the connection.
    GaveBack,
}

impl DirectSock {
    /// Whether its process may park it: its filter can be aimed at another connection.
    pub(super) fn parkable(&self) -> bool {
        self.filter.is_some() && self.cookie.is_some()
    }

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

    /// Takes a connection that took a parked socket, `sock`, onto the direct path: its
    /// filter is aimed at the connection, and urdmad's sockets stop taking its frames.
    fn reopen(
        &mut self,
        flow: u32,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        sock: &mut DirectSock,
    ) -> Result<(), NotDirect> {
        if self.flows.len() >= self.max {
            return Err(NotDirect::Full(self.max));
        }
        let filter = sock
            .filter
            .as_mut()
            .ok_or_else(|| NotDirect::Failed("a parked socket without its filter".into()))?;
        filter
            .aim(&local, &remote)
            .map_err(|e| NotDirect::Failed(format!("cannot aim its filter: {e}")))?;
        self.filter
            .insert(&local, &remote)
            .map_err(|e| NotDirect::Failed(format!("cannot filter the port's sockets: {e}")))?;
        self.flows.insert(flow, (local, remote));
        Ok(())
    }

    /// Takes `flow` off the direct path; urdmad's sockets take its frames again.
    fn forget(&mut self, flow: u32) {
        if let Some((local, remote)) = self.flows.remove(&flow) {
            if let Err(e) = self.filter.remove(&local, &remote) {
                tracing::warn!(flow, "cannot filter the port's sockets: {e}");
            }
        }
    }

    fn close(&mut self, flow: u32, sock: DirectSock) {
        self.forget(flow);
        self.discard(sock);
    }

    /// Closes a socket no longer on the direct path (off urdmad's thread), its filter kept
    /// for another socket.
    fn discard(&mut self, sock: DirectSock) {
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
        qp: (u32, u32),
    ) -> Option<OnDirect> {
        let frames = self.cfg.daemon.direct_frames;
        let client = self.flows.get(&flow)?.client;
        let geo = Geometry::new(datagram, frames);
        let p = self.ports.get(usize::from(spec.port))?;
        p.direct.as_ref()?;
        let (remote, mac) = (spec.remote?, spec.remote_mac?);
        if mac == p.port.mac {
            return None;
        }
        if let Some(d) = self.direct_reopen(flow, spec, geo, client, qp) {
            return Some(d);
        }
        let dp = self
            .ports
            .get_mut(usize::from(spec.port))?
            .direct
            .as_mut()?;
        let rec = self.flows.get_mut(&flow)?;
        match dp.open(flow, spec.local, remote, geo) {
            Ok((fd, bell)) => {
                let raw = fd.as_raw_fd();
                let maps = bell
                    .as_ref()
                    .map(|f| (f.verdicts.as_raw_fd(), f.word().as_raw_fd()));
                // Without it, the filter is not used again.
                let cookie = direct::socket_cookie(raw).ok();
                let sock = DirectSock {
                    fd,
                    filter: bell,
                    cookie,
                    qp,
                    port: spec.port,
                    geo,
                    owner: Owner::Holds,
                    rx_packets: Cell::new(0),
                    rx_drops: Cell::new(0),
                };
                let park = sock.parkable();
                rec.direct = Some(sock);
                Some(OnDirect {
                    socket: raw,
                    reuse: 0,
                    park,
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

    /// Puts `flow` on the direct path with a socket its process parked, when one fits: on
    /// the same port, rings of `geo`, and the connection it served over (it is `qp`'s number,
    /// or a QP urdmad no longer counts as the process's: closed, or destroyed).
    fn direct_reopen(
        &mut self,
        flow: u32,
        spec: &FlowSpec,
        geo: Geometry,
        client: u32,
        qp: (u32, u32),
    ) -> Option<OnDirect> {
        let remote = spec.remote?;
        let shelf = self.shelves.get_mut(&client)?;
        let i = shelf.iter().position(|s| {
            s.owner == Owner::Parked
                && s.port == spec.port
                && s.geo == geo
                && (s.qp == qp || self.cm.qp_owner(s.qp.0, s.qp.1) != Some(client))
        })?;
        let mut sock = shelf.swap_remove(i);
        let dp = self
            .ports
            .get_mut(usize::from(spec.port))
            .and_then(|p| p.direct.as_mut())?;
        if let Err(e) = dp.reopen(flow, spec.local, remote, &mut sock) {
            if let NotDirect::Failed(why) = e {
                tracing::warn!(flow, "a parked socket cannot serve the connection: {why}");
            }
            // Still the process's, parked.
            self.shelves.entry(client).or_default().push(sock);
            return None;
        }
        // Its counters start again with the connection.
        let _ = direct::take_stats(sock.fd.as_raw_fd());
        sock.rx_packets.set(0);
        sock.rx_drops.set(0);
        sock.qp = qp;
        sock.owner = Owner::Holds;
        let on = OnDirect {
            socket: sock.fd.as_raw_fd(),
            reuse: sock.cookie.unwrap_or(0),
            park: true,
            frames: geo.frames,
            bell: sock
                .filter
                .as_ref()
                .map(|f| (f.verdicts.as_raw_fd(), f.word().as_raw_fd())),
        };
        self.flows.get_mut(&flow)?.direct = Some(sock);
        self.sockets_reused += 1;
        Some(on)
    }

    /// Takes a closing flow of `client` off the direct path. Its socket goes on the
    /// client's shelf, aimed at nothing, if the client may park it and lives; otherwise it is
    /// closed off urdmad's path ([`SocketKeeper::close`]).
    pub(super) fn direct_close(&mut self, flow: u32, client: u32, mut sock: DirectSock) {
        let Some(dp) = self
            .ports
            .get_mut(usize::from(sock.port))
            .and_then(|p| p.direct.as_mut())
        else {
            return;
        };
        let lives = self.clients.iter().any(|c| c.id == client);
        if !(lives && sock.parkable() && sock.owner != Owner::GaveBack) {
            dp.close(flow, sock);
            return;
        }
        dp.forget(flow);
        if let Some(Err(e)) = sock.filter.as_mut().map(|f| f.aim_at_nothing()) {
            tracing::warn!(flow, "cannot clear a parked socket's filter: {e}");
            dp.discard(sock);
            return;
        }
        self.shelves.entry(client).or_default().push(sock);
    }

    /// Closes what waits on a shelf: `sock` (`port`'s).
    fn direct_discard(&mut self, sock: DirectSock) {
        match self
            .ports
            .get_mut(usize::from(sock.port))
            .and_then(|p| p.direct.as_mut())
        {
            Some(dp) => dp.discard(sock),
            None => drop(sock),
        }
    }

    /// Client `id` is gone: the sockets on its shelf close.
    pub(super) fn direct_release(&mut self, id: u32) {
        for sock in self.shelves.remove(&id).unwrap_or_default() {
            self.direct_discard(sock);
        }
    }

    /// `PARK`: client `i` keeps socket `cookie` of one of its connections, ended or ending,
    /// for its next one.
    pub(super) fn direct_park(&mut self, i: usize, cookie: u64) -> Result<(), String> {
        let id = self.clients[i].id;
        let sock = match self.client_direct(i, cookie) {
            Some(s) => Some(s),
            None => self
                .shelves
                .get_mut(&id)
                .and_then(|v| v.iter_mut().find(|s| s.cookie == Some(cookie))),
        };
        match sock {
            Some(s) if s.parkable() && s.owner == Owner::Holds => {
                s.owner = Owner::Parked;
                Ok(())
            }
            Some(_) => Err(format!("socket {cookie} cannot be parked")),
            None => Err(format!("no socket {cookie} of yours")),
        }
    }

    /// `GIVEBACK` of socket `cookie` by client `i`: urdmad's copy closes with its connection,
    /// or now if that ended.
    pub(super) fn direct_given_back(&mut self, i: usize, cookie: u64) {
        if let Some(s) = self.client_direct(i, cookie) {
            s.owner = Owner::GaveBack;
            return;
        }
        let id = self.clients[i].id;
        let Some(shelf) = self.shelves.get_mut(&id) else {
            return;
        };
        if let Some(k) = shelf.iter().position(|s| s.cookie == Some(cookie)) {
            let sock = shelf.swap_remove(k);
            self.direct_discard(sock);
        }
    }

    /// The process never heard of `flow`, which took a socket it had parked: the socket is
    /// still parked in the process.
    pub(super) fn direct_reparked(&mut self, flow: u32) {
        if let Some(d) = self.flows.get_mut(&flow).and_then(|r| r.direct.as_mut()) {
            d.owner = Owner::Parked;
        }
    }

    /// The socket `cookie` of one of client `i`'s open flows.
    fn client_direct(&mut self, i: usize, cookie: u64) -> Option<&mut DirectSock> {
        let c = &self.clients[i];
        let flow = c.flows.iter().copied().find(|f| {
            self.flows
                .get(f)
                .and_then(|r| r.direct.as_ref())
                .is_some_and(|d| d.cookie == Some(cookie))
        })?;
        self.flows.get_mut(&flow)?.direct.as_mut()
    }

    /// Sockets parked by processes, waiting for their next connections.
    pub(super) fn sockets_parked(&self) -> usize {
        self.shelves
            .values()
            .flatten()
            .filter(|s| s.owner == Owner::Parked)
            .count()
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
