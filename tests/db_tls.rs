//! TLS to both databases and secrets from files (issue 30 items 1–2), against the local
//! PostgreSQL and MariaDB that `scripts/services.sh` sets up for TLS: a self-signed test CA,
//! a second unrelated CA, and on each server one account that may connect only over TLS
//! (`hostssl` on PostgreSQL, `REQUIRE SSL` on MariaDB) with an all-digit password.
//! A verifying mode refuses the server without the CA (or with the wrong one) and accepts it
//! with the CA; the account's own rule refuses a connection without TLS; a second account on
//! each server also requires a client certificate (`clientcert=verify-full`, `REQUIRE X509`)
//! and is refused without `ssl_cert`/`ssl_key`, accepted with them; the service runs end to
//! end as that account over TLS with its passwords from a file and a systemd credential and
//! its store key from a credential (every pool it builds must carry the password, the TLS keys
//! and the client certificate, or the accounts refuse it).
//! Without the set-up the tests skip, except under `CI=true`, where they fail.

use msgx_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use msgx_core::devtools::fixture;
use msgx_core::inbox::names::{InboxNames, OutboxNames};
use msgx_core::inbox::Inbox;
use msgx_core::settings::Settings;
use msgx_core::store::Store;
use sqlx::{Connection, Executor};

const TLS_USER: &str = "msgxt_tls_only";
/// Needs TLS, the password and a client certificate signed by the test CA (CN = the name).
const CERT_USER: &str = "msgxt_tls_cert";
const TLS_PASSWORD: &str = "0012345678";

fn tls_dir() -> PathBuf {
    PathBuf::from("/var/lib/msgx-test-tls")
}

fn ca(name: &str) -> String {
    tls_dir().join(name).display().to_string()
}

/// True when both servers serve the test certificate and have the TLS-only accounts; else
/// skips (false), or fails under `CI=true`.
async fn tls_ready(test: &str) -> bool {
    let why = missing_setup().await;
    let Some(why) = why else { return true };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {why} (scripts/services.sh sets the servers up for TLS)"
    );
    eprintln!("\n*** SKIPPED {test}: {why} (run scripts/services.sh) ***\n");
    false
}

/// Why the servers are not set up for these tests, if they are not.
async fn missing_setup() -> Option<String> {
    let files = ["ca.crt", "other-ca.crt", "client.crt", "client.key"];
    if let Some(f) = files.iter().find(|f| !tls_dir().join(f).is_file()) {
        return Some(format!("no {f} under {}", tls_dir().display()));
    }
    let pg = match common::pg_admin().await {
        Ok(pg) => pg,
        Err(e) => return Some(format!("PostgreSQL: {e}")),
    };
    let ssl: Result<String, _> = sqlx::query_scalar("SHOW ssl").fetch_one(&pg).await;
    let roles: Result<i64, _> =
        sqlx::query_scalar("SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2)")
            .bind(TLS_USER)
            .bind(CERT_USER)
            .fetch_one(&pg)
            .await;
    pg.close().await;
    if !matches!((&ssl, &roles), (Ok(on), Ok(2)) if on == "on") {
        return Some(format!(
            "PostgreSQL: ssl = {ssl:?}, roles {TLS_USER} and {CERT_USER}: {roles:?} of 2"
        ));
    }
    let my = match common::mysql_admin().await {
        Ok(my) => my,
        Err(e) => return Some(format!("MariaDB: {e}")),
    };
    let have: Result<(String, String), _> = sqlx::query_as("SHOW VARIABLES LIKE 'have_ssl'")
        .fetch_one(&my)
        .await;
    let users: Result<Vec<String>, _> = sqlx::query_scalar(
        "SELECT CAST(ssl_type AS CHAR) FROM mysql.user WHERE user IN (?, ?) ORDER BY user DESC",
    )
    .bind(TLS_USER)
    .bind(CERT_USER)
    .fetch_all(&my)
    .await;
    my.close().await;
    match (&have, &users) {
        (Ok((_, yes)), Ok(types)) if yes == "YES" && types == &["ANY", "X509"] => None,
        _ => Some(format!(
            "MariaDB: have_ssl {have:?}, users {TLS_USER} and {CERT_USER}: {users:?}"
        )),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A PostgreSQL database owned by the TLS-only role and a MariaDB database with the inbox
/// tables (made as the DB owner, root), both named `msgxt_tls_<pid>_<n>` (the MariaDB account
/// may use only `msgxt_tls_%`).
struct TlsWorld {
    db: String,
    dir: PathBuf,
    /// Ports on 127.0.0.2 forwarding to PostgreSQL and MariaDB ([`forward`]): the servers
    /// reached under a name their certificate does not carry. None: 127.0.0.1 directly.
    via: Option<[u16; 2]>,
}

impl TlsWorld {
    async fn new() -> Self {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let db = format!("msgxt_tls_{}_{n}", std::process::id());
        common::fresh_pg_database(&db, Some(TLS_USER)).await;
        let my = common::mysql_admin().await.expect("mariadb");
        common::run_all(&my, &[format!("DROP DATABASE IF EXISTS `{db}`")]).await;
        my.close().await;
        let outbox = OutboxNames::new("COUTMSGS").expect("name");
        fixture::create_inbox_fixture(
            &format!("{}/{db}", common::mysql_base()),
            &InboxNames::defaults(),
            &outbox,
        )
        .await
        .expect("inbox fixture");
        let dir = std::env::temp_dir().join(format!("msgxt_tls_{}_{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("secrets dir");
        Self { db, dir, via: None }
    }

    fn pg_url(&self, user: &str) -> String {
        let at = self
            .via
            .map_or("127.0.0.1:5432".into(), |[pg, _]| format!("127.0.0.2:{pg}"));
        format!("postgres://{user}@{at}/{}", self.db)
    }

    fn my_url(&self, user: &str) -> String {
        let at = self
            .via
            .map_or("127.0.0.1:3306".into(), |[_, my]| format!("127.0.0.2:{my}"));
        format!("mysql://{user}@{at}/{}", self.db)
    }

    /// A secret file as an operator writes it (with a final line break).
    fn secret_file(&self, name: &str, value: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, format!("{value}\n")).expect("secret file");
        path.display().to_string()
    }

    /// Settings as this account on both servers, the password from a file, and these
    /// overrides.
    fn settings(&self, user: &str, extra: &[(&str, &str)]) -> Result<Settings, String> {
        let pw = self.secret_file("password", TLS_PASSWORD);
        let (pg, my) = (self.pg_url(user), self.my_url(user));
        let mut env = vec![
            ("MSGX_STORE__URL", pg.as_str()),
            ("MSGX_INBOX__URL", my.as_str()),
            ("MSGX_STORE__PASSWORD_FILE", pw.as_str()),
            ("MSGX_INBOX__PASSWORD_FILE", pw.as_str()),
            ("MSGX_STORE__CREATE_DATABASE", "false"),
            ("MSGX_STORE__MAX_CONNECTIONS", "2"),
            ("MSGX_STORE__CONNECT_TIMEOUT", "5s"),
        ];
        env.extend_from_slice(extra);
        Settings::load_layered_with_env(Some(&common::default_toml()), &env)
            .map_err(|e| e.to_string())
    }

    async fn cleanup(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Ok(pg) = common::pg_admin().await {
            let _ = pg
                .execute(format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.db).as_str())
                .await;
        }
        if let Ok(my) = common::mysql_admin().await {
            let _ = my
                .execute(format!("DROP DATABASE IF EXISTS `{}`", self.db).as_str())
                .await;
        }
    }
}

/// Opens the store the way the service does (pool, migrations) as `user` with these keys, and
/// asks the server whether this session is encrypted.
async fn store_as(w: &TlsWorld, user: &str, keys: &[(&str, &str)]) -> Result<bool, String> {
    let settings = w.settings(user, keys)?;
    let store = Store::connect(&settings.store)
        .await
        .map_err(|e| e.to_string())?;
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .map_err(|e| e.to_string())?;
    store.pool().close().await;
    Ok(ssl)
}

/// Reads the inbox through the service's adapter as `user` with these keys, then asks whether
/// the session is encrypted.
async fn inbox_as(w: &TlsWorld, user: &str, keys: &[(&str, &str)]) -> Result<bool, String> {
    let settings = w.settings(user, keys)?;
    let tz = settings.inbox_timezone();
    let names = settings.inbox_names();
    let inbox = Inbox::new(&settings.inbox, names, tz).map_err(|e| e.to_string())?;
    inbox.max_id().await.map_err(|e| e.to_string())?;
    let cipher: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(inbox.pool())
        .await
        .map_err(|e| e.to_string())?;
    inbox.pool().close().await;
    Ok(!cipher.1.is_empty())
}

fn assert_certificate_refused(what: &str, r: Result<bool, String>) {
    let e = r.expect_err(what);
    assert!(
        e.to_lowercase().contains("certificate") || e.contains("UnknownIssuer"),
        "{what}: refused for another reason: {e}"
    );
}

/// One of the two stores, with its TLS keys' prefix, its modes as its driver spells them, and
/// what its server says when it refuses an account.
#[derive(Debug, Clone, Copy)]
enum Side {
    Store,
    Inbox,
}

impl Side {
    fn prefix(self) -> &'static str {
        match self {
            Side::Store => "MSGX_STORE__",
            Side::Inbox => "MSGX_INBOX__",
        }
    }

    /// Verify the chain and the name, verify the chain, no TLS, TLS without checking.
    fn modes(self) -> [&'static str; 4] {
        match self {
            Side::Store => ["verify-full", "verify-ca", "disable", "require"],
            Side::Inbox => ["VERIFY_IDENTITY", "VERIFY_CA", "DISABLED", "REQUIRED"],
        }
    }

    /// What the server says to the TLS-only account without TLS: the role's own rule (hostssl
    /// only), the user's own rule (REQUIRE SSL).
    fn no_tls_refusal(self) -> &'static [&'static str] {
        match self {
            Side::Store => &["pg_hba.conf", "no encryption"],
            Side::Inbox => &["Access denied"],
        }
    }

    /// What the server says to the client-certificate account without its certificate.
    fn no_cert_refusal(self) -> &'static str {
        match self {
            Side::Store => "requires a valid client certificate",
            Side::Inbox => "Access denied",
        }
    }

    /// Connects as `user` with these keys (named without the prefix).
    async fn connect_as(
        self,
        w: &TlsWorld,
        user: &str,
        keys: &[(&str, &str)],
    ) -> Result<bool, String> {
        let named: Vec<(String, &str)> = keys
            .iter()
            .map(|(k, v)| (format!("{}{k}", self.prefix()), *v))
            .collect();
        let keys: Vec<(&str, &str)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        match self {
            Side::Store => store_as(w, user, &keys).await,
            Side::Inbox => inbox_as(w, user, &keys).await,
        }
    }

    /// Connects as the TLS-only account in `mode`, with the CA file if given.
    async fn over(self, w: &TlsWorld, mode: &str, ca: Option<&String>) -> Result<bool, String> {
        let mut keys = vec![("SSL_MODE", mode)];
        keys.extend(ca.map(|ca| ("SSL_CA", ca.as_str())));
        self.connect_as(w, TLS_USER, &keys).await
    }
}

/// The verify modes need the right CA, the account needs TLS, and the encrypt-only mode
/// checks no certificate.
async fn ca_and_tls_rules_hold(side: Side) {
    let w = TlsWorld::new().await;
    let (good, wrong) = (ca("ca.crt"), ca("other-ca.crt"));
    let [full, chain, off, encrypt] = side.modes();
    let over = |mode, ca| side.over(&w, mode, ca);
    assert_certificate_refused(&format!("{full}, no CA"), over(full, None).await);
    assert_certificate_refused(&format!("{full}, wrong CA"), over(full, Some(&wrong)).await);
    assert_certificate_refused(
        &format!("{chain}, wrong CA"),
        over(chain, Some(&wrong)).await,
    );
    let e = over(off, None).await.expect_err("no TLS");
    assert!(side.no_tls_refusal().iter().all(|s| e.contains(s)), "{e}");
    assert_eq!(over(full, Some(&good)).await, Ok(true));
    assert_eq!(over(chain, Some(&good)).await, Ok(true));
    assert_eq!(over(encrypt, None).await, Ok(true));
    // A named file may hold several CAs (a rotation): every one of them is a root, the only
    // roots (issue 42: the sqlx-core patch builds the root set from the file alone).
    let bundle = std::env::temp_dir().join(format!("msgx-ca-bundle-{}.pem", std::process::id()));
    let pem = |f: &str| std::fs::read_to_string(tls_dir().join(f)).expect("CA file");
    std::fs::write(&bundle, pem("other-ca.crt") + &pem("ca.crt")).expect("bundle");
    let bundle = bundle.display().to_string();
    assert_eq!(over(full, Some(&bundle)).await, Ok(true));
    w.cleanup().await;
}

#[tokio::test]
async fn the_store_needs_the_ca_to_verify_and_the_role_needs_tls() {
    if tls_ready("the_store_needs_the_ca_to_verify_and_the_role_needs_tls").await {
        ca_and_tls_rules_hold(Side::Store).await;
    }
}

#[tokio::test]
async fn the_inbox_needs_the_ca_to_verify_and_the_user_needs_tls() {
    if tls_ready("the_inbox_needs_the_ca_to_verify_and_the_user_needs_tls").await {
        ca_and_tls_rules_hold(Side::Inbox).await;
    }
}

/// A port on 127.0.0.2 whose connections are piped to `target` (TLS passes through untouched):
/// the server is reached under the name 127.0.0.2, which its certificate (localhost,
/// 127.0.0.1) does not carry.
async fn forward(target: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    port
}

/// Issue 55, upstream's verifier fix carried in the sqlx-core patch
/// (third_party/sqlx-core-verify-ca-names.patch, launchbadge/sqlx#3861): reached under a name
/// its certificate does not carry, a server whose certificate the named CA signed is accepted
/// by verify-ca / VERIFY_CA, which check the chain only (as libpq and the MySQL client do;
/// with rustls >= 0.23.24 sqlx 0.8.6 refused it), and refused by verify-full /
/// VERIFY_IDENTITY (the name) and by verify-ca with another CA (the chain).
#[tokio::test]
async fn verify_ca_checks_the_chain_not_the_name() {
    if !tls_ready("verify_ca_checks_the_chain_not_the_name").await {
        return;
    }
    let mut w = TlsWorld::new().await;
    w.via = Some([
        forward("127.0.0.1:5432").await,
        forward("127.0.0.1:3306").await,
    ]);
    let (good, wrong) = (ca("ca.crt"), ca("other-ca.crt"));
    for side in [Side::Store, Side::Inbox] {
        let [full, chain, _, _] = side.modes();
        assert_eq!(
            side.over(&w, chain, Some(&good)).await,
            Ok(true),
            "{side:?} {chain} at 127.0.0.2: the CA's chain, another name"
        );
        let e = side
            .over(&w, full, Some(&good))
            .await
            .expect_err("the name");
        assert!(e.contains("not valid for name"), "{side:?} {full}: {e}");
        assert_certificate_refused(
            &format!("{side:?} {chain}, wrong CA"),
            side.over(&w, chain, Some(&wrong)).await,
        );
    }
    w.cleanup().await;
}

/// An account that requires a client certificate (PostgreSQL `clientcert=verify-full`,
/// MariaDB `REQUIRE X509`): with the CA but no `ssl_cert`/`ssl_key` the server refuses it;
/// with them, the service's own adapters connect over TLS.
#[tokio::test]
async fn a_client_certificate_account_is_refused_without_it_and_accepted_with_it() {
    let test = "a_client_certificate_account_is_refused_without_it_and_accepted_with_it";
    if !tls_ready(test).await {
        return;
    }
    let w = TlsWorld::new().await;
    let (good, cert, key) = (ca("ca.crt"), ca("client.crt"), ca("client.key"));
    for side in [Side::Store, Side::Inbox] {
        let verify = [("SSL_MODE", side.modes()[0]), ("SSL_CA", good.as_str())];
        let e = side
            .connect_as(&w, CERT_USER, &verify)
            .await
            .expect_err("no client certificate");
        assert!(e.contains(side.no_cert_refusal()), "{side:?}: {e}");
        let with = [("SSL_CERT", cert.as_str()), ("SSL_KEY", key.as_str())];
        let keys = [&verify[..], &with].concat();
        assert_eq!(
            side.connect_as(&w, CERT_USER, &keys).await,
            Ok(true),
            "{side:?}"
        );
    }
    w.cleanup().await;
}

/// `run` as the client-certificate account on both servers, the store password and client key
/// from systemd credentials and the inbox password from a `_file` key: the service becomes
/// ready and processes and marks a message, so every pool it builds (sessions, relaxed
/// commits, the lease, the fenced ones, the inbox) carried the password, the TLS keys and the
/// client certificate.
#[tokio::test]
async fn the_service_runs_over_tls_with_secrets_from_files() {
    if !tls_ready("the_service_runs_over_tls_with_secrets_from_files").await {
        return;
    }
    let w = TlsWorld::new().await;
    let creds = w.dir.join("credentials");
    std::fs::create_dir_all(&creds).expect("credentials dir");
    std::fs::write(creds.join("store.password"), TLS_PASSWORD).expect("credential");
    std::fs::copy(tls_dir().join("client.key"), creds.join("store.ssl_key")).expect("key");
    let inbox_pw = w.secret_file("inbox-password", TLS_PASSWORD);
    let port = common::service::free_port();
    let log = w.dir.join("service.log");
    let mut cmd = common::instance::msgexchange();
    cmd.arg("run")
        .env("MSGEXCHANGE_CONFIG", common::default_toml())
        .env("CREDENTIALS_DIRECTORY", &creds)
        .env("MSGX_STORE__URL", w.pg_url(CERT_USER))
        .env("MSGX_STORE__SSL_MODE", "verify-full")
        .env("MSGX_STORE__SSL_CA", ca("ca.crt"))
        .env("MSGX_STORE__SSL_CERT", ca("client.crt"))
        .env("MSGX_STORE__CREATE_DATABASE", "false")
        .env("MSGX_INBOX__URL", w.my_url(CERT_USER))
        .env("MSGX_INBOX__PASSWORD_FILE", &inbox_pw)
        .env("MSGX_INBOX__SSL_MODE", "VERIFY_IDENTITY")
        .env("MSGX_INBOX__SSL_CA", ca("ca.crt"))
        .env("MSGX_INBOX__SSL_CERT", ca("client.crt"))
        .env("MSGX_INBOX__SSL_KEY", ca("client.key"))
        .env("MSGX_KAFKA__BROKERS", "embedded")
        .env("MSGX_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("MSGX_PIPELINE__POLL_INTERVAL", "100ms")
        .env("MSGX_BACKFILL__PERIOD", "300ms")
        .env("MSGX_OUTBOUND__SCHEDULE_REQUEST_AT", "")
        .env("MSGX_LOG__LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"));
    let mut child = cmd.spawn().expect("spawn msgexchange");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let ready = wait_until(Duration::from_secs(30), || async {
        common::instance::http_get(port, "/readyz")
            .await
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    assert!(ready, "not ready over TLS; log:\n{}", log_text());

    let owner = sqlx::MySqlConnection::connect(&format!("{}/{}", common::mysql_base(), w.db))
        .await
        .expect("owner");
    let id = insert_message(owner, &common::msgs::flop(1, "CA1234", &[])).await;
    let marked = wait_until(Duration::from_secs(30), || async {
        processed(&w.db, id).await
    })
    .await;
    assert!(marked, "row {id} never marked; log:\n{}", log_text());
    let _ = child.kill();
    let _ = child.wait();
    w.cleanup().await;
}

async fn insert_message(mut owner: sqlx::MySqlConnection, text: &str) -> u64 {
    let r = sqlx::query(
        "INSERT INTO CMINMSGS (CMINMSGS_DATE_RECEIVED, CMINMSGS_CLOB_MSG) VALUES (NOW(), ?)",
    )
    .bind(text)
    .execute(&mut owner)
    .await
    .expect("insert");
    let _ = owner.close().await;
    r.last_insert_id()
}

async fn processed(db: &str, id: u64) -> bool {
    let Ok(mut c) = sqlx::MySqlConnection::connect(&format!("{}/{db}", common::mysql_base())).await
    else {
        return false;
    };
    let mark: Option<Option<String>> = sqlx::query_scalar(
        "SELECT CAST(CMINMSGS_DATE_PROCESSED AS CHAR) FROM CMINMSGS WHERE CMINMSGS_ID = ?",
    )
    .bind(id)
    .fetch_optional(&mut c)
    .await
    .unwrap_or(None);
    let _ = c.close().await;
    mark.flatten().is_some()
}

/// Polls `f` every 100 ms; false after `limit`.
async fn wait_until<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// `check-config` with secrets from a file, a credential and the environment: says where each
/// came from, prints none; a missing file stops it in one line naming the key.
#[test]
fn check_config_names_each_secrets_source_and_refuses_a_missing_file() {
    let dir = std::env::temp_dir().join(format!("msgxt_tls_cli_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("creds")).expect("dir");
    let pw = dir.join("store-password");
    std::fs::write(&pw, "0012345678\n").expect("pw");
    std::fs::write(dir.join("creds/http.admin_token"), "cred-token-0123456789").expect("cred");
    let run = |extra: &[(&str, &Path)]| {
        let mut cmd = common::instance::msgexchange();
        cmd.arg("check-config")
            .env("MSGEXCHANGE_CONFIG", common::default_toml())
            .env("MSGX_KAFKA__SASL_PASSWORD", "env-kafka-secret")
            .env("CREDENTIALS_DIRECTORY", dir.join("creds"))
            .stdin(Stdio::null());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.output().expect("check-config")
    };
    let out = run(&[("MSGX_STORE__PASSWORD_FILE", pw.as_path())]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in ["0012345678", "cred-token", "env-kafka-secret"] {
        assert!(!stdout.contains(secret), "{secret} printed:\n{stdout}");
    }
    let source = |key: &str| {
        stdout
            .lines()
            .find(|l| {
                l.strip_prefix("#   ")
                    .is_some_and(|r| r.starts_with(&format!("{key} ")))
            })
            .unwrap_or_else(|| panic!("no source line for {key}:\n{stdout}"))
            .to_string()
    };
    let pw_source = format!(
        "file {} (named by environment MSGX_STORE__PASSWORD_FILE)",
        pw.display()
    );
    assert!(source("store.password").ends_with(&pw_source), "{stdout}");
    assert!(
        source("http.admin_token").contains("systemd credential"),
        "{stdout}"
    );
    assert!(
        source("kafka.sasl_password").ends_with("environment MSGX_KAFKA__SASL_PASSWORD"),
        "{stdout}"
    );
    let missing = dir.join("no-such-file");
    let out = run(&[("MSGX_STORE__PASSWORD_FILE", missing.as_path())]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("`store.password_file`"), "{stderr}");
    assert!(stderr.contains("no-such-file"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `check-config` shows the client certificate keys (paths, not secrets); a certificate
/// without its key stops it with exit 2 in one line naming the missing key.
#[test]
fn check_config_shows_the_client_certificate_and_refuses_half_of_it() {
    let dir = std::env::temp_dir().join(format!("msgxt_tls_cert_cli_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (cert, key) = (dir.join("client.crt"), dir.join("client.key"));
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
    )
    .expect("cert");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
    )
    .expect("key");
    let run = |vars: &[(&str, &Path)]| {
        let mut cmd = common::instance::msgexchange();
        cmd.arg("check-config")
            .env("MSGEXCHANGE_CONFIG", common::default_toml())
            .env("MSGX_INBOX__SSL_MODE", "REQUIRED")
            .envs(vars.iter().map(|(k, v)| (*k, *v)))
            .stdin(Stdio::null());
        cmd.output().expect("check-config")
    };
    let out = run(&[
        ("MSGX_INBOX__SSL_CERT", cert.as_path()),
        ("MSGX_INBOX__SSL_KEY", key.as_path()),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inbox = stdout
        .split("\n[")
        .find(|s| s.starts_with("inbox]"))
        .unwrap_or_else(|| panic!("no [inbox]:\n{stdout}"));
    for (k, path) in [("ssl_cert", &cert), ("ssl_key", &key)] {
        let line = format!("{k} = \"{}\"", path.display());
        assert!(inbox.lines().any(|l| l == line), "no `{line}`:\n{inbox}");
    }
    let out = run(&[("MSGX_INBOX__SSL_CERT", cert.as_path())]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("`inbox.ssl_key`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
