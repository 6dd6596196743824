//! A DPDK port urdmad owns, and its exception path: a TAP interface carrying the port's MAC
//! through which the kernel handles everything that is not a QP's data.

use crate::config;
use crate::proto::{Mac, Steering};
use dpdk_sys as sys;
use std::ffi::CString;
use std::ptr;

/// `0000:03:00.0` or `03:00.0`: a PCI address rather than a vdev.
pub fn is_pci(device: &str) -> bool {
    let parts: Vec<&str> = device.split([':', '.']).collect();
    (parts.len() == 3 || parts.len() == 4)
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
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

/// Hot-plugs a vdev (PCI devices were probed by EAL from `--allow`) and returns its port.
fn probe(devargs: &str) -> Result<u16, String> {
    if is_pci(devargs) {
        return port_id_by_name(devargs).ok_or_else(|| {
            format!("PCI device {devargs} has no DPDK port (is it bound to vfio-pci or uio?)")
        });
    }
    let c = CString::new(devargs).map_err(|_| "device contains NUL".to_string())?;
    // SAFETY: valid C string.
    let rc = unsafe { sys::rte_dev_probe(c.as_ptr()) };
    if rc < 0 {
        return Err(format!("cannot probe device {devargs:?}: {}", err(rc)));
    }
    port_id_by_name(dev_name(devargs))
        .ok_or_else(|| format!("device {devargs:?} was probed but is not an Ethernet port"))
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

/// Configures one RX and one TX queue and starts the port.
fn start(port: u16, rx_desc: u16, tx_desc: u16, pool: *mut sys::rte_mempool) -> Result<(), String> {
    // SAFETY: the port exists and is stopped; pool is a valid mempool.
    unsafe {
        let conf: sys::rte_eth_conf = Default::default();
        let rc = sys::rte_eth_dev_configure(port, 1, 1, &conf);
        if rc < 0 {
            return Err(format!("configure: {}", err(rc)));
        }
        let mut rxd = rx_desc;
        let mut txd = tx_desc;
        sys::rte_eth_dev_adjust_nb_rx_tx_desc(port, &mut rxd, &mut txd);
        let socket = sys::rte_eth_dev_socket_id(port);
        let socket = if socket < 0 {
            sys::SOCKET_ID_ANY
        } else {
            socket
        } as u32;
        let rc = sys::rte_eth_rx_queue_setup(port, 0, rxd, socket, ptr::null(), pool);
        if rc < 0 {
            return Err(format!("RX queue setup: {}", err(rc)));
        }
        let rc = sys::rte_eth_tx_queue_setup(port, 0, txd, socket, ptr::null());
        if rc < 0 {
            return Err(format!("TX queue setup: {}", err(rc)));
        }
        let rc = sys::rte_eth_dev_start(port);
        if rc < 0 {
            return Err(format!("start: {}", err(rc)));
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

/// Whether the PMD would accept a rule steering one UDP port to a queue. Asked before the
/// port is started, on the configured port. Returns the reason when it would not.
fn probe_rte_flow(port: u16) -> Result<(), String> {
    // SAFETY: all structures live on this stack frame for the duration of the call.
    unsafe {
        let mut udp_spec: sys::rte_flow_item_udp = Default::default();
        let mut udp_mask: sys::rte_flow_item_udp = Default::default();
        udp_spec.hdr.dst_port = 4791u16.to_be();
        udp_mask.hdr.dst_port = 0xffff;
        let items = [
            sys::rte_flow_item {
                type_: sys::RTE_FLOW_ITEM_TYPE_ETH,
                ..Default::default()
            },
            sys::rte_flow_item {
                type_: sys::RTE_FLOW_ITEM_TYPE_IPV4,
                ..Default::default()
            },
            sys::rte_flow_item {
                type_: sys::RTE_FLOW_ITEM_TYPE_UDP,
                spec: &udp_spec as *const _ as *const _,
                mask: &udp_mask as *const _ as *const _,
                ..Default::default()
            },
            sys::rte_flow_item {
                type_: sys::RTE_FLOW_ITEM_TYPE_END,
                ..Default::default()
            },
        ];
        let queue = sys::rte_flow_action_queue { index: 0 };
        let actions = [
            sys::rte_flow_action {
                type_: sys::RTE_FLOW_ACTION_TYPE_QUEUE,
                conf: &queue as *const _ as *const _,
            },
            sys::rte_flow_action {
                type_: sys::RTE_FLOW_ACTION_TYPE_END,
                conf: ptr::null(),
            },
        ];
        let mut attr: sys::rte_flow_attr = Default::default();
        attr.set_ingress(1);
        let mut error: sys::rte_flow_error = Default::default();
        let rc = sys::rte_flow_validate(port, &attr, items.as_ptr(), actions.as_ptr(), &mut error);
        if rc == 0 {
            Ok(())
        } else {
            let msg = if error.message.is_null() {
                err(rc)
            } else {
                std::ffi::CStr::from_ptr(error.message)
                    .to_string_lossy()
                    .into_owned()
            };
            Err(msg)
        }
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
    /// Sysctl values to put back on close.
    saved_sysctls: Vec<(String, String)>,
}

impl Port {
    /// Probes and starts the port, then creates and starts its TAP with the same MAC.
    /// On failure everything this call created is removed again.
    pub fn open(
        index: u16,
        cfg: &config::Port,
        pool: *mut sys::rte_mempool,
    ) -> Result<Port, String> {
        let id = probe(&cfg.device).map_err(|e| format!("port {}: {e}", cfg.name))?;
        let mac = mac_of(id);
        if let Err(e) = start(id, cfg.rx_descriptors, cfg.tx_descriptors, pool) {
            remove(id);
            return Err(format!("port {} ({}): {e}", cfg.name, cfg.device));
        }
        // Hardware steering needs a receive queue per flow handed to the owning process;
        // until that exists every port demultiplexes in software, and the probe only
        // records what the PMD would offer.
        let (steering, steering_reason) = match cfg.steering {
            config::SteeringChoice::Software => (Steering::Software, "configured".to_string()),
            config::SteeringChoice::Auto => match probe_rte_flow(id) {
                Ok(()) => (
                    Steering::Software,
                    "rte_flow accepted, per-flow hardware queues not implemented".to_string(),
                ),
                Err(why) => (Steering::Software, format!("rte_flow unsupported: {why}")),
            },
        };
        let tap = format!("net_tap_urdma{index},iface={},mac={mac}", cfg.exception);
        let exception_id = match probe(&tap) {
            Ok(t) => t,
            Err(e) => {
                remove(id);
                return Err(format!(
                    "port {}: exception interface {}: {e}",
                    cfg.name, cfg.exception
                ));
            }
        };
        if let Err(e) = start(exception_id, 512, 512, pool) {
            remove(exception_id);
            remove(id);
            return Err(format!(
                "port {}: exception interface {}: {e}",
                cfg.name, cfg.exception
            ));
        }
        let saved_sysctls = kernel_iface(&cfg.device).map(take_over).unwrap_or_default();
        tracing::info!(
            port = %cfg.name, device = %cfg.device, %mac, exception = %cfg.exception,
            steering = steering.as_str(), reason = %steering_reason, "port up"
        );
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
            saved_sysctls,
        })
    }

    /// Stops the port and removes its TAP.
    pub fn close(&self) {
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
}
