//! Where each secret comes from. Besides the configuration layers (a config file or an
//! `MSGX_*` variable), every secret key can be read from a file named by `<key>_file`
//! (`store.password_file = "/run/secrets/pg"`, `MSGX_STORE__PASSWORD_FILE=…`) or from a systemd
//! credential `$CREDENTIALS_DIRECTORY/<section>.<key>` (`LoadCredential=store.password:…`).
//! A secret given by two of these is refused (which one wins would be a guess); a compiled-in
//! default yields to a file or credential. A file's value
//! is taken as written, less one final line break; an empty file is refused.
//! [`resolve`] runs on the merged layers before typed parsing, so the `*_file` keys never reach
//! the typed settings and a value is never reinterpreted.

use std::fmt;
use std::path::{Path, PathBuf};

use config::{Map, Value, ValueKind};

use super::{invalid, SettingsError};

/// One secret key: `section.name` and its `section.name_file`.
struct SecretKey {
    section: &'static str,
    name: &'static str,
    key: &'static str,
    file_key: &'static str,
}

macro_rules! secret_keys {
    ($($section:literal . $name:literal),* $(,)?) => {
        &[$(SecretKey {
            section: $section,
            name: $name,
            key: concat!($section, ".", $name),
            file_key: concat!($section, ".", $name, "_file"),
        }),*]
    };
}

/// Every secret of the configuration (the fields typed [`Secret`](super::Secret)).
const SECRET_KEYS: &[SecretKey] = secret_keys![
    "inbox"."url",
    "inbox"."password",
    "store"."url",
    "store"."password",
    "kafka"."sasl_password",
    "kafka"."extra",
    "http"."admin_token",
    "http"."read_tokens",
    "http"."operate_tokens",
    "http"."compat_tokens",
    "traces"."headers",
];

/// Keys whose value is a file's path (the TLS client certificate and key): no `_file` form
/// (the key already names a file), but a systemd credential of the key's name stands for the
/// path (`LoadCredential=store.ssl_key:…` puts the key file at
/// `$CREDENTIALS_DIRECTORY/store.ssl_key`, readable by the service user only).
const CREDENTIAL_PATH_KEYS: &[SecretKey] = secret_keys![
    "inbox"."ssl_cert",
    "inbox"."ssl_key",
    "store"."ssl_cert",
    "store"."ssl_key",
];

/// Where one secret's value came from (`check-config` prints it; never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Empty everywhere.
    Unset,
    /// The compiled-in `config/default.toml`.
    Default,
    /// A `--config` / `--config-extra` file.
    ConfigFile(String),
    /// An `MSGX_*` variable.
    Environment(String),
    /// The file named by `<key>_file` (itself set where `via` says).
    File { path: PathBuf, via: String },
    /// `$CREDENTIALS_DIRECTORY/<key>`.
    Credential(PathBuf),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unset => f.write_str("unset"),
            Self::Default => f.write_str("built-in default"),
            Self::ConfigFile(path) => write!(f, "config file {path}"),
            Self::Environment(var) => write!(f, "environment {var}"),
            Self::File { path, via } => write!(f, "file {} (named by {via})", path.display()),
            Self::Credential(path) => write!(f, "systemd credential {}", path.display()),
        }
    }
}

/// Each secret key with its source, in a fixed order.
pub type SecretSources = Vec<(&'static str, SecretSource)>;

/// Reads every `*_file` and credential into `root` (the merged layers) and removes the
/// `*_file` keys; returns where each secret came from. `credentials`: the systemd credentials
/// directory, if any.
pub(super) fn resolve(
    root: &mut Map<String, Value>,
    credentials: Option<&Path>,
) -> Result<SecretSources, SettingsError> {
    let mut sources = Vec::with_capacity(SECRET_KEYS.len());
    for k in SECRET_KEYS {
        let Some(ValueKind::Table(table)) = root.get_mut(k.section).map(|v| &mut v.kind) else {
            return Err(invalid(k.key, format!("[{}] is not a table", k.section)));
        };
        let source = resolve_one(k, table, credentials)?;
        sources.push((k.key, source));
    }
    if let Some(dir) = credentials {
        resolve_credential_paths(root, dir)?;
    }
    Ok(sources)
}

/// Sets each [`CREDENTIAL_PATH_KEYS`] key with a credential to the credential's path; a key
/// also set elsewhere is refused, as a secret given twice is.
fn resolve_credential_paths(
    root: &mut Map<String, Value>,
    credentials: &Path,
) -> Result<(), SettingsError> {
    for k in CREDENTIAL_PATH_KEYS {
        let path = credentials.join(k.key);
        if !path.is_file() {
            continue;
        }
        let Some(ValueKind::Table(table)) = root.get_mut(k.section).map(|v| &mut v.kind) else {
            return Err(invalid(k.key, format!("[{}] is not a table", k.section)));
        };
        let literal = table.get(k.name).map(|v| text_of(v, k.key)).transpose()?;
        if let Some((_, origin)) = literal.filter(|(text, _)| !text.is_empty()) {
            let set = origin_source(k.section, k.name, origin.as_deref());
            let credential = SecretSource::Credential(path);
            return Err(invalid(
                k.key,
                format!("given twice, by {set} and by {credential}; keep one"),
            ));
        }
        table.insert(k.name.into(), Value::new(None, path.display().to_string()));
    }
    Ok(())
}

/// One key: at most one of its literal value, its `_file` and its credential.
fn resolve_one(
    k: &SecretKey,
    table: &mut Map<String, Value>,
    credentials: Option<&Path>,
) -> Result<SecretSource, SettingsError> {
    let literal = table
        .get(k.name)
        .map(|v| text_of(v, k.key))
        .transpose()?
        .filter(|(text, _)| !text.is_empty());
    let file_name = format!("{}_file", k.name);
    let named = table
        .remove(&file_name)
        .map(|v| text_of(&v, k.file_key))
        .transpose()?
        .filter(|(path, _)| !path.is_empty());
    let credential = credentials
        .map(|dir| dir.join(k.key))
        .filter(|p| p.is_file());
    let mut given: Vec<SecretSource> = Vec::new();
    // A compiled-in default (the demo's URLs) yields to a file or credential; a value a site
    // set does not.
    let default = literal.as_ref().is_some_and(|(_, origin)| origin.is_none());
    if let Some((_, origin)) = literal.as_ref().filter(|_| !default) {
        given.push(origin_source(k.section, k.name, origin.as_deref()));
    }
    if let Some((path, origin)) = &named {
        given.push(SecretSource::File {
            path: PathBuf::from(path),
            via: origin_source(k.section, &file_name, origin.as_deref()).to_string(),
        });
    }
    if let Some(path) = &credential {
        given.push(SecretSource::Credential(path.clone()));
    }
    if let [a, b, ..] = given.as_slice() {
        return Err(invalid(
            k.key,
            format!("given twice, by {a} and by {b}; keep one"),
        ));
    }
    let Some(source) = given.pop() else {
        return Ok(if default {
            SecretSource::Default
        } else {
            SecretSource::Unset
        });
    };
    let read_from = match &source {
        SecretSource::File { path, .. } => Some((path, k.file_key)),
        SecretSource::Credential(path) => Some((path, k.key)),
        _ => None,
    };
    if let Some((path, key)) = read_from {
        let value = read_secret(path, key)?;
        table.insert(k.name.into(), Value::new(None, value));
    }
    Ok(source)
}

/// A value as text with where it was set (`None`: the compiled-in defaults).
fn text_of(v: &Value, key: &'static str) -> Result<(String, Option<String>), SettingsError> {
    let origin = v.origin().map(str::to_string);
    let text = v
        .clone()
        .into_string()
        .map_err(|e| invalid(key, format!("not text: {e}")))?;
    Ok((text, origin))
}

/// The source a configuration layer's origin stands for.
fn origin_source(section: &str, name: &str, origin: Option<&str>) -> SecretSource {
    match origin {
        None => SecretSource::Default,
        Some("the environment") => SecretSource::Environment(format!(
            "MSGX_{}__{}",
            section.to_ascii_uppercase(),
            name.to_ascii_uppercase()
        )),
        // The config crate names a file relative to the working directory.
        Some(path) => SecretSource::ConfigFile(
            std::fs::canonicalize(path)
                .map_or_else(|_| path.to_string(), |p| p.display().to_string()),
        ),
    }
}

/// The file's text less one final line break (what `echo` and editors add).
fn read_secret(path: &Path, key: &'static str) -> Result<String, SettingsError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read `{}`: {e}", path.display())))?;
    let value = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(invalid(key, format!("`{}` is empty", path.display())));
    }
    Ok(value.to_string())
}

/// `# key  source` lines for the top of `check-config`'s output (a TOML comment, so the
/// output still loads back).
pub(super) fn describe(sources: &SecretSources) -> String {
    let width = sources.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::from("# Secrets (values redacted below), where each came from:\n");
    for (key, source) in sources {
        out.push_str(&format!("#   {key:width$}  {source}\n"));
    }
    out.push('\n');
    out
}
