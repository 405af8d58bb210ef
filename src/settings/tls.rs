//! The TLS and password keys of `[inbox]` and `[store]`, checked at start: a mode the driver
//! knows, a CA file that can be read and holds a certificate, a client certificate with its
//! key (both or neither, each file readable and of its kind), and nothing given twice (a key
//! and the same parameter in the URL would leave an operator guessing which one counts).
//! [`ConnectKeys`] holds these keys for both sections; the check and the connect options read it.

use serde::{Deserialize, Serialize};

mod posture;

use super::secret::{redact_url, Secret, SecretUrl};
use super::{invalid, SettingsError};

/// The connect keys `[inbox]` and `[store]` share (flattened into each section, so the keys
/// stay `inbox.url`, `store.ssl_mode`, …): what [`check_connect`] checks at start and what
/// `msgx_core::db_options` applies to the driver's options (one struct, so both read the same).
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ConnectKeys {
    /// `mysql://…` (inbox) or `postgres://…` (store): `user:password@host:port/database`, may
    /// carry the password and TLS parameters; the password is never printed.
    pub url: SecretUrl,
    /// The password apart from the URL ("" = the URL's, if any); never printed.
    pub password: Secret,
    /// The TLS mode ("" leaves it to the URL): MySQL `ssl-mode` DISABLED | PREFERRED |
    /// REQUIRED | VERIFY_CA | VERIFY_IDENTITY (the driver's default is PREFERRED); PostgreSQL
    /// `sslmode` disable | allow | prefer | require | verify-ca | verify-full (default prefer).
    pub ssl_mode: String,
    /// PEM file of the CA(s) the server certificate must chain to (`ssl-ca` / `sslrootcert`;
    /// verifying modes only).
    pub ssl_ca: String,
    /// PEM file of our client certificate (`ssl-cert` / `sslcert`), for an account that
    /// requires one (MySQL `REQUIRE X509`, PostgreSQL `clientcert=verify-full` or `cert`);
    /// with `ssl_key`, or neither.
    pub ssl_cert: String,
    /// PEM file of the client certificate's unencrypted private key (`ssl-key` / `sslkey`).
    pub ssl_key: String,
}

/// What one database section accepts.
pub(super) struct TlsRules {
    /// `store.ssl_mode`.
    mode_key: &'static str,
    /// `store.ssl_ca`.
    ca_key: &'static str,
    /// `store.ssl_cert`.
    cert_key: &'static str,
    /// `store.ssl_key`.
    key_key: &'static str,
    /// `store.url`.
    url_key: &'static str,
    /// `store.password`.
    password_key: &'static str,
    /// The URL schemes the driver takes.
    schemes: &'static [&'static str],
    /// Every mode the driver knows (compared without case).
    modes: &'static [&'static str],
    /// The modes that check the server certificate against a CA.
    verifying: &'static [&'static str],
    /// The mode that never uses TLS (a client certificate would never be sent).
    plain: &'static str,
    /// The driver's mode when neither the key nor the URL sets one.
    default_mode: &'static str,
    /// URL query parameters that set the mode.
    mode_params: &'static [&'static str],
    /// URL query parameters that set the CA file.
    ca_params: &'static [&'static str],
    /// URL query parameters that set the client certificate and its key (the drivers'
    /// names; the same for both).
    client_params: [&'static [&'static str]; 2],
}

/// `sslcert` / `sslkey` as both drivers read them from a URL.
const CLIENT_PARAMS: [&[&str]; 2] = [&["sslcert", "ssl-cert"], &["sslkey", "ssl-key"]];

/// PostgreSQL (`sslmode`, `sslrootcert`).
pub(super) const STORE_TLS: TlsRules = TlsRules {
    mode_key: "store.ssl_mode",
    ca_key: "store.ssl_ca",
    cert_key: "store.ssl_cert",
    key_key: "store.ssl_key",
    url_key: "store.url",
    password_key: "store.password",
    schemes: &["postgres://", "postgresql://"],
    modes: &[
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ],
    verifying: &["verify-ca", "verify-full"],
    plain: "disable",
    default_mode: "prefer",
    mode_params: &["sslmode", "ssl-mode"],
    ca_params: &["sslrootcert", "ssl-root-cert", "ssl-ca"],
    client_params: CLIENT_PARAMS,
};

/// MySQL / MariaDB (`ssl-mode`, `ssl-ca`).
pub(super) const INBOX_TLS: TlsRules = TlsRules {
    mode_key: "inbox.ssl_mode",
    ca_key: "inbox.ssl_ca",
    cert_key: "inbox.ssl_cert",
    key_key: "inbox.ssl_key",
    url_key: "inbox.url",
    password_key: "inbox.password",
    schemes: &["mysql://", "mariadb://"],
    modes: &[
        "DISABLED",
        "PREFERRED",
        "REQUIRED",
        "VERIFY_CA",
        "VERIFY_IDENTITY",
    ],
    verifying: &["VERIFY_CA", "VERIFY_IDENTITY"],
    plain: "DISABLED",
    default_mode: "PREFERRED",
    mode_params: &["sslmode", "ssl-mode"],
    ca_params: &["sslca", "ssl-ca"],
    client_params: CLIENT_PARAMS,
};

/// The mode is known and given once, the CA file readable and used by a verifying mode, the
/// client certificate and key given together.
fn check_tls(rules: &TlsRules, keys: &ConnectKeys) -> Result<(), SettingsError> {
    let params = query_params(keys.url.expose());
    let url_param = |names: &[&str]| {
        params
            .iter()
            .find(|(k, _)| names.iter().any(|n| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| *v)
    };
    let url_mode = url_param(rules.mode_params);
    if !keys.ssl_mode.is_empty() {
        if !rules
            .modes
            .iter()
            .any(|m| m.eq_ignore_ascii_case(&keys.ssl_mode))
        {
            return Err(invalid(
                rules.mode_key,
                format!(
                    "`{}` is not one of {}",
                    keys.ssl_mode,
                    rules.modes.join(" | ")
                ),
            ));
        }
        if url_mode.is_some() {
            return Err(invalid(
                rules.mode_key,
                format!("{} sets the TLS mode too; keep one", rules.url_key),
            ));
        }
    }
    let mode = if keys.ssl_mode.is_empty() {
        url_mode.unwrap_or("")
    } else {
        &keys.ssl_mode
    };
    for (key, value, names) in [
        (rules.ca_key, &keys.ssl_ca, rules.ca_params),
        (rules.cert_key, &keys.ssl_cert, rules.client_params[0]),
        (rules.key_key, &keys.ssl_key, rules.client_params[1]),
    ] {
        if !value.is_empty() && url_param(names).is_some() {
            return Err(invalid(
                key,
                format!("{} names that file too; keep one", rules.url_key),
            ));
        }
    }
    check_ca(rules, &keys.ssl_ca, mode)?;
    check_client_cert(rules, keys, mode)
}

/// A CA file only with a mode that checks the server's certificate.
fn check_ca(rules: &TlsRules, ca: &str, mode: &str) -> Result<(), SettingsError> {
    if ca.is_empty() {
        return Ok(());
    }
    if !rules.verifying.iter().any(|m| m.eq_ignore_ascii_case(mode)) {
        return Err(invalid(
            rules.ca_key,
            format!(
                "a CA file is only used by {} = {}, not `{mode}` (which never checks the server's certificate)",
                rules.mode_key,
                rules.verifying.join(" or "),
            ),
        ));
    }
    check_pem(rules.ca_key, ca, Pem::Certificate)
}

/// Both or neither, a mode that uses TLS, a certificate and an unencrypted private key the
/// service can read now (a server that requires the certificate would refuse every
/// connection otherwise, hours later at a reconnect).
fn check_client_cert(
    rules: &TlsRules,
    keys: &ConnectKeys,
    mode: &str,
) -> Result<(), SettingsError> {
    match (keys.ssl_cert.is_empty(), keys.ssl_key.is_empty()) {
        (true, true) => return Ok(()),
        (false, true) => {
            return Err(invalid(
                rules.key_key,
                format!(
                    "{} is set: a client certificate needs its private key (set both or neither)",
                    rules.cert_key
                ),
            ))
        }
        (true, false) => {
            return Err(invalid(
                rules.cert_key,
                format!(
                    "{} is set: a private key needs its client certificate (set both or neither)",
                    rules.key_key
                ),
            ))
        }
        (false, false) => {}
    }
    if mode.eq_ignore_ascii_case(rules.plain) {
        return Err(invalid(
            rules.cert_key,
            format!(
                "{} = {mode} never uses TLS, so the client certificate would never be sent",
                rules.mode_key
            ),
        ));
    }
    check_pem(rules.cert_key, &keys.ssl_cert, Pem::Certificate)?;
    check_pem(rules.key_key, &keys.ssl_key, Pem::PrivateKey)
}

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pem {
    Certificate,
    PrivateKey,
}

/// Readable now and holding what it should (a typo fails the start, not the first reconnect
/// hours later). A private key must be unencrypted: the driver has no passphrase key.
fn check_pem(key: &'static str, path: &str, kind: Pem) -> Result<(), SettingsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read `{path}`: {e}")))?;
    let (found, what) = match kind {
        Pem::Certificate => (text.contains("-----BEGIN CERTIFICATE-----"), "certificate"),
        Pem::PrivateKey => {
            if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
                return Err(invalid(
                    key,
                    format!(
                        "`{path}` is encrypted; the driver reads only unencrypted keys (protect \
                         the file instead: mode 0600, or a systemd credential)"
                    ),
                ));
            }
            let found = [
                "PRIVATE KEY-----",
                "RSA PRIVATE KEY-----",
                "EC PRIVATE KEY-----",
            ]
            .iter()
            .any(|end| text.contains(&format!("-----BEGIN {end}")));
            (found, "private key")
        }
    };
    if found {
        Ok(())
    } else {
        Err(invalid(key, format!("`{path}` holds no PEM {what}")))
    }
}

/// The URL's scheme, the password given once, and the TLS keys of one section.
pub(super) fn check_connect(rules: &TlsRules, keys: &ConnectKeys) -> Result<(), SettingsError> {
    check_url(&keys.url, rules.url_key, rules.schemes)?;
    check_password_once(&keys.url, &keys.password, rules)?;
    check_tls(rules, keys)
}

fn check_url(url: &SecretUrl, key: &'static str, schemes: &[&str]) -> Result<(), SettingsError> {
    let raw = url.expose();
    if schemes.iter().any(|s| raw.starts_with(s)) && raw.len() > 12 {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!(
                "`{}` must start with {}",
                redact_url(url),
                schemes.join(" or ")
            ),
        ))
    }
}

/// A password key next to a URL that carries one too is refused: which one wins would be a
/// guess.
fn check_password_once(
    url: &SecretUrl,
    password: &Secret,
    rules: &TlsRules,
) -> Result<(), SettingsError> {
    if !password.is_empty() && url_has_password(url.expose()) {
        return Err(invalid(
            rules.password_key,
            format!("{} carries a password too; keep one", rules.url_key),
        ));
    }
    Ok(())
}

/// `scheme://user:password@host/…` has a password.
fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'))
}

/// The URL's query as `(name, value)` pairs (names are plain ASCII, values used as given).
fn query_params(url: &str) -> Vec<(&str, &str)> {
    url.split_once('?')
        .map(|(_, q)| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split_once('=').unwrap_or((p, "")))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rules: &TlsRules, url: &str, mode: &str, ca: &str) -> Result<(), SettingsError> {
        check_client(rules, url, mode, ca, ["", ""])
    }

    fn check_client(
        rules: &TlsRules,
        url: &str,
        mode: &str,
        ca: &str,
        [cert, key]: [&str; 2],
    ) -> Result<(), SettingsError> {
        check_tls(
            rules,
            &ConnectKeys {
                url: url.into(),
                password: Secret::default(),
                ssl_mode: mode.into(),
                ssl_ca: ca.into(),
                ssl_cert: cert.into(),
                ssl_key: key.into(),
            },
        )
    }

    fn ca_file(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("msgx_tls_{}_{name}", std::process::id()));
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }

    #[test]
    fn modes_are_checked_and_given_once() {
        let url = "postgres://app@db/msgx";
        assert!(check(&STORE_TLS, url, "", "").is_ok());
        assert!(check(&STORE_TLS, url, "verify-full", "").is_ok());
        assert!(check(&INBOX_TLS, "mysql://a@h/d", "verify_identity", "").is_ok());
        let e = check(&STORE_TLS, url, "verify_full", "").expect_err("unknown");
        assert!(e.to_string().contains("store.ssl_mode"), "{e}");
        let e = check(
            &STORE_TLS,
            "postgres://a@h/d?sslmode=require",
            "verify-full",
            "",
        )
        .expect_err("twice");
        assert!(e.to_string().contains("keep one"), "{e}");
        let e = check(&INBOX_TLS, "mysql://a@h/d", "REQUIRE", "").expect_err("pg word");
        assert!(e.to_string().contains("inbox.ssl_mode"), "{e}");
    }

    #[test]
    fn a_ca_file_needs_a_verifying_mode_and_a_certificate() {
        let good = ca_file(
            "good.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let bad = ca_file("bad.pem", "not a certificate\n");
        let url = "postgres://app@db/msgx";
        assert!(check(&STORE_TLS, url, "verify-ca", &good).is_ok());
        let from_url = "postgres://app@db/msgx?sslmode=verify-full";
        assert!(check(&STORE_TLS, from_url, "", &good).is_ok());
        let e = check(&STORE_TLS, url, "require", &good).expect_err("require");
        assert!(e.to_string().contains("store.ssl_ca"), "{e}");
        let e = check(&STORE_TLS, url, "verify-full", &bad).expect_err("no cert");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = check(
            &INBOX_TLS,
            "mysql://a@h/d",
            "VERIFY_CA",
            "/nonexistent/ca.pem",
        )
        .expect_err("missing");
        let line = e.to_string();
        assert!(
            line.contains("inbox.ssl_ca") && line.contains("/nonexistent/ca.pem"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        let _ = std::fs::remove_file(good);
        let _ = std::fs::remove_file(bad);
    }

    #[test]
    fn a_client_certificate_comes_with_its_key_and_tls() {
        let cert = ca_file(
            "client.crt",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let key = ca_file(
            "client.key",
            "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
        );
        let rsa = ca_file(
            "rsa.key",
            "-----BEGIN RSA PRIVATE KEY-----\nAA==\n-----END RSA PRIVATE KEY-----\n",
        );
        let sealed = ca_file(
            "sealed.key",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAA==\n-----END ENCRYPTED PRIVATE KEY-----\n",
        );
        let (pg, my) = ("postgres://app@db/msgx", "mysql://a@h/d");
        assert!(check_client(&STORE_TLS, pg, "require", "", [&cert, &key]).is_ok());
        assert!(check_client(&INBOX_TLS, my, "", "", [&cert, &rsa]).is_ok());
        // Each refusal is one line naming the key and why.
        let refused = |url: &str, mode: &str, files: [&str; 2], name: &str, why: &str| {
            let rules = if url.starts_with("mysql") {
                &INBOX_TLS
            } else {
                &STORE_TLS
            };
            let e = check_client(rules, url, mode, "", files)
                .expect_err(why)
                .to_string();
            assert!(e.contains(name) && e.contains(why), "{files:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        };
        let (c, k) = (cert.as_str(), key.as_str());
        refused(pg, "", [c, ""], "store.ssl_key", "both or neither");
        refused(my, "", ["", k], "inbox.ssl_cert", "both or neither");
        refused(pg, "disable", [c, k], "store.ssl_cert", "never uses TLS");
        refused(my, "", [k, k], "inbox.ssl_cert", "no PEM certificate");
        refused(pg, "", [c, c], "store.ssl_key", "no PEM private key");
        refused(pg, "", [c, &sealed], "store.ssl_key", "encrypted");
        let gone = "/nonexistent/k";
        refused(pg, "", [c, gone], "store.ssl_key", "cannot read");
        let twice = "mysql://a@h/d?ssl-cert=/etc/c.pem";
        refused(twice, "", [c, k], "inbox.ssl_cert", "keep one");
        for f in [cert, key, rsa, sealed] {
            let _ = std::fs::remove_file(f);
        }
    }

    #[test]
    fn a_password_is_given_once() {
        let pw: Secret = "0012345678".into();
        let with: SecretUrl = "postgres://app:pw@db/msgx".into();
        let without: SecretUrl = "postgres://app@db/msgx?x=a:b@c".into();
        assert!(check_password_once(&without, &pw, &STORE_TLS).is_ok());
        assert!(check_password_once(&with, &Secret::default(), &STORE_TLS).is_ok());
        let e = check_password_once(&with, &pw, &STORE_TLS).expect_err("twice");
        assert!(e.to_string().contains("store.password"), "{e}");
    }
}
