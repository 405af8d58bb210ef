//! The configuration layers, for the binary and the tests alike: `config/default.toml` compiled
//! in as the base (so `msgexchange` runs from any directory), then `--config FILE`, then
//! `--config-extra FILE`, then `MSGX_*` variables; and the effective configuration printed as
//! TOML with every secret redacted (`check-config`).

use std::path::Path;

use super::{Settings, SettingsError};

/// The shipped defaults, compiled into the binary: every key with its documentation.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// The one loader: the layers, then typed parsing (unknown keys refused, durations bounded),
/// then validation. `env: None` reads the process's `MSGX_*` variables; tests give the pairs
/// instead (the process environment is shared by parallel tests).
fn load_layers(
    config: Option<&Path>,
    extra: Option<&Path>,
    env: Option<&[(&str, &str)]>,
) -> Result<Settings, SettingsError> {
    let mut builder = config::Config::builder().add_source(config::File::from_str(
        DEFAULT_TOML,
        config::FileFormat::Toml,
    ));
    for file in [config, extra].into_iter().flatten() {
        builder = builder.add_source(config::File::from(file).required(true));
    }
    let env = env.map(|pairs| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    let settings: Settings = builder
        .add_source(env_source(env))
        .build()
        .and_then(config::Config::try_deserialize::<Settings>)
        .map_err(|e| SettingsError::Load(e.to_string()))?;
    settings.validate()?;
    Ok(settings)
}

/// `MSGX_SECTION__KEY` (e.g. `MSGX_PIPELINE__MAX_COMMIT_DELAY=5m`), from `map` or the process.
fn env_source(map: Option<config::Map<String, String>>) -> config::Environment {
    config::Environment::with_prefix("MSGX")
        .prefix_separator("_")
        .separator("__")
        .try_parsing(true)
        .source(map)
}

impl Settings {
    /// What the binary loads: the compiled-in defaults, then `config` (a full or partial
    /// file), then `extra`, then the `MSGX_*` environment. A file named but missing is an
    /// error naming it.
    pub fn load_layered(
        config: Option<&Path>,
        extra: Option<&Path>,
    ) -> Result<Self, SettingsError> {
        load_layers(config, extra, None)
    }

    /// The same layers with these `MSGX_*` pairs as the environment (tests: the process
    /// environment is shared by tests running in parallel).
    pub fn load_layered_with_env(
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<Self, SettingsError> {
        load_layers(config, None, Some(env))
    }

    /// The effective configuration of these layers as TOML, validated, every secret printed
    /// by its type's redaction (`"***"`, passwords in URLs too): what `check-config` prints.
    /// Durations are written in days, hours, minutes and seconds (`"30d"`, `"1h 30m"`).
    pub fn effective_toml(
        config: Option<&Path>,
        extra: Option<&Path>,
        env: Option<&[(&str, &str)]>,
    ) -> Result<String, SettingsError> {
        let settings = load_layers(config, extra, env)?;
        toml::to_string_pretty(&settings).map_err(|e| SettingsError::Load(e.to_string()))
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
