//! The settings reader: files and their permissions, the environment, ADO.NET
//! connection strings, and hostile content (property tests at the end).

use super::*;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// A settings file with `mode`, unique per test, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, mode: u32, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("stalltrace-dmv-{}-{name}.conf", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
        // The umask may have cleared bits: set exactly what the test asks.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .unwrap();
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const FILE: &str = "# DMV poller\n\
    host = sql.example,1444\n\
    user = stalltrace\n\
    password = \"p#ss=word; x\"\n\
    database = tempdb\n\
    poll_every = 10s\n\
    trust_server_certificate = true\n\
    encrypt = on\n";

#[test]
fn a_private_file_is_read() {
    let f = TempFile::new("private", 0o600, FILE);
    let c = DmvConfig::from_file(&f.0).unwrap();
    assert_eq!(c.host, "sql.example");
    assert_eq!(c.port, 1444);
    assert_eq!(c.user, "stalltrace");
    assert_eq!(c.password.expose(), "p#ss=word; x");
    assert_eq!(c.database, "tempdb");
    assert_eq!(c.poll_every, Duration::from_secs(10));
    assert!(c.trust_server_certificate);
    assert_eq!(c.encrypt, Encrypt::On);
}

#[test]
fn a_file_others_can_read_is_refused() {
    let f = TempFile::new("shared", 0o644, FILE);
    let e = DmvConfig::from_file(&f.0).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("group or others") && s.contains("0644"), "{s}");
    assert!(s.contains("chmod 600"), "{s}");
    assert!(!s.contains('\n') && !s.contains("p#ss"), "{s}");
    let g = TempFile::new("group", 0o640, FILE);
    assert!(DmvConfig::from_file(&g.0).is_err());
}

#[test]
fn a_file_of_another_user_is_refused() {
    let e = check_private(Path::new("/etc/dmv.conf"), 0o100600, 1000, 0).unwrap_err();
    assert!(e.to_string().contains("owned by uid 1000"), "{e}");
    assert!(check_private(Path::new("/x"), 0o100600, 7, 7).is_ok());
    assert!(check_private(Path::new("/x"), 0o100604, 7, 7).is_err());
}

#[test]
fn file_errors_name_the_line_and_never_the_password() {
    let e = DmvConfig::parse_file("user = a\npassword = hunter2\nport = hunter2\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("f line 3") && !e.contains("hunter2"), "{e}");
    let e = DmvConfig::parse_file("pasword = hunter2\n", "f")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown key `pasword` (did you mean `password`?)") && !e.contains("hunter2"),
        "{e}"
    );
    let e = DmvConfig::parse_file("host = h\n", "f")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no SQL Server user and password"), "{e}");
}

#[test]
fn only_a_misspelled_key_is_quoted_back() {
    let err = |text: &str| DmvConfig::parse_file(text, "f").unwrap_err().to_string();
    assert!(err("usr = a\n").contains("unknown key `usr` (did you mean `user`?)"));
    assert!(err("trust_server_cert = 1\n").contains("unknown key (not shown"));
    assert!(!err("Tr0ub4dor&3 = x\n").contains("r0ub4dor"));
    assert_eq!(edit_distance(b"kitten", b"sitting"), 3);
    assert_eq!(edit_distance(b"", b"port"), 4);
    assert_eq!(edit_distance(b"poll", b"poll"), 0);
}

#[test]
fn defaults_are_local_master_every_5s_encrypted() {
    let c = DmvConfig::parse_file("user=u\npassword=p", "f").unwrap();
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1433));
    assert_eq!(c.database, "master");
    assert_eq!(c.poll_every, DEFAULT_POLL);
    assert_eq!(c.encrypt, Encrypt::Required);
    assert!(!c.trust_server_certificate);
}

#[test]
fn debug_never_shows_the_password() {
    let c = DmvConfig::parse_file("user=u\npassword=hunter2", "f").unwrap();
    let d = format!("{c:?}");
    assert!(!d.contains("hunter2") && d.contains("<hidden>"), "{d}");
}

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn an_ado_connection_string_in_the_environment() {
    let c = DmvConfig::from_env_with(env(&[(
        ENV_CONN,
        "Server=tcp:10.0.0.5,1533; User ID=sa;Password='it''s;secret';Initial Catalog=msdb;\
         TrustServerCertificate=True;Encrypt=false;Application Name=x",
    )]))
    .unwrap();
    assert_eq!((c.host.as_str(), c.port), ("10.0.0.5", 1533));
    assert_eq!(c.user, "sa");
    assert_eq!(c.password.expose(), "it's;secret");
    assert_eq!(c.database, "msdb");
    assert!(c.trust_server_certificate);
    assert_eq!(c.encrypt, Encrypt::Off);
}

#[test]
fn single_variables_override_the_connection_string() {
    let c = DmvConfig::from_env_with(env(&[
        (ENV_CONN, "Data Source=(local);uid=a;pwd=b"),
        (ENV_USER, "stalltrace"),
        (ENV_PORT, "1500"),
        (ENV_POLL, "2s"),
    ]))
    .unwrap();
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1500));
    assert_eq!(c.user, "stalltrace");
    assert_eq!(c.password.expose(), "b");
    assert_eq!(c.poll_every, Duration::from_secs(2));
    let c = DmvConfig::from_env_with(env(&[
        (ENV_HOST, "[::1],1444"),
        (ENV_USER, "u"),
        (ENV_PASSWORD, "p"),
    ]))
    .unwrap();
    assert_eq!((c.host.as_str(), c.port), ("::1", 1444));
}

#[test]
fn unsupported_connection_strings_say_why() {
    let err = |conn: &str| {
        DmvConfig::from_env_with(env(&[(ENV_CONN, conn)]))
            .unwrap_err()
            .to_string()
    };
    assert!(err("Server=h\\SQLEXPRESS;uid=a;pwd=b").contains("named instances"));
    assert!(err("Server=h;Integrated Security=true").contains("SQL login"));
    assert!(err("Server=h;uid=a;pwd='open").contains("unterminated"));
    assert!(err("Server=h,99999;uid=a;pwd=b").contains("TCP port"));
    assert!(err("Server=h;uid=a;pwd=b;Encrypt=strict").contains("not supported"));
    assert!(err("").contains("no SQL Server user and password"));
}

// ---- hostile content ------------------------------------------------------------

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

/// Fixed seed so a failure reproduces; PROPTEST_RNG_SEED explores others.
fn cases(n: u32) -> Config {
    let mut c = Config::with_cases(n);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0xd3f_c0f1);
    }
    c.failure_persistence = None;
    c
}

/// An error a user sees: one printable line, a sentence or two long.
fn assert_one_line(e: &UserError) -> String {
    let s = e.to_string();
    assert!(
        !s.chars().any(char::is_control),
        "control character in {s:?}"
    );
    assert!(s.len() <= 400, "{} bytes: {s}", s.len());
    s
}

/// A valid configuration, and a settings file that says it in any of the
/// ways the format allows: keys in any order and case, `host,port` or
/// `port`, quoted values, comments, blank lines, CRLF, a byte-order mark.
fn written_config() -> impl Strategy<Value = (DmvConfig, String)> {
    let value = "[^\n\r\0]{0,20}".prop_map(|s| s.trim().to_string());
    (
        "[a-z][a-z0-9.-]{0,20}",
        1..=u16::MAX,
        value.clone().prop_filter("non-empty", |s| !s.is_empty()),
        value.clone().prop_filter("non-empty", |s| !s.is_empty()),
        value,
        100..100_000u64,
        any::<bool>(),
        prop::sample::select(vec![Encrypt::Off, Encrypt::On, Encrypt::Required]),
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(host, port, user, password, database, poll_ms, trust, encrypt, style)| {
                let (crlf, bom, port_in_host, upper, order) = style;
                let config = DmvConfig {
                    host: host.clone(),
                    port,
                    user: user.clone(),
                    password: Secret::new(password.clone()),
                    database: if database.is_empty() {
                        "master".into()
                    } else {
                        database.clone()
                    },
                    poll_every: Duration::from_millis(poll_ms),
                    trust_server_certificate: trust,
                    encrypt,
                };
                let key = |k: &str| {
                    if upper {
                        k.to_ascii_uppercase()
                    } else {
                        k.to_string()
                    }
                };
                let mut lines = vec![
                    format!("{} = \"{user}\"", key("user")),
                    format!("{}=\"{password}\"", key("password")),
                    format!("  {} =   {poll_ms}ms  ", key("poll_every")),
                    format!(
                        "{} = {}",
                        key("trust_server_certificate"),
                        if trust { "yes" } else { "0" }
                    ),
                    format!(
                        "{} = {}",
                        key("encrypt"),
                        match encrypt {
                            Encrypt::Off => "OFF",
                            Encrypt::On => "on",
                            Encrypt::Required => "mandatory",
                        }
                    ),
                    "# a comment = with an equals sign".into(),
                    String::new(),
                ];
                if port_in_host {
                    lines.push(format!("{} = tcp:{host},{port}", key("host")));
                } else {
                    lines.push(format!("{} = {host}", key("host")));
                    lines.push(format!("{} = {port}", key("port")));
                }
                if !database.is_empty() {
                    lines.push(format!("{} = \"{database}\"", key("database")));
                }
                // A deterministic shuffle from `order`.
                let n = lines.len();
                for i in (1..n).rev() {
                    lines.swap(i, (order >> (i % 32)) as usize % (i + 1));
                }
                let eol = if crlf { "\r\n" } else { "\n" };
                let text = format!(
                    "{}{}{eol}",
                    if bom { "\u{feff}" } else { "" },
                    lines.join(eol)
                );
                (config, text)
            },
        )
}

proptest! {
    #![proptest_config(cases(1000))]

    /// What the file says is what is read: an independent writer of the
    /// format, read back.
    #[test]
    fn a_written_config_reads_back_as_written((config, text) in written_config()) {
        let read = DmvConfig::parse_file(&text, "f").map_err(|e| e.to_string());
        prop_assert_eq!(read, Ok(config), "{:?}", text);
    }

    /// Any text at all (NUL, control characters, any Unicode): a config or
    /// one printable line.
    #[test]
    fn any_text_is_read_or_refused_in_one_line(text in any::<String>()) {
        if let Err(e) = DmvConfig::parse_file(&text, "f") {
            assert_one_line(&e);
        }
    }

    /// Lines of settings with hostile keys and values around a password:
    /// an error never quotes the password, wherever it was put.
    #[test]
    fn an_error_never_quotes_the_password(
        secret in "[A-Z]{3}[0-9]{3}[a-z]{3}",
        lines in prop::collection::vec(
            (prop::sample::select(vec![
                "host", "port", "user", "password", "database", "poll_every",
                "trust_server_certificate", "encrypt", "pasword", "", "password x",
            ]), prop::sample::select(vec!["=", " = ", ":", " "]), any::<bool>(), ".{0,12}"),
            0..10,
        ),
    ) {
        // Each line holds the secret where its value, or its key, would be.
        let text: String = lines
            .iter()
            .map(|(key, sep, as_key, filler)| if *as_key {
                format!("{key} {secret} {sep} {filler}\n")
            } else {
                format!("{key}{sep}{secret}{filler}\n")
            })
            .collect();
        if let Err(e) = DmvConfig::parse_file(&text, "f") {
            let s = assert_one_line(&e);
            // Keys are lower-cased before an error could quote them.
            let quoted = s.to_lowercase().contains(&secret.to_lowercase());
            prop_assert!(!quoted, "{} quotes the password: {:?}", s, text);
        }
    }

    /// Any connection string and any single variables: a config or one line.
    #[test]
    fn any_environment_is_read_or_refused_in_one_line(
        conn in prop::option::of(".{0,80}"),
        port in prop::option::of(".{0,8}"),
        poll in prop::option::of("[0-9a-z ]{0,30}"),
        host in prop::option::of(".{0,20}"),
    ) {
        let mut vars = vec![(ENV_USER, "u".to_string()), (ENV_PASSWORD, "p".to_string())];
        for (k, v) in [(ENV_CONN, conn), (ENV_PORT, port), (ENV_POLL, poll), (ENV_HOST, host)] {
            if let Some(v) = v {
                vars.push((k, v));
            }
        }
        let map: HashMap<String, String> =
            vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        if let Err(e) = DmvConfig::from_env_with(|k| map.get(k).cloned()) {
            assert_one_line(&e);
        }
    }
}

proptest! {
    #![proptest_config(cases(200))]

    /// Random bytes in a private file: a config or one line.
    #[test]
    fn any_file_content_is_read_or_refused_in_one_line(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        let f = TempFile::new("random", 0o600, "");
        std::fs::write(&f.0, &bytes).unwrap();
        if let Err(e) = DmvConfig::from_file(&f.0) {
            assert_one_line(&e);
        }
    }
}

fn file_error(path: &Path) -> String {
    assert_one_line(&DmvConfig::from_file(path).unwrap_err())
}

#[test]
fn a_huge_file_is_refused_after_reading_64_kib() {
    // 8 GiB, sparse: no disk used, and reading it all would take seconds and 8 GiB.
    let f = TempFile::new("huge", 0o600, FILE);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f.0)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    let started = std::time::Instant::now();
    let e = file_error(&f.0);
    assert!(
        e.contains("larger than 64 KiB: it is not a settings file"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // Exactly the limit is still read (and then parsed: comment padding here).
    let text = format!(
        "{FILE}#{}\n",
        "x".repeat(MAX_FILE_BYTES as usize - FILE.len() - 2)
    );
    let f = TempFile::new("limit", 0o600, &text);
    assert_eq!(DmvConfig::from_file(&f.0).unwrap().user, "stalltrace");
}

#[test]
fn nul_bytes_and_other_encodings_name_their_line() {
    let f = TempFile::new("nul", 0o600, "user = a\npassword = b\0c\n");
    let e = file_error(&f.0);
    assert!(
        e.contains("line 2: a NUL byte") && !e.contains("b\0c"),
        "{e}"
    );
    let f = TempFile::new("latin1", 0o600, "");
    std::fs::write(&f.0, b"user = a\n\npassword = caf\xe9\n").unwrap();
    assert!(file_error(&f.0).contains("line 3 is not UTF-8 text"));
    // UTF-16, as a Windows editor might save it: a NUL in line 1.
    let utf16: Vec<u8> = "user = a\n"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    std::fs::write(&f.0, [&[0xff, 0xfe][..], &utf16].concat()).unwrap();
    assert!(file_error(&f.0).contains("line 1 is not UTF-8 text"));
    // A UTF-8 byte-order mark is fine.
    let f = TempFile::new("bom", 0o600, &format!("\u{feff}{FILE}"));
    assert_eq!(DmvConfig::from_file(&f.0).unwrap().host, "sql.example");
}

#[test]
fn a_fifo_a_directory_and_a_device_are_refused_without_waiting() {
    let dir = std::env::temp_dir().join(format!("stalltrace-dmv-{}-dir", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Opened without O_NONBLOCK, this would wait for a writer forever.
    let e = file_error(&fifo);
    assert!(e.contains("is not a regular file but a FIFO"), "{e}");
    assert!(file_error(&dir).contains("but a directory"));
    assert!(file_error(Path::new("/dev/null")).contains("but a device"));
    let _ = std::fs::remove_dir_all(&dir);
}
