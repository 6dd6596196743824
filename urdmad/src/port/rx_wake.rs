//! How a port tells an idle urdmad that frames came: its sockets, its RX interrupts, or
//! nothing (a timer).

use dpdk_sys as sys;
use std::os::fd::RawFd;

/// What tells an idle urdmad that a port received frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RxWake {
    /// The af_packet PMD's kernel sockets, which poll() reports readable.
    Socket,
    /// Each RX queue's interrupt (an eventfd per queue, index = queue), armed only around a
    /// sleep ([`arm`]): a PCI device bound to vfio-pci with an IOMMU.
    Interrupt(Vec<RawFd>),
    /// Nothing: urdmad looks again when its sleep times out. Why.
    Timer(String),
}

impl RxWake {
    pub fn as_str(&self) -> &'static str {
        match self {
            RxWake::Socket => "socket",
            RxWake::Interrupt(_) => "interrupt",
            RxWake::Timer(_) => "timer",
        }
    }

    /// Why the port has no interrupt, for status.
    pub fn reason(&self) -> Option<&str> {
        match self {
            RxWake::Timer(why) => Some(why),
            _ => None,
        }
    }
}

/// The interrupts of the started port's RX queues 0..=`flow_queues`, left disarmed.
pub(super) fn interrupts(port: u16, flow_queues: u16) -> RxWake {
    // Left armed, an interrupt nobody reads would still be raised for every frame.
    disarm(port, 1 + flow_queues);
    if flow_queues > 0 {
        // Each flow queue would need the look after arming that queue 0 gets (forward.rs).
        return RxWake::Timer("hardware steering's flow queues have no interrupt mode".into());
    }
    let mut fds = Vec::new();
    for q in 0..=flow_queues {
        // SAFETY: the port is started with intr_conf.rxq.
        let fd = unsafe { sys::rte_eth_dev_rx_intr_ctl_q_get_fd(port, q) };
        if fd < 0 {
            return RxWake::Timer(format!("RX queue {q} has no interrupt descriptor"));
        }
        fds.push(fd);
    }
    RxWake::Interrupt(fds)
}

/// Arms the interrupts of RX queues `0..queues`: the next frame raises one.
pub fn arm(port: u16, queues: u16) {
    for q in 0..queues {
        // SAFETY: a started port in interrupt mode.
        unsafe { sys::rte_eth_dev_rx_intr_enable(port, q) };
    }
}

/// Disarms them: frames are polled for while urdmad is awake.
pub fn disarm(port: u16, queues: u16) {
    for q in 0..queues {
        // SAFETY: a started port in interrupt mode.
        unsafe { sys::rte_eth_dev_rx_intr_disable(port, q) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_mode_is_named_and_a_timer_says_why() {
        assert_eq!(RxWake::Socket.as_str(), "socket");
        assert_eq!(RxWake::Interrupt(vec![7]).as_str(), "interrupt");
        assert_eq!(RxWake::Interrupt(vec![7]).reason(), None);
        let t = RxWake::Timer("the PMD has no RX interrupts".into());
        assert_eq!(
            (t.as_str(), t.reason()),
            ("timer", Some("the PMD has no RX interrupts"))
        );
    }
}
