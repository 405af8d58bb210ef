//! `[http]` (the HTTP surface and its bearer tokens) and `[log]`.

use serde::{Deserialize, Serialize};

use super::secret::Secret;
use super::{invalid, SettingsError};

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
}

impl HttpSettings {
    pub(super) fn validate(&self) -> Result<(), SettingsError> {
        self.listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.listen)))?;
        let token = self.admin_token.expose();
        if !token.is_empty() && (token.len() < 16 || token.chars().any(char::is_whitespace)) {
            return Err(invalid(
                "http.admin_token",
                "must be empty (no admin surface) or at least 16 characters without spaces",
            ));
        }
        for (key, list) in [
            ("http.read_tokens", &self.read_tokens),
            ("http.operate_tokens", &self.operate_tokens),
            ("http.compat_tokens", &self.compat_tokens),
        ] {
            let bad = list
                .expose()
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .any(|t| t.len() < 16 || t.chars().any(char::is_whitespace));
            if bad {
                return Err(invalid(
                    key,
                    "every token must be at least 16 characters without spaces (comma-separated)",
                ));
            }
        }
        Ok(())
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
