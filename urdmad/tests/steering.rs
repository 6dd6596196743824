//! Per-flow steering on a port whose PMD implements rte_flow: a TAP port (`net_tap`, whose
//! rules are tc flower filters with a skbedit queue action on the TAP's multiq qdisc).
//!
//! urdmad runs in namespace A with two TAPs there: the data port (`…d`, the DPDK port under
//! test) and its exception interface. The "wire peer" is namespace A's kernel sending UDP
//! out of the data TAP: it holds 10.98.0.2 on it and a permanent neighbour entry for the
//! flows' address 10.98.0.1 with the port's MAC.
//!
//! The `hardware_*` tests need a kernel with sch_multiq, cls_flower and act_skbedit (Debian's
//! 6.1 has them as modules; the development hosts' kernel has none), so they are ignored in a
//! plain `cargo test` and run in the VM:
//!   scripts/vm --no-kmod -- TESTBINARY --ignored --test-threads=1
//! Each of them first asserts that the port really runs in hardware mode. On any kernel,
//! `tap_port_steering_follows_what_the_kernel_offers` checks the start-up choice against an
//! independent probe of the kernel and that flows work in whichever mode was chosen.

mod common;

use common::*;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};
use urdmad::status::{Daemon, Exception, Flow, Pool, Port, Queue};

const FLOW_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 1);
const SENDER_IP: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 2);

fn flow(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(FLOW_IP, port)
}

/// A bed whose urdmad port is a TAP, with the kernel of namespace A as the sender.
struct TapBed {
    bed: Bed,
    dtap: String,
    d: Urdmad,
    sender: UdpSocket,
}

impl TapBed {
    /// `port_extra` lines go into the `[[port]]` section.
    fn start(tag: &str, port_extra: &str) -> TapBed {
        Self::start_env(tag, port_extra, &[])
    }

    fn start_env(tag: &str, port_extra: &str, env: &[(&str, &str)]) -> TapBed {
        // The sch_multiq/cls_flower/act_skbedit modules load on demand where they exist.
        let bed = Bed::new(tag);
        let dtap = format!("{}d", bed.veth_a.trim_end_matches('a'));
        let device = format!("net_tap_data{tag},iface={dtap}");
        let text = bed.config("", Some(&device)) + port_extra + "\n";
        let cfg = bed.write_config("tap.toml", &text);
        let d = bed.start_with_env(&cfg, env);
        let mac = one::<Port>(&d.status()).mac.clone();
        for args in [
            vec!["link", "set", &dtap, "up"],
            vec!["addr", "add", "10.98.0.2/24", "dev", &dtap],
        ] {
            let mut a = vec!["ip", "-n", &bed.ns_a];
            a.extend(args);
            sh(&a);
        }
        sh(&[
            "ip",
            "-n",
            &bed.ns_a,
            "neigh",
            "replace",
            &FLOW_IP.to_string(),
            "lladdr",
            &mac,
            "dev",
            &dtap,
            "nud",
            "permanent",
        ]);
        let sender = udp_in(&bed.ns_a, SocketAddrV4::new(SENDER_IP, 6000));
        TapBed {
            bed,
            dtap,
            d,
            sender,
        }
    }

    fn send(&self, datagrams: &[(u16, &str)]) {
        for (port, payload) in datagrams {
            self.sender
                .send_to(payload.as_bytes(), flow(*port))
                .expect("send");
        }
    }

    fn status(&self) -> Vec<Record> {
        self.d.status()
    }

    /// The tc filters the TAP PMD installed for rte_flow rules, as the queue each one
    /// steers to.
    fn tc_rules(&self) -> Vec<u16> {
        let out = run_bounded(
            Command::new("ip").args([
                "netns",
                "exec",
                &self.bed.ns_a,
                "tc",
                "filter",
                "show",
                "dev",
                &self.dtap,
                "parent",
                "1:",
            ]),
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "tc filter show failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split("skbedit queue_mapping ").nth(1))
            .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
            .collect()
    }

    fn assert_hardware(&self) {
        let st = self.status();
        assert_eq!(
            one::<Port>(&st).steering,
            "hardware",
            "the port must run with hardware steering (a kernel with sch_multiq, cls_flower and act_skbedit): {st:?}"
        );
    }

    /// Waits until status has no flow rule and every flow queue is free, and tc shows only
    /// the catch-all rule (to queue 0).
    fn assert_no_rules_within(&self, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let st = self.status();
            let (daemon, port) = (one::<Daemon>(&st), one::<Port>(&st));
            let clean =
                daemon.flow_rules == 0 && port.free_queues == port.flow_queues && daemon.flows == 0;
            let tc = self.tc_rules();
            if clean && tc == [0] {
                return;
            }
            assert!(
                Instant::now() < end,
                "rules or queues not released within {limit:?}: tc {tc:?}, status {st:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `OPENED flow=N local=A steering=S queue=Q` → (N, S, Q).
fn opened(line: &str) -> (String, String, String) {
    let get = |k: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {line:?}"))
            .to_owned()
    };
    (get("flow"), get("steering"), get("queue"))
}

/// The status record of flow `id` (as the client printed it).
fn flow_record<'a>(st: &'a [Record], id: &str) -> &'a Flow {
    let id: u32 = id.parse().unwrap();
    find::<Flow>(st, |f| f.id == id).unwrap_or_else(|| panic!("no flow {id}: {st:?}"))
}

/// The payloads a client printed for flow `id`.
fn received(lines: &[String], id: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.starts_with(&format!("RX flow={id} ")))
        .map(|l| l.rsplit("payload=").next().unwrap().to_owned())
        .collect()
}

/// Whether this kernel can do what the TAP PMD's rte_flow needs, asked of the kernel itself
/// on a veth in namespace B.
fn kernel_has_tc_flower(bed: &Bed) -> bool {
    let ok = |args: &[&str]| {
        run_bounded(
            Command::new("tc").args(["-n", &bed.ns_b]).args(args),
            Duration::from_secs(10),
        )
        .status
        .success()
    };
    ok(&[
        "qdisc",
        "add",
        "dev",
        &bed.veth_b,
        "root",
        "handle",
        "1:",
        "multiq",
    ]) && ok(&[
        "filter",
        "add",
        "dev",
        &bed.veth_b,
        "parent",
        "1:",
        "protocol",
        "ip",
        "flower",
        "ip_proto",
        "udp",
        "dst_port",
        "9",
        "action",
        "skbedit",
        "queue_mapping",
        "0",
    ])
}

/// A test client that opens a flow to each of `ports` and stays attached for `secs` seconds.
fn client_with_flows(t: &TapBed, ports: [u16; 2], secs: u32) -> TestClient {
    let [a, b] = ports.map(|p| flow(p).to_string());
    let secs = secs.to_string();
    TestClient::spawn(
        &t.bed.socket(),
        &["--open", &a, "--open", &b, "--run-secs", &secs],
    )
}

/// Waits for a two-flow client's two OPENED lines, in order, and its READY.
fn two_opened(c: &mut TestClient) -> [(String, String, String); 2] {
    let first = opened(&c.wait_for("OPENED", Duration::from_secs(30)));
    let second = opened(&c.wait_for("OPENED", Duration::from_secs(10)));
    c.wait_for("READY", Duration::from_secs(10));
    [first, second]
}

/// Two flows open, datagrams to each and to an unknown port; returns the client's lines.
fn two_flows_exchange(t: &TapBed, expect: &str) -> Vec<String> {
    let mut c = client_with_flows(t, [5001, 5002], 6);
    let [(f1, s1, _), (f2, s2, _)] = two_opened(&mut c);
    assert_eq!((s1.as_str(), s2.as_str()), (expect, expect));
    let before = one::<Exception>(&t.status()).to_kernel;
    t.send(&[
        (5001, "one-a"),
        (5002, "two-a"),
        (7000, "kernel-a"),
        (5001, "one-b"),
        (7001, "kernel-b"),
        (5002, "two-b"),
    ]);
    let lines = c.collect(Duration::from_secs(2)).to_vec();
    assert_eq!(received(&lines, &f1), ["one-a", "one-b"], "{lines:?}");
    assert_eq!(received(&lines, &f2), ["two-a", "two-b"], "{lines:?}");
    let st = t.status();
    assert!(
        one::<Exception>(&st).to_kernel >= before + 2,
        "unknown ports must reach the kernel: {st:?}"
    );
    assert_eq!(c.wait(Duration::from_secs(20)).code(), Some(0));
    lines
}

#[test]
fn tap_port_steering_follows_what_the_kernel_offers() {
    let t = TapBed::start("ta", "");
    let capable = kernel_has_tc_flower(&t.bed);
    let st = t.status();
    let port = one::<Port>(&st);
    let mode = port.steering.clone();
    if capable {
        assert_eq!(mode, "hardware", "{st:?}");
        // The TAP PMD shares at most 8 queue descriptors with secondaries: 3 flow queues.
        assert_eq!(port.flow_queues, 3, "{st:?}");
        assert_eq!(t.tc_rules(), [0], "only the catch-all rule at start");
    } else {
        assert_eq!(mode, "software", "{st:?}");
        let reason = port.steering_reason.as_deref().unwrap_or_default();
        assert!(reason.contains("rule not created"), "{st:?}");
        assert_eq!(port.flow_queues, 0, "{st:?}");
    }
    two_flows_exchange(&t, &mode);
    if capable {
        t.assert_no_rules_within(Duration::from_secs(2));
    } else {
        let end = Instant::now() + Duration::from_secs(2);
        while one::<Daemon>(&t.status()).flows != 0 {
            assert!(Instant::now() < end, "flows not released");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
#[ignore = "needs tc flower in the kernel: run in the VM (see the module documentation)"]
fn hardware_two_flows_on_their_own_queues_and_rules_removed_on_close_and_kill() {
    let t = TapBed::start("hw", "");
    t.assert_hardware();
    two_flows_exchange(&t, "hardware");
    // The client detached at its end (one flow closed by CLOSE, the other by DETACH).
    t.assert_no_rules_within(Duration::from_secs(2));

    // Counted on the flow queues, not by software classification.
    let st = t.status();
    let on_queues: u64 = status::all::<Queue>(&st).map(|q| q.rx_packets).sum();
    assert!(
        on_queues >= 4,
        "datagrams did not arrive on flow queues: {st:?}"
    );

    // kill -9: the rules go within a second; the queues return to the pool.
    let mut c = client_with_flows(&t, [5003, 5004], 30);
    c.wait_for("READY", Duration::from_secs(30));
    let st = t.status();
    assert_eq!(one::<Daemon>(&st).flow_rules, 2, "{st:?}");
    let mut tc = t.tc_rules();
    tc.sort();
    assert_eq!(tc.len(), 3, "catch-all and two flow rules: {tc:?}");
    // SAFETY: signalling the process we started.
    unsafe { libc::kill(c.pid(), libc::SIGKILL) };
    let _ = c.wait(Duration::from_secs(5));
    t.assert_no_rules_within(Duration::from_secs(1));
}

#[test]
#[ignore = "needs tc flower in the kernel: run in the VM (see the module documentation)"]
fn hardware_fifty_cycles_leak_no_rule_and_no_queue() {
    let t = TapBed::start("cy", "");
    t.assert_hardware();
    let baseline = one::<Pool>(&t.status()).in_use;
    let out = wait_bounded(
        Command::new(TESTCLIENT)
            .arg("--socket")
            .arg(t.bed.socket())
            .args([
                "--open",
                &flow(5001).to_string(),
                "--open",
                &flow(5002).to_string(),
                "--cycles",
                "50",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(240),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.assert_no_rules_within(Duration::from_secs(2));
    let st = t.status();
    assert_eq!(one::<Port>(&st).quarantined_queues, 0, "{st:?}");
    assert_eq!(one::<Daemon>(&st).rings, 0, "{st:?}");
    assert_eq!(one::<Pool>(&st).in_use, baseline, "{st:?}");
    // The queues still work after the cycles.
    two_flows_exchange(&t, "hardware");
}

#[test]
#[ignore = "needs tc flower in the kernel: run in the VM (see the module documentation)"]
fn hardware_pool_exhausted_flow_falls_back_to_software_and_works() {
    let t = TapBed::start("ex", "flow_queues = 1");
    t.assert_hardware();
    let mut c = client_with_flows(&t, [5001, 5002], 6);
    let [(f1, s1, q1), (f2, s2, q2)] = two_opened(&mut c);
    assert_eq!((s1.as_str(), q1.as_str()), ("hardware", "1"));
    assert_eq!((s2.as_str(), q2.as_str()), ("software", "none"));
    let st = t.status();
    let fb = flow_record(&st, &f2)
        .fallback
        .clone()
        .expect("fallback reason");
    assert!(fb.contains("in use"), "{fb}");
    assert_eq!(flow_record(&st, &f1).steering, "hardware", "{st:?}");
    t.send(&[(5001, "one"), (5002, "two"), (5002, "two-again")]);
    let lines = c.collect(Duration::from_secs(2)).to_vec();
    assert_eq!(received(&lines, &f1), ["one"], "{lines:?}");
    assert_eq!(received(&lines, &f2), ["two", "two-again"], "{lines:?}");
    assert_eq!(c.wait(Duration::from_secs(20)).code(), Some(0));
    t.assert_no_rules_within(Duration::from_secs(2));
}

#[test]
#[ignore = "needs tc flower in the kernel: run in the VM (see the module documentation)"]
fn hardware_rule_failures_fall_back_and_quarantine() {
    // The second flow rule's creation fails; so does the first destruction.
    let t = TapBed::start_env("rf", "", &[("URDMAD_TEST_FAIL_RULE", "create:2,destroy:1")]);
    t.assert_hardware();
    let mut c = client_with_flows(&t, [5001, 5002], 5);
    let [(f1, s1, q1), (f2, s2, _)] = two_opened(&mut c);
    assert_eq!((s1.as_str(), s2.as_str()), ("hardware", "software"));
    let st = t.status();
    let fb = flow_record(&st, &f2)
        .fallback
        .clone()
        .expect("fallback reason");
    assert!(fb.contains("rule not created"), "{fb}");
    t.send(&[(5001, "one"), (5002, "two")]);
    let lines = c.collect(Duration::from_secs(2)).to_vec();
    assert_eq!(received(&lines, &f1), ["one"], "{lines:?}");
    assert_eq!(received(&lines, &f2), ["two"], "{lines:?}");
    assert_eq!(c.wait(Duration::from_secs(20)).code(), Some(0));

    // The first flow's rule could not be destroyed: its queue is quarantined, the rule is
    // still counted and still in the kernel, and the queue is never handed out again.
    let end = Instant::now() + Duration::from_secs(2);
    while one::<Daemon>(&t.status()).flows != 0 {
        assert!(Instant::now() < end, "flows not released");
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = t.status();
    assert_eq!(one::<Port>(&st).quarantined_queues, 1, "{st:?}");
    assert_eq!(one::<Daemon>(&st).flow_rules, 1, "{st:?}");
    let q1: u16 = q1.parse().unwrap();
    assert_eq!(
        find::<Queue>(&st, |q| q.id == q1).map(|q| q.state.as_str()),
        Some("quarantined"),
        "{st:?}"
    );
    let mut tc = t.tc_rules();
    tc.sort();
    assert_eq!(tc, [0, q1], "{tc:?}");
    for round in 0..2 {
        let mut c = TestClient::spawn(
            &t.bed.socket(),
            &["--open", &flow(5003).to_string(), "--run-secs", "4"],
        );
        let (f3, s3, q3) = opened(&c.wait_for("OPENED", Duration::from_secs(30)));
        c.wait_for("READY", Duration::from_secs(10));
        assert_eq!(s3, "hardware", "round {round}");
        assert_ne!(
            q3,
            q1.to_string(),
            "a quarantined queue was handed out again"
        );
        t.send(&[(5003, "three")]);
        let lines = c.collect(Duration::from_secs(2)).to_vec();
        assert_eq!(received(&lines, &f3), ["three"], "{lines:?}");
        assert_eq!(c.wait(Duration::from_secs(20)).code(), Some(0));
    }
}
