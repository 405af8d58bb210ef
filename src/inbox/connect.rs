//! The inbox's connect options: `inbox.url` with `inbox.password` and the TLS keys, for every
//! connection the service and its tools open to the inbox.

use sqlx::mysql::MySqlConnectOptions;

use super::InboxError;
use crate::db_options;
use crate::settings::{redact_url, InboxSettings};

/// `inbox.url` with `inbox.password`, `inbox.ssl_mode`, `inbox.ssl_ca` and the client
/// certificate (`inbox.ssl_cert`, `inbox.ssl_key`) applied, as [`db_options::connect_options`]
/// applies them to both databases (each validated at start; a URL that sets one of them too
/// was refused then).
pub fn connect_options(settings: &InboxSettings) -> Result<MySqlConnectOptions, InboxError> {
    db_options::connect_options(&settings.connect).map_err(|source| InboxError::Url {
        url: redact_url(&settings.connect.url),
        source,
    })
}
