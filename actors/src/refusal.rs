//! Refusals a restart cannot fix, and the exit codes the systemd unit lists in
//! `RestartPreventExitStatus` (packaging/msgexchange.service): a process manager that restarted
//! them would only repeat the refusal every `RestartSec`.

use msgx_core::cutover::seed::SeedError;
use msgx_core::store::StoreError;

/// A bad or missing setting, a decision the operator has not made yet (a cutover mode), or one
/// the inbox cannot honour (an id above its head, a stock that is not the approved one).
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
        // The configured cutover cannot be honoured on this inbox: the same every restart.
        if let Some(SeedError::Refused(_)) = cause.downcast_ref::<SeedError>() {
            return EXIT_CONFIG;
        }
        // Not the inbox's primary (read-only, a replica) is not here: during a failover it
        // is what the primary looks like for a while, so start-up waits for it (issue 55;
        // lifecycle::wait_for_primary) instead of an exit the unit never restarts.
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
        let head = anyhow::Error::from(SeedError::Refused("above the head".into()));
        assert_eq!(exit_code(&head.context("cutover")), EXIT_CONFIG);
        let replica = anyhow::Error::from(msgx_core::inbox::primary::PrimaryError::NotPrimary(
            "read-only (@@read_only = 1)",
        ));
        assert_eq!(
            exit_code(&replica),
            1,
            "a failover, not a setting: restartable"
        );
        assert_eq!(exit_code(&anyhow::anyhow!("store unreachable")), 1);
    }
}

/// The one line an error prints: the context and each cause in turn, joined by ": ", each said
/// once. A `thiserror` message that embeds its source (`"…: {0}"` with `#[from]`) already says
/// the source's text, and sqlx's own errors do the same with theirs: anyhow's `{:#}` would print
/// that text again for every link of the chain.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod line_tests {
    use super::error_line;

    /// A source embedded in its wrapper's message (the `"…: {0}"` + `#[from]` shape).
    #[derive(Debug, thiserror::Error)]
    #[error("inbox statement failed: {0}")]
    struct Wrapper(#[from] std::io::Error);

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::other("connection refused");
        let e = anyhow::Error::from(Wrapper(io)).context("opening the inbox");
        assert_eq!(format!("{e:#}").matches("connection refused").count(), 2);
        assert_eq!(
            error_line(&e),
            "opening the inbox: inbox statement failed: connection refused"
        );
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(error_line(&plain), "top: middle: root");
    }
}
