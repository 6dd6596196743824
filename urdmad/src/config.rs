//! urdmad's configuration file (TOML). The shipped example, `urdmad.toml`, documents every
//! field; [`DEFAULT`] is what urdmad uses when no file is given and works unedited in the
//! VM test bed (an af_packet port on `veth0`).

use crate::netlink::Prefix;
use crate::portfilter::MAX_DIRECT;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Built-in configuration, used when `--config` is not given.
pub const DEFAULT: &str = include_str!("../urdmad.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: Daemon,
    #[serde(rename = "port")]
    pub ports: Vec<Port>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Daemon {
    /// Unix control socket.
    pub socket: PathBuf,
    /// Permission bits of the socket file, octal. urdmad checks every peer's credentials
    /// itself, so a wider mode only changes who hears the refusal from urdmad.
    pub socket_mode: String,
    /// Besides root, members of this group may attach. Empty: root only.
    pub group: String,
    /// DPDK `--file-prefix`: names the shared memory that secondaries attach to.
    pub file_prefix: String,
    /// Hugepage memory urdmad reserves at start-up, MiB.
    pub memory_mb: u32,
    /// Mbufs in the shared pool (RX for every port and TX for every process).
    pub mbufs: u32,
    /// Entries in each flow's RX ring and each process's TX ring (power of two).
    pub ring_size: u32,
    /// Frames in each direction of a direct connection's socket rings (af_packet ports
    /// with `direct`; `direct::Geometry`).
    pub direct_frames: u32,
    /// Sockets with rings of that size kept ready for connections to come, so that a
    /// connection does not wait for its rings to be set up (`socket_keeper`); 0: each is
    /// made when needed.
    pub direct_ready: u32,
    pub log_level: String,
    /// Sleep between polls once nothing has arrived for a while, microseconds; 0 polls
    /// without pause (a dedicated core).
    pub idle_sleep_us: u32,
    /// Longest sleep between polls once idle for a while, microseconds (the idle back-off
    /// doubles the sleep from `idle_sleep_us` up to this).
    pub idle_sleep_max_us: u32,
    /// Scheduling priority (nice value, -20..=19) of the thread that forwards frames; `None`:
    /// the one urdmad was started with. Every frame of a connection through urdmad waits for
    /// that thread, but a raised one spins at the applications' expense (docs/urdmad.md,
    /// "Priority").
    pub nice: Option<i32>,
    /// Extra EAL arguments, appended as given.
    pub eal_args: Vec<String>,
    /// urdma.ko's connection channel (docs/connection.md). When it does not exist urdmad
    /// runs without connection management. (A Unix `SOCK_SEQPACKET` socket works too: tests
    /// put a fake kernel there.)
    pub cm_device: PathBuf,
}

impl Default for Daemon {
    fn default() -> Self {
        Daemon {
            socket: PathBuf::from("/run/urdma/urdmad.sock"),
            socket_mode: "0660".into(),
            group: "urdma".into(),
            file_prefix: "urdma".into(),
            memory_mb: 128,
            mbufs: 8191,
            ring_size: 1024,
            direct_frames: 256,
            direct_ready: 4,
            log_level: "info".into(),
            idle_sleep_us: 100,
            idle_sleep_max_us: 4000,
            nice: None,
            eal_args: Vec::new(),
            cm_device: PathBuf::from("/dev/urdma_cm"),
        }
    }
}

/// Longest RDMA device name (`IB_DEVICE_NAME_MAX` less its NUL).
pub const MAX_RDMA_NAME: usize = 63;

/// A name the kernel takes as it is: `%` would make it a template (`urdma%d`).
fn valid_rdma_name(name: &str) -> bool {
    (1..=MAX_RDMA_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Most flow queues per port (queue 0 stays the port's default queue).
pub const MAX_FLOW_QUEUES: u16 = 1023;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SteeringChoice {
    /// Hardware steering if the PMD accepts the rules, software otherwise.
    Auto,
    Software,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// Name used in logs, status and by processes.
    pub name: String,
    /// A PCI address (`0000:03:00.0`) or a vdev with its arguments
    /// (`net_af_packet0,iface=veth0`).
    pub device: String,
    /// Name of the kernel interface of the exception path (a TAP carrying the port's MAC).
    pub exception: String,
    /// Addresses urdmad puts on the exception interface, bringing it up, when it creates it
    /// (they go with the interface when urdmad stops).
    #[serde(default)]
    pub addresses: Vec<Prefix>,
    /// The urdma device urdmad creates on the exception interface once urdma.ko allows
    /// (`rdma link add NAME type urdma netdev EXCEPTION`) and deletes when it stops.
    #[serde(default)]
    pub rdma_device: Option<String>,
    #[serde(default = "default_steering")]
    pub steering: SteeringChoice,
    #[serde(default = "default_queue")]
    pub rx_descriptors: u16,
    #[serde(default = "default_queue")]
    pub tx_descriptors: u16,
    /// Extra RX queues for hardware steering: each open flow takes one while any is free.
    /// 0 disables hardware steering on the port.
    #[serde(default = "default_flow_queues")]
    pub flow_queues: u16,
    /// Descriptors of each flow queue (each holds that many mbufs of the shared pool).
    #[serde(default = "default_flow_queue_descriptors")]
    pub flow_queue_descriptors: u16,
    /// Ask for the CRC32C trailer on the connections of this port (either end's asking is
    /// enough for a connection to use it).
    #[serde(default = "default_crc")]
    pub crc: bool,
    /// Hand each connection its own packet socket on the port's interface (af_packet ports
    /// only: `direct`), so that its frames bypass urdmad.
    #[serde(default = "default_direct")]
    pub direct: bool,
    /// Most connections of the port on the direct path at once; later ones go through
    /// urdmad. Every direct socket's filter runs on every frame of the interface, so each
    /// makes all frames dearer (docs/urdmad.md, "The direct path", has the figures).
    #[serde(default = "default_direct_max")]
    pub direct_max: u32,
}

fn default_direct() -> bool {
    true
}

fn default_direct_max() -> u32 {
    16
}

fn default_crc() -> bool {
    true
}

fn default_flow_queues() -> u16 {
    8
}

fn default_flow_queue_descriptors() -> u16 {
    128
}

fn default_steering() -> SteeringChoice {
    SteeringChoice::Auto
}

fn default_queue() -> u16 {
    512
}

/// Why a configuration was not accepted. Each prints as one line naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {error}", .path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not valid TOML, or not the shape of a configuration (an unknown field, a wrong type).
    /// `line` is where the parser points, when it does.
    #[error("{origin}: {}{message}", line_prefix(*.line))]
    Syntax {
        origin: String,
        line: Option<usize>,
        message: String,
    },
    /// Well-formed, but a value is not acceptable.
    #[error("{origin}: {error}")]
    Invalid {
        origin: String,
        error: ValidationError,
    },
}

fn line_prefix(line: Option<usize>) -> String {
    line.map_or_else(String::new, |l| format!("line {l}: "))
}

/// A value of a well-formed configuration that urdmad does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("socket_mode {socket_mode:?} is not an octal mode like \"0660\"")]
    SocketMode { socket_mode: String },
    #[error("no [[port]] configured")]
    NoPorts,
    #[error("ring_size {ring_size} is not a power of two >= 16")]
    RingSize { ring_size: u32 },
    #[error("direct_frames {direct_frames} is not between 16 and 65536")]
    DirectFrames { direct_frames: u32 },
    #[error("direct_ready {direct_ready} is above 64")]
    DirectReady { direct_ready: u32 },
    #[error("mbufs {mbufs} is below 1024")]
    Mbufs { mbufs: u32 },
    #[error("nice {nice} is not between -20 and 19")]
    Nice { nice: i32 },
    #[error("file_prefix {file_prefix:?} must be letters, digits, - or _")]
    FilePrefix { file_prefix: String },
    /// `index` is the port's position in the file (its name is what is wrong).
    #[error("port {index}: name {name:?} must be one word")]
    PortName { index: usize, name: String },
    #[error("port {port}: exception interface name {exception:?} is not a valid interface name")]
    ExceptionName { port: String, exception: String },
    #[error("port {port}: device {device:?} is empty or contains spaces")]
    Device { port: String, device: String },
    #[error("port {port}: flow_queues {flow_queues} is above {MAX_FLOW_QUEUES}")]
    FlowQueues { port: String, flow_queues: u16 },
    #[error("port {port}: direct_max {direct_max} is not between 1 and {MAX_DIRECT}")]
    DirectMax { port: String, direct_max: u32 },
    #[error(
        "port {port}: rdma_device {name:?} is not 1 to {MAX_RDMA_NAME} letters, digits, - _ or ."
    )]
    RdmaDevice { port: String, name: String },
    #[error("port {port}: name, exception interface or rdma_device used twice")]
    Duplicate { port: String },
}

impl Config {
    /// Parses and validates; the error is one line naming the problem.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            origin: origin.to_string(),
            line: e.span().map(|span| {
                let before = text.get(..span.start).unwrap_or(text);
                before.matches('\n').count() + 1
            }),
            message: e.message().replace('\n', " "),
        })?;
        cfg.validate().map_err(|error| ConfigError::Invalid {
            origin: origin.to_string(),
            error,
        })?;
        Ok(cfg)
    }

    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            None => Config::parse(DEFAULT, "built-in configuration"),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|error| ConfigError::Read {
                    path: p.to_path_buf(),
                    error,
                })?;
                Config::parse(&text, &p.display().to_string())
            }
        }
    }

    /// The socket's permission bits.
    pub fn socket_mode(&self) -> u32 {
        u32::from_str_radix(&self.daemon.socket_mode, 8).unwrap_or(0o660)
    }

    fn validate(&self) -> Result<(), ValidationError> {
        let d = &self.daemon;
        match u32::from_str_radix(&d.socket_mode, 8) {
            Ok(m) if m <= 0o777 => {}
            _ => {
                return Err(ValidationError::SocketMode {
                    socket_mode: d.socket_mode.clone(),
                })
            }
        }
        if self.ports.is_empty() {
            return Err(ValidationError::NoPorts);
        }
        if !d.ring_size.is_power_of_two() || d.ring_size < 16 {
            return Err(ValidationError::RingSize {
                ring_size: d.ring_size,
            });
        }
        if !(16..=65536).contains(&d.direct_frames) {
            return Err(ValidationError::DirectFrames {
                direct_frames: d.direct_frames,
            });
        }
        if d.direct_ready > 64 {
            return Err(ValidationError::DirectReady {
                direct_ready: d.direct_ready,
            });
        }
        if d.mbufs < 1024 {
            return Err(ValidationError::Mbufs { mbufs: d.mbufs });
        }
        if let Some(nice) = d.nice.filter(|n| !(-20..=19).contains(n)) {
            return Err(ValidationError::Nice { nice });
        }
        if d.file_prefix.is_empty()
            || !d
                .file_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ValidationError::FilePrefix {
                file_prefix: d.file_prefix.clone(),
            });
        }
        for (i, p) in self.ports.iter().enumerate() {
            if p.name.is_empty() || !p.name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ValidationError::PortName {
                    index: i,
                    name: p.name.clone(),
                });
            }
            if p.exception.is_empty()
                || p.exception.len() > 15
                || !p
                    .exception
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            {
                return Err(ValidationError::ExceptionName {
                    port: p.name.clone(),
                    exception: p.exception.clone(),
                });
            }
            if p.device.is_empty() || p.device.contains(char::is_whitespace) {
                return Err(ValidationError::Device {
                    port: p.name.clone(),
                    device: p.device.clone(),
                });
            }
            if p.flow_queues > MAX_FLOW_QUEUES {
                return Err(ValidationError::FlowQueues {
                    port: p.name.clone(),
                    flow_queues: p.flow_queues,
                });
            }
            if !(1..=MAX_DIRECT).contains(&p.direct_max) {
                return Err(ValidationError::DirectMax {
                    port: p.name.clone(),
                    direct_max: p.direct_max,
                });
            }
            if let Some(name) = p.rdma_device.as_ref().filter(|n| !valid_rdma_name(n)) {
                return Err(ValidationError::RdmaDevice {
                    port: p.name.clone(),
                    name: name.clone(),
                });
            }
            if self.ports[..i].iter().any(|q| {
                q.name == p.name
                    || q.exception == p.exception
                    || (q.rdma_device.is_some() && q.rdma_device == p.rdma_device)
            }) {
                return Err(ValidationError::Duplicate {
                    port: p.name.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_default_parses() {
        let c = Config::load(None).unwrap();
        assert_eq!(c.ports.len(), 1);
        assert!(c.ports[0].device.contains("veth0"));
        // Unset, the forwarding thread keeps the priority urdmad was started with.
        assert_eq!(c.daemon.nice, None);
        let c = Config::parse(&with("nice = -10", ""), "u.toml").unwrap();
        assert_eq!(c.daemon.nice, Some(-10));
    }

    #[test]
    fn malformed_config_names_the_line() {
        let e = Config::parse("[daemon]\nsocket = \n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml: line 2"), "{e}");
        assert!(!e.contains('\n'));
        let e = Config::parse(
            "[[port]]\nname='a'\ndevice='net_null0'\nexception='t'\nbogus=1\n",
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = Config::parse("[daemon]\n", "x").unwrap_err().to_string();
        assert!(e.contains("port"), "{e}");
    }

    /// A configuration with one valid port, `daemon` appended to its `[daemon]` table and
    /// `port` to its `[[port]]` table.
    fn with(daemon: &str, port: &str) -> String {
        format!(
            "[daemon]\n{daemon}\n[[port]]\nname = 'p0'\ndevice = 'net_null0'\nexception = 'tap0'\n{port}\n"
        )
    }

    fn message(text: &str) -> String {
        Config::parse(text, "u.toml").unwrap_err().to_string()
    }

    #[test]
    fn validation_messages_are_pinned() {
        assert!(Config::parse(&with("", ""), "u.toml").is_ok());
        let cases = [
            (
                with("socket_mode = '999'", ""),
                r#"u.toml: socket_mode "999" is not an octal mode like "0660""#,
            ),
            ("port = []\n".to_string(), "u.toml: no [[port]] configured"),
            (
                with("ring_size = 100", ""),
                "u.toml: ring_size 100 is not a power of two >= 16",
            ),
            (
                with("ring_size = 8", ""),
                "u.toml: ring_size 8 is not a power of two >= 16",
            ),
            (with("mbufs = 1000", ""), "u.toml: mbufs 1000 is below 1024"),
            (
                with("direct_ready = 65", ""),
                "u.toml: direct_ready 65 is above 64",
            ),
            (
                with("nice = -21", ""),
                "u.toml: nice -21 is not between -20 and 19",
            ),
            (
                with("nice = 20", ""),
                "u.toml: nice 20 is not between -20 and 19",
            ),
            (
                with("file_prefix = 'a b'", ""),
                r#"u.toml: file_prefix "a b" must be letters, digits, - or _"#,
            ),
            (
                with("", "").replace("name = 'p0'", "name = 'two words'"),
                r#"u.toml: port 0: name "two words" must be one word"#,
            ),
            (
                with("", "").replace("exception = 'tap0'", "exception = 'much-too-long-name'"),
                r#"u.toml: port p0: exception interface name "much-too-long-name" is not a valid interface name"#,
            ),
            (
                with("", "").replace("device = 'net_null0'", "device = 'net null0'"),
                r#"u.toml: port p0: device "net null0" is empty or contains spaces"#,
            ),
            (
                with("", "flow_queues = 1024"),
                "u.toml: port p0: flow_queues 1024 is above 1023",
            ),
            (
                with("", "direct_max = 0"),
                "u.toml: port p0: direct_max 0 is not between 1 and 512",
            ),
            (
                with("", "direct_max = 513"),
                "u.toml: port p0: direct_max 513 is not between 1 and 512",
            ),
            (
                format!(
                    "{}[[port]]\nname = 'p1'\ndevice = 'net_null1'\nexception = 'tap0'\n",
                    with("", "")
                ),
                "u.toml: port p1: name, exception interface or rdma_device used twice",
            ),
            (
                format!(
                    "{}[[port]]\nname = 'p1'\ndevice = 'net_null1'\nexception = 'tap1'\nrdma_device = 'u0'\n",
                    with("", "rdma_device = 'u0'")
                ),
                "u.toml: port p1: name, exception interface or rdma_device used twice",
            ),
            (
                with("", "rdma_device = 'urdma%d'"),
                r#"u.toml: port p0: rdma_device "urdma%d" is not 1 to 63 letters, digits, - _ or ."#,
            ),
            (
                with("", "rdma_device = ''"),
                r#"u.toml: port p0: rdma_device "" is not 1 to 63 letters, digits, - _ or ."#,
            ),
        ];
        for (text, expect) in cases {
            assert_eq!(message(&text), expect, "{text}");
        }
    }

    #[test]
    fn a_port_names_its_addresses_and_device() {
        let c = Config::parse(
            &with(
                "",
                "addresses = ['10.77.0.1/24', 'fd00::1/64']\nrdma_device = 'urdma0'",
            ),
            "u.toml",
        )
        .unwrap();
        let p = &c.ports[0];
        let shown: Vec<String> = p.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.77.0.1/24", "fd00::1/64"]);
        assert_eq!(p.rdma_device.as_deref(), Some("urdma0"));
        let plain = &Config::parse(&with("", ""), "u.toml").unwrap().ports[0];
        assert!(plain.addresses.is_empty() && plain.rdma_device.is_none());
        let e = message(&with("", "addresses = ['10.77.0.1']"));
        assert!(e.starts_with("u.toml: line 7: "), "{e}");
        assert!(
            e.contains(r#""10.77.0.1" is not an address with its prefix length"#),
            "{e}"
        );
    }

    #[test]
    fn syntax_and_read_messages_are_pinned() {
        assert_eq!(
            message("[daemon]\nmbufs = 'many'\n"),
            "u.toml: line 2: invalid type: string \"many\", expected u32"
        );
        let e = message("[[port]]\nname = 'p0'\n");
        assert!(e.starts_with("u.toml: "), "{e}");
        assert!(e.contains("missing field `device`"), "{e}");
        let e = Config::load(Some(Path::new("/nonexistent/urdmad.toml")))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "cannot read /nonexistent/urdmad.toml: No such file or directory (os error 2)"
        );
    }
}
