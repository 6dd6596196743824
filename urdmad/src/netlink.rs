//! The netlink requests that make a port's exception interface usable: its addresses and its
//! state (rtnetlink, as `ip addr add` and `ip link set up` send them) and the urdma device on
//! it (RDMA netlink, as `rdma link add` and `rdma link delete` send them); and the packet
//! sockets that still exist (sock_diag, as `ss -0` asks), for the direct path's filters.
//!
//! Requests are built and answers read by pure functions, tested byte for byte; [`Netlink`]
//! only sends a request and reads its answer, each bounded by [`ANSWER_TIMEOUT`]. Netlink
//! carries its numbers in the host's byte order.

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const HEADER: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 0x1;

const NETLINK_RDMA: i32 = 20;
/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)` of `<rdma/rdma_netlink.h>`.
const fn nldev(op: u16) -> u16 {
    (5 << 10) + op
}
const NLDEV_GET: u16 = nldev(1);
const NLDEV_NEWLINK: u16 = nldev(3);
const NLDEV_DELLINK: u16 = nldev(4);
const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_NDEV_NAME: u16 = 51;
const ATTR_LINK_TYPE: u16 = 65;
const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct packet_diag_msg` of `<linux/packet_diag.h>`: family, type, protocol, inode, then
/// the socket's cookie as two 32-bit halves, low first.
const PACKET_DIAG_MSG_LEN: usize = 16;
/// The flag bits of an attribute's type (nested, byte order).
const ATTR_TYPE_MASK: u16 = 0x3fff;

/// How long an answer may take before the request counts as failed (`ETIMEDOUT`): creating
/// a device may load its module first.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// An interface address with its prefix length, as written in the configuration:
/// `10.77.0.1/24`, `fd00::1/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl std::str::FromStr for Prefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Prefix, String> {
        let bad = || format!("{s:?} is not an address with its prefix length, like 10.0.0.1/24");
        let (addr, len) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(format!("{s:?}: prefix length {len} is above {max}"));
        }
        Ok(Prefix { addr, len })
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl<'de> serde::Deserialize<'de> for Prefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Prefix, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One request being written: the header, then the body, 4-byte aligned.
struct Request(Vec<u8>);

impl Request {
    fn new(kind: u16, flags: u16, seq: u32) -> Request {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `done`
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        Request(b)
    }

    fn raw(mut self, bytes: &[u8]) -> Request {
        self.0.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn attr(mut self, kind: u16, payload: &[u8]) -> Request {
        let len = 4 + payload.len() as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.pad();
        self
    }

    fn attr_str(self, kind: u16, s: &str) -> Request {
        let mut z = s.as_bytes().to_vec();
        z.push(0);
        self.attr(kind, &z)
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn done(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

fn octets(addr: IpAddr) -> (u8, Vec<u8>) {
    match addr {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    }
}

/// `ip addr replace P dev IFINDEX`: the address on the interface, whether or not it is
/// there already.
fn address_request(seq: u32, ifindex: u32, p: &Prefix) -> Vec<u8> {
    let (family, bytes) = octets(p.addr);
    let mut ifa = [0u8; 8];
    ifa[0] = family;
    ifa[1] = p.len;
    // flags 0, scope 0 (universe)
    ifa[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    Request::new(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE, seq)
        .raw(&ifa)
        .attr(IFA_LOCAL, &bytes)
        .attr(IFA_ADDRESS, &bytes)
        .done()
}

/// `ip link set IFINDEX up`.
fn up_request(seq: u32, ifindex: u32) -> Vec<u8> {
    let mut ifi = [0u8; 16];
    // family AF_UNSPEC, type 0
    ifi[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    ifi[8..12].copy_from_slice(&IFF_UP.to_ne_bytes());
    ifi[12..16].copy_from_slice(&IFF_UP.to_ne_bytes()); // what changes
    Request::new(RTM_NEWLINK, NLM_F_ACK, seq).raw(&ifi).done()
}

/// `rdma link add NAME type TYPE netdev NETDEV`.
fn rdma_add_request(seq: u32, name: &str, link_type: &str, netdev: &str) -> Vec<u8> {
    Request::new(NLDEV_NEWLINK, NLM_F_ACK, seq)
        .attr_str(ATTR_DEV_NAME, name)
        .attr_str(ATTR_LINK_TYPE, link_type)
        .attr_str(ATTR_NDEV_NAME, netdev)
        .done()
}

/// `rdma link delete` of the device with this index.
fn rdma_delete_request(seq: u32, index: u32) -> Vec<u8> {
    Request::new(NLDEV_DELLINK, NLM_F_ACK, seq)
        .attr(ATTR_DEV_INDEX, &index.to_ne_bytes())
        .done()
}

/// Every RDMA device, one answer each.
fn rdma_list_request(seq: u32) -> Vec<u8> {
    Request::new(NLDEV_GET, NLM_F_DUMP, seq).done()
}

/// A dump of the packet sockets of this network namespace (`struct packet_diag_req`: the
/// family, then zeros: no details asked for).
fn packet_list_request(seq: u32) -> Vec<u8> {
    let mut req = [0u8; 20];
    req[0] = libc::AF_PACKET as u8;
    Request::new(SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, seq)
        .raw(&req)
        .done()
}

/// The cookie of a packet socket of a dump.
fn packet_cookie(body: &[u8]) -> Option<u64> {
    let msg = body.get(..PACKET_DIAG_MSG_LEN)?;
    let low = u32::from_ne_bytes(msg[8..12].try_into().unwrap());
    let high = u32::from_ne_bytes(msg[12..16].try_into().unwrap());
    Some(u64::from(high) << 32 | u64::from(low))
}

/// One message of an answer.
#[derive(Debug, PartialEq, Eq)]
enum Answer<'a> {
    /// The request's acknowledgement: 0, or a negative errno.
    Status(i32),
    /// The end of a dump.
    Done,
    /// A message of a dump: its type and body.
    Part(u16, &'a [u8]),
}

/// The messages of one datagram that answer `seq`; the first malformed one ends the list
/// with `Err`.
fn answers(buf: &[u8], seq: u32) -> Result<Vec<Answer<'_>>, io::Error> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink answer");
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let head = rest.get(..HEADER).ok_or_else(malformed)?;
        let len = u32::from_ne_bytes(head[0..4].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(head[4..6].try_into().unwrap());
        let their_seq = u32::from_ne_bytes(head[8..12].try_into().unwrap());
        let body = rest.get(HEADER..len).ok_or_else(malformed)?;
        rest = rest.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        if their_seq != seq {
            continue;
        }
        out.push(match kind {
            NLMSG_ERROR => {
                let e = body.get(..4).ok_or_else(malformed)?;
                Answer::Status(i32::from_ne_bytes(e.try_into().unwrap()))
            }
            NLMSG_DONE => Answer::Done,
            k => Answer::Part(k, body),
        });
    }
    Ok(out)
}

/// The attributes of a message body, `(type, payload)`; a truncated one ends the list.
fn attributes(mut body: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while body.len() >= 4 {
        let len = u16::from_ne_bytes([body[0], body[1]]) as usize;
        let kind = u16::from_ne_bytes([body[2], body[3]]) & ATTR_TYPE_MASK;
        let Some(payload) = body.get(4..len.max(4)) else {
            break;
        };
        out.push((kind, payload));
        body = body.get(len.max(4).next_multiple_of(4)..).unwrap_or(&[]);
    }
    out
}

/// An RDMA device of a dump: its index and name.
fn rdma_device(body: &[u8]) -> Option<(u32, String)> {
    let attrs = attributes(body);
    let index = attrs
        .iter()
        .find(|(k, p)| *k == ATTR_DEV_INDEX && p.len() == 4)
        .map(|(_, p)| u32::from_ne_bytes((*p).try_into().unwrap()))?;
    let name = attrs.iter().find(|(k, _)| *k == ATTR_DEV_NAME)?.1;
    let name = name.split(|b| *b == 0).next().unwrap_or_default();
    Some((index, String::from_utf8_lossy(name).into_owned()))
}

/// A netlink socket of one family, for one request at a time.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    /// rtnetlink: addresses and interface state.
    pub fn route() -> io::Result<Netlink> {
        Netlink::open(libc::NETLINK_ROUTE)
    }

    /// RDMA netlink: devices.
    pub fn rdma() -> io::Result<Netlink> {
        Netlink::open(NETLINK_RDMA)
    }

    /// sock_diag: the sockets that exist.
    pub fn sock_diag() -> io::Result<Netlink> {
        Netlink::open(NETLINK_SOCK_DIAG)
    }

    fn open(family: i32) -> io::Result<Netlink> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                family,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: ANSWER_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        // SAFETY: tv outlives the call, and its size is passed.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Netlink { fd, seq: 0 })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `request` (made for `seq`) and reads the answer: `each` sees the messages of a
    /// dump; the request's status (or the dump's end) ends it.
    fn exchange(
        &mut self,
        seq: u32,
        request: &[u8],
        mut each: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        // SAFETY: request is valid for its length; the kernel is the default destination.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: buf is writable for its length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
                }
                return Err(e);
            }
            for a in answers(&buf[..n as usize], seq)? {
                match a {
                    Answer::Status(0) | Answer::Done => return Ok(()),
                    Answer::Status(e) => return Err(io::Error::from_raw_os_error(-e)),
                    Answer::Part(kind, body) => each(kind, body),
                }
            }
        }
    }

    /// Puts `p` on the interface (kept if it is there already).
    pub fn add_address(&mut self, ifindex: u32, p: &Prefix) -> io::Result<()> {
        let seq = self.next_seq();
        self.exchange(seq, &address_request(seq, ifindex, p), |_, _| {})
    }

    /// Brings the interface up.
    pub fn set_up(&mut self, ifindex: u32) -> io::Result<()> {
        let seq = self.next_seq();
        self.exchange(seq, &up_request(seq, ifindex), |_, _| {})
    }

    /// Creates RDMA device `name` of `link_type` on interface `netdev` (of this socket's
    /// network namespace). The kernel loads the type's module when it can.
    pub fn rdma_add(&mut self, name: &str, link_type: &str, netdev: &str) -> io::Result<()> {
        let seq = self.next_seq();
        self.exchange(
            seq,
            &rdma_add_request(seq, name, link_type, netdev),
            |_, _| {},
        )
    }

    /// The index of RDMA device `name`, if it exists.
    pub fn rdma_find(&mut self, name: &str) -> io::Result<Option<u32>> {
        let seq = self.next_seq();
        let mut found = None;
        self.exchange(seq, &rdma_list_request(seq), |kind, body| {
            if kind == NLDEV_GET {
                if let Some((index, n)) = rdma_device(body) {
                    if n == name {
                        found = Some(index);
                    }
                }
            }
        })?;
        Ok(found)
    }

    /// The cookies ([`crate::direct::socket_cookie`]) of the packet sockets of this network namespace: a
    /// socket is listed until its last descriptor is closed.
    pub fn packet_cookies(&mut self) -> io::Result<std::collections::HashSet<u64>> {
        let seq = self.next_seq();
        let mut out = std::collections::HashSet::new();
        self.exchange(seq, &packet_list_request(seq), |kind, body| {
            if kind == SOCK_DIAG_BY_FAMILY {
                out.extend(packet_cookie(body));
            }
        })?;
        Ok(out)
    }

    /// Deletes the RDMA device with this index.
    pub fn rdma_delete(&mut self, index: u32) -> io::Result<()> {
        let seq = self.next_seq();
        self.exchange(seq, &rdma_delete_request(seq, index), |_, _| {})
    }
}

/// The index of interface `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a valid C string.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16s(v: u16) -> [u8; 2] {
        v.to_ne_bytes()
    }

    fn u32s(v: u32) -> [u8; 4] {
        v.to_ne_bytes()
    }

    /// A header as the kernel writes it.
    fn header(len: u32, kind: u16, flags: u16, seq: u32) -> Vec<u8> {
        [
            &u32s(len)[..],
            &u16s(kind),
            &u16s(flags),
            &u32s(seq),
            &u32s(0),
        ]
        .concat()
    }

    #[test]
    fn prefixes_parse_and_print_as_written() {
        let p: Prefix = "10.77.0.1/24".parse().unwrap();
        assert_eq!(p.len, 24);
        assert_eq!(p.to_string(), "10.77.0.1/24");
        assert_eq!(
            "fd00::1/64".parse::<Prefix>().unwrap().to_string(),
            "fd00::1/64"
        );
        for bad in [
            "10.77.0.1",
            "10.77.0.1/",
            "10.77.0/24",
            "x/8",
            "10.0.0.1/-1",
        ] {
            assert!(
                bad.parse::<Prefix>()
                    .unwrap_err()
                    .contains("like 10.0.0.1/24"),
                "{bad}"
            );
        }
        assert_eq!(
            "10.0.0.1/33".parse::<Prefix>().unwrap_err(),
            "\"10.0.0.1/33\": prefix length 33 is above 32"
        );
        assert!("fd00::1/129".parse::<Prefix>().is_err());
    }

    #[test]
    fn an_address_request_is_what_ip_addr_replace_sends() {
        let p: Prefix = "10.77.0.1/24".parse().unwrap();
        let got = address_request(7, 3, &p);
        let want = [
            header(40, RTM_NEWADDR, 0x1 | 0x4 | 0x400 | 0x100, 7),
            vec![libc::AF_INET as u8, 24, 0, 0],
            u32s(3).to_vec(),
            [&u16s(8)[..], &u16s(IFA_LOCAL), &[10, 77, 0, 1]].concat(),
            [&u16s(8)[..], &u16s(IFA_ADDRESS), &[10, 77, 0, 1]].concat(),
        ]
        .concat();
        assert_eq!(got, want);
        let v6 = address_request(1, 3, &"fd00::1/64".parse().unwrap());
        assert_eq!(v6.len(), 16 + 8 + 2 * 20);
        assert_eq!(v6[16], libc::AF_INET6 as u8);
    }

    #[test]
    fn an_up_request_changes_only_the_up_flag() {
        let got = up_request(2, 9);
        let want = [
            header(32, RTM_NEWLINK, 0x5, 2),
            vec![0, 0, 0, 0],
            u32s(9).to_vec(),
            u32s(1).to_vec(),
            u32s(1).to_vec(),
        ]
        .concat();
        assert_eq!(got, want);
    }

    #[test]
    fn rdma_requests_are_what_the_rdma_tool_sends() {
        let got = rdma_add_request(4, "urdma0", "urdma", "tap0");
        let want = [
            header(16 + 12 + 12 + 12, (5 << 10) + 3, 0x5, 4),
            [&u16s(11)[..], &u16s(2), b"urdma0\0", &[0]].concat(),
            [&u16s(10)[..], &u16s(65), b"urdma\0", &[0, 0]].concat(),
            [&u16s(9)[..], &u16s(51), b"tap0\0", &[0, 0, 0]].concat(),
        ]
        .concat();
        assert_eq!(got, want);
        let got = rdma_delete_request(5, 12);
        let want = [
            header(24, (5 << 10) + 4, 0x5, 5),
            [&u16s(8)[..], &u16s(1), &u32s(12)].concat(),
        ]
        .concat();
        assert_eq!(got, want);
        assert_eq!(rdma_list_request(6), header(16, (5 << 10) + 1, 0x301, 6));
    }

    #[test]
    fn answers_are_read_for_their_request_only() {
        let ack = |seq, e: i32| {
            [
                header(36, NLMSG_ERROR, 0, seq),
                i32::to_ne_bytes(e).to_vec(),
                header(16, 0, 0, seq),
            ]
            .concat()
        };
        let mut dgram = ack(3, 0);
        dgram.extend(ack(4, -libc::EEXIST));
        assert_eq!(answers(&dgram, 3).unwrap(), [Answer::Status(0)]);
        assert_eq!(answers(&dgram, 4).unwrap(), [Answer::Status(-libc::EEXIST)]);
        let part = [
            header(24, NLDEV_GET, 2, 9),
            [&u16s(8)[..], &u16s(1), &u32s(2)].concat(),
        ]
        .concat();
        let done = [header(20, NLMSG_DONE, 2, 9), vec![0; 4]].concat();
        let both = [part.clone(), done].concat();
        assert_eq!(
            answers(&both, 9).unwrap(),
            [Answer::Part(NLDEV_GET, &part[16..]), Answer::Done]
        );
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        let cases: Vec<Vec<u8>> = vec![
            vec![1, 2, 3],
            header(8, NLMSG_ERROR, 0, 1),
            header(100, NLMSG_ERROR, 0, 1),
            header(16, NLMSG_ERROR, 0, 1),
            header(0, NLMSG_DONE, 0, 1),
        ];
        for c in cases {
            assert!(answers(&c, 1).is_err(), "{c:?}");
        }
    }

    #[test]
    fn a_device_of_a_dump_is_its_index_and_name() {
        let body = [
            [&u16s(8)[..], &u16s(ATTR_DEV_INDEX), &u32s(4)].concat(),
            [&u16s(11)[..], &u16s(ATTR_DEV_NAME), b"urdmaB\0", &[0]].concat(),
        ]
        .concat();
        assert_eq!(rdma_device(&body), Some((4, "urdmaB".to_string())));
        assert_eq!(rdma_device(&body[..8]), None);
        assert_eq!(rdma_device(&body[..13]), None);
        assert_eq!(attributes(&[0, 0, 1, 0, 9]), [(1, &[][..])]);
        assert!(attributes(&[200, 0, 1, 0]).is_empty());
    }

    #[test]
    fn an_address_put_on_an_interface_is_what_ip_shows() {
        // A network namespace of the test's own thread: lo there is down and bare.
        std::thread::spawn(|| {
            // SAFETY: changes only this thread's network namespace.
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "unshare: {}",
                io::Error::last_os_error()
            );
            // What iproute2 (a child of this thread, so in its namespace) sees.
            let ip = |args: &[&str]| {
                let out = std::process::Command::new("ip")
                    .args(args)
                    .output()
                    .unwrap();
                String::from_utf8(out.stdout).unwrap()
            };
            let p: Prefix = "10.213.0.1/24".parse().unwrap();
            assert!(!ip(&["-o", "addr", "show", "dev", "lo"]).contains("10.213.0.1/24"));
            let lo = ifindex("lo").unwrap();
            let mut nl = Netlink::route().unwrap();
            nl.add_address(lo, &p).unwrap();
            nl.add_address(lo, &p).unwrap(); // a second time: kept, no error
            nl.set_up(lo).unwrap();
            let addrs = ip(&["-o", "addr", "show", "dev", "lo"]);
            assert_eq!(addrs.matches("inet 10.213.0.1/24").count(), 1, "{addrs}");
            let link = ip(&["-o", "link", "show", "dev", "lo"]);
            assert!(link.contains("<LOOPBACK,UP,LOWER_UP>"), "{link}");
            let e = nl.add_address(999, &p).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
            assert_eq!(
                ifindex("no-such-if").unwrap_err().raw_os_error(),
                Some(libc::ENODEV)
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_packet_socket_is_listed_until_its_last_descriptor_is_closed() {
        // The request as `ss -0` sends it, and a dump's message read.
        let req = packet_list_request(7);
        assert_eq!(req.len(), HEADER + 20);
        assert_eq!(&req[4..6], &u16s(SOCK_DIAG_BY_FAMILY));
        assert_eq!(req[HEADER], libc::AF_PACKET as u8);
        let msg = [
            [17u8, 3, 0, 3],
            u32s(99),
            u32s(0x89ab_cdef),
            u32s(0x0123_4567),
        ]
        .concat();
        assert_eq!(packet_cookie(&msg), Some(0x0123_4567_89ab_cdef));
        assert_eq!(packet_cookie(&msg[..15]), None);
        // The kernel's (needs CAP_NET_RAW, as urdmad has, for the socket).
        // SAFETY: plain system call; owned from here on.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: just made, ours alone.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let cookie = crate::direct::socket_cookie(sock.as_raw_fd()).unwrap();
        // SAFETY: a plain dup; the copy is owned.
        let copy = unsafe { OwnedFd::from_raw_fd(libc::dup(sock.as_raw_fd())) };
        let mut nl = Netlink::sock_diag().unwrap();
        assert!(nl.packet_cookies().unwrap().contains(&cookie));
        drop(sock);
        assert!(
            nl.packet_cookies().unwrap().contains(&cookie),
            "a copy is open"
        );
        drop(copy);
        assert!(!nl.packet_cookies().unwrap().contains(&cookie));
    }
}
