//! Refusals a restart cannot fix, and the exit codes the systemd unit lists in
//! `RestartPreventExitStatus` (packaging/msgexchange.service): a process manager that restarted
//! them would only repeat the refusal every `RestartSec`.

use msgx_core::store::StoreError;

/// A bad or missing setting, or a decision the operator has not made yet (a cutover mode).
pub const EXIT_CONFIG: u8 = 2;

/// The store's schema is newer than this binary's, or older with `store.migrate_at_start`
/// off: run the right binary, or `msgexchange migrate`.
pub const EXIT_SCHEMA: u8 = 3;

/// A refusal with its exit code; its text is the one line the operator reads.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// [`EXIT_CONFIG`] or [`EXIT_SCHEMA`].
    pub code: u8,
    message: String,
}

impl Refusal {
    /// A configuration refusal (exit 2).
    pub fn config(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_CONFIG,
            message: message.into(),
        }
    }
}

/// The exit code of a failed command: a [`Refusal`] or a schema refusal of the store anywhere
/// in the chain gives its code; anything else 1 (worth a restart: an outage, a lost lease).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(r) = cause.downcast_ref::<Refusal>() {
            return r.code;
        }
        if let Some(StoreError::Schema(_)) = cause.downcast_ref::<StoreError>() {
            return EXIT_SCHEMA;
        }
        if let Some(StoreError::SeedRefused(_)) = cause.downcast_ref::<StoreError>() {
            return EXIT_CONFIG;
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn refusals_keep_their_code_through_context_and_the_rest_is_1() {
        let schema = anyhow::Error::from(StoreError::Schema("ahead".into())).context("opening");
        assert_eq!(exit_code(&schema), EXIT_SCHEMA);
        let config: anyhow::Result<()> = Err(Refusal::config("kafka.brokers").into());
        assert_eq!(
            exit_code(&config.context("start").unwrap_err()),
            EXIT_CONFIG
        );
        let seed = anyhow::Error::from(StoreError::SeedRefused("not fresh".into()));
        assert_eq!(exit_code(&seed), EXIT_CONFIG);
        assert_eq!(exit_code(&anyhow::anyhow!("store unreachable")), 1);
    }
}
