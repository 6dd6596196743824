//! How libibverbs finds urdma devices: the `verbs_device_ops` we register,
//! the match decision, and the per-device struct libibverbs keeps for us.

use std::ffi::{c_char, CStr};
use std::path::Path;

use rdma_core_sys::{
    verbs_device, verbs_device_ops, verbs_match_ent, verbs_match_ent__bindgen_ty_1,
    verbs_register_driver_34, verbs_sysfs_dev, IBV_NODE_RNIC, RDMA_DRIVER_UNKNOWN,
    VERBS_MATCH_SENTINEL,
};

use crate::abi::{URDMA_ABI_VERSION, URDMA_NODE_DESC};
use crate::guard::catch;
use crate::log;
use crate::zero::{zeroed, Zeroable};

/// What urdma.ko writes into the device's `node_desc` (urdma-abi.h).
pub fn node_desc() -> &'static str {
    CStr::from_bytes_until_nul(URDMA_NODE_DESC)
        .ok()
        .and_then(|c| c.to_str().ok())
        .unwrap_or("")
}

/// The provider's name, as in `/etc/libibverbs.d/urdma.driver`.
const NAME: &CStr = c"urdma";

/// The per-device struct libibverbs keeps for us. It hands back the
/// `verbs_device` pointer, so that comes first; state of ours goes after.
#[repr(C)]
pub struct UrdmaDevice {
    pub vdev: verbs_device,
}

// SAFETY: rdma-core's verbs_device, a bindgen C struct (integers, raw
// pointers, C enums as integers, lists of raw pointers): all-zero is valid,
// and is the state libibverbs expects a fresh one in.
unsafe impl Zeroable for UrdmaDevice {}

struct MatchTable([verbs_match_ent; 1]);
// SAFETY: immutable, and its only pointer is null.
unsafe impl Sync for MatchTable {}

/// An empty match table, the sentinel alone.  For every device whose kernel
/// driver has an id (rxe, siw, any NIC's), libibverbs walks each provider's
/// table looking for that id without checking the table for null: a null
/// table crashed every process that merely listed such a device while
/// urdma's provider was installed.  Ours are found by `match_device`.
static MATCH_TABLE: MatchTable = MatchTable([verbs_match_ent {
    driver_data: std::ptr::null_mut(),
    u: verbs_match_ent__bindgen_ty_1 { driver_id: 0 },
    vendor: 0,
    device: 0,
    kind: VERBS_MATCH_SENTINEL as u8,
}]);

struct DeviceOps(verbs_device_ops);
// SAFETY: the table is immutable; its pointers name 'static data and code.
unsafe impl Sync for DeviceOps {}

static DEVICE_OPS: DeviceOps = DeviceOps(verbs_device_ops {
    name: NAME.as_ptr(),
    // libibverbs compares these with the uverbs device's sysfs abi_version,
    // which urdma.ko sets to its URDMA_ABI_VERSION.
    match_min_abi_version: URDMA_ABI_VERSION,
    match_max_abi_version: URDMA_ABI_VERSION,
    match_table: &MATCH_TABLE.0 as *const [verbs_match_ent; 1] as *const verbs_match_ent,
    static_providers: std::ptr::null_mut(),
    match_device: Some(match_device),
    alloc_context: Some(crate::context::alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
});

/// The ops table libibverbs sees (tests inspect it).
pub fn device_ops() -> &'static verbs_device_ops {
    &DEVICE_OPS.0
}

pub(crate) fn register() {
    // SAFETY: the table lives for the whole process, as libibverbs requires.
    unsafe { verbs_register_driver_34(&DEVICE_OPS.0) };
    log::debug(format_args!("registered with libibverbs"));
}

/// What the match looks at, taken out of libibverbs' sysfs record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub driver_id: u32,
    pub node_type: i32,
    pub node_desc: Option<&'a str>,
}

/// The match decision. A device is urdma's when the kernel registered it
/// with no driver id of its own (`RDMA_DRIVER_UNKNOWN`, as urdma.ko does),
/// as an iWARP RNIC, with urdma.ko's node description. The device name is
/// chosen by whoever runs `rdma link add` and proves nothing. libibverbs
/// then checks the uverbs ABI version against our range, and opening the
/// device checks the magic and version urdma.ko returns.
pub fn is_urdma(c: &Candidate<'_>) -> bool {
    c.driver_id == RDMA_DRIVER_UNKNOWN
        && c.node_type == IBV_NODE_RNIC
        && !node_desc().is_empty()
        && c.node_desc.map(str::trim_end) == Some(node_desc())
}

fn c_array_str(a: &[c_char]) -> &str {
    // SAFETY: reinterpreting c_char as u8 of the same size.
    let bytes = unsafe { &*(a as *const [c_char] as *const [u8]) };
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(&bytes[..len]).unwrap_or("")
}

unsafe extern "C" fn match_device(sysfs_dev: *mut verbs_sysfs_dev) -> bool {
    catch(false, || {
        // SAFETY: libibverbs passes a valid record for the call's duration.
        let Some(dev) = (unsafe { sysfs_dev.as_ref() }) else {
            return false;
        };
        let ibdev_path = c_array_str(&dev.ibdev_path);
        let desc = std::fs::read_to_string(Path::new(ibdev_path).join("node_desc")).ok();
        let candidate = Candidate {
            driver_id: dev.driver_id,
            node_type: dev.node_type,
            node_desc: desc.as_deref(),
        };
        let ours = is_urdma(&candidate);
        log::debug(format_args!(
            "match {} ({ibdev_path}): {candidate:?} abi {} -> {ours}",
            c_array_str(&dev.ibdev_name),
            dev.abi_ver
        ));
        ours
    })
}

unsafe extern "C" fn alloc_device(_sysfs_dev: *mut verbs_sysfs_dev) -> *mut verbs_device {
    catch(std::ptr::null_mut(), || {
        // All-zero is the state libibverbs expects a fresh verbs_device in
        // (it fills in the rest itself).
        let dev: Box<UrdmaDevice> = Box::new(zeroed());
        let dev = Box::into_raw(dev);
        // SAFETY: just allocated; vdev is the first field.
        unsafe { &raw mut (*dev).vdev }
    })
}

unsafe extern "C" fn uninit_device(vdev: *mut verbs_device) {
    catch((), || {
        if !vdev.is_null() {
            // SAFETY: vdev came from alloc_device, at offset 0 of its box.
            drop(unsafe { Box::from_raw(vdev.cast::<UrdmaDevice>()) });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(desc: Option<&str>) -> Candidate<'_> {
        Candidate {
            driver_id: RDMA_DRIVER_UNKNOWN,
            node_type: IBV_NODE_RNIC,
            node_desc: desc,
        }
    }

    #[test]
    fn matches_urdma_kmod_device() {
        assert_eq!(node_desc(), "urdma");
        assert!(is_urdma(&candidate(Some("urdma\n"))));
    }

    #[test]
    fn rejects_other_drivers_and_types() {
        assert!(!is_urdma(&candidate(None)));
        assert!(!is_urdma(&candidate(Some("urdmaX"))));
        assert!(!is_urdma(&candidate(Some("siw"))));
        let mut c = candidate(Some("urdma"));
        c.driver_id = RDMA_DRIVER_UNKNOWN + 1;
        assert!(!is_urdma(&c));
        let mut c = candidate(Some("urdma"));
        c.node_type = rdma_core_sys::IBV_NODE_CA;
        assert!(!is_urdma(&c));
    }

    #[test]
    fn ops_table_names_the_provider() {
        let ops = device_ops();
        // SAFETY: name is a 'static C string.
        assert_eq!(unsafe { CStr::from_ptr(ops.name) }, NAME);
        assert_eq!(ops.match_min_abi_version, URDMA_ABI_VERSION);
        assert!(ops.match_device.is_some() && ops.alloc_context.is_some());
    }

    #[test]
    fn device_alloc_and_free() {
        // SAFETY: the hooks accept any sysfs pointer for allocation.
        unsafe {
            let d = alloc_device(std::ptr::null_mut());
            assert!(!d.is_null());
            uninit_device(d);
        }
    }
}
