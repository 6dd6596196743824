//! `urdmad`: the daemon, `urdmad --check-config`, and `urdmad status`.

use clap::{Parser, Subcommand};
use std::fmt::Display;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use urdmad::client::Connection;
use urdmad::config::Config;
use urdmad::status;

#[derive(Parser)]
#[command(
    version,
    about = "urdma daemon: owns the NIC through DPDK and steers each QP's packets"
)]
struct Cli {
    /// Configuration file (TOML); without it the built-in default is used.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace), overriding the configuration.
    #[arg(long)]
    log_level: Option<String>,
    /// Check the configuration and exit.
    #[arg(long)]
    check_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the running daemon's ports, processes, flows and counters: a line per record
    /// (`kind key=value ...`), or with --json one JSON document.
    Status {
        /// Control socket (default: the one in the configuration).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// One JSON object: per kind of record, the list of its records.
        #[arg(long)]
        json: bool,
    },
}

/// The report as `urdmad status` prints it.
fn show_status(records: &[status::Record], json: bool) -> String {
    if json {
        let doc = status::document(records);
        return serde_json::to_string_pretty(&doc).expect("a JSON value prints") + "\n";
    }
    records
        .iter()
        .map(|r| status::text_line(r) + "\n")
        .collect()
}

fn fail(msg: impl Display) -> ExitCode {
    eprintln!("urdmad: error: {msg}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    // systemd sets RUNTIME_DIRECTORY for the unit's RuntimeDirectory= (the control socket's
    // /run/urdma), and DPDK's EAL prefers it to /var/run/dpdk for its runtime files, where
    // the applications, outside the unit, look for them (eal::runtime_dir). Removed while
    // the process has one thread.
    std::env::remove_var("RUNTIME_DIRECTORY");
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if let Some(Command::Status { socket, json }) = cli.command {
        let path = socket.unwrap_or(cfg.daemon.socket);
        return match Connection::connect(&path, Duration::from_secs(5))
            .and_then(|mut c| c.status())
            .map(|records| show_status(&records, json))
        {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    }
    if cli.check_config {
        println!(
            "configuration OK: {} port(s), socket {}, file prefix {}",
            cfg.ports.len(),
            cfg.daemon.socket.display(),
            cfg.daemon.file_prefix
        );
        return ExitCode::SUCCESS;
    }
    let level = cli
        .log_level
        .unwrap_or_else(|| cfg.daemon.log_level.clone());
    if let Err(e) = urdmad::logging::init(&level) {
        return fail(&e);
    }
    let mut cfg = cfg;
    cfg.daemon.log_level = level;
    match urdmad::service::run(cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::debug!("start-up failed: {e}");
            fail(&e)
        }
    }
}
