//! urdmad on the host: exception path, steering, process life cycle, service behaviour.
//! Each test builds its own namespaces and veth pair (see `common`), bounded in time; this
//! file holds what they share, one module per subject.

#[path = "../common/mod.rs"]
mod common;
mod frames;
mod processes;
mod service;

use common::*;
use std::net::SocketAddrV4;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use urdmad::status::{Daemon, Exception, Flow, Pool, Port, Process};

fn addr(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(LOCAL_IP, port)
}

fn send_from_peer(bed: &Bed, datagrams: Vec<(u16, Vec<u8>)>) {
    in_netns(&bed.ns_b, move || {
        let s = std::net::UdpSocket::bind(SocketAddrV4::new(PEER_IP, 0)).unwrap();
        for (port, payload) in datagrams {
            s.send_to(&payload, addr(port)).unwrap();
        }
    });
}

/// `count` pings from namespace `ns` to `target`, 0.2 s apart, each
/// waiting at most 2 s for its reply; the whole run bounded.
fn ping(ns: &str, count: u32, target: &str) -> std::process::Output {
    let count = count.to_string();
    let args = [
        "netns", "exec", ns, "ping", "-c", &count, "-i", "0.2", "-W", "2", target,
    ];
    run_bounded(Command::new("ip").args(args), Duration::from_secs(20))
}

/// Stops `d` and checks that it exited with success and left nothing of the bed's behind.
fn stop_cleanly(bed: &Bed, d: &mut Urdmad) {
    let (status, log) = d.stop();
    assert!(status.success(), "{log}");
    bed.assert_nothing_left(&bed.socket());
}

/// The baseline after one datagram has warmed the exception path, so that ARP does not
/// change the counts mid-test.
fn warm_baseline(bed: &Bed, d: &Urdmad) -> (u32, usize, usize, usize) {
    send_from_peer(bed, vec![(7000, b"warm".to_vec())]);
    std::thread::sleep(Duration::from_millis(300));
    baseline(&d.status())
}

/// Status fields that must return to their starting values.
fn baseline(st: &[Record]) -> (u32, usize, usize, usize) {
    let daemon = one::<Daemon>(st);
    (
        one::<Pool>(st).available,
        daemon.rings,
        daemon.flows,
        daemon.processes,
    )
}

fn bad_start(bed: &Bed, cmd: &mut Command, expect: &str, socket: &std::path::Path) {
    let out = run_bounded(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail: {err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("urdmad: error: "),
        "last line is not the error: {err}"
    );
    assert!(
        last.contains(expect),
        "error does not name {expect:?}: {last}"
    );
    let errors: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("urdmad: error"))
        .collect();
    assert_eq!(errors.len(), 1, "{err}");
    bed.assert_nothing_left(socket);
}

/// Kills test client `c` and waits at most `limit` for urdmad's status to be back to
/// `before`.
fn kill_and_await_baseline(
    d: &Urdmad,
    mut c: TestClient,
    before: &(u32, usize, usize, usize),
    limit: Duration,
) {
    // SAFETY: killing the process this test started.
    unsafe { libc::kill(c.pid(), libc::SIGKILL) };
    let _ = c.wait(Duration::from_secs(5));
    let end = Instant::now() + limit;
    loop {
        let st = d.status();
        if baseline(&st) == *before {
            break;
        }
        assert!(
            Instant::now() < end,
            "not back to baseline: {st:?} vs {before:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
