//! Hardware steering: `rte_flow` rules that send one flow's datagrams to an RX queue of its
//! own, and the pool of such queues of a port.
//!
//! Every creation and destruction is checked. A rule that cannot be created leaves the flow
//! to software steering; a rule that cannot be destroyed quarantines its queue, which is
//! never handed out again (its packets might still be steered there).

use dpdk_sys as sys;
use std::ffi::CStr;
use std::net::SocketAddrV4;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

/// Test-only fault injection, for the paths a working PMD never takes: the environment
/// variable `URDMAD_TEST_FAIL_RULE="create:K,destroy:K"` makes the K-th per-flow rule
/// creation or destruction after start-up fail (the rule of a failed destruction stays in
/// force, as after a real failure). Read once when the ports are up; unset in production.
pub const FAULT_ENV: &str = "URDMAD_TEST_FAIL_RULE";
static FAIL_CREATE_AT: AtomicU32 = AtomicU32::new(0);
static FAIL_DESTROY_AT: AtomicU32 = AtomicU32::new(0);
static CREATED: AtomicU32 = AtomicU32::new(0);
static DESTROYED: AtomicU32 = AtomicU32::new(0);

/// Arms the faults named in [`FAULT_ENV`], if any; returns what was armed for the log.
pub fn arm_faults_from_env() -> Option<String> {
    let v = std::env::var(FAULT_ENV).ok()?;
    for part in v.split(',') {
        let (what, k) = part.split_once(':')?;
        let k: u32 = k.trim().parse().ok()?;
        match what.trim() {
            "create" => FAIL_CREATE_AT.store(k, Ordering::Relaxed),
            "destroy" => FAIL_DESTROY_AT.store(k, Ordering::Relaxed),
            _ => return None,
        }
    }
    CREATED.store(0, Ordering::Relaxed);
    DESTROYED.store(0, Ordering::Relaxed);
    Some(v)
}

/// Whether this call is the one armed to fail.
fn injected(counter: &AtomicU32, at: &AtomicU32) -> bool {
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    n == at.load(Ordering::Relaxed)
}

/// Priority of per-flow rules; the catch-all rule has a lower one (a larger number).
const FLOW_PRIORITY: u32 = 0;
const DEFAULT_PRIORITY: u32 = 1;

/// What a rule matches.
#[derive(Clone, Copy, Debug)]
pub enum Match {
    /// IPv4/UDP to `local`, and from `remote` when given.
    Flow {
        local: SocketAddrV4,
        remote: Option<SocketAddrV4>,
    },
    /// Every frame: without it a multi-queue port may spread unmatched traffic over the
    /// flow queues (a TAP hashes by flow), where it would reach a process unchecked.
    Everything,
}

/// Why a rule was refused, not created or not destroyed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The PMD's message, or `rte_strerror` of the error code when it gave none.
    #[error("{reason}")]
    Pmd { reason: String },
    /// Armed by [`FAULT_ENV`].
    #[error("injected failure ({FAULT_ENV})")]
    Injected,
}

fn error_text(rc: i32, e: &sys::rte_flow_error) -> RuleError {
    let reason = if e.message.is_null() {
        sys::rte_strerror_string(rc)
    } else {
        // SAFETY: PMDs set a NUL-terminated static or per-port message.
        unsafe { CStr::from_ptr(e.message) }
            .to_string_lossy()
            .into_owned()
    };
    RuleError::Pmd { reason }
}

/// Builds the rule for `m` → `queue` and hands its parts to `f`; the structures live on
/// this stack frame for the duration of `f`.
fn with_rule<T>(
    m: Match,
    queue: u16,
    f: impl FnOnce(&sys::rte_flow_attr, &[sys::rte_flow_item], &[sys::rte_flow_action]) -> T,
) -> T {
    let mut ip_spec: sys::rte_flow_item_ipv4 = Default::default();
    let mut ip_mask: sys::rte_flow_item_ipv4 = Default::default();
    let mut udp_spec: sys::rte_flow_item_udp = Default::default();
    let mut udp_mask: sys::rte_flow_item_udp = Default::default();
    let mut attr: sys::rte_flow_attr = Default::default();
    attr.set_ingress(1);
    let end = sys::rte_flow_item {
        type_: sys::RTE_FLOW_ITEM_TYPE_END,
        ..Default::default()
    };
    let eth = sys::rte_flow_item {
        type_: sys::RTE_FLOW_ITEM_TYPE_ETH,
        ..Default::default()
    };
    let items: Vec<sys::rte_flow_item> = match m {
        Match::Everything => {
            attr.priority = DEFAULT_PRIORITY;
            vec![eth, end]
        }
        Match::Flow { local, remote } => {
            attr.priority = FLOW_PRIORITY;
            ip_spec.hdr.dst_addr = u32::from(*local.ip()).to_be();
            ip_mask.hdr.dst_addr = u32::MAX;
            udp_spec.hdr.dst_port = local.port().to_be();
            udp_mask.hdr.dst_port = u16::MAX;
            if let Some(r) = remote {
                ip_spec.hdr.src_addr = u32::from(*r.ip()).to_be();
                ip_mask.hdr.src_addr = u32::MAX;
                udp_spec.hdr.src_port = r.port().to_be();
                udp_mask.hdr.src_port = u16::MAX;
            }
            vec![
                eth,
                sys::rte_flow_item {
                    type_: sys::RTE_FLOW_ITEM_TYPE_IPV4,
                    spec: &ip_spec as *const _ as *const _,
                    mask: &ip_mask as *const _ as *const _,
                    ..Default::default()
                },
                sys::rte_flow_item {
                    type_: sys::RTE_FLOW_ITEM_TYPE_UDP,
                    spec: &udp_spec as *const _ as *const _,
                    mask: &udp_mask as *const _ as *const _,
                    ..Default::default()
                },
                end,
            ]
        }
    };
    let q = sys::rte_flow_action_queue { index: queue };
    let actions = [
        sys::rte_flow_action {
            type_: sys::RTE_FLOW_ACTION_TYPE_QUEUE,
            conf: &q as *const _ as *const _,
        },
        sys::rte_flow_action {
            type_: sys::RTE_FLOW_ACTION_TYPE_END,
            conf: ptr::null(),
        },
    ];
    f(&attr, &items, &actions)
}

/// Whether the PMD would accept the rule; the reason when not.
pub fn validate(port: u16, m: Match, queue: u16) -> Result<(), RuleError> {
    with_rule(m, queue, |attr, items, actions| {
        let mut e: sys::rte_flow_error = Default::default();
        // SAFETY: the rule's structures outlive the call.
        let rc =
            unsafe { sys::rte_flow_validate(port, attr, items.as_ptr(), actions.as_ptr(), &mut e) };
        if rc == 0 {
            Ok(())
        } else {
            Err(error_text(rc, &e))
        }
    })
}

/// A created rule.
pub struct Rule(*mut sys::rte_flow);

pub fn create(port: u16, m: Match, queue: u16) -> Result<Rule, RuleError> {
    if matches!(m, Match::Flow { .. }) && injected(&CREATED, &FAIL_CREATE_AT) {
        return Err(RuleError::Injected);
    }
    with_rule(m, queue, |attr, items, actions| {
        let mut e: sys::rte_flow_error = Default::default();
        // SAFETY: the rule's structures outlive the call.
        let f =
            unsafe { sys::rte_flow_create(port, attr, items.as_ptr(), actions.as_ptr(), &mut e) };
        if f.is_null() {
            Err(error_text(-sys::rte_errno(), &e))
        } else {
            Ok(Rule(f))
        }
    })
}

/// Destroys a rule; on failure the rule is handed back (it may still be in force).
pub fn destroy(port: u16, rule: Rule) -> Result<(), (Rule, RuleError)> {
    if injected(&DESTROYED, &FAIL_DESTROY_AT) {
        return Err((rule, RuleError::Injected));
    }
    let mut e: sys::rte_flow_error = Default::default();
    // SAFETY: the rule was created on this port and not destroyed yet.
    let rc = unsafe { sys::rte_flow_destroy(port, rule.0, &mut e) };
    if rc == 0 {
        Ok(())
    } else {
        let why = error_text(rc, &e);
        Err((rule, why))
    }
}

/// What a flow queue is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueUse {
    Free,
    /// Steered to flow `id`, whose frames go onto `ring` (the flow's `slot` in the port's
    /// flow table holds its counters).
    Flow {
        id: u32,
        slot: u32,
        ring: *mut sys::rte_ring,
    },
    /// Its rule could not be destroyed: never handed out again.
    Quarantined,
}

/// One dedicated RX queue of a port.
pub struct FlowQueue {
    pub id: u16,
    pub state: QueueUse,
    pub rule: Option<Rule>,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames dropped because the flow's ring was full.
    pub drops: u64,
    /// Frames found on the queue while it belonged to no flow (sent to software steering).
    pub strays: u64,
}

impl FlowQueue {
    pub fn new(id: u16) -> FlowQueue {
        FlowQueue {
            id,
            state: QueueUse::Free,
            rule: None,
            rx_packets: 0,
            rx_bytes: 0,
            drops: 0,
            strays: 0,
        }
    }

    pub fn state_str(&self) -> &'static str {
        match self.state {
            QueueUse::Free => "free",
            QueueUse::Flow { .. } => "flow",
            QueueUse::Quarantined => "quarantined",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_pinned() {
        assert_eq!(
            RuleError::Injected.to_string(),
            "injected failure (URDMAD_TEST_FAIL_RULE)"
        );
        let e = RuleError::Pmd {
            reason: "Operation not supported".into(),
        };
        assert_eq!(e.to_string(), "Operation not supported");
    }
}
