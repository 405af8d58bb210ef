//! The configuration layers, for the binary and the tests alike: `config/default.toml` compiled
//! in as the base (so `msgexchange` runs from any directory), then `--config FILE`, then
//! `--config-extra FILE`, then `MSGX_*` variables; and the effective configuration printed as
//! TOML with every secret redacted (`check-config`).

use std::path::{Path, PathBuf};

use super::sources::{self, SecretSources};
use super::{Settings, SettingsError};

/// The shipped defaults, compiled into the binary: every key with its documentation.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// The one loader: the layers, then the secrets read from `*_file` keys and systemd
/// credentials ([`sources`](super::sources)), then typed parsing (unknown keys refused,
/// durations bounded), then validation. `env: None` reads the process's `MSGX_*` variables
/// and `CREDENTIALS_DIRECTORY`; tests give the pairs instead (the process environment is
/// shared by parallel tests).
fn load_layers(
    config: Option<&Path>,
    extra: Option<&Path>,
    env: Option<&[(&str, &str)]>,
) -> Result<(Settings, SecretSources), SettingsError> {
    let mut builder = config::Config::builder().add_source(config::File::from_str(
        DEFAULT_TOML,
        config::FileFormat::Toml,
    ));
    for file in [config, extra].into_iter().flatten() {
        builder = builder.add_source(config::File::from(file).required(true));
    }
    let credentials = credentials_dir(env);
    let env = env.map(|pairs| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    let load = |e: config::ConfigError| SettingsError::Load(e.to_string());
    let mut root = builder
        .add_source(env_source(env))
        .build()
        .and_then(|c| config::Source::collect(&c))
        .map_err(load)?;
    let sources = sources::resolve(&mut root, credentials.as_deref())?;
    let settings: Settings = config::Value::new(None, config::ValueKind::Table(root))
        .try_deserialize()
        .map_err(load)?;
    Ok((settings.resolve()?, sources))
}

/// systemd's `$CREDENTIALS_DIRECTORY` (`LoadCredential=`), from `env` or the process.
fn credentials_dir(env: Option<&[(&str, &str)]>) -> Option<PathBuf> {
    let dir = match env {
        Some(pairs) => pairs
            .iter()
            .find(|(k, _)| *k == "CREDENTIALS_DIRECTORY")
            .map(|(_, v)| std::ffi::OsString::from(v)),
        None => std::env::var_os("CREDENTIALS_DIRECTORY"),
    }?;
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

/// `MSGX_SECTION__KEY` (e.g. `MSGX_PIPELINE__MAX_COMMIT_DELAY=5m`), from `map` or the process.
/// Every value is kept as text (no `try_parsing`): typed keys parse their text themselves, and
/// a secret such as `0012345678` stays exactly that (parsed as a number it lost its zeros).
fn env_source(map: Option<config::Map<String, String>>) -> config::Environment {
    config::Environment::with_prefix("MSGX")
        .prefix_separator("_")
        .separator("__")
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
        load_layers(config, extra, None).map(|(s, _)| s)
    }

    /// The same layers with these `MSGX_*` pairs as the environment (tests: the process
    /// environment is shared by tests running in parallel).
    pub fn load_layered_with_env(
        config: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<Self, SettingsError> {
        load_layers(config, None, Some(env)).map(|(s, _)| s)
    }

    /// The effective configuration of these layers as TOML, validated, every secret printed
    /// by its type's redaction (`"***"`, passwords in URLs too): what `check-config` prints.
    /// Durations are written in days, hours, minutes and seconds (`"30d"`, `"1h 30m"`). A
    /// comment block first says where each secret came from (env, file, credential, config
    /// file), without its value.
    pub fn effective_toml(
        config: Option<&Path>,
        extra: Option<&Path>,
        env: Option<&[(&str, &str)]>,
    ) -> Result<String, SettingsError> {
        let (settings, sources) = load_layers(config, extra, env)?;
        let body =
            toml::to_string_pretty(&settings).map_err(|e| SettingsError::Load(e.to_string()))?;
        Ok(sources::describe(&sources) + &body)
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
