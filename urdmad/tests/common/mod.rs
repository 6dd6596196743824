//! Test bed for urdmad's host tests: two network namespaces joined by a veth pair, urdmad on
//! one end (af_packet) in namespace A, the kernel peer in namespace B. Every name carries
//! the test process's pid and a per-test tag, and everything is removed on drop, also when
//! the test fails. Needs root, hugepages (scripts/setup reserves them) and iproute2.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use urdmad::status::Kind;
pub use urdmad::status::{self, Record};

pub const URDMAD: &str = env!("CARGO_BIN_EXE_urdmad");
pub const TESTCLIENT: &str = env!("CARGO_BIN_EXE_urdmad-testclient");
/// How long urdmad may take to start serving.
pub const START_LIMIT: Duration = Duration::from_secs(120);
pub const LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

pub fn require_root() {
    // SAFETY: trivial libc call.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "urdmad's host tests must run as root (CI runs them as root)"
    );
}

/// Runs a command to completion, killing it after `limit`.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    wait_bounded(child, limit)
}

pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let end = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > end {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "process did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sh(args: &[&str]) {
    let out = run_bounded(
        Command::new(args[0]).args(&args[1..]),
        Duration::from_secs(10),
    );
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tmp_base() -> PathBuf {
    std::env::temp_dir()
}

/// Namespaces, veth pair, a scratch directory and the names a daemon of this bed uses.
pub struct Bed {
    pub ns_a: String,
    pub ns_b: String,
    pub veth_a: String,
    pub veth_b: String,
    pub tap: String,
    pub prefix: String,
    pub dir: PathBuf,
}

impl Bed {
    /// `tag`: at most 3 characters, unique among the tests of one binary.
    pub fn new(tag: &str) -> Bed {
        require_root();
        let id = std::process::id() % 100_000;
        let base = format!("u{id}{tag}");
        let bed = Bed {
            ns_a: format!("urdt-{base}-a"),
            ns_b: format!("urdt-{base}-b"),
            veth_a: format!("{base}a"),
            veth_b: format!("{base}b"),
            tap: format!("{base}t"),
            prefix: format!("urdt{base}"),
            dir: tmp_base().join(format!("urdt-{base}")),
        };
        bed.teardown();
        std::fs::create_dir_all(&bed.dir).unwrap();
        sh(&["ip", "netns", "add", &bed.ns_a]);
        sh(&["ip", "netns", "add", &bed.ns_b]);
        sh(&["ip", "-n", &bed.ns_a, "link", "set", "lo", "up"]);
        sh(&["ip", "-n", &bed.ns_b, "link", "set", "lo", "up"]);
        bed.add_veth_pair(&bed.veth_a, &bed.veth_b, &format!("{PEER_IP}/24"));
        bed
    }

    /// Joins the namespaces with the veth pair `a` (in A, left for urdmad) and `b` (in B,
    /// given `peer_cidr`), both up.
    pub fn add_veth_pair(&self, a: &str, b: &str, peer_cidr: &str) {
        sh(&["ip", "link", "add", a, "type", "veth", "peer", "name", b]);
        sh(&["ip", "link", "set", a, "netns", &self.ns_a]);
        sh(&["ip", "link", "set", b, "netns", &self.ns_b]);
        sh(&["ip", "-n", &self.ns_a, "link", "set", a, "up"]);
        sh(&["ip", "-n", &self.ns_b, "link", "set", b, "up"]);
        sh(&["ip", "-n", &self.ns_b, "addr", "add", peer_cidr, "dev", b]);
        // veth leaves UDP checksums to an offload that af_packet never performs; the kernel
        // behind the exception path would then drop the peer's datagrams as corrupt.
        sh(&[
            "ip", "netns", "exec", &self.ns_b, "ethtool", "-K", b, "tx", "off",
        ]);
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("urdmad.sock")
    }

    /// A configuration for this bed; `daemon_extra` lines go into `[daemon]`.
    pub fn config(&self, daemon_extra: &str, device: Option<&str>) -> String {
        format!(
            "[daemon]\nsocket = {:?}\ngroup = \"\"\nfile_prefix = {:?}\nmemory_mb = 48\nmbufs = 2047\nring_size = 256\nlog_level = \"info\"\n{daemon_extra}\n\
             [[port]]\nname = \"p0\"\ndevice = {:?}\nexception = {:?}\n",
            self.socket(),
            self.prefix,
            device.map_or(format!("net_af_packet0,iface={}", self.veth_a), str::to_owned),
            self.tap
        )
    }

    pub fn write_config(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The urdmad command, run in namespace A.
    pub fn urdmad_cmd(&self, config: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns_a, URDMAD, "--config"])
            .arg(config);
        c
    }

    /// Starts urdmad with the bed's default configuration and waits until it serves.
    pub fn start(&self) -> Urdmad {
        let cfg = self.write_config("urdmad.toml", &self.config("", None));
        self.start_with(&cfg)
    }

    pub fn start_with(&self, config: &Path) -> Urdmad {
        self.start_with_env(config, &[])
    }

    /// Like [`Bed::start_with`], with extra environment variables for urdmad.
    pub fn start_with_env(&self, config: &Path, env: &[(&str, &str)]) -> Urdmad {
        let log = self.dir.join(format!(
            "{}.log",
            config.file_stem().unwrap_or_default().to_string_lossy()
        ));
        let child = self
            .urdmad_cmd(config)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn urdmad");
        let mut d = Urdmad {
            child: Some(child),
            socket: self.socket(),
            log,
        };
        // Generous: in the VM (emulated CPU, cold caches) EAL alone can take half a minute.
        let end = Instant::now() + START_LIMIT;
        while Instant::now() < end {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                panic!("urdmad exited ({st}): {}", d.log_text());
            }
            if d.try_status().is_ok() {
                sh(&[
                    "ip",
                    "-n",
                    &self.ns_a,
                    "addr",
                    "add",
                    &format!("{LOCAL_IP}/24"),
                    "dev",
                    &self.tap,
                ]);
                return d;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "urdmad did not start serving within {START_LIMIT:?}; its log: {}",
            d.log_text()
        );
    }

    /// The peer's MAC address.
    pub fn peer_mac(&self) -> String {
        self.link_mac(&self.ns_b, &self.veth_b)
    }

    /// The MAC address of interface `iface` in namespace `ns`.
    pub fn link_mac(&self, ns: &str, iface: &str) -> String {
        let out = run_bounded(
            Command::new("ip").args(["-n", ns, "-o", "link", "show", iface]),
            Duration::from_secs(5),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let after = text
            .split("link/ether ")
            .nth(1)
            .expect("the link has a MAC");
        after.split_whitespace().next().unwrap().to_string()
    }

    pub fn link_exists(&self, ns: &str, iface: &str) -> bool {
        run_bounded(
            Command::new("ip").args(["-n", ns, "link", "show", iface]),
            Duration::from_secs(5),
        )
        .status
        .success()
    }

    /// What a stopped urdmad of this bed must not leave behind.
    pub fn assert_nothing_left(&self, socket: &Path) {
        assert!(
            !socket.exists(),
            "socket file {} left behind",
            socket.display()
        );
        assert!(
            !self.link_exists(&self.ns_a, &self.tap),
            "TAP {} left behind",
            self.tap
        );
        let marker = format!("{}map_", self.prefix);
        for dir in hugetlbfs_mounts() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                assert!(
                    !e.file_name().to_string_lossy().starts_with(&marker),
                    "hugepage file {:?} left behind",
                    e.path()
                );
            }
        }
        assert!(
            !Path::new("/var/run/dpdk").join(&self.prefix).exists(),
            "DPDK runtime directory left behind"
        );
    }

    fn teardown(&self) {
        for ns in [&self.ns_a, &self.ns_b] {
            if Path::new("/var/run/netns").join(ns).exists() {
                let _ = run_bounded(
                    Command::new("ip").args(["netns", "del", ns]),
                    Duration::from_secs(10),
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let marker = format!("{}map_", self.prefix);
        for dir in hugetlbfs_mounts() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(&marker) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.teardown();
    }
}

pub fn hugetlbfs_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "hugetlbfs").then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// A running urdmad, stopped (SIGTERM, then SIGKILL) on drop.
pub struct Urdmad {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Urdmad {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn try_status(&self) -> Result<Vec<Record>, urdmad::client::Error> {
        status_of(&self.socket, Duration::from_secs(5))
    }

    pub fn status(&self) -> Vec<Record> {
        self.try_status().expect("status")
    }

    /// SIGTERM and wait; returns the exit status and the log.
    pub fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let child = self.child.take().expect("running");
        // SAFETY: signalling the process we started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = wait_bounded(child, Duration::from_secs(15));
        (out.status, self.log_text())
    }
}

impl Drop for Urdmad {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling the process we started.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let end = Instant::now() + Duration::from_secs(10);
            while Instant::now() < end {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The status report of the urdmad at `socket`.
pub fn status_of(socket: &Path, timeout: Duration) -> Result<Vec<Record>, urdmad::client::Error> {
    urdmad::client::Connection::connect(socket, timeout)?.status()
}

/// The report's first record of kind `T` (`daemon`, `pool`, `cm`: the only one; the
/// first port's, ...); a test without it fails, showing the report.
pub fn one<T: Kind>(st: &[Record]) -> &T {
    status::first(st).unwrap_or_else(|| {
        panic!(
            "no {} record in the status report: {st:?}",
            std::any::type_name::<T>()
        )
    })
}

/// The report's first record of kind `T` for which `pick` holds.
pub fn find<T: Kind>(st: &[Record], pick: impl Fn(&T) -> bool) -> Option<&T> {
    status::all(st).find(|r| pick(r))
}

/// How many records of kind `T` the report has.
pub fn count<T: Kind>(st: &[Record]) -> usize {
    status::all::<T>(st).count()
}

/// Runs `f` on a thread that has entered network namespace `ns`.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = Path::new("/var/run/netns").join(ns);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("netns file");
        // SAFETY: setns on this thread only, with an fd we own.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns failed");
        f()
    })
    .join()
    .expect("netns thread panicked")
}

/// A UDP socket bound in namespace `ns`.
pub fn udp_in(ns: &str, addr: SocketAddrV4) -> UdpSocket {
    in_netns(ns, move || {
        let s = UdpSocket::bind(addr).expect("bind");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    })
}

/// Every datagram that arrives on `s` within `wait`.
pub fn drain(s: &UdpSocket, wait: Duration) -> Vec<(Vec<u8>, std::net::SocketAddr)> {
    let end = Instant::now() + wait;
    let mut out = Vec::new();
    let mut buf = [0u8; 2048];
    while Instant::now() < end {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            out.push((buf[..n].to_vec(), from));
        }
    }
    out
}

/// A test client process whose stdout lines arrive on a channel.
pub struct TestClient {
    pub child: Option<Child>,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl TestClient {
    pub fn spawn(socket: &Path, args: &[&str]) -> TestClient {
        let mut child = Command::new(TESTCLIENT)
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn test client");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        TestClient {
            child: Some(child),
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with `prefix`; all lines read are kept in `seen`.
    pub fn wait_for(&mut self, prefix: &str, limit: Duration) -> String {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(_) => panic!("no {prefix:?} line within {limit:?}; got {:?}", self.seen),
            }
        }
    }

    /// Collects lines for `wait`.
    pub fn collect(&mut self, wait: Duration) -> &[String] {
        let end = Instant::now() + wait;
        while let Ok(l) = self
            .lines
            .recv_timeout(end.saturating_duration_since(Instant::now()))
        {
            self.seen.push(l);
        }
        &self.seen
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let c = self.child.take().expect("running");
        wait_bounded(c, limit).status
    }
}

impl Drop for TestClient {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
