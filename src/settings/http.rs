//! `[http]` (the HTTP surface and its bearer tokens) and `[log]`.

use serde::{Deserialize, Serialize};

use std::time::Duration;

use super::secret::Secret;
use super::{check_nonzero, duration, invalid, SettingsError};

/// HTTP surface.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Listen address of `/metrics`, `/healthz`, `/readyz` (and `/admin/*` when enabled).
    pub listen: String,
    /// Bearer token of the admin API and the compat entry, with every scope (kept from earlier
    /// versions). With this and the scoped lists all empty there is no admin surface (404).
    /// At least 16 characters; never printed. A token with every scope (read, operate, compat).
    pub admin_token: Secret,
    /// Comma-separated bearer tokens that may read `/admin/*` (status, messages, dead events).
    #[serde(default)]
    pub read_tokens: Secret,
    /// Comma-separated bearer tokens that may also run the audited actions (`POST /admin/*`).
    #[serde(default)]
    pub operate_tokens: Secret,
    /// Comma-separated bearer tokens that may call only the compat entry `POST /cminmsgs/send`.
    #[serde(default)]
    pub compat_tokens: Secret,
    /// How long a client may take to send a request's head, and again its body: a slower
    /// one gets 408 and its connection is closed, so a slow client cannot hold a connection.
    #[serde(with = "duration", default = "default_read_timeout")]
    pub read_timeout: Duration,
}

fn default_read_timeout() -> Duration {
    Duration::from_secs(5)
}

/// One configured bearer token: `name:secret`, or a bare `secret` (earlier versions) that is
/// then named by its key and position ([`HttpSettings::tokens`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry<'a> {
    /// The key it is listed under (`http.read_tokens`, …).
    pub key: &'static str,
    /// The name the audit log and the logs record: the given one, or `<scope>-<n>` (the
    /// n-th entry of its list) / `admin` for a bare token.
    pub name: String,
    /// Whether the name was given (`name:secret`).
    pub named: bool,
    /// The secret the request's bearer token must equal.
    pub secret: &'a str,
}

/// Longest token name.
pub const MAX_TOKEN_NAME: usize = 64;

/// A token name: 1..=64 of `A-Z a-z 0-9 . _ @ -` (it lands in the audit log and the logs).
fn valid_name(name: &str) -> bool {
    (1..=MAX_TOKEN_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
}

impl HttpSettings {
    /// Every configured token with its key and name, in the order listed (`admin_token`
    /// first). Entries are comma-separated, each `name:secret` or a bare secret.
    pub fn tokens(&self) -> Vec<TokenEntry<'_>> {
        let lists = [
            ("http.admin_token", &self.admin_token, "admin"),
            ("http.read_tokens", &self.read_tokens, "read"),
            ("http.operate_tokens", &self.operate_tokens, "operate"),
            ("http.compat_tokens", &self.compat_tokens, "compat"),
        ];
        let mut out = Vec::new();
        for (key, list, scope) in lists {
            let entries = list.expose().split(',').map(str::trim);
            for (i, entry) in entries.filter(|t| !t.is_empty()).enumerate() {
                let (name, named, secret) = match entry.split_once(':') {
                    Some((name, secret)) => (name.to_string(), true, secret),
                    None if key == "http.admin_token" => (scope.to_string(), false, entry),
                    None => (format!("{scope}-{}", i + 1), false, entry),
                };
                out.push(TokenEntry {
                    key,
                    name,
                    named,
                    secret,
                });
            }
        }
        out
    }

    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        check_nonzero(self.read_timeout, "http.read_timeout")?;
        if self.read_timeout > Duration::from_secs(300) {
            return Err(invalid("http.read_timeout", "longer than 5m"));
        }
        self.listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.listen)))?;
        if self.admin_token.expose().contains(',') {
            return Err(invalid(
                "http.admin_token",
                "is one token (`name:secret` or a bare secret); list more in the scoped keys",
            ));
        }
        for t in self.tokens() {
            if t.named && !valid_name(&t.name) {
                return Err(invalid(
                    t.key,
                    format!(
                        "a token is written `name:secret` with a name of 1..={MAX_TOKEN_NAME} \
                         letters, digits, `.`, `_`, `@` or `-` (a secret containing `:` needs a \
                         name in front)"
                    ),
                ));
            }
            if t.secret.len() < 16 || t.secret.chars().any(char::is_whitespace) {
                return Err(invalid(
                    t.key,
                    "every token's secret must be at least 16 characters without spaces \
                     (comma-separated `name:secret`; \"\" = none)",
                ));
            }
        }
        self.check_token_hygiene()
    }

    /// Each name once and each secret once across every list: the audit log tells callers
    /// apart by name, and a secret listed under two scopes (a compat secret pasted into
    /// `operate_tokens`) would quietly hold both.
    fn check_token_hygiene(&self) -> Result<(), SettingsError> {
        let tokens = self.tokens();
        for (i, t) in tokens.iter().enumerate() {
            for earlier in &tokens[..i] {
                if earlier.name == t.name {
                    return Err(invalid(
                        t.key,
                        format!(
                            "the token name `{}` is used twice (also in {}): each caller's own \
                             name is what the audit log records",
                            t.name, earlier.key
                        ),
                    ));
                }
                if earlier.secret == t.secret {
                    return Err(invalid(
                        t.key,
                        format!(
                            "token `{}` has the same secret as `{}` in {}: one secret would hold \
                             both entries' scopes; give each its own",
                            t.name, earlier.name, earlier.key
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// What start-up warns about the tokens: `http.admin_token` holds every scope (read,
    /// operate and the compat entry); a scoped token per caller is what least privilege asks.
    pub fn token_warnings(&self) -> Vec<(&'static str, String)> {
        if self.admin_token.expose().trim().is_empty() {
            return Vec::new();
        }
        vec![(
            "http.admin_token",
            "holds every scope (read, operate, compat): a leak of it can read, run the audited \
             actions and register inbox ids; give each caller a token in http.read_tokens, \
             http.operate_tokens or http.compat_tokens instead"
                .to_string(),
        )]
    }
}

/// Logging.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `tracing` filter, e.g. `info,msgx_core=debug`; `RUST_LOG` overrides it.
    pub level: String,
    /// `text` for people, `json` for log shippers.
    pub format: String,
}

impl LogSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        if !matches!(self.format.as_str(), "text" | "json") {
            return Err(invalid(
                "log.format",
                format!("`{}` is not `text` or `json`", self.format),
            ));
        }
        Ok(())
    }
}
