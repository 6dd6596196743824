//! A DPDK port urdmad owns, and its exception path: a TAP interface carrying the port's MAC
//! through which the kernel handles everything that is not a QP's data.

use crate::config;
use crate::hwflow::{self, Match, Rule, RuleError};
use crate::proto::{Mac, Steering};
use dpdk_sys as sys;
use std::ffi::CString;
use std::net::SocketAddrV4;
use std::path::Path;
use std::ptr;

mod pci;
mod rx_wake;

pub use pci::is_pci;
use pci::pci_why;
use rx_wake::interrupts;
pub use rx_wake::{arm, disarm, RxWake};

/// Whether the port can hand us back our own transmissions: an af_packet port whose sends go
/// through the kernel's queueing (`tc netem` on the link releases frames from their socket,
/// and af_packet then delivers the sender a copy). Other ports can legitimately receive
/// frames with the port's own source address (a TAP port is the kernel interface with the
/// same MAC), so only af_packet ports drop them.
pub fn may_echo(device: &str) -> bool {
    device.starts_with("net_af_packet") || device.starts_with("eth_af_packet")
}

/// The device name of a devargs string (the part before the first comma).
fn dev_name(devargs: &str) -> &str {
    devargs.split(',').next().unwrap_or(devargs)
}

fn port_id_by_name(name: &str) -> Option<u16> {
    let c = CString::new(name).ok()?;
    let mut id = 0u16;
    // SAFETY: valid C string and out-pointer.
    (unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) } == 0).then_some(id)
}

fn err(rc: i32) -> String {
    sys::rte_strerror_string(rc)
}

/// A step of bringing one DPDK device up that failed. `reason` is `rte_strerror` of the
/// error code DPDK returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("PCI device {device} has no DPDK port: {why}")]
    PciNotBound { device: String, why: String },
    #[error("device contains NUL")]
    Nul,
    #[error("cannot probe device {device:?}: {reason}")]
    Probe { device: String, reason: String },
    #[error("device {device:?} was probed but is not an Ethernet port")]
    NotEthernet { device: String },
    #[error("configure: {reason}")]
    Configure { reason: String },
    #[error("RX queue {queue} setup: {reason}")]
    RxQueue { queue: u16, reason: String },
    #[error("TX queue {queue} setup: {reason}")]
    TxQueue { queue: u16, reason: String },
    #[error("start: {reason}")]
    Start { reason: String },
}

/// Why a configured port could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The device was not found or not probed.
    #[error("port {port}: {error}")]
    Probe { port: String, error: DeviceError },
    /// The device was probed but could not be configured or started.
    #[error("port {port} ({device}): {error}")]
    Start {
        port: String,
        device: String,
        error: DeviceError,
    },
    /// The TAP of the exception path could not be created or started.
    #[error("port {port}: exception interface {exception}: {error}")]
    Exception {
        port: String,
        exception: String,
        error: DeviceError,
    },
}

/// Why hardware steering is not used on a port, or for one flow (which then stays with
/// software steering).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SteeringError {
    /// The port could not be configured with its flow queues.
    #[error("{error}")]
    Configure { error: DeviceError },
    #[error("per-flow rule refused: {error}")]
    FlowRuleRefused { error: RuleError },
    #[error("catch-all rule refused: {error}")]
    CatchAllRuleRefused { error: RuleError },
    #[error("catch-all rule not created: {error}")]
    CatchAllRuleNotCreated { error: RuleError },
    #[error("flow rule not created: {error}")]
    FlowRuleNotCreated { error: RuleError },
    #[error("flow rule not destroyed: {error}")]
    FlowRuleNotDestroyed { error: RuleError },
    /// A flow found every flow queue of its port taken.
    #[error("all {queues} flow queues are in use")]
    QueuesInUse { queues: u16 },
    /// A flow's rule could not be created.
    #[error("rule not created: {error}")]
    RuleNotCreated { error: RuleError },
}

/// Hot-plugs a vdev (PCI devices were probed by EAL from `--allow`) and returns its port.
fn probe(devargs: &str) -> Result<u16, DeviceError> {
    if is_pci(devargs) {
        return port_id_by_name(devargs).ok_or_else(|| DeviceError::PciNotBound {
            device: devargs.to_string(),
            why: pci_why(devargs, Path::new("/sys/bus/pci/devices")),
        });
    }
    let c = CString::new(devargs).map_err(|_| DeviceError::Nul)?;
    // SAFETY: valid C string.
    let rc = unsafe { sys::rte_dev_probe(c.as_ptr()) };
    if rc < 0 {
        return Err(DeviceError::Probe {
            device: devargs.to_string(),
            reason: err(rc),
        });
    }
    port_id_by_name(dev_name(devargs)).ok_or_else(|| DeviceError::NotEthernet {
        device: devargs.to_string(),
    })
}

/// Stops, closes and unplugs a port. Closing a TAP removes its kernel interface.
fn remove(port: u16) {
    // SAFETY: port ids come from a successful probe.
    unsafe {
        sys::rte_eth_dev_stop(port);
        let mut info: sys::rte_eth_dev_info = Default::default();
        let dev = if sys::rte_eth_dev_info_get(port, &mut info) == 0 {
            info.device
        } else {
            ptr::null_mut()
        };
        sys::rte_eth_dev_close(port);
        if !dev.is_null() {
            sys::rte_dev_remove(dev);
        }
    }
}

/// Configures `queues` RX and as many TX queues: some PMDs (TAP) insist on equal numbers;
/// urdmad transmits on TX queue 0 only. `rx_interrupts`: each RX queue gets an interrupt of
/// its own ([`RxWake`]).
fn configure(port: u16, queues: u16, rx_interrupts: bool) -> Result<(), DeviceError> {
    let mut conf: sys::rte_eth_conf = Default::default();
    conf.intr_conf.set_rxq(u32::from(rx_interrupts));
    // SAFETY: the port exists and is stopped.
    let rc = unsafe { sys::rte_eth_dev_configure(port, queues, queues, &conf) };
    if rc < 0 {
        return Err(DeviceError::Configure { reason: err(rc) });
    }
    Ok(())
}

/// Configures RX queue 0, `flow_queues` more RX queues (and TX queues to match), and starts
/// the port.
fn start(
    port: u16,
    rx_desc: u16,
    tx_desc: u16,
    flow_queues: u16,
    flow_desc: u16,
    pool: *mut sys::rte_mempool,
    rx_interrupts: bool,
) -> Result<(), DeviceError> {
    configure(port, 1 + flow_queues, rx_interrupts)?;
    // SAFETY: the port exists, is configured and stopped; pool is a valid mempool.
    unsafe {
        let mut rxd = rx_desc;
        let mut txd = tx_desc;
        sys::rte_eth_dev_adjust_nb_rx_tx_desc(port, &mut rxd, &mut txd);
        let mut fd = flow_desc;
        let mut unused = tx_desc;
        sys::rte_eth_dev_adjust_nb_rx_tx_desc(port, &mut fd, &mut unused);
        let socket = sys::rte_eth_dev_socket_id(port);
        let socket = if socket < 0 {
            sys::SOCKET_ID_ANY
        } else {
            socket
        } as u32;
        for q in 0..=flow_queues {
            let n = if q == 0 { rxd } else { fd };
            let rc = sys::rte_eth_rx_queue_setup(port, q, n, socket, ptr::null(), pool);
            if rc < 0 {
                return Err(DeviceError::RxQueue {
                    queue: q,
                    reason: err(rc),
                });
            }
        }
        for q in 0..=flow_queues {
            let n = if q == 0 { txd } else { unused };
            let rc = sys::rte_eth_tx_queue_setup(port, q, n, socket, ptr::null());
            if rc < 0 {
                return Err(DeviceError::TxQueue {
                    queue: q,
                    reason: err(rc),
                });
            }
        }
        let rc = sys::rte_eth_dev_start(port);
        if rc < 0 {
            return Err(DeviceError::Start { reason: err(rc) });
        }
        // Multicast (IPv6 neighbour discovery) must reach the kernel too; not every PMD can.
        let _ = sys::rte_eth_allmulticast_enable(port);
    }
    Ok(())
}

fn mac_of(port: u16) -> Mac {
    let mut a: sys::rte_ether_addr = Default::default();
    // SAFETY: valid port and out-pointer.
    unsafe { sys::rte_eth_macaddr_get(port, &mut a) };
    Mac(a.addr_bytes)
}

/// Whether the PMD accepts what hardware steering needs, asked on the port configured with
/// its flow queues: a rule per flow (Ethernet / IPv4 to an address / UDP to a port → a flow
/// queue) and a catch-all rule keeping everything else on queue 0. The reason when not.
fn probe_rte_flow(port: u16) -> Result<(), SteeringError> {
    hwflow::validate(port, SAMPLE, 1).map_err(|error| SteeringError::FlowRuleRefused { error })?;
    hwflow::validate(port, Match::Everything, 0)
        .map_err(|error| SteeringError::CatchAllRuleRefused { error })
}

/// A flow no real QP uses (TEST-NET-1): the rule created and destroyed at start-up.
const SAMPLE: Match = Match::Flow {
    local: SocketAddrV4::new(std::net::Ipv4Addr::new(192, 0, 2, 1), 4791),
    remote: None,
};

/// Validation is not enough: a PMD may accept a rule it then fails to install (a TAP on a
/// kernel without tc flower does). So the started port gets its catch-all rule, and a
/// sample flow rule is created and destroyed. Returns the catch-all rule; on failure every
/// rule of the port is flushed and the reason returned.
fn install_rte_flow(port: u16) -> Result<Rule, SteeringError> {
    let result = hwflow::create(port, Match::Everything, 0)
        .map_err(|error| SteeringError::CatchAllRuleNotCreated { error })
        .and_then(|all| {
            let sample = hwflow::create(port, SAMPLE, 1)
                .map_err(|error| SteeringError::FlowRuleNotCreated { error })?;
            hwflow::destroy(port, sample)
                .map_err(|(_, error)| SteeringError::FlowRuleNotDestroyed { error })?;
            Ok(all)
        });
    if result.is_err() {
        let mut e: sys::rte_flow_error = Default::default();
        // SAFETY: valid port and out-pointer.
        unsafe { sys::rte_flow_flush(port, &mut e) };
    }
    result
}

/// The PMD's driver name ("net_tap", "net_ixgbe", ...).
fn driver_name(port: u16) -> String {
    let mut info: sys::rte_eth_dev_info = Default::default();
    // SAFETY: valid port and out-pointer; driver_name is a static string of the PMD.
    unsafe {
        if sys::rte_eth_dev_info_get(port, &mut info) != 0 || info.driver_name.is_null() {
            return String::new();
        }
        std::ffi::CStr::from_ptr(info.driver_name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Most flow queues a PMD can take. DPDK 22.11's TAP hands every queue's file descriptor to
/// secondary processes in one message of at most 8 descriptors (RX and TX queues alike) and
/// overruns its stack beyond that, so a TAP gets at most 4 queues of each kind.
fn flow_queue_limit(driver: &str) -> u16 {
    if driver == "net_tap" {
        3
    } else {
        config::MAX_FLOW_QUEUES
    }
}

/// Counters of one DPDK port, from `rte_eth_stats_get`.
#[derive(Default, Clone, Copy)]
pub struct EthCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

pub fn counters(port: u16) -> EthCounters {
    let mut s: sys::rte_eth_stats = Default::default();
    // SAFETY: valid port and out-pointer.
    unsafe { sys::rte_eth_stats_get(port, &mut s) };
    EthCounters {
        rx_packets: s.ipackets,
        rx_bytes: s.ibytes,
        rx_missed: s.imissed,
        rx_errors: s.ierrors,
        tx_packets: s.opackets,
        tx_bytes: s.obytes,
        tx_errors: s.oerrors,
    }
}

/// The kernel interface under an af_packet or af_xdp port, if the port is one.
fn kernel_iface(devargs: &str) -> Option<&str> {
    let name = dev_name(devargs);
    if !(name.starts_with("net_af_packet") || name.starts_with("net_af_xdp")) {
        return None;
    }
    devargs.split(',').find_map(|kv| kv.strip_prefix("iface="))
}

/// Sets the interface under an af_packet/af_xdp port up. The PMD's probe needs it running
/// (af_packet's PACKET_FANOUT is refused on a down interface), and on a host nobody else
/// configures it: the kernel must not use it, and its addresses are the TAP's. The PMD takes
/// it down again when the port stops.
fn bring_up(device: &str, iface: &str) -> Result<(), DeviceError> {
    let fail = |e: std::io::Error| DeviceError::Probe {
        device: device.to_owned(),
        reason: format!("cannot bring up interface {iface}: {e}"),
    };
    let index = crate::netlink::ifindex(iface).map_err(fail)?;
    crate::netlink::Netlink::route()
        .and_then(|mut nl| nl.set_up(index))
        .map_err(fail)
}

/// Sysctls that keep the kernel from answering, on the interface under an af_packet/af_xdp
/// port, what the exception interface (same MAC) answers: without them every ARP and ICMP
/// request gets two replies. rp_filter drops IPv4 whose return route is the TAP, arp_ignore
/// answers ARP only for addresses on the interface itself (it has none).
const TAKEOVER: [(&str, &str); 3] = [
    ("ipv4/conf/{}/rp_filter", "1"),
    ("ipv4/conf/{}/arp_ignore", "1"),
    ("ipv6/conf/{}/disable_ipv6", "1"),
];

/// Applies [`TAKEOVER`] and returns what to restore.
fn take_over(iface: &str) -> Vec<(String, String)> {
    let mut saved = Vec::new();
    for (path, value) in TAKEOVER {
        let file = format!("/proc/sys/net/{}", path.replace("{}", iface));
        if let Ok(old) = std::fs::read_to_string(&file) {
            if std::fs::write(&file, value).is_ok() {
                saved.push((file, old.trim().to_string()));
            } else {
                tracing::warn!(%file, "cannot set to {value}");
            }
        }
    }
    saved
}

fn restore(saved: &[(String, String)]) {
    for (file, old) in saved {
        let _ = std::fs::write(file, old);
    }
}

/// The tap PMD's IPC request by which a secondary process asks the primary for duplicates
/// of a TAP's queue descriptors (DPDK 22.11 `TAP_MP_KEY`).
const TAP_MP_KEY: &str = "tap_mp_sync_queues";
/// Its parameter (the PMD's `struct ipc_queues`): the port name, then the RX and TX queue
/// counts, which must add up to the number of descriptors passed.
const TAP_MP_NAME_LEN: usize = sys::RTE_DEV_NAME_MAX_LEN as usize;
const TAP_MP_PARAM_LEN: usize = TAP_MP_NAME_LEN + 8;

/// Makes the tap PMD's queue-sharing request fail, so that no process attached to urdmad
/// holds a descriptor of an exception TAP.
///
/// Every secondary probes the primary's vdevs, and the tap PMD then asks for duplicates of
/// the TAP's queue descriptors, which it keeps until the process exits (closing the port in
/// a secondary does not close them). The applications never use the exception port, and
/// those descriptors do harm: when urdmad dies the TAP survives it, so the urdma device on it
/// stays and a restarted urdmad cannot create its interface; and the application that closes
/// the last of them unregisters the interface from its own exit, which waits for the urdma
/// device to go, which waits for that process to close the device: an exit that never ends.
/// The refusal makes the secondary's probe of the TAP fail (logged by DPDK at error level
/// and ignored by EAL) before it touches the port's shared data.
fn keep_tap_queues_private() {
    let Ok(key) = CString::new(TAP_MP_KEY) else {
        return;
    };
    // SAFETY: a valid C string; the PMD registered its action at its first probe, and the
    // replacement is a plain function.
    let rc = unsafe {
        sys::rte_mp_action_unregister(key.as_ptr());
        sys::rte_mp_action_register(key.as_ptr(), Some(refuse_tap_queues))
    };
    if rc < 0 {
        tracing::warn!(
            "cannot keep the TAP's queues from secondary processes: {}",
            err(sys::rte_errno())
        );
    }
}

/// The reply to [`TAP_MP_KEY`]: one RX queue announced and no descriptor, which the
/// requesting PMD rejects ("Unexpected number of fds received").
fn tap_refusal(request: &sys::rte_mp_msg) -> sys::rte_mp_msg {
    let mut reply = sys::rte_mp_msg {
        name: request.name,
        len_param: TAP_MP_PARAM_LEN as i32,
        num_fds: 0,
        ..Default::default()
    };
    reply.param[..TAP_MP_NAME_LEN].copy_from_slice(&request.param[..TAP_MP_NAME_LEN]);
    reply.param[TAP_MP_NAME_LEN..TAP_MP_NAME_LEN + 4].copy_from_slice(&1i32.to_ne_bytes());
    reply.param[TAP_MP_NAME_LEN + 4..TAP_MP_PARAM_LEN].copy_from_slice(&0i32.to_ne_bytes());
    reply
}

unsafe extern "C" fn refuse_tap_queues(
    msg: *const sys::rte_mp_msg,
    peer: *const std::ffi::c_void,
) -> i32 {
    // SAFETY: EAL passes the request it received and its sender.
    let mut reply = tap_refusal(unsafe { &*msg });
    unsafe { sys::rte_mp_reply(&mut reply, peer.cast()) }
}

/// A started port with its exception interface.
pub struct Port {
    pub index: u16,
    pub name: String,
    pub device: String,
    pub id: u16,
    pub mac: Mac,
    pub exception_name: String,
    pub exception_id: u16,
    pub steering: Steering,
    /// Why hardware steering is not used (empty when it is).
    pub steering_reason: String,
    /// RX queues 1..=flow_queues are flow queues.
    pub flow_queues: u16,
    /// The catch-all rule keeping unsteered traffic on queue 0.
    default_rule: Option<Rule>,
    /// Sysctl values to put back on close.
    saved_sysctls: Vec<(String, String)>,
    /// What tells an idle urdmad that frames came.
    pub rx_wake: RxWake,
}

impl Port {
    /// Probes and starts the port, then creates and starts its TAP with the same MAC.
    /// On failure everything this call created is removed again.
    pub fn open(
        index: u16,
        cfg: &config::Port,
        pool: *mut sys::rte_mempool,
    ) -> Result<Port, PortError> {
        if let Some(iface) = kernel_iface(&cfg.device) {
            bring_up(&cfg.device, iface).map_err(|error| PortError::Probe {
                port: cfg.name.clone(),
                error,
            })?;
        }
        let id = probe(&cfg.device).map_err(|error| PortError::Probe {
            port: cfg.name.clone(),
            error,
        })?;
        let mac = mac_of(id);
        // Hardware steering is chosen once, here, from what the PMD says about the rules on
        // the port configured with its flow queues and then from whether they can really be
        // created and destroyed; a refusal costs a restart of the port, a log line and the
        // reason in status.
        let wanted = cfg.flow_queues.min(flow_queue_limit(&driver_name(id)));
        if wanted < cfg.flow_queues {
            tracing::warn!(port = %cfg.name, configured = cfg.flow_queues, used = wanted,
                "the PMD supports fewer flow queues than configured");
        }
        let (mut steering, mut steering_reason, mut flow_queues) = match cfg.steering {
            config::SteeringChoice::Software => (Steering::Software, "configured".to_string(), 0),
            config::SteeringChoice::Auto if wanted == 0 => {
                (Steering::Software, "flow_queues = 0".to_string(), 0)
            }
            config::SteeringChoice::Auto => {
                match configure(id, 1 + wanted, false)
                    .map_err(|error| SteeringError::Configure { error })
                    .and_then(|()| probe_rte_flow(id))
                {
                    Ok(()) => (Steering::Hardware, String::new(), wanted),
                    Err(why) => (
                        Steering::Software,
                        format!("rte_flow unsupported: {why}"),
                        0,
                    ),
                }
            }
        };
        let started = |queues, rx_interrupts| {
            start(
                id,
                cfg.rx_descriptors,
                cfg.tx_descriptors,
                queues,
                cfg.flow_queue_descriptors,
                pool,
                rx_interrupts,
            )
        };
        let start_error = |error| PortError::Start {
            port: cfg.name.clone(),
            device: cfg.device.clone(),
            error,
        };
        // A PCI device's queues may interrupt; a port that refuses is started without.
        let mut rx_interrupts = is_pci(&cfg.device);
        let mut no_interrupts = String::new();
        if rx_interrupts {
            if let Err(e) = started(flow_queues, true) {
                no_interrupts = format!("the PMD refused RX interrupts: {e}");
                rx_interrupts = false;
            }
        }
        if !rx_interrupts {
            if let Err(e) = started(flow_queues, false) {
                remove(id);
                return Err(start_error(e));
            }
        }
        let mut default_rule = None;
        if steering == Steering::Hardware {
            match install_rte_flow(id) {
                Ok(r) => default_rule = Some(r),
                Err(why) => {
                    steering = Steering::Software;
                    steering_reason = format!("rte_flow unsupported: {why}");
                    flow_queues = 0;
                    // SAFETY: started above.
                    unsafe { sys::rte_eth_dev_stop(id) };
                    if let Err(e) = started(0, rx_interrupts) {
                        remove(id);
                        return Err(start_error(e));
                    }
                }
            }
        }
        let tap = format!("net_tap_urdma{index},iface={},mac={mac}", cfg.exception);
        let exception_error = |error| PortError::Exception {
            port: cfg.name.clone(),
            exception: cfg.exception.clone(),
            error,
        };
        let exception_id = match probe(&tap) {
            Ok(t) => t,
            Err(e) => {
                remove(id);
                return Err(exception_error(e));
            }
        };
        keep_tap_queues_private();
        if let Err(e) = start(exception_id, 512, 512, 0, 0, pool, false) {
            remove(exception_id);
            remove(id);
            return Err(exception_error(e));
        }
        let saved_sysctls = kernel_iface(&cfg.device).map(take_over).unwrap_or_default();
        let rx_wake = if may_echo(&cfg.device) {
            RxWake::Socket
        } else if rx_interrupts {
            interrupts(id, flow_queues)
        } else if no_interrupts.is_empty() {
            RxWake::Timer("the PMD has no RX interrupts".into())
        } else {
            RxWake::Timer(no_interrupts)
        };
        tracing::info!(
            port = %cfg.name, device = %cfg.device, %mac, exception = %cfg.exception,
            steering = steering.as_str(), reason = %steering_reason, flow_queues, "port up"
        );
        match &rx_wake {
            RxWake::Timer(why) => tracing::warn!(port = %cfg.name, device = %cfg.device,
                "no RX interrupts ({why}): urdmad looks for this port's frames on a timer \
                 when idle (idle_sleep_us), or give it a core (idle_sleep_us = 0)"),
            w => tracing::info!(port = %cfg.name, rx_wake = w.as_str(),
                "this port's frames end urdmad's sleeps"),
        }
        Ok(Port {
            index,
            name: cfg.name.clone(),
            device: cfg.device.clone(),
            id,
            mac,
            exception_name: cfg.exception.clone(),
            exception_id,
            steering,
            steering_reason,
            flow_queues,
            default_rule,
            saved_sysctls,
            rx_wake,
        })
    }

    /// Stops the port and removes its TAP.
    /// The PMD's driver name ("net_af_packet", "net_ixgbe", ...).
    pub fn driver(&self) -> String {
        driver_name(self.id)
    }

    pub fn close(&mut self) {
        if let Some(r) = self.default_rule.take() {
            if let Err((_, why)) = hwflow::destroy(self.id, r) {
                tracing::error!(port = %self.name, "catch-all rule not destroyed: {why}");
            }
        }
        remove(self.exception_id);
        remove(self.id);
        restore(&self.saved_sysctls);
        tracing::info!(port = %self.name, exception = %self.exception_name, "port closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_told_from_vdevs() {
        assert!(is_pci("0000:03:00.0"));
        assert!(is_pci("03:00.1"));
        assert!(!is_pci("net_af_packet0,iface=veth0"));
        assert!(!is_pci("net_tap0"));
    }

    #[test]
    fn messages_are_pinned() {
        let probe = DeviceError::Probe {
            device: "net_bogus0".into(),
            reason: "No such device".into(),
        };
        assert_eq!(
            PortError::Probe {
                port: "p0".into(),
                error: probe
            }
            .to_string(),
            r#"port p0: cannot probe device "net_bogus0": No such device"#
        );
        assert_eq!(
            PortError::Probe {
                port: "p0".into(),
                error: DeviceError::PciNotBound {
                    device: "0000:03:00.0".into(),
                    why: "no such PCI device".into()
                }
            }
            .to_string(),
            "port p0: PCI device 0000:03:00.0 has no DPDK port: no such PCI device"
        );
        assert_eq!(
            PortError::Start {
                port: "p0".into(),
                device: "net_null0".into(),
                error: DeviceError::RxQueue {
                    queue: 3,
                    reason: "Invalid argument".into()
                }
            }
            .to_string(),
            "port p0 (net_null0): RX queue 3 setup: Invalid argument"
        );
        assert_eq!(
            PortError::Exception {
                port: "p0".into(),
                exception: "tap0".into(),
                error: DeviceError::Start {
                    reason: "Operation not permitted".into()
                }
            }
            .to_string(),
            "port p0: exception interface tap0: start: Operation not permitted"
        );
        let configure = SteeringError::Configure {
            error: DeviceError::Configure {
                reason: "Invalid argument".into(),
            },
        };
        assert_eq!(configure.to_string(), "configure: Invalid argument");
        assert_eq!(
            SteeringError::FlowRuleNotDestroyed {
                error: RuleError::Injected
            }
            .to_string(),
            "flow rule not destroyed: injected failure (URDMAD_TEST_FAIL_RULE)"
        );
        assert_eq!(
            SteeringError::QueuesInUse { queues: 3 }.to_string(),
            "all 3 flow queues are in use"
        );
    }

    #[test]
    fn only_af_packet_ports_may_echo() {
        assert!(may_echo("net_af_packet0,iface=veth0,qdisc_bypass=0"));
        assert!(may_echo("eth_af_packet1,iface=eth1"));
        assert!(!may_echo("net_tap_data0,iface=tap0"));
        assert!(!may_echo("0000:03:00.0"));
        assert!(!may_echo("net_null0"));
    }

    #[test]
    fn tap_queue_requests_get_a_reply_the_pmd_rejects() {
        let mut req = sys::rte_mp_msg::default();
        for (d, s) in req.name.iter_mut().zip(TAP_MP_KEY.bytes()) {
            *d = s as std::ffi::c_char;
        }
        req.param[..14].copy_from_slice(b"net_tap_urdma0");
        req.len_param = TAP_MP_PARAM_LEN as i32;
        let r = tap_refusal(&req);
        assert_eq!(r.name, req.name);
        assert_eq!(&r.param[..15], b"net_tap_urdma0\0");
        let count = |at: usize| i32::from_ne_bytes(r.param[at..at + 4].try_into().unwrap());
        let (rx, tx) = (count(TAP_MP_NAME_LEN), count(TAP_MP_NAME_LEN + 4));
        // The PMD's own check: the queue counts must match the descriptors passed.
        assert_ne!(rx + tx, r.num_fds);
        assert_eq!(r.num_fds, 0);
        assert!(r.len_param as usize <= sys::RTE_MP_MAX_PARAM_LEN as usize);
    }
}
