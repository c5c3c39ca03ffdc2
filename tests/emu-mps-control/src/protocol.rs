//! The control daemon's stdin command language: parsing one line into a [`Command`] and the
//! reply texts.
//!
//! Commands and their meaning follow NVIDIA's MPS documentation ("Tools and Interface
//! Reference", nvidia-cuda-mps-control(1)): `get_server_list`, `start_server -uid <uid>`,
//! `get_client_list <server pid>`, `get_device_client_list [<pid>]`,
//! `set_default_active_thread_percentage <p>` (affects servers spawned afterwards, lost on
//! `quit`, default 100), `get_default_active_thread_percentage`,
//! `set_active_thread_percentage <server pid> <p>`, `get_active_thread_percentage <pid>`,
//! `set_default_device_pinned_mem_limit <dev> <value>`, `get_default_device_pinned_mem_limit
//! <dev>`, `set_device_pinned_mem_limit <pid> <dev> <value>`, `terminate_client <server pid>
//! <client pid>`, `shutdown_server <server pid> [-f]`, `quit [-t <seconds>]`. The percentage setters echo the value as the real
//! daemon does (`50.0`).

use std::fmt;

/// One parsed control command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `get_server_list`.
    GetServerList,
    /// `start_server -uid <uid>`.
    StartServer {
        /// User the server runs for.
        uid: u32,
    },
    /// `get_client_list <server pid>`.
    GetClientList {
        /// Server pid.
        server: u32,
    },
    /// `get_device_client_list [<server pid>]`.
    GetDeviceClientList {
        /// Optional server pid.
        server: Option<u32>,
    },
    /// `set_default_active_thread_percentage <p>`.
    SetDefaultPercentage(f64),
    /// `get_default_active_thread_percentage`.
    GetDefaultPercentage,
    /// `set_active_thread_percentage <pid> <p>` (server pid only, as in real MPS; a client
    /// pid is answered `Server <pid> not found`).
    SetPercentage {
        /// Server pid.
        pid: u32,
        /// Percentage in (0, 100].
        pct: f64,
    },
    /// `get_active_thread_percentage <pid>`.
    GetPercentage {
        /// Server (or client) pid.
        pid: u32,
    },
    /// `set_default_device_pinned_mem_limit <dev> <value>`.
    SetDefaultPinnedMemLimit {
        /// Device ordinal.
        device: u32,
        /// Limit in bytes.
        bytes: u64,
    },
    /// `get_default_device_pinned_mem_limit <dev>`.
    GetDefaultPinnedMemLimit {
        /// Device ordinal.
        device: u32,
    },
    /// `set_device_pinned_mem_limit <server pid> <dev> <value>`.
    SetPinnedMemLimit {
        /// Server pid.
        pid: u32,
        /// Device ordinal.
        device: u32,
        /// Limit in bytes.
        bytes: u64,
    },
    /// `terminate_client <server pid> <client pid>`.
    TerminateClient {
        /// Server pid.
        server: u32,
        /// Client pid.
        client: u32,
    },
    /// `shutdown_server <server pid> [-f]`: the server takes no new client and exits once its
    /// clients are done; with `-f` at once, its clients' work ended (what NVIDIA's MPS docs
    /// give for a server a faulty kernel keeps busy for ever). The control daemon stays, and
    /// starts a new server for the next client.
    ShutdownServer {
        /// Server pid.
        server: u32,
        /// `-f`: forced, immediate.
        force: bool,
    },
    /// `quit [-t <seconds>]`.
    Quit {
        /// Seconds to wait for servers to exit before killing them.
        timeout_s: Option<u64>,
    },
}

/// Why a line is not a command; `Display` is the reply text.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseError {
    /// Not a known command word.
    Unknown(String),
    /// Known command, wrong arguments; holds the usage line.
    Usage(&'static str),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Unknown(w) => write!(f, "Invalid command: {w}"),
            ParseError::Usage(u) => write!(f, "Invalid arguments. Usage: {u}"),
        }
    }
}

fn num<T: std::str::FromStr>(s: Option<&&str>, usage: &'static str) -> Result<T, ParseError> {
    s.and_then(|v| v.parse().ok())
        .ok_or(ParseError::Usage(usage))
}

fn pct(s: Option<&&str>, usage: &'static str) -> Result<f64, ParseError> {
    let p: f64 = num(s, usage)?;
    if p.is_finite() && p > 0.0 && p <= 100.0 {
        Ok(p)
    } else {
        Err(ParseError::Usage(usage))
    }
}

/// Parses a memory size as the MPS docs write it: a number with an optional `K`, `M`, `G`
/// (or `T`) suffix, binary multiples.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// Formats bytes with the largest exact binary suffix (`2G`, `512M`, `1000`).
pub fn format_size(bytes: u64) -> String {
    for (suffix, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Formats a percentage as the daemon prints it (`50.0`).
pub fn format_pct(p: f64) -> String {
    format!("{p:.1}")
}

impl Command {
    /// Parses one input line (surrounding whitespace ignored). `Ok(None)` for a blank line.
    pub fn parse(line: &str) -> Result<Option<Command>, ParseError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&cmd, args)) = words.split_first() else {
            return Ok(None);
        };
        let a = |i: usize| args.get(i);
        let exact = |n: usize, usage| {
            if args.len() == n {
                Ok(())
            } else {
                Err(ParseError::Usage(usage))
            }
        };
        use Command::*;
        let c = match cmd {
            "get_server_list" => {
                exact(0, "get_server_list")?;
                GetServerList
            }
            "start_server" => {
                const U: &str = "start_server -uid <user id>";
                exact(2, U)?;
                if args[0] != "-uid" {
                    return Err(ParseError::Usage(U));
                }
                StartServer { uid: num(a(1), U)? }
            }
            "get_client_list" => {
                const U: &str = "get_client_list <server PID>";
                exact(1, U)?;
                GetClientList {
                    server: num(a(0), U)?,
                }
            }
            "get_device_client_list" => {
                const U: &str = "get_device_client_list [<server PID>]";
                if args.len() > 1 {
                    return Err(ParseError::Usage(U));
                }
                GetDeviceClientList {
                    server: a(0).map(|_| num(a(0), U)).transpose()?,
                }
            }
            "set_default_active_thread_percentage" => {
                const U: &str = "set_default_active_thread_percentage <percentage>";
                exact(1, U)?;
                SetDefaultPercentage(pct(a(0), U)?)
            }
            "get_default_active_thread_percentage" => {
                exact(0, "get_default_active_thread_percentage")?;
                GetDefaultPercentage
            }
            "set_active_thread_percentage" => {
                const U: &str = "set_active_thread_percentage <PID> <percentage>";
                exact(2, U)?;
                SetPercentage {
                    pid: num(a(0), U)?,
                    pct: pct(a(1), U)?,
                }
            }
            "get_active_thread_percentage" => {
                const U: &str = "get_active_thread_percentage <PID>";
                exact(1, U)?;
                GetPercentage { pid: num(a(0), U)? }
            }
            "set_default_device_pinned_mem_limit" => {
                const U: &str = "set_default_device_pinned_mem_limit <dev> <value>";
                exact(2, U)?;
                SetDefaultPinnedMemLimit {
                    device: num(a(0), U)?,
                    bytes: parse_size(args[1]).ok_or(ParseError::Usage(U))?,
                }
            }
            "get_default_device_pinned_mem_limit" => {
                const U: &str = "get_default_device_pinned_mem_limit <dev>";
                exact(1, U)?;
                GetDefaultPinnedMemLimit {
                    device: num(a(0), U)?,
                }
            }
            "set_device_pinned_mem_limit" => {
                const U: &str = "set_device_pinned_mem_limit <PID> <dev> <value>";
                exact(3, U)?;
                SetPinnedMemLimit {
                    pid: num(a(0), U)?,
                    device: num(a(1), U)?,
                    bytes: parse_size(args[2]).ok_or(ParseError::Usage(U))?,
                }
            }
            "terminate_client" => {
                const U: &str = "terminate_client <server PID> <client PID>";
                exact(2, U)?;
                TerminateClient {
                    server: num(a(0), U)?,
                    client: num(a(1), U)?,
                }
            }
            "shutdown_server" => {
                const U: &str = "shutdown_server <server PID> [-f]";
                match args {
                    [pid] => ShutdownServer { server: num(Some(pid), U)?, force: false },
                    [pid, "-f"] => ShutdownServer { server: num(Some(pid), U)?, force: true },
                    _ => return Err(ParseError::Usage(U)),
                }
            }
            "quit" => {
                const U: &str = "quit [-t <timeout in seconds>]";
                match args {
                    [] => Quit { timeout_s: None },
                    ["-t", t] => Quit {
                        timeout_s: Some(num(Some(t), U)?),
                    },
                    _ => return Err(ParseError::Usage(U)),
                }
            }
            other => return Err(ParseError::Unknown(other.to_string())),
        };
        Ok(Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        use Command::*;
        let cases: &[(&str, Command)] = &[
            ("get_server_list", GetServerList),
            ("  start_server -uid 1000 ", StartServer { uid: 1000 }),
            ("get_client_list 42", GetClientList { server: 42 }),
            ("shutdown_server 42", ShutdownServer { server: 42, force: false }),
            ("shutdown_server 42 -f", ShutdownServer { server: 42, force: true }),
            (
                "get_device_client_list",
                GetDeviceClientList { server: None },
            ),
            (
                "get_device_client_list 7",
                GetDeviceClientList { server: Some(7) },
            ),
            (
                "set_default_active_thread_percentage 25",
                SetDefaultPercentage(25.0),
            ),
            ("get_default_active_thread_percentage", GetDefaultPercentage),
            (
                "set_active_thread_percentage 42 12.5",
                SetPercentage { pid: 42, pct: 12.5 },
            ),
            ("get_active_thread_percentage 42", GetPercentage { pid: 42 }),
            (
                "set_default_device_pinned_mem_limit 0 2G",
                SetDefaultPinnedMemLimit {
                    device: 0,
                    bytes: 2 << 30,
                },
            ),
            (
                "get_default_device_pinned_mem_limit 0",
                GetDefaultPinnedMemLimit { device: 0 },
            ),
            (
                "set_device_pinned_mem_limit 42 1 512M",
                SetPinnedMemLimit {
                    pid: 42,
                    device: 1,
                    bytes: 512 << 20,
                },
            ),
            (
                "terminate_client 42 43",
                TerminateClient {
                    server: 42,
                    client: 43,
                },
            ),
            ("quit", Quit { timeout_s: None }),
            ("quit -t 5", Quit { timeout_s: Some(5) }),
        ];
        for (line, want) in cases {
            assert_eq!(Command::parse(line).unwrap().as_ref(), Some(want), "{line}");
        }
        assert_eq!(Command::parse("   ").unwrap(), None);
    }

    #[test]
    fn rejects_unknown_and_malformed() {
        assert_eq!(
            Command::parse("frobnicate 1").unwrap_err().to_string(),
            "Invalid command: frobnicate"
        );
        for bad in [
            "start_server 1000",
            "start_server -uid x",
            "set_default_active_thread_percentage 0",
            "set_default_active_thread_percentage 101",
            "set_default_active_thread_percentage nan",
            "set_active_thread_percentage 42",
            "get_client_list",
            "quit -x",
            "set_default_device_pinned_mem_limit 0 lots",
        ] {
            assert!(
                matches!(Command::parse(bad), Err(ParseError::Usage(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn sizes_round_trip() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("3k"), Some(3072));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("99999999999T"), None);
        assert_eq!(format_size(2 << 30), "2G");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_pct(50.0), "50.0");
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever arrives on the socket, parsing answers (a command or an error) and never
        /// panics.
        #[test]
        fn any_line_parses_or_errs(line in "\\PC{0,80}") {
            let _ = Command::parse(&line);
        }

        /// Known commands with arbitrary argument words never panic either.
        #[test]
        fn known_words_with_junk_args(cmd in prop::sample::select(vec![
            "start_server", "get_client_list", "set_active_thread_percentage", "quit",
            "set_default_device_pinned_mem_limit", "terminate_client", "set_device_pinned_mem_limit", "shutdown_server",
        ]), args in prop::collection::vec("[-a-z0-9.]{0,12}", 0..4)) {
            let _ = Command::parse(&format!("{cmd} {}", args.join(" ")));
        }

        /// The size printed back is the size that was set.
        #[test]
        fn sizes_round_trip(bytes in 0u64..(1 << 50)) {
            prop_assert_eq!(parse_size(&format_size(bytes)), Some(bytes));
        }

        /// Accepted percentages are exactly (0, 100].
        #[test]
        fn percentages_in_range(p in -1000.0f64..1000.0) {
            let r = Command::parse(&format!("set_default_active_thread_percentage {p}"));
            prop_assert_eq!(r.is_ok(), p > 0.0 && p <= 100.0);
        }
    }
}
