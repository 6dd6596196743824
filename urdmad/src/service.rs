//! Start-up and shutdown of the daemon as a service: the checks before DPDK is touched, the
//! control socket, systemd notification, signals, and removing everything on the way out.

use crate::config::Config;
use crate::daemon::{Daemon, STOP};
use crate::{eal, logging};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

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

fn bind_socket(path: &Path, mode: u32, gid: Option<u32>) -> Result<(UnixListener, Socket), String> {
    let what = |e: std::io::Error| format!("cannot create control socket {}: {e}", path.display());
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
            return Err(format!("another urdmad is listening on {}", path.display()));
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

fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// Runs the daemon until SIGTERM/SIGINT. `Err` is one line naming what went wrong; by then
/// everything that was created has been removed again.
pub fn run(cfg: Config) -> Result<(), String> {
    install_signal_handlers();
    eal::check_hugepages(cfg.daemon.memory_mb)?;
    let prefix = cfg.daemon.file_prefix.clone();
    eal::check_no_other_primary(&prefix)?;
    for p in &cfg.ports {
        if Path::new("/sys/class/net").join(&p.exception).exists() {
            return Err(format!(
                "port {}: interface {} already exists",
                p.name, p.exception
            ));
        }
    }
    // Every exception interface is a TAP; say so plainly rather than through DPDK's errors.
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
    {
        return Err(format!(
            "cannot open /dev/net/tun for the exception interfaces: {e} (load the tun module: modprobe tun)"
        ));
    }
    let gid = crate::access::group_id(&cfg.daemon.group);
    let (listener, socket) = bind_socket(&cfg.daemon.socket, cfg.socket_mode(), gid)?;

    logging::route_dpdk_logs();
    let mut args = eal::eal_args(&cfg);
    args.push(logging::dpdk_level_arg(&cfg.daemon.log_level));
    tracing::debug!(?args, "starting EAL");
    if let Err(e) = eal::init(&args) {
        eal::remove_files(&prefix);
        return Err(e);
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
