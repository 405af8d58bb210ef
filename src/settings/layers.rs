//! The configuration layers of the binary: `config/default.toml` compiled in as the base (so
//! `msgexchange` runs from any directory), then `--config FILE`, then `--config-extra FILE`,
//! then `MSGX_*` variables; and the effective configuration printed as TOML with every secret
//! redacted (`check-config`).

use std::path::Path;

use super::{env_source, redact_extra, redact_url, Settings, SettingsError};

/// The shipped defaults, compiled into the binary: every key with its documentation.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Keys whose value is a secret however it is spelled (`http.admin_token`,
/// `kafka.sasl_password`, `http.read_tokens`, …).
const SECRET_WORDS: &[&str] = &["password", "token", "secret"];

fn layered(
    config: Option<&Path>,
    extra: Option<&Path>,
    env: Option<config::Map<String, String>>,
) -> config::ConfigBuilder<config::builder::DefaultState> {
    let mut builder = config::Config::builder().add_source(config::File::from_str(
        DEFAULT_TOML,
        config::FileFormat::Toml,
    ));
    for file in [config, extra].into_iter().flatten() {
        builder = builder.add_source(config::File::from(file).required(true));
    }
    builder.add_source(env_source(env))
}

impl Settings {
    /// The compiled-in defaults, then `config` (a full or partial file), then `extra`, then
    /// the `MSGX_*` environment. A file named but missing is an error naming it.
    pub fn load_layered(
        config: Option<&Path>,
        extra: Option<&Path>,
    ) -> Result<Self, SettingsError> {
        Self::from_builder(layered(config, extra, None))
    }

    /// Same as [`Settings::load_layered`] with explicit environment pairs (tests).
    pub fn load_layered_with_env(
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<Self, SettingsError> {
        Self::from_builder(layered(config, None, Some(env_map(env))))
    }

    /// The effective configuration of these layers as TOML, validated, with every secret
    /// replaced by `"***"` (passwords in URLs too): what `check-config` prints.
    pub fn effective_toml(
        config: Option<&Path>,
        extra: Option<&Path>,
        env: Option<&[(&str, &str)]>,
    ) -> Result<String, SettingsError> {
        let env = env.map(env_map);
        Self::from_builder(layered(config, extra, env.clone()))?;
        let merged = layered(config, extra, env)
            .build()
            .map_err(|e| SettingsError::Load(e.to_string()))?;
        let mut table: toml::Table = merged
            .try_deserialize()
            .map_err(|e| SettingsError::Load(e.to_string()))?;
        redact_table(&mut table);
        toml::to_string_pretty(&table).map_err(|e| SettingsError::Load(e.to_string()))
    }
}

fn env_map(env: &[(&str, &str)]) -> config::Map<String, String> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Redacts secrets in place: values of secret-named keys, URL passwords, `kafka.extra`
/// secret pairs.
fn redact_table(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        let lower = key.to_ascii_lowercase();
        match value {
            toml::Value::Table(inner) => redact_table(inner),
            toml::Value::String(s)
                if !s.is_empty() && SECRET_WORDS.iter().any(|w| lower.contains(w)) =>
            {
                *s = "***".into();
            }
            toml::Value::String(s) if SECRET_WORDS.iter().any(|w| lower.contains(w)) => {}
            toml::Value::String(s) if lower == "url" || lower.ends_with("_url") => {
                *s = redact_url(s);
            }
            toml::Value::String(s) if lower == "extra" => *s = redact_extra(s),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiled_defaults_load_without_any_file() {
        let s = Settings::load_layered_with_env(None, &[]).expect("defaults");
        assert_eq!(s.inbox.table, "CMINMSGS");
    }

    #[test]
    fn effective_toml_redacts_and_parses_back() {
        let out = Settings::effective_toml(
            None,
            None,
            Some(&[
                ("MSGX_STORE__URL", "postgres://app:hunter2@db:5432/msgx"),
                ("MSGX_HTTP__ADMIN_TOKEN", "a-very-secret-token-123"),
                ("MSGX_KAFKA__SASL_PASSWORD", "pw-kafka"),
                ("MSGX_KAFKA__EXTRA", "ssl.key.password=k3y;linger.ms=2"),
            ]),
        )
        .expect("effective");
        for secret in ["hunter2", "a-very-secret-token-123", "pw-kafka", "k3y"] {
            assert!(!out.contains(secret), "{secret} leaked:\n{out}");
        }
        let parsed: toml::Table = toml::from_str(&out).expect("valid TOML");
        assert_eq!(parsed["http"]["admin_token"].as_str(), Some("***"));
        assert_eq!(
            parsed["store"]["url"].as_str(),
            Some("postgres://app:***@db:5432/msgx")
        );
        assert_eq!(parsed["pipeline"]["max_commit_delay"].as_str(), Some("5m"));
    }

    #[test]
    fn effective_toml_refuses_an_invalid_value_naming_the_key() {
        let e = Settings::effective_toml(None, None, Some(&[("MSGX_PIPELINE__CLAIM_BATCH", "0")]))
            .expect_err("invalid");
        assert!(e.to_string().contains("pipeline.claim_batch"), "{e}");
    }
}
