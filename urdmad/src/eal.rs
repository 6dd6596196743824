//! Bringing DPDK's EAL up as the primary process, the checks that must pass before it is
//! touched (hugepages, another primary on the same prefix), and removing what it leaves on
//! disk when urdmad stops.

use crate::config::Config;
use dpdk_sys as sys;
use std::ffi::CString;
use std::os::raw::c_char;
use std::path::{Path, PathBuf};

/// Why EAL was not, or could not be, brought up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EalError {
    #[error("no hugetlbfs is mounted (mount -t hugetlbfs nodev /dev/hugepages)")]
    NoHugetlbfs,
    #[error(
        "not enough free hugepages: {needed_mb} MiB needed, {free_mb} MiB free \
         (reserve more: echo N > /proc/sys/vm/nr_hugepages)"
    )]
    Hugepages { needed_mb: u32, free_mb: u64 },
    /// Another process holds the lock of the prefix's runtime directory.
    #[error("another DPDK primary process (pid {pid}) is running with file prefix {prefix:?}")]
    OtherPrimary { pid: libc::pid_t, prefix: String },
    #[error("EAL argument {arg:?} contains NUL")]
    ArgumentNul { arg: String },
    /// `rte_eal_init` failed; `reason` is `rte_strerror` of its error.
    #[error("DPDK EAL initialisation failed: {reason}")]
    Init { reason: String },
}

/// DPDK's runtime directory for a file prefix (config lock, multi-process socket).
pub fn runtime_dir(prefix: &str) -> PathBuf {
    Path::new("/var/run/dpdk").join(prefix)
}

/// Mount points of hugetlbfs, from /proc/mounts.
pub fn hugetlbfs_mounts() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let _dev = f.next()?;
            let dir = f.next()?;
            (f.next()? == "hugetlbfs").then(|| PathBuf::from(dir))
        })
        .collect()
}

/// Free hugepage memory of the default page size, MiB.
fn free_hugepage_mb() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:") * field("Hugepagesize:") / 1024
}

/// Refuses early, with a message saying what to do, when EAL could not get its memory.
pub fn check_hugepages(memory_mb: u32) -> Result<(), EalError> {
    if hugetlbfs_mounts().is_empty() {
        return Err(EalError::NoHugetlbfs);
    }
    let free = free_hugepage_mb();
    if free < u64::from(memory_mb) {
        return Err(EalError::Hugepages {
            needed_mb: memory_mb,
            free_mb: free,
        });
    }
    Ok(())
}

/// EAL holds a write lock on `<runtime dir>/config` for the primary's whole life; finding it
/// held means another primary uses this prefix. Checked before EAL so that the refusal does
/// not depend on EAL's own messages and touches nothing.
pub fn check_no_other_primary(prefix: &str) -> Result<(), EalError> {
    let path = runtime_dir(prefix).join("config");
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return Ok(());
    };
    use std::os::fd::AsRawFd;
    // SAFETY: plain fcntl on an fd we own, with a zeroed flock struct filled in below.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) };
    if rc == 0 && lock.l_type != libc::F_UNLCK as i16 {
        return Err(EalError::OtherPrimary {
            pid: lock.l_pid,
            prefix: prefix.to_string(),
        });
    }
    Ok(())
}

/// EAL arguments of the daemon.
pub fn eal_args(cfg: &Config) -> Vec<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut args = vec![
        "urdmad".to_string(),
        "--proc-type=primary".into(),
        format!("--file-prefix={}", cfg.daemon.file_prefix),
        // Float over every CPU: small machines share their cores with the applications.
        format!("--lcores=0@(0-{})", cpus - 1),
        "-m".into(),
        cfg.daemon.memory_mb.to_string(),
    ];
    let pci: Vec<&str> = cfg
        .ports
        .iter()
        .map(|p| p.device.as_str())
        .filter(|d| crate::port::is_pci(d))
        .collect();
    if pci.is_empty() {
        args.push("--no-pci".into());
    } else {
        for d in pci {
            args.push(format!("--allow={d}"));
        }
    }
    args.extend(cfg.daemon.eal_args.iter().cloned());
    args
}

/// Runs `rte_eal_init`. EAL keeps pointers into argv, so the strings are leaked on purpose.
pub fn init(args: &[String]) -> Result<(), EalError> {
    let cargs: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()).map_err(|_| EalError::ArgumentNul { arg: a.clone() }))
        .collect::<Result<_, _>>()?;
    let argv: &mut Vec<*mut c_char> = Box::leak(Box::new(
        cargs.into_iter().map(|c| c.into_raw()).collect::<Vec<_>>(),
    ));
    // SAFETY: argv holds valid NUL-terminated strings that live for the whole process.
    let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if rc < 0 {
        return Err(EalError::Init {
            reason: sys::rte_strerror_string(sys::rte_errno()),
        });
    }
    Ok(())
}

/// Releases EAL and removes this primary's files: its hugepage backing files and its
/// runtime directory. Only called by a primary that initialised EAL itself.
pub fn cleanup(prefix: &str) {
    // SAFETY: called once, after every port is closed.
    unsafe {
        sys::rte_eal_cleanup();
    }
    remove_files(prefix);
}

/// Removes hugepage files and the runtime directory of `prefix`.
pub fn remove_files(prefix: &str) {
    let marker = format!("{prefix}map_");
    for dir in hugetlbfs_mounts() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&marker) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(runtime_dir(prefix));
}

/// Whether `name`, a file of a DPDK runtime directory, was made by the secondary process
/// `pid`: its multi-process socket (`mp_socket_<pid>_<tsc>`) or its local copy of a memory
/// segment list (`fbarray_<list>_<pid>`). A secondary removes them in `rte_eal_cleanup`,
/// which the provider never calls (EAL cannot start again in that process) and a process
/// killed with SIGKILL never gets to: left alone they pile up in /var/run, a tmpfs, with
/// every process that ever attached.
fn made_by_secondary(name: &str, pid: u32) -> bool {
    let pid = pid.to_string();
    if let Some(rest) = name.strip_prefix("mp_socket_") {
        return rest.strip_prefix(&pid).is_some_and(|r| r.starts_with('_'));
    }
    name.starts_with("fbarray_") && name.strip_suffix(&pid).is_some_and(|r| r.ends_with('_'))
}

/// Removes from `dir` (a prefix's runtime directory) the files of the secondary process
/// `pid` ([`made_by_secondary`]); returns how many went.
pub fn remove_secondary_files(dir: &Path, pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| made_by_secondary(&e.file_name().to_string_lossy(), pid))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_secondary_s_files_go_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("urdmad-eal-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let names = [
            // the primary's
            "config",
            "mp_socket",
            "fbarray_memzone",
            "fbarray_memseg-2048k-0-0",
            "hugepage_info",
            // process 42's
            "mp_socket_42_1f3a9c",
            "fbarray_memseg-2048k-0-0_42",
            "fbarray_memseg-2048k-0-1_42",
            // other processes' (420, 4, 142)
            "mp_socket_420_77",
            "mp_socket_4_2a",
            "fbarray_memseg-2048k-0-0_142",
            "fbarray_memseg-2048k-0-0_4",
        ];
        for n in names {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        assert_eq!(remove_secondary_files(&dir, 42), 3);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want: Vec<String> = names[..5]
            .iter()
            .chain(&names[8..])
            .map(|n| n.to_string())
            .collect();
        want.sort();
        assert_eq!(left, want);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn messages_are_pinned() {
        assert_eq!(
            EalError::Hugepages {
                needed_mb: 128,
                free_mb: 2
            }
            .to_string(),
            "not enough free hugepages: 128 MiB needed, 2 MiB free (reserve more: echo N > /proc/sys/vm/nr_hugepages)"
        );
        assert_eq!(
            EalError::OtherPrimary {
                pid: 42,
                prefix: "urdma".into()
            }
            .to_string(),
            r#"another DPDK primary process (pid 42) is running with file prefix "urdma""#
        );
        assert_eq!(
            init(&["urdmad".into(), "a\0b".into()])
                .unwrap_err()
                .to_string(),
            r#"EAL argument "a\0b" contains NUL"#
        );
    }
}
