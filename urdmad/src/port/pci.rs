//! PCI devices as ports: telling an address from a vdev, and why DPDK has no port for one.

use std::path::Path;

/// `0000:03:00.0` or `03:00.0`: a PCI address rather than a vdev.
pub fn is_pci(device: &str) -> bool {
    let parts: Vec<&str> = device.split([':', '.']).collect();
    (parts.len() == 3 || parts.len() == 4)
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Why DPDK has no port for PCI device `device`, from what `devices` (sysfs's
/// `/sys/bus/pci/devices`) says of it.
pub(super) fn pci_why(device: &str, devices: &Path) -> String {
    let addr = if device.matches(':').count() == 1 {
        format!("0000:{device}")
    } else {
        device.to_string()
    };
    let dir = devices.join(&addr);
    if !dir.exists() {
        return "no such PCI device".into();
    }
    let driver_of = |d: &Path| {
        std::fs::read_link(d.join("driver"))
            .ok()
            .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    match driver_of(&dir).as_deref() {
        None => "it is bound to no driver (bind it to vfio-pci)".into(),
        Some("vfio-pci") => {
            let Ok(members) = std::fs::read_dir(dir.join("iommu_group").join("devices")) else {
                return "it is bound to vfio-pci but has no IOMMU group (is the IOMMU on: \
                        intel_iommu=on or amd_iommu=on?)"
                    .into();
            };
            let others: Vec<String> = members
                .flatten()
                .map(|m| m.file_name().to_string_lossy().into_owned())
                .filter(|m| *m != addr)
                .map(|m| {
                    let drv = driver_of(&devices.join(&m)).unwrap_or_else(|| "no driver".into());
                    format!("{m} ({drv})")
                })
                .collect();
            if others.is_empty() {
                "DPDK did not probe it (see EAL's lines before this one)".into()
            } else {
                format!(
                    "its IOMMU group also holds {}: vfio-pci needs every device of the group",
                    others.join(", ")
                )
            }
        }
        Some(d @ ("uio_pci_generic" | "igb_uio")) => {
            format!("DPDK did not probe it under {d} (see EAL's lines before this one)")
        }
        Some(d) => format!("it is bound to {d}, not to vfio-pci"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysfs `devices` directory with `devices` (address, driver, IOMMU group).
    fn sysfs(name: &str, devices: &[(&str, Option<&str>, Option<u32>)]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("urdmad-sysfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let devs = root.join("devices");
        for (addr, driver, group) in devices {
            let d = devs.join(addr);
            std::fs::create_dir_all(&d).unwrap();
            if let Some(drv) = driver {
                let target = root.join("drivers").join(drv);
                std::fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(&target, d.join("driver")).unwrap();
            }
            if let Some(g) = group {
                let gd = root.join("groups").join(g.to_string()).join("devices");
                std::fs::create_dir_all(&gd).unwrap();
                let _ = std::os::unix::fs::symlink(&d, gd.join(addr));
                std::os::unix::fs::symlink(gd.parent().unwrap(), d.join("iommu_group")).unwrap();
            }
        }
        devs
    }

    #[test]
    fn a_pci_device_without_a_port_is_told_why() {
        let devs = sysfs(
            "why",
            &[
                ("0000:00:03.0", Some("vfio-pci"), Some(3)),
                ("0000:00:04.0", Some("vfio-pci"), Some(4)),
                ("0000:00:04.1", Some("e1000e"), Some(4)),
                ("0000:00:05.0", Some("virtio-pci"), Some(5)),
                ("0000:00:06.0", None, Some(6)),
                ("0000:00:07.0", Some("vfio-pci"), None),
                ("0000:00:08.0", Some("uio_pci_generic"), None),
            ],
        );
        let why = |d| pci_why(d, &devs);
        assert_eq!(why("0000:00:09.0"), "no such PCI device");
        assert_eq!(
            why("00:03.0"),
            "DPDK did not probe it (see EAL's lines before this one)"
        );
        assert_eq!(
            why("0000:00:04.0"),
            "its IOMMU group also holds 0000:00:04.1 (e1000e): vfio-pci needs every device of \
             the group"
        );
        assert_eq!(
            why("0000:00:05.0"),
            "it is bound to virtio-pci, not to vfio-pci"
        );
        assert_eq!(
            why("0000:00:06.0"),
            "it is bound to no driver (bind it to vfio-pci)"
        );
        assert!(why("0000:00:07.0").starts_with("it is bound to vfio-pci but has no IOMMU group"));
        assert_eq!(
            why("0000:00:08.0"),
            "DPDK did not probe it under uio_pci_generic (see EAL's lines before this one)"
        );
        std::fs::remove_dir_all(devs.parent().unwrap()).unwrap();
    }
}
