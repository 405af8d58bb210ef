//! The TLS and password keys of `[inbox]` and `[store]`, checked at start: a mode the driver
//! knows, a CA file that can be read and holds a certificate, and nothing given twice (a key
//! and the same parameter in the URL would leave an operator guessing which one counts).

use super::secret::{Secret, SecretUrl};
use super::{invalid, SettingsError};

/// What one database section accepts.
pub(super) struct TlsRules {
    /// `store.ssl_mode`.
    mode_key: &'static str,
    /// `store.ssl_ca`.
    ca_key: &'static str,
    /// `store.url`.
    url_key: &'static str,
    /// Every mode the driver knows (compared without case).
    modes: &'static [&'static str],
    /// The modes that check the server certificate against a CA.
    verifying: &'static [&'static str],
    /// URL query parameters that set the mode.
    mode_params: &'static [&'static str],
    /// URL query parameters that set the CA file.
    ca_params: &'static [&'static str],
}

/// PostgreSQL (`sslmode`, `sslrootcert`).
pub(super) const STORE_TLS: TlsRules = TlsRules {
    mode_key: "store.ssl_mode",
    ca_key: "store.ssl_ca",
    url_key: "store.url",
    modes: &[
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ],
    verifying: &["verify-ca", "verify-full"],
    mode_params: &["sslmode", "ssl-mode"],
    ca_params: &["sslrootcert", "ssl-root-cert", "ssl-ca"],
};

/// MySQL / MariaDB (`ssl-mode`, `ssl-ca`).
pub(super) const INBOX_TLS: TlsRules = TlsRules {
    mode_key: "inbox.ssl_mode",
    ca_key: "inbox.ssl_ca",
    url_key: "inbox.url",
    modes: &[
        "DISABLED",
        "PREFERRED",
        "REQUIRED",
        "VERIFY_CA",
        "VERIFY_IDENTITY",
    ],
    verifying: &["VERIFY_CA", "VERIFY_IDENTITY"],
    mode_params: &["sslmode", "ssl-mode"],
    ca_params: &["sslca", "ssl-ca"],
};

/// The section's values.
pub(super) struct TlsKeys<'a> {
    pub url: &'a str,
    pub mode: &'a str,
    pub ca: &'a str,
}

/// The mode is known and given once, the CA file readable and used by a verifying mode.
pub(super) fn check_tls(rules: &TlsRules, keys: TlsKeys<'_>) -> Result<(), SettingsError> {
    let params = query_params(keys.url);
    let url_param = |names: &[&str]| {
        params
            .iter()
            .find(|(k, _)| names.iter().any(|n| k.eq_ignore_ascii_case(n)))
            .map(|(_, v)| *v)
    };
    let url_mode = url_param(rules.mode_params);
    if !keys.mode.is_empty() {
        if !rules
            .modes
            .iter()
            .any(|m| m.eq_ignore_ascii_case(keys.mode))
        {
            return Err(invalid(
                rules.mode_key,
                format!("`{}` is not one of {}", keys.mode, rules.modes.join(" | ")),
            ));
        }
        if url_mode.is_some() {
            return Err(invalid(
                rules.mode_key,
                format!("{} sets the TLS mode too; keep one", rules.url_key),
            ));
        }
    }
    if keys.ca.is_empty() {
        return Ok(());
    }
    if url_param(rules.ca_params).is_some() {
        return Err(invalid(
            rules.ca_key,
            format!("{} names a CA file too; keep one", rules.url_key),
        ));
    }
    let mode = if keys.mode.is_empty() {
        url_mode.unwrap_or("")
    } else {
        keys.mode
    };
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
    check_ca_file(rules.ca_key, keys.ca)
}

/// Readable now and holding at least one PEM certificate (a typo fails the start, not the
/// first reconnect hours later).
fn check_ca_file(key: &'static str, path: &str) -> Result<(), SettingsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read `{path}`: {e}")))?;
    if text.contains("-----BEGIN CERTIFICATE-----") {
        Ok(())
    } else {
        Err(invalid(key, format!("`{path}` holds no PEM certificate")))
    }
}

/// A password key next to a URL that carries one too is refused: which one wins would be a
/// guess.
pub(super) fn check_password_once(
    url: &SecretUrl,
    password: &Secret,
    key: &'static str,
    url_key: &'static str,
) -> Result<(), SettingsError> {
    if !password.is_empty() && url_has_password(url.expose()) {
        return Err(invalid(
            key,
            format!("{url_key} carries a password too; keep one"),
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

    fn keys<'a>(url: &'a str, mode: &'a str, ca: &'a str) -> TlsKeys<'a> {
        TlsKeys { url, mode, ca }
    }

    fn ca_file(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("msgx_tls_{}_{name}", std::process::id()));
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }

    #[test]
    fn modes_are_checked_and_given_once() {
        let url = "postgres://app@db/msgx";
        assert!(check_tls(&STORE_TLS, keys(url, "", "")).is_ok());
        assert!(check_tls(&STORE_TLS, keys(url, "verify-full", "")).is_ok());
        assert!(check_tls(&INBOX_TLS, keys("mysql://a@h/d", "verify_identity", "")).is_ok());
        let e = check_tls(&STORE_TLS, keys(url, "verify_full", "")).expect_err("unknown");
        assert!(e.to_string().contains("store.ssl_mode"), "{e}");
        let e = check_tls(
            &STORE_TLS,
            keys("postgres://a@h/d?sslmode=require", "verify-full", ""),
        )
        .expect_err("twice");
        assert!(e.to_string().contains("keep one"), "{e}");
        let e = check_tls(&INBOX_TLS, keys("mysql://a@h/d", "REQUIRE", "")).expect_err("pg word");
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
        assert!(check_tls(&STORE_TLS, keys(url, "verify-ca", &good)).is_ok());
        let from_url = "postgres://app@db/msgx?sslmode=verify-full";
        assert!(check_tls(&STORE_TLS, keys(from_url, "", &good)).is_ok());
        let e = check_tls(&STORE_TLS, keys(url, "require", &good)).expect_err("require");
        assert!(e.to_string().contains("store.ssl_ca"), "{e}");
        let e = check_tls(&STORE_TLS, keys(url, "verify-full", &bad)).expect_err("no cert");
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = check_tls(
            &INBOX_TLS,
            keys("mysql://a@h/d", "VERIFY_CA", "/nonexistent/ca.pem"),
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
    fn a_password_is_given_once() {
        let pw: Secret = "0012345678".into();
        let with: SecretUrl = "postgres://app:pw@db/msgx".into();
        let without: SecretUrl = "postgres://app@db/msgx?x=a:b@c".into();
        assert!(check_password_once(&without, &pw, "store.password", "store.url").is_ok());
        assert!(
            check_password_once(&with, &Secret::default(), "store.password", "store.url").is_ok()
        );
        let e = check_password_once(&with, &pw, "store.password", "store.url").expect_err("twice");
        assert!(e.to_string().contains("store.password"), "{e}");
    }
}
