//! The connect keys both databases share — `url`, `password`, `ssl_mode`, `ssl_ca`,
//! `ssl_cert`, `ssl_key` ([`ConnectKeys`], checked at start by `settings::tls`) — applied the
//! same way to PostgreSQL's and MySQL's connect options, so the store and the inbox cannot
//! drift apart in how a key is read. Each store maps the driver's error to its own.

use std::str::FromStr;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::settings::ConnectKeys;

/// What the two drivers' connect options have in common, under one name each.
pub trait DbOptions: FromStr<Err = sqlx::Error> + Sized {
    /// The driver's TLS mode (`PgSslMode`, `MySqlSslMode`).
    type Mode: FromStr<Err = sqlx::Error>;
    /// The password apart from the URL.
    fn with_password(self, password: &str) -> Self;
    /// The TLS mode.
    fn with_mode(self, mode: Self::Mode) -> Self;
    /// The CA file the server certificate must chain to.
    fn with_ca(self, path: &str) -> Self;
    /// Our client certificate and its private key (files).
    fn with_client_cert(self, cert: &str, key: &str) -> Self;
}

impl DbOptions for PgConnectOptions {
    type Mode = PgSslMode;
    fn with_password(self, password: &str) -> Self {
        self.password(password)
    }
    fn with_mode(self, mode: PgSslMode) -> Self {
        self.ssl_mode(mode)
    }
    fn with_ca(self, path: &str) -> Self {
        self.ssl_root_cert(path)
    }
    fn with_client_cert(self, cert: &str, key: &str) -> Self {
        self.ssl_client_cert(cert).ssl_client_key(key)
    }
}

impl DbOptions for MySqlConnectOptions {
    type Mode = MySqlSslMode;
    fn with_password(self, password: &str) -> Self {
        self.password(password)
    }
    fn with_mode(self, mode: MySqlSslMode) -> Self {
        self.ssl_mode(mode)
    }
    fn with_ca(self, path: &str) -> Self {
        self.ssl_ca(path)
    }
    fn with_client_cert(self, cert: &str, key: &str) -> Self {
        self.ssl_client_cert(cert).ssl_client_key(key)
    }
}

/// The URL's options with every key that is set applied on top (start-up refused a key that
/// the URL sets too, so nothing here overrides the URL silently). Certificates are read by the
/// driver at each new connection: a renewed file takes effect without a restart.
pub fn connect_options<O: DbOptions>(keys: &ConnectKeys) -> Result<O, sqlx::Error> {
    let mut options = O::from_str(keys.url.expose())?;
    if !keys.password.is_empty() {
        options = options.with_password(keys.password.expose());
    }
    if !keys.ssl_mode.is_empty() {
        options = options.with_mode(O::Mode::from_str(&keys.ssl_mode)?);
    }
    if !keys.ssl_ca.is_empty() {
        options = options.with_ca(&keys.ssl_ca);
    }
    // Both or neither (checked at start).
    if !keys.ssl_cert.is_empty() && !keys.ssl_key.is_empty() {
        options = options.with_client_cert(&keys.ssl_cert, &keys.ssl_key);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    /// A CA certificate (self-signed, its key discarded when it was made).
    const CA: &str = include_str!("../tests/fixtures/tls/test-ca.crt");

    /// A named CA is the only root trusted (sqlx-core patch, third_party/README.md): the root
    /// set is exactly its certificate(s); without one, the compiled-in public roots.
    #[test]
    fn a_named_ca_is_the_only_root() {
        let named = sqlx_core::net::tls::trusted_roots(Some(CA.as_bytes())).expect("the CA");
        assert_eq!(
            named.len(),
            1,
            "only the named CA, no public root beside it"
        );
        let builtin = sqlx_core::net::tls::trusted_roots(None).expect("public roots");
        assert!(builtin.len() > 100, "{} public roots", builtin.len());
        assert!(sqlx_core::net::tls::trusted_roots(Some(b"no PEM here")).is_err());
    }
}
