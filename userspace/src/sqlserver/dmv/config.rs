//! Where the DMV poller connects and as whom: from a private settings file or
//! from the environment, never from argv (visible to every user in
//! /proc/PID/cmdline) and never logged (the password has no Debug, Display or
//! Serialize that shows it).

use std::fmt;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use crate::error::UserError;

/// Default poll period: DMV rows are a sampled picture; every 5 s is cheap for
/// SQL Server and still names the sessions of a stall that lasts seconds.
pub const DEFAULT_POLL: Duration = Duration::from_secs(5);

/// Environment variables read when no settings file is given.
pub const ENV_CONN: &str = "STALLTRACE_SQL_CONN";
pub const ENV_HOST: &str = "STALLTRACE_SQL_HOST";
pub const ENV_PORT: &str = "STALLTRACE_SQL_PORT";
pub const ENV_USER: &str = "STALLTRACE_SQL_USER";
pub const ENV_PASSWORD: &str = "STALLTRACE_SQL_PASSWORD";
pub const ENV_DATABASE: &str = "STALLTRACE_SQL_DATABASE";
pub const ENV_POLL: &str = "STALLTRACE_SQL_POLL";
pub const ENV_TRUST: &str = "STALLTRACE_SQL_TRUST_SERVER_CERTIFICATE";
pub const ENV_ENCRYPT: &str = "STALLTRACE_SQL_ENCRYPT";

/// A password: kept out of every Debug print of the config, and only
/// readable through `expose`, so it cannot reach a log line by accident.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<hidden>")
    }
}

/// TDS encryption: `off` encrypts the login only (SQL Server always does),
/// `on` encrypts everything when the server can, `required` fails otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encrypt {
    Off,
    On,
    /// ADO.NET's default since Microsoft.Data.SqlClient 4: secure unless told.
    #[default]
    Required,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmvConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Secret,
    pub database: String,
    pub poll_every: Duration,
    pub trust_server_certificate: bool,
    pub encrypt: Encrypt,
}

impl Default for DmvConfig {
    /// stalltrace runs on the SQL Server host, so the instance is local.
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 1433,
            user: String::new(),
            password: Secret::default(),
            database: "master".into(),
            poll_every: DEFAULT_POLL,
            trust_server_certificate: false,
            encrypt: Encrypt::default(),
        }
    }
}

/// The largest settings file read. Eight settings take a few hundred bytes;
/// a file past this is something else (a log, a binary), and reading stops
/// here rather than holding whatever it is in memory.
pub const MAX_FILE_BYTES: u64 = 64 << 10;

const FILE_FIX: &str = "write one `key = value` per line: host, port, user, password, database, poll_every, trust_server_certificate, encrypt (off|on|required)";

impl DmvConfig {
    /// Read a settings file of `key = value` lines (`#` starts a comment line;
    /// a value may be wrapped in double quotes). Refused unless it is owned by
    /// the user running stalltrace and unreadable by anyone else, as ssh does
    /// with private keys: a password in a world-readable file is already leaked.
    pub fn from_file(path: &Path) -> Result<Self, UserError> {
        let shown = path.display();
        // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before
        // it could be refused; reads of a regular file ignore the flag.
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| {
                UserError::new(
                    format!("cannot open the DMV settings file {shown}: {e}"),
                    "give the path of an existing file readable by the user running stalltrace",
                )
            })?;
        // fstat the open file, not the path: nothing can swap it in between.
        let meta = file.metadata().map_err(|e| {
            UserError::new(
                format!("cannot stat the DMV settings file {shown}: {e}"),
                "give the path of a regular file",
            )
        })?;
        if !meta.is_file() {
            return Err(UserError::new(
                format!(
                    "the DMV settings file {shown} is not a regular file but {}",
                    file_kind(&meta.file_type())
                ),
                "give the path of the settings file itself",
            ));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !credential::is_systemd_credential(path, &file, me) {
            check_private(path, meta.mode(), meta.uid(), me)?;
        } else if meta.mode() & 0o007 != 0 {
            return Err(UserError::new(
                format!(
                    "the DMV settings file {shown} (a systemd credential) is readable by others"
                ),
                "load it with LoadCredential= from a root-only file (packaging/README.md)",
            ));
        }
        let mut bytes = Vec::new();
        (&mut file)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                UserError::new(
                    format!("cannot read the DMV settings file {shown}: {e}"),
                    "give the path of a regular file readable by the user running stalltrace",
                )
            })?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(UserError::new(
                format!(
                    "the DMV settings file {shown} is larger than {} KiB: it is not a settings file",
                    MAX_FILE_BYTES >> 10
                ),
                FILE_FIX,
            ));
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let line = 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            UserError::new(
                format!("the DMV settings file {shown} line {line} is not UTF-8 text"),
                format!("save it as UTF-8; {FILE_FIX}"),
            )
        })?;
        Self::parse_file(text, &shown.to_string())
    }

    /// The `key = value` format of `from_file`, `origin` naming it in errors.
    pub fn parse_file(text: &str, origin: &str) -> Result<Self, UserError> {
        let mut config = Self::default();
        // A byte-order mark, as some Windows editors write: not part of the first key.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.contains('\0') {
                return Err(UserError::new(
                    format!("{origin} line {}: a NUL byte: it is not a text file", n + 1),
                    FILE_FIX,
                ));
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(UserError::new(
                    format!("{origin} line {}: no `=`", n + 1),
                    FILE_FIX,
                ));
            };
            let value = unquote(value.trim());
            let key = key.trim().to_ascii_lowercase();
            config.set(&key, value).map_err(|why| {
                UserError::new(format!("{origin} line {}: {why}", n + 1), FILE_FIX)
            })?;
        }
        config.finish(origin)
    }

    /// Settings from the process environment (see `from_env_with`).
    pub fn from_env() -> Result<Self, UserError> {
        Self::from_env_with(|k| std::env::var(k).ok())
    }

    /// Settings from `STALLTRACE_SQL_CONN` (an ADO.NET connection string) and
    /// then the single `STALLTRACE_SQL_*` variables, which override it.
    /// `get` reads a variable, so tests need not touch the real environment.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<Self, UserError> {
        let mut config = match get(ENV_CONN) {
            Some(conn) => Self::parse_ado(&conn).map_err(|why| {
                UserError::new(
                    format!("{ENV_CONN}: {why}"),
                    "use a connection string such as `Server=tcp:127.0.0.1,1433;User Id=stalltrace;Password=...;TrustServerCertificate=true`",
                )
            })?,
            None => Self::default(),
        };
        let single = [
            (ENV_HOST, "host"),
            (ENV_PORT, "port"),
            (ENV_USER, "user"),
            (ENV_PASSWORD, "password"),
            (ENV_DATABASE, "database"),
            (ENV_POLL, "poll_every"),
            (ENV_TRUST, "trust_server_certificate"),
            (ENV_ENCRYPT, "encrypt"),
        ];
        for (var, key) in single {
            if let Some(value) = get(var) {
                config
                    .set(key, &value)
                    .map_err(|why| UserError::new(format!("{var}: {why}"), "fix or unset it"))?;
            }
        }
        config.finish("the environment")
    }

    /// An ADO.NET connection string (`Server=tcp:host,port;User Id=...;...`).
    /// Keys it does not need (Application Name, Connect Timeout, ...) are ignored.
    fn parse_ado(conn: &str) -> Result<Self, String> {
        let mut config = Self::default();
        for (key, value) in ado_pairs(conn)? {
            let key: String = key
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '_')
                .flat_map(char::to_lowercase)
                .collect();
            match key.as_str() {
                "server" | "datasource" | "address" | "addr" | "networkaddress" => {
                    let (host, port) = parse_server(&value)?;
                    config.host = host;
                    if let Some(port) = port {
                        config.port = port;
                    }
                }
                "userid" | "uid" | "user" => config.user = value,
                "password" | "pwd" => config.password = Secret(value),
                "database" | "initialcatalog" => config.database = value,
                "trustservercertificate" => config.set("trust_server_certificate", &value)?,
                "encrypt" => config.set("encrypt", &value)?,
                "integratedsecurity" | "trustedconnection" if parse_bool(&value) == Some(true) => {
                    return Err(
                        "integrated (Windows/Kerberos) authentication is not supported: use a SQL login"
                            .into(),
                    );
                }
                _ => {}
            }
        }
        Ok(config)
    }

    /// One setting by its file key. Errors never quote the value: it may be
    /// the password, or a password pasted into the wrong key.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "host" | "server" => {
                let (host, port) = parse_server(value)?;
                self.host = host;
                if let Some(port) = port {
                    self.port = port;
                }
            }
            "port" => {
                self.port = value
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or("port must be a TCP port number (1-65535)")?;
            }
            "user" => self.user = value.to_string(),
            "password" => self.password = Secret(value.to_string()),
            "database" => self.database = value.to_string(),
            "poll_every" | "poll" => {
                self.poll_every = humantime::parse_duration(value)
                    .ok()
                    .filter(|d| *d >= Duration::from_millis(100))
                    .ok_or("poll_every must be a duration of at least 100ms, such as 5s or 1m")?;
            }
            "trust_server_certificate" => {
                self.trust_server_certificate =
                    parse_bool(value).ok_or("trust_server_certificate must be true or false")?;
            }
            "encrypt" => {
                self.encrypt = match value.to_ascii_lowercase().as_str() {
                    "off" | "false" | "no" | "optional" => Encrypt::Off,
                    "on" => Encrypt::On,
                    "required" | "true" | "yes" | "mandatory" => Encrypt::Required,
                    "strict" => {
                        return Err(
                            "encrypt=strict (TDS 8.0) is not supported: use required".into()
                        );
                    }
                    _ => return Err("encrypt must be off, on or required".into()),
                };
            }
            // A misspelled key is quoted, with the one meant. Anything else
            // is not echoed: it may be the password on the wrong side of the
            // `=` (`hunter2 = x`), or bytes a terminal would act on.
            _ => {
                return Err(match nearest_key(key) {
                    Some(meant) => format!("unknown key `{key}` (did you mean `{meant}`?)"),
                    None => "unknown key (not shown, in case it is a secret)".into(),
                });
            }
        }
        Ok(())
    }

    fn finish(self, origin: &str) -> Result<Self, UserError> {
        if self.user.is_empty() || self.password.expose().is_empty() {
            return Err(UserError::new(
                format!("{origin} gives no SQL Server user and password for the DMV poller"),
                format!(
                    "set user and password in the settings file, or {ENV_USER} and {ENV_PASSWORD} (or {ENV_CONN}); the login needs VIEW SERVER STATE"
                ),
            ));
        }
        Ok(self)
    }
}

/// The file keys `set` knows.
const KEYS: [&str; 10] = [
    "host",
    "server",
    "port",
    "user",
    "password",
    "database",
    "poll_every",
    "poll",
    "trust_server_certificate",
    "encrypt",
];

/// The key `key` is a typo of (at most 2 edits away), if any: only such a
/// key is quoted back in an error.
fn nearest_key(key: &str) -> Option<&'static str> {
    if key.len() > 32 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    KEYS.into_iter()
        .map(|k| (edit_distance(key.as_bytes(), k.as_bytes()), k))
        .filter(|&(d, _)| d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions).
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn file_kind(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// Refuse a settings file that others can read or that someone else owns
/// (they could have put a password of their choosing, or read ours).
pub fn check_private(path: &Path, mode: u32, owner: u32, me: u32) -> Result<(), UserError> {
    let shown = path.display();
    if owner != me {
        return Err(UserError::new(
            format!(
                "the DMV settings file {shown} is owned by uid {owner}, not by the user running stalltrace (uid {me})"
            ),
            format!("chown {me} {shown} && chmod 600 {shown}"),
        ));
    }
    if mode & 0o077 != 0 {
        return Err(UserError::new(
            format!(
                "the DMV settings file {shown} holds a password but is accessible by group or others (mode {:04o})",
                mode & 0o7777
            ),
            format!("chmod 600 {shown}"),
        ));
    }
    Ok(())
}

/// `tcp:host,port`, `host,port`, `host`, `(local)`, `.`; a named instance
/// (`host\NAME`) would need the SQL Browser service to find its port.
fn parse_server(value: &str) -> Result<(String, Option<u16>), String> {
    let value = value.trim();
    let value = value
        .strip_prefix("tcp:")
        .or_else(|| value.strip_prefix("TCP:"))
        .unwrap_or(value);
    if value.contains('\\') {
        return Err("named instances (host\\NAME) are not supported: give the instance's TCP port, as host,port".into());
    }
    let (host, port) = match value.rsplit_once(',') {
        Some((h, p)) => (
            h.trim(),
            Some(
                p.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or("the port after `,` in the server must be a TCP port number")?,
            ),
        ),
        None => (value, None),
    };
    let host = match host {
        "" => return Err("the server names no host".into()),
        "." | "(local)" | "(localdb)" => "127.0.0.1",
        h => h.trim_start_matches('[').trim_end_matches(']'),
    };
    Ok((host.to_string(), port))
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "1" | "on" => Some(true),
        "false" | "no" | "0" | "off" => Some(false),
        _ => None,
    }
}

fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// Split an ADO.NET connection string into pairs: `;` separates them, a
/// value may be quoted with `"` or `'` (a doubled quote inside stands for one)
/// so that it can hold `;`, and `==` in a key is a literal `=`.
fn ado_pairs(conn: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = conn.chars().peekable();
    loop {
        // Key: up to a single `=`.
        let mut key = String::new();
        loop {
            match chars.next() {
                None => {
                    if key.trim().is_empty() {
                        return Ok(pairs);
                    }
                    return Err("a key without `=` in the connection string".into());
                }
                Some(';') if key.trim().is_empty() => key.clear(),
                Some('=') if chars.peek() == Some(&'=') => {
                    chars.next();
                    key.push('=');
                }
                Some('=') => break,
                Some(c) => key.push(c),
            }
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        match chars.peek().copied() {
            Some(q @ ('"' | '\'')) => {
                chars.next();
                loop {
                    match chars.next() {
                        None => {
                            return Err(
                                "an unterminated quoted value in the connection string".into()
                            );
                        }
                        Some(c) if c == q && chars.peek() == Some(&q) => {
                            chars.next();
                            value.push(q);
                        }
                        Some(c) if c == q => break,
                        Some(c) => value.push(c),
                    }
                }
                while chars.next_if(|c| *c != ';').is_some() {}
                chars.next();
            }
            _ => {
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                    value.push(c);
                }
                value = value.trim().to_string();
            }
        }
        pairs.push((key.trim().to_string(), value));
    }
}

mod credential;

#[cfg(test)]
mod tests;
