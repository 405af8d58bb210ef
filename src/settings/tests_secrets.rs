//! Secrets from files and systemd credentials: each source works, a secret given twice or a
//! missing file fails in one line naming the key, values are never reinterpreted, and
//! `check-config` says where each came from without its value.

use std::path::PathBuf;

use super::*;

/// A private directory for this test's secret files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("msgx_secrets_{}_{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write secret");
    path.display().to_string()
}

fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::load_layered_with_env(None, env)
}

#[test]
fn every_secret_reads_from_a_file_named_by_its_file_key() {
    let dir = scratch("file_keys");
    let keys = [
        ("MSGX_INBOX__PASSWORD_FILE", "inbox-pw-1"),
        ("MSGX_STORE__PASSWORD_FILE", "store-pw-2"),
        ("MSGX_KAFKA__SASL_PASSWORD_FILE", "kafka-pw-3"),
        ("MSGX_HTTP__ADMIN_TOKEN_FILE", "admin-token-4-0123456789"),
        ("MSGX_HTTP__READ_TOKENS_FILE", "read-token-5-0123456789"),
        ("MSGX_HTTP__OPERATE_TOKENS_FILE", "operate-token-6-012345"),
        ("MSGX_HTTP__COMPAT_TOKENS_FILE", "compat-token-7-0123456"),
        ("MSGX_KAFKA__EXTRA_FILE", "ssl.key.password=extra-8"),
        ("MSGX_STORE__URL_FILE", "postgres://app-9@db:5432/msgx"),
        ("MSGX_INBOX__URL_FILE", "mysql://app-10@inbox:3306/aodb"),
    ];
    let paths: Vec<String> = keys
        .iter()
        .enumerate()
        // One final line break is dropped (what `echo` and editors add), nothing else.
        .map(|(i, (_, v))| write(&dir, &format!("s{i}"), &format!("{v}\n")))
        .collect();
    let env: Vec<(&str, &str)> = keys
        .iter()
        .zip(&paths)
        .map(|((k, _), p)| (*k, p.as_str()))
        .collect();
    let s = load(&env).expect("load");
    assert_eq!(s.inbox.connect.password.expose(), "inbox-pw-1");
    assert_eq!(s.store.connect.password.expose(), "store-pw-2");
    assert_eq!(s.kafka.sasl_password.expose(), "kafka-pw-3");
    assert_eq!(s.http.admin_token.expose(), "admin-token-4-0123456789");
    assert_eq!(s.http.read_tokens.expose(), "read-token-5-0123456789");
    assert_eq!(s.http.operate_tokens.expose(), "operate-token-6-012345");
    assert_eq!(s.http.compat_tokens.expose(), "compat-token-7-0123456");
    assert_eq!(s.kafka.extra.expose(), "ssl.key.password=extra-8");
    assert_eq!(
        s.store.connect.url.expose(),
        "postgres://app-9@db:5432/msgx"
    );
    assert_eq!(
        s.inbox.connect.url.expose(),
        "mysql://app-10@inbox:3306/aodb"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn systemd_credentials_fill_secrets_by_their_key_name() {
    let dir = scratch("credentials");
    write(&dir, "store.password", "cred-store-pw\r\n");
    write(&dir, "http.admin_token", "cred-admin-token-0123456789");
    let creds = dir.display().to_string();
    let s = load(&[("CREDENTIALS_DIRECTORY", &creds)]).expect("load");
    assert_eq!(s.store.connect.password.expose(), "cred-store-pw");
    assert_eq!(s.http.admin_token.expose(), "cred-admin-token-0123456789");
    // Not in the directory: the layers' value.
    assert_eq!(s.kafka.sasl_password.expose(), "");
    // A credential and an environment value for one key: refused, naming both.
    let e = load(&[
        ("CREDENTIALS_DIRECTORY", &creds),
        ("MSGX_STORE__PASSWORD", "other"),
    ])
    .expect_err("twice");
    let line = e.to_string();
    assert!(line.contains("`store.password`"), "{line}");
    assert!(line.contains("MSGX_STORE__PASSWORD"), "{line}");
    assert!(line.contains("systemd credential"), "{line}");
    assert!(
        !line.contains("cred-store-pw") && !line.contains("other"),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A client certificate and key loaded as systemd credentials: the keys name the
/// credentials' files (checked at start like any other); set elsewhere too, refused.
#[test]
fn credentials_stand_for_the_client_certificate_and_key_paths() {
    let dir = scratch("client_cert");
    let cert = write(
        &dir,
        "store.ssl_cert",
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    );
    let key = write(
        &dir,
        "store.ssl_key",
        "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
    );
    let creds = dir.display().to_string();
    let s = load(&[("CREDENTIALS_DIRECTORY", &creds)]).expect("load");
    assert_eq!(
        (
            s.store.connect.ssl_cert.as_str(),
            s.store.connect.ssl_key.as_str()
        ),
        (cert.as_str(), key.as_str())
    );
    assert_eq!(s.inbox.connect.ssl_key, "", "no credential, no key");
    let e = load(&[
        ("CREDENTIALS_DIRECTORY", &creds),
        ("MSGX_STORE__SSL_KEY", "/etc/msgexchange/other.key"),
    ])
    .expect_err("twice")
    .to_string();
    assert!(
        e.contains("`store.ssl_key`") && e.contains("MSGX_STORE__SSL_KEY"),
        "{e}"
    );
    assert!(
        e.contains("systemd credential") && e.contains("keep one"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_or_empty_secret_file_fails_in_one_line_naming_the_key() {
    let dir = scratch("missing");
    let missing = dir.join("nope").display().to_string();
    let e = load(&[("MSGX_STORE__PASSWORD_FILE", &missing)]).expect_err("missing");
    let line = e.to_string();
    assert!(line.contains("`store.password_file`"), "{line}");
    assert!(line.contains(&missing), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    let empty = write(&dir, "empty", "\n");
    let e = load(&[("MSGX_HTTP__ADMIN_TOKEN_FILE", &empty)]).expect_err("empty");
    assert!(e.to_string().contains("`http.admin_token_file`"), "{e}");
    assert!(e.to_string().contains("is empty"), "{e}");
    // A `_file` key for something that is not a secret is an unknown key, as before.
    let e = load(&[("MSGX_STORE__MAX_CONNECTIONS_FILE", &empty)]).expect_err("unknown");
    assert!(e.to_string().contains("max_connections_file"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_secret_given_by_value_and_by_file_is_refused() {
    let dir = scratch("twice");
    let path = write(&dir, "pw", "from-file");
    let e = load(&[
        ("MSGX_KAFKA__SASL_PASSWORD", "from-env"),
        ("MSGX_KAFKA__SASL_PASSWORD_FILE", &path),
    ])
    .expect_err("twice");
    assert!(e.to_string().contains("`kafka.sasl_password`"), "{e}");
    assert!(e.to_string().contains("keep one"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn values_are_never_reinterpreted() {
    let dir = scratch("digits");
    let file = write(&dir, "pw", "0012345678\n");
    let s = load(&[
        ("MSGX_STORE__PASSWORD", "0012345678"),
        ("MSGX_INBOX__PASSWORD_FILE", &file),
        ("MSGX_KAFKA__SASL_PASSWORD", "1e5"),
        ("MSGX_HTTP__ADMIN_TOKEN", "0000111122223333"),
        ("MSGX_HTTP__READ_TOKENS", "TRUE000011112222"),
        // Typed keys still parse their text.
        ("MSGX_STORE__MAX_CONNECTIONS", "05"),
        ("MSGX_STORE__CREATE_DATABASE", "false"),
    ])
    .expect("load");
    assert_eq!(s.store.connect.password.expose(), "0012345678");
    assert_eq!(s.inbox.connect.password.expose(), "0012345678");
    assert_eq!(s.kafka.sasl_password.expose(), "1e5");
    assert_eq!(s.http.admin_token.expose(), "0000111122223333");
    assert_eq!(s.http.read_tokens.expose(), "TRUE000011112222");
    assert_eq!(s.store.max_connections, 5);
    assert!(!s.store.create_database);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn check_config_says_where_each_secret_came_from_never_its_value() {
    let dir = scratch("check_config");
    let pw = write(&dir, "pw", "file-secret-pw\n");
    let creds = scratch("check_config_creds");
    write(&creds, "http.admin_token", "cred-secret-token-0123456789");
    let creds_dir = creds.display().to_string();
    let config = write(
        &dir,
        "site.toml",
        "[kafka]\nsasl_password = \"config-secret-pw\"\n",
    );
    let env = [
        ("MSGX_STORE__PASSWORD_FILE", pw.as_str()),
        ("CREDENTIALS_DIRECTORY", creds_dir.as_str()),
        ("MSGX_INBOX__PASSWORD", "0012345678"),
    ];
    let out = Settings::effective_toml(Some(std::path::Path::new(&config)), None, Some(&env))
        .expect("effective");
    for secret in [
        "file-secret-pw",
        "cred-secret-token",
        "config-secret-pw",
        "0012345678",
    ] {
        assert!(!out.contains(secret), "{secret} leaked:\n{out}");
    }
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with("#   ") && l[4..].starts_with(&format!("{key} ")))
            .unwrap_or_else(|| panic!("no source line for {key}:\n{out}"))
            .to_string()
    };
    assert!(
        line("store.password").contains(&format!(
            "file {pw} (named by environment MSGX_STORE__PASSWORD_FILE)"
        )),
        "{out}"
    );
    assert!(
        line("http.admin_token").contains("systemd credential"),
        "{out}"
    );
    assert!(
        line("kafka.sasl_password").contains(&format!("config file {config}")),
        "{out}"
    );
    assert!(
        line("inbox.password").contains("environment MSGX_INBOX__PASSWORD"),
        "{out}"
    );
    assert!(line("store.url").contains("built-in default"), "{out}");
    assert!(line("http.compat_tokens").ends_with("unset"), "{out}");
    // Still a configuration: the comments aside it parses, secrets redacted.
    let parsed: toml::Table = toml::from_str(&out).expect("valid TOML");
    assert_eq!(parsed["store"]["password"].as_str(), Some("***"));
    assert_eq!(parsed["http"]["admin_token"].as_str(), Some("***"));
    assert!(parsed["store"].get("password_file").is_none());
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(creds);
}

/// Issue 42 item 4: tokens are `name:secret` (the name goes to the audit log); a bare secret
/// of earlier versions still works, named by its key and position; a bad name or a short
/// secret is refused in one line naming the key.
#[test]
fn tokens_carry_names_and_bare_ones_keep_working() {
    let s = Settings::load_layered_with_env(
        None,
        &[
            ("MSGX_HTTP__ADMIN_TOKEN", "root-0123456789abcdef"),
            (
                "MSGX_HTTP__OPERATE_TOKENS",
                "deploy-bot:0123456789abcdef, alice@ops:fedcba9876543210:x",
            ),
            (
                "MSGX_HTTP__READ_TOKENS",
                "0000111122223333,1111222233334444",
            ),
        ],
    )
    .expect("load");
    let got: Vec<(&str, String, bool, &str)> = s
        .http
        .tokens()
        .into_iter()
        .map(|t| (t.key, t.name, t.named, t.secret))
        .collect();
    assert_eq!(
        got,
        [
            (
                "http.admin_token",
                "admin".into(),
                false,
                "root-0123456789abcdef"
            ),
            (
                "http.read_tokens",
                "read-1".into(),
                false,
                "0000111122223333"
            ),
            (
                "http.read_tokens",
                "read-2".into(),
                false,
                "1111222233334444"
            ),
            (
                "http.operate_tokens",
                "deploy-bot".into(),
                true,
                "0123456789abcdef"
            ),
            (
                "http.operate_tokens",
                "alice@ops".into(),
                true,
                "fedcba9876543210:x"
            ),
        ]
    );
    for (key, value, names) in [
        (
            "MSGX_HTTP__READ_TOKENS",
            "bad name:0123456789abcdef",
            "`http.read_tokens`",
        ),
        ("MSGX_HTTP__READ_TOKENS", "bot:short", "`http.read_tokens`"),
        (
            "MSGX_HTTP__COMPAT_TOKENS",
            ":0123456789abcdef",
            "`http.compat_tokens`",
        ),
        (
            "MSGX_HTTP__ADMIN_TOKEN",
            "a:0123456789abcdef,b:0123456789abcdef",
            "`http.admin_token`",
        ),
    ] {
        let e = Settings::load_layered_with_env(None, &[(key, value)])
            .expect_err(value)
            .to_string();
        assert!(e.contains(names) && !e.contains("0123456789abcdef"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

/// Issue 55: a token name used twice, or one secret under two entries (a compat secret pasted
/// into `operate_tokens` would quietly gain operate), is refused in one line naming the key
/// and never the secret; `http.admin_token` (every scope) draws a start-up warning.
#[test]
fn token_names_and_secrets_are_each_used_once() {
    for (env, names) in [
        (
            vec![
                ("MSGX_HTTP__COMPAT_TOKENS", "upstream:compat-0123456789ab"),
                ("MSGX_HTTP__OPERATE_TOKENS", "ops:compat-0123456789ab"),
            ],
            "`http.compat_tokens`",
        ),
        (
            vec![(
                "MSGX_HTTP__READ_TOKENS",
                "grafana:read-0123456789abcd,grafana:read-abcd0123456789",
            )],
            "`http.read_tokens`",
        ),
        (
            vec![
                ("MSGX_HTTP__ADMIN_TOKEN", "admin-0123456789abcdef"),
                ("MSGX_HTTP__READ_TOKENS", "admin-0123456789abcdef"),
            ],
            "`http.read_tokens`",
        ),
        (
            vec![
                ("MSGX_HTTP__READ_TOKENS", "alice:read-0123456789abcd"),
                ("MSGX_HTTP__OPERATE_TOKENS", "alice:oper-0123456789abcd"),
            ],
            "`http.operate_tokens`",
        ),
    ] {
        let e = Settings::load_layered_with_env(None, &env)
            .expect_err(names)
            .to_string();
        assert!(e.contains(names), "{e}");
        assert!(!e.contains("0123456789"), "never the secret: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    let scoped = Settings::load_layered_with_env(
        None,
        &[
            ("MSGX_HTTP__READ_TOKENS", "grafana:read-0123456789abcd"),
            ("MSGX_HTTP__OPERATE_TOKENS", "alice:oper-0123456789abcd"),
        ],
    )
    .expect("distinct names and secrets");
    assert!(scoped.http.token_warnings().is_empty());
    let all = Settings::load_layered_with_env(
        None,
        &[("MSGX_HTTP__ADMIN_TOKEN", "root:admin-0123456789abcd")],
    )
    .expect("load");
    let warned = all.http.token_warnings();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].0, "http.admin_token");
    assert!(warned[0].1.contains("every scope"), "{warned:?}");
}

/// Issue 55: the packaged environment file's token examples are named placeholders, not bare
/// secrets a site could paste and run with (`name:<secret>`, the audit log's name first).
#[test]
fn the_packaged_token_examples_are_named_placeholders() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/msgexchange.env");
    let text = std::fs::read_to_string(&path).expect("packaging/msgexchange.env");
    let examples: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start_matches(['#', ' ']).strip_prefix("MSGX_HTTP__"))
        .filter(|l| l.contains("TOKEN"))
        .collect();
    assert!(!examples.is_empty(), "{text}");
    for e in examples {
        let (_, value) = e.split_once('=').expect("KEY=value");
        let (name, secret) = value.split_once(':').unwrap_or(("", value));
        assert!(!name.is_empty(), "a named token: {e}");
        assert_eq!(secret, "<secret>", "a placeholder, not a secret: {e}");
    }
}
