//! The inbox's connect options: `inbox.url` with `inbox.password` and the TLS keys, for every
//! connection the service and its tools open to the inbox.

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use super::InboxError;
use crate::settings::{redact_url, InboxSettings};

/// `inbox.url` with `inbox.password`, `inbox.ssl_mode` and `inbox.ssl_ca` applied (each
/// validated at start; a URL that sets one of them too was refused then).
pub fn connect_options(settings: &InboxSettings) -> Result<MySqlConnectOptions, InboxError> {
    let url_error = |source| InboxError::Url {
        url: redact_url(&settings.url),
        source,
    };
    let mut options = MySqlConnectOptions::from_str(settings.url.expose()).map_err(url_error)?;
    if !settings.password.is_empty() {
        options = options.password(settings.password.expose());
    }
    if !settings.ssl_mode.is_empty() {
        options = options.ssl_mode(MySqlSslMode::from_str(&settings.ssl_mode).map_err(url_error)?);
    }
    if !settings.ssl_ca.is_empty() {
        options = options.ssl_ca(&settings.ssl_ca);
    }
    Ok(options)
}
