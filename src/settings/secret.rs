//! Secrets in the configuration: a type that never prints its value. The value is held in the
//! `secrecy` crate's [`SecretString`] (zeroed when dropped, read only through
//! `ExposeSecret`); this wrapper adds how each kind is *shown*: `Debug`, `Display` and
//! `Serialize` (what `check-config` prints) give only the redacted form, by the field's
//! type, not by a list of key names. The value itself is read with an explicit
//! [`Secret::expose`] where it is used (a connection, a token check).

use std::fmt;
use std::marker::PhantomData;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How a secret of one kind is shown.
pub trait Redaction {
    /// The printable form of `raw`.
    fn redact(raw: &str) -> String;
}

/// The whole value is secret (a password, a token, a token list): `***`, or `""` when unset
/// (so an operator sees that it is unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole;

impl Redaction for Whole {
    fn redact(raw: &str) -> String {
        if raw.is_empty() {
            String::new()
        } else {
            "***".into()
        }
    }
}

/// A URL whose password is secret: shown with the password as `***`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlPassword;

impl Redaction for UrlPassword {
    fn redact(raw: &str) -> String {
        redact_url(raw)
    }
}

/// `key=value;key=value` properties where values of `*password*` / `*secret*` keys are secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretPairs;

impl Redaction for SecretPairs {
    fn redact(raw: &str) -> String {
        redact_extra(raw)
    }
}

/// A configured secret; see the module docs.
pub struct Secret<R: Redaction = Whole> {
    /// The value, zeroed on drop.
    raw: SecretString,
    /// How it is shown.
    kind: PhantomData<R>,
}

/// A database URL that may carry a password.
pub type SecretUrl = Secret<UrlPassword>;

impl<R: Redaction> Secret<R> {
    /// The value itself, for the one place that needs it. Never log it.
    pub fn expose(&self) -> &str {
        self.raw.expose_secret()
    }

    /// True when unset.
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }

    /// The printable form.
    pub fn redacted(&self) -> String {
        R::redact(self.expose())
    }
}

impl<R: Redaction> Clone for Secret<R> {
    fn clone(&self) -> Self {
        Secret {
            raw: self.raw.clone(),
            kind: PhantomData,
        }
    }
}

impl<R: Redaction> Default for Secret<R> {
    fn default() -> Self {
        String::new().into()
    }
}

impl<R: Redaction> PartialEq for Secret<R> {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl<R: Redaction> Eq for Secret<R> {}

impl<R: Redaction> From<String> for Secret<R> {
    fn from(raw: String) -> Self {
        Secret {
            raw: raw.into(),
            kind: PhantomData,
        }
    }
}

impl<R: Redaction> From<&str> for Secret<R> {
    fn from(raw: &str) -> Self {
        raw.to_string().into()
    }
}

impl<R: Redaction> fmt::Debug for Secret<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

impl<R: Redaction> fmt::Display for Secret<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl<'de, R: Redaction> Deserialize<'de> for Secret<R> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

impl<R: Redaction> Serialize for Secret<R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// Text that [`redact_url`] can show: a plain URL, or a [`SecretUrl`] (shown redacted without
/// exposing it at the call site).
pub trait UrlText {
    /// The URL as text, password included.
    fn url_text(&self) -> &str;
}

impl UrlText for str {
    fn url_text(&self) -> &str {
        self
    }
}

impl UrlText for String {
    fn url_text(&self) -> &str {
        self
    }
}

impl UrlText for SecretUrl {
    fn url_text(&self) -> &str {
        self.expose()
    }
}

/// A URL with its password replaced by `***`, safe for logs and errors.
pub fn redact_url(url: &(impl UrlText + ?Sized)) -> String {
    let url = url.url_text();
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.find('@') else {
        return url.to_string();
    };
    let creds = &rest[..at];
    match creds.find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &creds[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// librdkafka property names whose values are secret (`ssl.key.password`,
/// `sasl.oauthbearer.client.secret`, …): `kafka.extra` is free-form, so its pairs are judged
/// by name.
pub(super) fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    // librdkafka's secret-bearing properties: passwords and secrets by name, inline PEM keys
    // (`ssl.key.pem`, `ssl.keystore…`), and the SASL configs that carry credentials inline
    // (`sasl.oauthbearer.config`, `sasl.jaas.config`, `sasl.kerberos.keytab` is a path).
    k.contains("password")
        || k.contains("secret")
        || k.contains("token")
        || k.ends_with(".pem")
        || k.contains("keystore")
        || k == "sasl.oauthbearer.config"
        || k == "sasl.jaas.config"
        || k.contains("credential")
}

/// One `key=value` pair with a secret value replaced.
pub(super) fn redact_pair(part: &str) -> String {
    match part.split_once('=') {
        Some((k, _)) if is_secret_key(k) => format!("{k}=***"),
        _ => part.to_string(),
    }
}

/// `extra` with secret values replaced, safe for logs.
pub fn redact_extra(extra: &str) -> String {
    extra
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(redact_pair)
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_bearing_kafka_property_is_redacted() {
        for key in [
            "ssl.key.password",
            "sasl.password",
            "ssl.key.pem",
            "ssl.keystore.location",
            "ssl.keystore.password",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.client.secret",
            "sasl.jaas.config",
            "sasl.oauthbearer.token.endpoint.url.credentials",
        ] {
            let line = redact_extra(&format!("socket.keepalive.enable=true; {key}=hush"));
            assert!(!line.contains("hush"), "{key}: {line}");
            assert!(line.contains(&format!("{key}=***")), "{key}: {line}");
        }
        assert_eq!(
            redact_extra("ssl.ca.location=/etc/ca.pem"),
            "ssl.ca.location=/etc/ca.pem",
            "a path to a public CA is no secret"
        );
    }

    #[test]
    fn a_secret_prints_only_redacted() {
        let token: Secret = "operator-secret-0123456789".into();
        assert_eq!(format!("{token:?}"), "\"***\"");
        assert_eq!(token.to_string(), "***");
        assert_eq!(token.expose(), "operator-secret-0123456789");
        assert_eq!(
            Secret::<Whole>::default().to_string(),
            "",
            "unset shows unset"
        );
        let url: SecretUrl = "postgres://app:s3cret@db:5432/msgx".into();
        assert_eq!(format!("{url}"), "postgres://app:***@db:5432/msgx");
        assert_eq!(redact_url(&url), "postgres://app:***@db:5432/msgx");
        assert!(!format!("{url:?}").contains("s3cret"));
        let extra: Secret<SecretPairs> = "ssl.key.password=k3y;linger.ms=2".into();
        assert_eq!(extra.to_string(), "ssl.key.password=***;linger.ms=2");
        let toml =
            toml::to_string(&std::collections::BTreeMap::from([("t", &token)])).expect("serialize");
        assert_eq!(toml.trim(), "t = \"***\"");
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/msgx"),
            "postgres://app:***@db:5432/msgx"
        );
        assert_eq!(redact_url("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(redact_url("no scheme"), "no scheme");
    }
}
