//! A port's exception interface made usable as the configuration says: its addresses and
//! state as soon as urdmad has created it, and the urdma device on it, created once the
//! kernel allows and deleted when urdmad stops (docs/urdmad.md, "The host's side of a port").

use super::{Daemon, PortState};
use crate::config;
use crate::netlink::{self, Netlink};
use crate::service::StartupError;
use std::io;
use std::time::{Duration, Instant};

/// How often urdmad tries again to create a device the kernel refused: urdma.ko not loaded
/// yet, or the name still held by the device of an urdmad that died, which the kernel
/// removes once the processes that used it have let go.
pub(super) const DEVICE_RETRY: Duration = Duration::from_secs(1);

/// The urdma device a port is to have.
pub(super) struct RdmaDevice {
    pub name: String,
    pub state: DeviceState,
}

pub(super) enum DeviceState {
    /// Not created (yet): why, and when to try again.
    Waiting { why: String, next: Instant },
    /// Created, with the kernel's index for it.
    Created { index: u32 },
}

impl RdmaDevice {
    pub fn new(name: &str) -> RdmaDevice {
        RdmaDevice {
            name: name.to_string(),
            state: DeviceState::Waiting {
                why: String::new(),
                next: Instant::now(),
            },
        }
    }

    /// What status shows: `created`, or `waiting: WHY`.
    pub fn state_text(&self) -> String {
        match &self.state {
            DeviceState::Created { .. } => "created".to_string(),
            DeviceState::Waiting { why, .. } => format!("waiting: {why}"),
        }
    }
}

/// Puts the port's addresses on its exception interface and brings it up; nothing to do for
/// a port without addresses.
pub(super) fn configure_interface(pc: &config::Port) -> Result<(), StartupError> {
    if pc.addresses.is_empty() {
        return Ok(());
    }
    let fail = |what: String, error: io::Error| StartupError::Interface {
        port: pc.name.clone(),
        interface: pc.exception.clone(),
        what,
        error,
    };
    let index = netlink::ifindex(&pc.exception).map_err(|e| fail("not found".into(), e))?;
    let mut nl = Netlink::route().map_err(|e| fail("no rtnetlink".into(), e))?;
    for a in &pc.addresses {
        nl.add_address(index, a)
            .map_err(|e| fail(format!("cannot add {a}"), e))?;
    }
    nl.set_up(index)
        .map_err(|e| fail("cannot bring it up".into(), e))?;
    let shown: Vec<String> = pc.addresses.iter().map(ToString::to_string).collect();
    tracing::info!(port = %pc.name, iface = %pc.exception, addresses = %shown.join(","), "exception interface up");
    Ok(())
}

/// Creates device `name` on `netdev`; `Err` says why not, in words for the log and status.
fn create(name: &str, netdev: &str) -> Result<u32, String> {
    let mut nl = Netlink::rdma().map_err(|e| format!("no RDMA netlink ({e})"))?;
    match nl.rdma_add(name, "urdma", netdev) {
        Ok(()) => {}
        // The kernel's answer when it has no link type "urdma" after trying to load it.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            return Err("urdma.ko is not loaded (rdma link add: Invalid argument)".into())
        }
        Err(e) if e.raw_os_error() == Some(libc::ENFILE) => {
            return Err(format!(
            "an RDMA device named {name} exists (an earlier urdmad's, until its processes let go?)"
        ))
        }
        Err(e) => return Err(format!("rdma link add: {e}")),
    }
    match nl.rdma_find(name) {
        Ok(Some(index)) => Ok(index),
        Ok(None) => Err("created, then gone at once".into()),
        Err(e) => Err(format!("created, then not listed: {e}")),
    }
}

impl Daemon {
    /// Creates each port's device that is due: at start, then every [`DEVICE_RETRY`] while
    /// the kernel refuses. The first refusal, and each new reason, is logged.
    pub(super) fn devices_create(&mut self) {
        let now = Instant::now();
        for p in &mut self.ports {
            let netdev = p.port.exception_name.clone();
            let Some(d) = &mut p.rdma else { continue };
            let DeviceState::Waiting { why, next } = &d.state else {
                continue;
            };
            if *next > now {
                continue;
            }
            d.state = match create(&d.name, &netdev) {
                Ok(index) => {
                    tracing::info!(port = %p.port.name, device = %d.name, index, iface = %netdev, "urdma device created");
                    DeviceState::Created { index }
                }
                Err(e) => {
                    if *why != e {
                        tracing::warn!(port = %p.port.name, device = %d.name,
                            "urdma device not created: {e}; trying again every {DEVICE_RETRY:?}");
                    }
                    DeviceState::Waiting {
                        why: e,
                        next: now + DEVICE_RETRY,
                    }
                }
            };
        }
    }
}

/// Deletes the port's device, if urdmad created it and it is still the one of that name.
/// Processes still using it lose it as when the interface goes (their contexts are cut off
/// by the kernel), so this does not wait for them.
pub(super) fn delete(p: &mut PortState) {
    let Some(d) = p.rdma.take() else { return };
    let DeviceState::Created { index } = d.state else {
        return;
    };
    let done = Netlink::rdma().and_then(|mut nl| match nl.rdma_find(&d.name)? {
        Some(i) if i == index => nl.rdma_delete(index).map(|()| true),
        _ => Ok(false),
    });
    match done {
        Ok(true) => tracing::info!(port = %p.port.name, device = %d.name, "urdma device deleted"),
        Ok(false) => {
            tracing::info!(port = %p.port.name, device = %d.name, "urdma device already gone")
        }
        Err(e) => tracing::warn!(port = %p.port.name, device = %d.name,
            "cannot delete the urdma device ({e}); it goes with the exception interface"),
    }
}
