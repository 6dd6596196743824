//! A process that attaches to urdmad as a DPDK secondary, for the daemon's tests: opens
//! flows, reports every frame it receives on stdout, sends frames, or cycles through
//! attach/open/detach.

use clap::Parser;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use urdmad::client::Connection;
use urdmad::frame::udp_frame;
use urdmad::proto::{FlowSpec, Mac};
use urdmad::secondary::Session;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    socket: PathBuf,
    /// Port (index in the attachment) that flows are opened and frames sent on.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Open a flow for this local address (repeatable).
    #[arg(long = "open")]
    opens: Vec<SocketAddrV4>,
    /// Send one UDP datagram after the flows are open: DST_MAC,SRC_IP:PORT,DST_IP:PORT,PAYLOAD
    #[arg(long = "send")]
    sends: Vec<String>,
    /// Wait this long before each --send (milliseconds).
    #[arg(long, default_value_t = 0)]
    send_every_ms: u64,
    /// Receive for this long, then detach.
    #[arg(long, default_value_t = 0.0)]
    run_secs: f64,
    /// Do not take frames off the flow rings (they fill up).
    #[arg(long)]
    hold: bool,
    /// Take this many frames off the first flow's ring and keep them, never freed, as a
    /// process killed while it handles them would (prints KEPT once it has them all).
    #[arg(long, default_value_t = 0)]
    keep: usize,
    /// Allocate this many mbufs after attaching and keep them, never sent or freed.
    #[arg(long, default_value_t = 0)]
    allocate: usize,
    /// After READY, take up to this many lent mbufs and give them back, over and over
    /// until --run-secs ends: a process killed at a random moment of it may be in the
    /// middle of either.
    #[arg(long, default_value_t = 0)]
    churn: usize,
    /// Connect without saying anything and report when urdmad hangs up (at most 5 s).
    #[arg(long)]
    silent: bool,
    /// Attach, open the flows and detach this many times, then exit.
    #[arg(long, default_value_t = 0)]
    cycles: u32,
}

/// The errors of this tool are what it prints: the library's errors, and its own
/// complaints about its arguments.
type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

fn connect(args: &Args) -> CliResult<Session> {
    let conn = Connection::connect(&args.socket, Duration::from_secs(5))?;
    Ok(Session::attach(conn)?)
}

fn open_all(s: &mut Session, args: &Args) -> CliResult<()> {
    for local in &args.opens {
        let f = s.open(FlowSpec {
            port: args.port,
            local: *local,
            remote: None,
            remote_mac: None,
        })?;
        let queue = f.queue.map_or("none".to_string(), |q| q.to_string());
        println!(
            "OPENED flow={} local={} steering={} queue={queue}",
            f.id,
            local,
            f.steering.as_str()
        );
    }
    Ok(())
}

fn send_all(s: &Session, args: &Args) -> CliResult<()> {
    let src_mac = s
        .attachment
        .ports
        .get(usize::from(args.port))
        .ok_or("no such port")?
        .mac;
    for spec in &args.sends {
        let parts: Vec<&str> = spec.splitn(4, ',').collect();
        let [mac, src, dst, payload] = parts[..] else {
            return Err(format!("bad --send {spec:?}").into());
        };
        let mac: Mac = mac.parse().map_err(|e| format!("{e}"))?;
        let src: SocketAddrV4 = src.parse().map_err(|e| format!("{e}"))?;
        let dst: SocketAddrV4 = dst.parse().map_err(|e| format!("{e}"))?;
        std::thread::sleep(Duration::from_millis(args.send_every_ms));
        s.send(
            usize::from(args.port),
            &udp_frame(mac.0, src_mac.0, src, dst, payload.as_bytes()),
        )?;
        println!("SENT {dst}");
    }
    Ok(())
}

/// Waits for urdmad to close a connection on which nothing is sent.
fn silent(args: &Args) -> CliResult<()> {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(&args.socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                println!("HANGUP ms={}", start.elapsed().as_millis());
                return Ok(());
            }
            Ok(_) => continue,
            Err(e) => return Err(format!("no hangup: {e}").into()),
        }
    }
}

fn run(args: &Args) -> CliResult<()> {
    if args.silent {
        return silent(args);
    }
    if args.cycles > 0 {
        for _ in 0..args.cycles {
            let mut s = connect(args)?;
            for local in &args.opens {
                s.open(FlowSpec {
                    port: args.port,
                    local: *local,
                    remote: None,
                    remote_mac: None,
                })?;
            }
            send_all(&s, args)?;
            let first = s.flows.first().map(|f| f.id);
            if let Some(id) = first {
                s.close(id)?;
            }
            s.detach()?;
        }
        println!("CYCLES {}", args.cycles);
        return Ok(());
    }
    let mut s = connect(args)?;
    println!(
        "ATTACHED client={} lcore={}",
        s.attachment.client, s.attachment.lcore
    );
    open_all(&mut s, args)?;
    send_all(&s, args)?;
    let allocated = s.allocate_kept(args.allocate);
    println!("READY allocated={allocated}");
    let end = Instant::now() + Duration::from_secs_f64(args.run_secs);
    if args.churn > 0 {
        let mut rounds = 0u64;
        while Instant::now() < end {
            // None lent: urdmad refills the ring on its next pass.
            if s.churn(args.churn) == 0 {
                std::thread::yield_now();
            }
            rounds += 1;
        }
        println!("CHURNED rounds={rounds}");
    }
    let mut kept = Vec::new();
    while kept.len() < args.keep && Instant::now() < end {
        let mut m = [std::ptr::null_mut(); 1];
        if s.recv_burst(0, &mut m) == 1 {
            kept.push(m[0]);
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if args.keep > 0 {
        println!("KEPT {}", kept.len());
    }
    while Instant::now() < end {
        if args.hold || args.keep > 0 {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let mut got = false;
        for i in 0..s.flows.len() {
            while let Some(frame) = s.recv(i) {
                got = true;
                let f = &s.flows[i];
                let (dst, src) =
                    urdmad::frame::udp4_addresses(&frame).ok_or("non-UDP frame on a flow ring")?;
                let payload = &frame[42.min(frame.len())..];
                println!(
                    "RX flow={} dst={dst} src={src} payload={}",
                    f.id,
                    String::from_utf8_lossy(payload).replace(char::is_whitespace, "_")
                );
            }
        }
        if !got {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    s.detach()?;
    println!("DETACHED");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("urdmad-testclient: error: {e}");
            ExitCode::FAILURE
        }
    }
}
