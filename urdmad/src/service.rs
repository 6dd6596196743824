//! Start-up and shutdown of the daemon as a service: the checks before DPDK is touched, the
//! control socket, systemd notification, signals, and removing everything on the way out.

use crate::config::Config;
use crate::daemon::{Daemon, STOP};
use crate::eal::EalError;
use crate::port::PortError;
use crate::{eal, logging};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Why the daemon could not start, besides EAL and the ports.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// A port's exception interface would take the name of an existing interface.
    #[error("port {port}: interface {interface} already exists")]
    InterfaceExists { port: String, interface: String },
    #[error(
        "cannot open /dev/net/tun for the exception interfaces: {error} (load the tun module: modprobe tun)"
    )]
    Tun { error: std::io::Error },
    #[error("cannot create control socket {}: {error}", .path.display())]
    Socket {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The control socket answers: urdmad is running already.
    #[error("another urdmad is listening on {}", .path.display())]
    SocketInUse { path: PathBuf },
    /// `reason` is `rte_strerror` of DPDK's error.
    #[error("cannot create a pool of {mbufs} mbufs: {reason} (raise memory_mb or lower mbufs)")]
    Pool { mbufs: u32, reason: String },
    /// `reason` is `rte_strerror` of DPDK's error.
    #[error("cannot reserve the doorbell's shared memory: {reason}")]
    Doorbell { reason: String },
    /// `reason` is `rte_strerror` of DPDK's error.
    #[error("cannot reserve the table of QP figures: {reason}")]
    QpStats { reason: String },
    /// A port's exception interface could not be given its addresses or brought up.
    #[error("port {port}: exception interface {interface}: {what}: {error}")]
    Interface {
        port: String,
        interface: String,
        what: String,
        error: std::io::Error,
    },
    /// The bound control socket could not be set up for polling.
    #[error("control socket: {error}")]
    ControlSocket { error: std::io::Error },
}

/// Why [`run`] failed: one line naming what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Eal(#[from] EalError),
    #[error(transparent)]
    Port(#[from] PortError),
    #[error(transparent)]
    Startup(#[from] StartupError),
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}

/// The control socket, removed again when dropped.
struct Socket {
    path: PathBuf,
    created_dir: Option<PathBuf>,
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(d) = &self.created_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

fn bind_socket(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
) -> Result<(UnixListener, Socket), StartupError> {
    let what = |error| StartupError::Socket {
        path: path.to_path_buf(),
        error,
    };
    let mut created_dir = None;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir(dir).map_err(what)?;
            created_dir = Some(dir.to_path_buf());
        }
    }
    let cleanup = |created: &Option<PathBuf>| {
        if let Some(d) = created {
            let _ = std::fs::remove_dir(d);
        }
    };
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            cleanup(&created_dir);
            return Err(StartupError::SocketInUse {
                path: path.to_path_buf(),
            });
        }
        // A socket file nobody listens on is what a killed urdmad leaves behind.
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|e| {
        cleanup(&created_dir);
        what(e)
    })?;
    let guard = Socket {
        path: path.to_path_buf(),
        created_dir,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(what)?;
    if let Some(g) = gid {
        std::os::unix::fs::chown(path, None, Some(g)).map_err(what)?;
    }
    Ok((listener, guard))
}

/// Gives the calling thread, the one that forwards frames, the nice value `nice` (Linux keeps
/// one per thread: DPDK's own threads keep theirs). Not being allowed to is no reason to
/// stop: it is said, and urdmad runs as it is.
fn set_nice(nice: i32) {
    // SAFETY: plain system calls on the calling thread.
    let (now, r) = unsafe {
        (
            libc::getpriority(libc::PRIO_PROCESS, 0),
            libc::setpriority(libc::PRIO_PROCESS, 0, nice),
        )
    };
    if r == 0 {
        tracing::debug!(nice, "forwarding thread's priority set");
    } else {
        let e = std::io::Error::last_os_error();
        tracing::warn!(
            nice,
            "cannot set the forwarding thread's priority ({e}); it stays at nice {now}"
        );
    }
}

fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// Lets urdmad open as many descriptors as its hard limit allows: each direct connection
/// holds six (its socket, its filter's program and four maps), and a service manager's soft
/// limit (1,024) is below what `direct_max` allows.
fn raise_open_files() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: l is a valid rlimit, read then written back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            let was = l.rlim_cur;
            l.rlim_cur = l.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                tracing::debug!(
                    "open files stay at {was}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// Runs the daemon until SIGTERM/SIGINT. `Err` is one line naming what went wrong; by then
/// everything that was created has been removed again.
pub fn run(cfg: Config) -> Result<(), ServiceError> {
    install_signal_handlers();
    raise_open_files();
    eal::check_hugepages(cfg.daemon.memory_mb)?;
    let prefix = cfg.daemon.file_prefix.clone();
    eal::check_no_other_primary(&prefix)?;
    for p in &cfg.ports {
        if Path::new("/sys/class/net").join(&p.exception).exists() {
            return Err(StartupError::InterfaceExists {
                port: p.name.clone(),
                interface: p.exception.clone(),
            }
            .into());
        }
    }
    // Every exception interface is a TAP; say so plainly rather than through DPDK's errors.
    if let Err(error) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        return Err(StartupError::Tun { error }.into());
    }
    let gid = crate::access::group_id(&cfg.daemon.group);
    let (listener, socket) = bind_socket(&cfg.daemon.socket, cfg.socket_mode(), gid)?;

    logging::route_dpdk_logs();
    let mut args = eal::eal_args(&cfg);
    args.push(logging::dpdk_level_arg(&cfg.daemon.log_level));
    tracing::debug!(?args, "starting EAL");
    if let Err(e) = eal::init(&args) {
        eal::remove_files(&prefix);
        return Err(e.into());
    }
    let daemon = match Daemon::start(cfg.clone(), listener) {
        Ok(d) => d,
        Err(e) => {
            eal::cleanup(&prefix);
            return Err(e);
        }
    };
    let mut daemon = daemon;
    let ports: Vec<String> = cfg
        .ports
        .iter()
        .map(|p| format!("{}+{}", p.name, p.exception))
        .collect();
    if let Some(nice) = cfg.daemon.nice {
        set_nice(nice);
    }
    tracing::info!(socket = %cfg.daemon.socket.display(), prefix = %prefix, "urdmad ready");
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("serving ports {}", ports.join(" "))),
    ]);
    daemon.run();
    notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("stopping");
    daemon.shutdown();
    drop(socket);
    eal::cleanup(&prefix);
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_pinned() {
        let e: ServiceError = StartupError::InterfaceExists {
            port: "p0".into(),
            interface: "tap0".into(),
        }
        .into();
        assert_eq!(e.to_string(), "port p0: interface tap0 already exists");
        let e: ServiceError = StartupError::Socket {
            path: "/run/urdma/urdmad.sock".into(),
            error: std::io::Error::from_raw_os_error(libc::EACCES),
        }
        .into();
        assert_eq!(
            e.to_string(),
            "cannot create control socket /run/urdma/urdmad.sock: Permission denied (os error 13)"
        );
        let e = StartupError::Tun {
            error: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        assert_eq!(
            e.to_string(),
            "cannot open /dev/net/tun for the exception interfaces: No such file or directory (os error 2) (load the tun module: modprobe tun)"
        );
        let e: ServiceError = EalError::NoHugetlbfs.into();
        assert_eq!(
            e.to_string(),
            "no hugetlbfs is mounted (mount -t hugetlbfs nodev /dev/hugepages)"
        );
        let e = StartupError::Pool {
            mbufs: 8191,
            reason: "Cannot allocate memory".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot create a pool of 8191 mbufs: Cannot allocate memory (raise memory_mb or lower mbufs)"
        );
    }
}
