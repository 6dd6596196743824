//! urdmad as a service: where its files go, starts that fail, a second urdmad, systemd,
//! its configuration, restarts.

use super::*;

/// systemd gives a unit with `RuntimeDirectory=` (urdmad's, for its socket) the variable
/// RUNTIME_DIRECTORY, which DPDK prefers for its runtime files; the applications, outside
/// the unit, look under /var/run/dpdk, and found no primary there.
#[test]
fn dpdk_runtime_files_stay_where_applications_look_under_a_systemd_runtime_directory() {
    let bed = Bed::new("rd");
    let run = bed.dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let cfg = bed.write_config("urdmad.toml", &bed.config("", None));
    let mut d = bed.start_with_env(&cfg, &[("RUNTIME_DIRECTORY", run.to_str().unwrap())]);
    let config = Path::new("/var/run/dpdk").join(&bed.prefix).join("config");
    assert!(config.exists(), "no {}", config.display());
    let inside: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().collect();
    assert!(
        inside.is_empty(),
        "DPDK files in RUNTIME_DIRECTORY: {inside:?}"
    );
    stop_cleanly(&bed, &mut d);
}

#[test]
fn bad_starts_exit_non_zero_with_one_line_and_leave_nothing() {
    let bed = Bed::new("bs");
    let socket = bed.socket();

    // Malformed configuration.
    let cfg = bed.write_config("malformed.toml", "[daemon\nsocket = 1\n");
    bad_start(&bed, &mut bed.urdmad_cmd(&cfg), "line 1", &socket);

    // Unknown vdev.
    let cfg = bed.write_config("vdev.toml", &bed.config("", Some("net_nosuchpmd0")));
    bad_start(&bed, &mut bed.urdmad_cmd(&cfg), "net_nosuchpmd0", &socket);

    // af_packet on an interface that does not exist.
    let cfg = bed.write_config(
        "iface.toml",
        &bed.config("", Some("net_af_packet0,iface=nosuchif0")),
    );
    bad_start(&bed, &mut bed.urdmad_cmd(&cfg), "net_af_packet0", &socket);

    // Unwritable socket path.
    let unwritable = std::path::PathBuf::from("/proc/urdmad-test/urdmad.sock");
    let text = bed
        .config("", None)
        .replace(&format!("{:?}", socket), &format!("{:?}", unwritable));
    let cfg = bed.write_config("sock.toml", &text);
    bad_start(
        &bed,
        &mut bed.urdmad_cmd(&cfg),
        "control socket /proc/urdmad-test/urdmad.sock",
        &socket,
    );

    // No hugepages: hugetlbfs unmounted in a private mount namespace.
    let cfg = bed.write_config("nohuge.toml", &bed.config("", None));
    let script = format!(
        "awk '$3==\"hugetlbfs\"{{print $2}}' /proc/mounts | while read m; do umount \"$m\"; done; exec ip netns exec {} {URDMAD} --config {}",
        bed.ns_a,
        cfg.display()
    );
    bad_start(
        &bed,
        Command::new("unshare").args(["-m", "sh", "-c", &script]),
        "hugetlbfs",
        &socket,
    );

    // More hugepage memory than is free.
    let cfg = bed.write_config(
        "toomuch.toml",
        &bed.config("", None)
            .replace("memory_mb = 48", "memory_mb = 10000000"),
    );
    bad_start(
        &bed,
        &mut bed.urdmad_cmd(&cfg),
        "not enough free hugepages",
        &socket,
    );
}

#[test]
fn second_urdmad_on_the_same_prefix_is_refused_and_the_first_keeps_serving() {
    let bed = Bed::new("sp");
    let mut first = bed.start();
    let other_socket = bed.dir.join("second.sock");
    let text = bed
        .config("", None)
        .replace(&format!("{:?}", bed.socket()), &format!("{other_socket:?}"))
        .replace(
            &format!("exception = {:?}", bed.tap),
            "exception = \"urdt2nd0\"",
        );
    let cfg = bed.write_config("second.toml", &text);
    let out = run_bounded(&mut bed.urdmad_cmd(&cfg), Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("urdmad: error: ") && last.contains("another DPDK primary"),
        "{err}"
    );
    assert!(!other_socket.exists());
    assert!(!bed.link_exists(&bed.ns_a, "urdt2nd0"));
    assert!(first.try_status().is_ok(), "first urdmad must keep serving");
    stop_cleanly(&bed, &mut first);
}

#[test]
fn notify_socket_gets_ready_after_ports_are_up_and_stopping_on_sigterm() {
    let bed = Bed::new("nt");
    let notify_path = bed.dir.join("notify");
    let listener = UnixDatagram::bind(&notify_path).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let cfg = bed.write_config("notify.toml", &bed.config("", None));
    let mut child = bed
        .urdmad_cmd(&cfg)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = listener.recv(&mut buf).expect("a notification within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    let ready_tap = bed.link_exists(&bed.ns_a, &bed.tap);
    let ready_socket = bed.socket().exists();
    // SAFETY: signalling the process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = listener.recv(&mut buf);
    let end = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("urdmad did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(
        ready_tap && ready_socket,
        "READY=1 before the exception interface and socket were up"
    );
    let stopping = String::from_utf8_lossy(&buf[..n.expect("STOPPING within 30 s")]).to_string();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
    assert!(status.success());
    bed.assert_nothing_left(&bed.socket());
}

#[test]
fn systemd_accepts_the_unit() {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/urdmad.service")).unwrap();
    // The unit names the installed path; verify it against the binary built here.
    let dir = std::env::temp_dir().join(format!("urdmad-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("urdmad.service");
    std::fs::write(&path, unit.replace("/usr/sbin/urdmad", URDMAD)).unwrap();
    let out = run_bounded(
        Command::new("systemd-analyze").arg("verify").arg(&path),
        Duration::from_secs(30),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_config_accepts_the_example_and_rejects_garbage() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/urdmad.toml");
    let out = run_bounded(
        Command::new(URDMAD).args(["--check-config", "--config", example]),
        Duration::from_secs(10),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_bounded(
        Command::new(URDMAD).args(["--check-config"]),
        Duration::from_secs(10),
    );
    assert!(out.status.success(), "built-in default");
    let out = run_bounded(
        Command::new(URDMAD).args(["--check-config", "--config", "/nonexistent/urdmad.toml"]),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("urdmad: error: cannot read"));
}

#[test]
fn urdmad_restarts_cleanly_after_being_killed() {
    let bed = Bed::new("rs");
    let mut d = bed.start();
    // SAFETY: killing the process this test started.
    unsafe { libc::kill(d.pid(), libc::SIGKILL) };
    let _ = wait_bounded(d.child.take().unwrap(), Duration::from_secs(10));
    // What systemd's Restart=on-failure then does: start again on the same prefix and socket.
    let mut again = bed.start();
    stop_cleanly(&bed, &mut again);
}

#[test]
fn built_in_default_configuration_serves_on_veth0_unedited() {
    let bed = Bed::new("df");
    // The VM test bed's layout: the port's interface is called veth0.
    sh(&["ip", "-n", &bed.ns_a, "link", "set", &bed.veth_a, "down"]);
    sh(&[
        "ip",
        "-n",
        &bed.ns_a,
        "link",
        "set",
        &bed.veth_a,
        "name",
        "veth0",
    ]);
    // Left down, as a host's spare NIC is: urdmad brings its port's interface up itself.
    let socket = std::path::PathBuf::from("/run/urdma/urdmad.sock");
    let log = bed.dir.join("default.log");
    let child = Command::new("ip")
        .args(["netns", "exec", &bed.ns_a, URDMAD])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut d = Urdmad {
        child: Some(child),
        socket: socket.clone(),
        log,
    };
    let end = Instant::now() + Duration::from_secs(30);
    while d.try_status().is_err() {
        assert!(
            Instant::now() < end,
            "default urdmad not serving: {}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sh(&[
        "ip",
        "-n",
        &bed.ns_a,
        "addr",
        "add",
        &format!("{LOCAL_IP}/24"),
        "dev",
        "urdma-tap0",
    ]);
    let out = ping(&bed.ns_b, 2, &LOCAL_IP.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let st = d.status();
    assert_eq!(one::<Daemon>(&st).prefix, "urdma");
    assert_eq!(one::<Port>(&st).device, "net_af_packet0,iface=veth0");
    let (status, log) = d.stop();
    assert!(status.success(), "{log}");
    assert!(!socket.exists());
    assert!(!Path::new("/var/run/dpdk/urdma").exists());
}
