//! What TLS each connection will use, said once at start when it does not verify the server:
//! the packaged configuration asks for `verify-full` / `VERIFY_IDENTITY` (and `ssl` to the
//! brokers), and a site that opts out (`disable`, the driver's `prefer`, `plaintext`) reads so in
//! the log, naming the key.

use super::{query_params, ConnectKeys, TlsRules, INBOX_TLS, STORE_TLS};
use crate::settings::Settings;

/// The mode a connection uses: the key's, else the URL's, else the driver's default.
fn effective_mode<'a>(rules: &TlsRules, keys: &'a ConnectKeys) -> &'a str {
    if !keys.ssl_mode.is_empty() {
        return &keys.ssl_mode;
    }
    let url = keys.url.expose();
    query_params(url)
        .into_iter()
        .find(|(k, _)| rules.mode_params.iter().any(|n| k.eq_ignore_ascii_case(n)))
        .map_or(rules.default_mode, |(_, v)| v)
}

/// Why the mode does not verify the server, when it does not.
fn unverified(rules: &TlsRules, keys: &ConnectKeys) -> Option<String> {
    let mode = effective_mode(rules, keys);
    if rules.verifying.iter().any(|m| m.eq_ignore_ascii_case(mode)) {
        return None;
    }
    let verify = rules.verifying[rules.verifying.len() - 1];
    let what = if mode.eq_ignore_ascii_case(rules.plain) {
        "no TLS at all"
    } else {
        "TLS without checking the server's certificate, or none"
    };
    Some(format!(
        "`{mode}`: {what}; set {} = \"{verify}\" (with {}) unless this connection never leaves \
         the host",
        rules.mode_key, rules.ca_key
    ))
}

impl Settings {
    /// `(key, why)` for each database whose TLS mode does not verify the server (logged once
    /// at start); empty when both verify.
    pub fn unverified_tls(&self) -> Vec<(&'static str, String)> {
        [
            (&INBOX_TLS, &self.inbox.connect),
            (&STORE_TLS, &self.store.connect),
        ]
        .into_iter()
        .filter_map(|(rules, keys)| unverified(rules, keys).map(|why| (rules.mode_key, why)))
        .chain(
            self.kafka_in_clear()
                .map(|why| ("kafka.security_protocol", why)),
        )
        .collect()
    }

    /// Why the brokers are reached without TLS, when they are (not for the in-process
    /// `embedded` cluster, nor before brokers are named).
    fn kafka_in_clear(&self) -> Option<String> {
        let k = &self.kafka;
        let local = k.brokers.trim().is_empty() || k.brokers.trim() == "embedded";
        let proto = k.security_protocol.to_ascii_lowercase();
        (!local && !proto.ends_with("ssl")).then(|| {
            format!(
                "`{proto}`: events and credentials cross the network in clear; set \
                 kafka.security_protocol = \"ssl\" (or \"sasl_ssl\") with kafka.ssl_ca_location"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::Settings;

    fn unverified(env: &[(&str, &str)]) -> Vec<(&'static str, String)> {
        Settings::load_layered_with_env(None, env)
            .expect("load")
            .unverified_tls()
    }

    #[test]
    fn a_mode_that_does_not_verify_is_named_by_its_key() {
        let both = unverified(&[]);
        assert_eq!(both.len(), 2, "{both:?}");
        assert_eq!(both[0].0, "inbox.ssl_mode");
        assert!(both[0].1.starts_with("`PREFERRED`"), "{both:?}");
        assert!(
            both[1].1.contains("store.ssl_mode = \"verify-full\""),
            "{both:?}"
        );
        let off = unverified(&[("MSGX_STORE__SSL_MODE", "disable")]);
        assert!(off[1].1.contains("`disable`: no TLS at all"), "{off:?}");
        let url = "postgres://u@h/d?sslmode=verify-full";
        let verified = unverified(&[
            ("MSGX_INBOX__SSL_MODE", "verify_identity"),
            ("MSGX_STORE__URL", url),
        ]);
        assert!(verified.is_empty(), "{verified:?}");
        let kafka = unverified(&[
            ("MSGX_INBOX__SSL_MODE", "VERIFY_CA"),
            ("MSGX_STORE__SSL_MODE", "verify-ca"),
            ("MSGX_KAFKA__BROKERS", "k1:9092"),
        ]);
        assert_eq!(kafka.len(), 1, "{kafka:?}");
        assert_eq!(kafka[0].0, "kafka.security_protocol");
        let tls = unverified(&[
            ("MSGX_INBOX__SSL_MODE", "VERIFY_CA"),
            ("MSGX_STORE__SSL_MODE", "verify-ca"),
            ("MSGX_KAFKA__BROKERS", "k1:9093"),
            ("MSGX_KAFKA__SECURITY_PROTOCOL", "ssl"),
        ]);
        assert!(tls.is_empty(), "{tls:?}");
    }
}
