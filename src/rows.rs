//! What our rows hold, typed: the states of `PROC_STATE` and `MSG_EVENT`, the error classes,
//! a row's source and backfill abandon reason, a replay's raw-text source, and the head row the
//! pump decides on (the cutover record is in [`stock`]). Below both the store (which reads and writes them)
//! and the pump (which decides on them), so neither reaches into the other for a type.
//!
//! The names are strings only at the SQL edge: each type converts one way with `as_str` (and
//! binds as `TEXT`), the other way with `TryFrom<&str>` (and decodes from `TEXT`; a name no
//! migration allows is a corrupt row). The names are those of the `CHECK` constraints in
//! migrations 0001 (`proc_state.state`) and 0002 (`msg_event.state`).

use chrono::{DateTime, Utc};

pub mod stock;

/// A stored name that is not one of the type's names (a manual edit, or a newer schema).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is not a known {what}")]
pub struct UnknownName {
    /// What was expected (`proc_state.state`, …).
    pub what: &'static str,
    /// What was found.
    pub name: String,
}

/// The rest of a text enum, around strum's derives (`VariantArray`, and `IntoStaticStr`, which
/// spells each name once from the variant): `ALL`, `as_str`, `names`,
/// `TryFrom<&str>` with [`UnknownName`] (naming `$what`), `Display`, `Serialize`, and sqlx's
/// `Type`/`Encode`/`Decode` (and arrays) for PostgreSQL as `TEXT` through those two.
macro_rules! text_enum {
    ($ty:ident, $what:literal) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = <$ty as strum::VariantArray>::VARIANTS;

            /// The stored and exported name.
            pub fn as_str(self) -> &'static str {
                self.into()
            }

            /// Every name, in declaration order (a metric's label values).
            pub fn names() -> Vec<&'static str> {
                Self::ALL.iter().map(|v| v.as_str()).collect()
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = $crate::rows::UnknownName;
            fn try_from(name: &str) -> Result<Self, $crate::rows::UnknownName> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == name)
                    .ok_or_else(|| $crate::rows::UnknownName {
                        what: $what,
                        name: name.to_string(),
                    })
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl sqlx::postgres::PgHasArrayType for $ty {
            fn array_type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let name = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                Ok($ty::try_from(name)?)
            }
        }
    };
}
pub(crate) use text_enum;

/// `proc_state.state` (migration 0001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ProcState {
    /// Enqueued, not yet processed (or replayed).
    Pending,
    /// An attempt failed; retried after a backoff.
    Failed,
    /// Business work committed.
    Succeeded,
    /// A business duplicate, or an approved skip.
    Skipped,
    /// Malformed, missing, or poison.
    Dead,
}

text_enum!(ProcState, "proc_state.state");

impl ProcState {
    /// PENDING or FAILED: the pump still owes it an outcome.
    pub fn is_unfinished(self) -> bool {
        matches!(self, Self::Pending | Self::Failed)
    }

    /// SUCCEEDED, SKIPPED or DEAD: an outcome is recorded (with its backfill intent).
    pub fn is_terminal(self) -> bool {
        !self.is_unfinished()
    }
}

/// `msg_event.state` (migration 0002).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum EventState {
    /// Waiting for (another) send.
    Pending,
    /// Acknowledged by the broker.
    Sent,
    /// Copied to the dead-letter topic after the last attempt.
    Dead,
}

text_enum!(EventState, "msg_event.state");

/// Error classes and skip reasons recorded on `PROC_STATE.ERROR_CLASS` (SPEC §2, §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorClass {
    /// Not a valid message, or its inbox row/text is gone: DEAD, not replayable.
    Malformed,
    /// The message contradicts the protocol (reserved for the real SIS format).
    Protocol,
    /// A type/subtype the codec does not know yet: FAILED with backoff, replayable.
    Unsupported,
    /// The codec cannot handle something in a known message: FAILED, replayable.
    CodecError,
    /// A store timed out or dropped the connection: FAILED with backoff, replayable.
    Infra,
    /// Poison: attempts or head deadline exhausted: DEAD, replayable.
    Exhausted,
    /// A business duplicate (identity already bound): SKIPPED.
    Duplicate,
}

text_enum!(ErrorClass, "proc_state.error_class");

/// Where a `PROC_STATE` row came from (`proc_state.source`, migration 0001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Source {
    /// Discovered by the poller, in id order.
    Poll,
    /// Registered by the compat HTTP entry (waits for W).
    Compat,
    /// A released hole id found in the inbox later: processed with the ordering guard.
    Late,
}

text_enum!(Source, "proc_state.source");

impl Source {
    /// True for rows processed out of id order, under the ordering guard.
    pub fn is_late(self) -> bool {
        self == Source::Late
    }
}

/// Why a row's backfill was given up (`proc_state.backfill_abandon_reason`; also the `reason`
/// label of `msgx_backfill_abandoned_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum AbandonReason {
    /// The inbox row does not exist: abandoned at once.
    MissingRow,
    /// Transient failures reached `backfill.max_attempts`.
    MaxAttempts,
}

text_enum!(AbandonReason, "proc_state.backfill_abandon_reason");

/// Where a replayed row's raw text will come from (API, audit, logs, metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RawSource {
    /// The inbox row still holds it.
    Inbox,
    /// The inbox row is gone; our raw copy holds it.
    RawCopy,
}

text_enum!(RawSource, "replay source");

/// Terminal states written by one statement (non-business).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SingleTerminal {
    /// SKIPPED (business duplicate).
    Skipped,
    /// DEAD (malformed, missing row, exhausted).
    Dead,
}

impl SingleTerminal {
    /// The state it writes.
    pub fn state(self) -> ProcState {
        match self {
            Self::Skipped => ProcState::Skipped,
            Self::Dead => ProcState::Dead,
        }
    }

    /// The stored state.
    pub fn as_str(self) -> &'static str {
        self.state().as_str()
    }
}

/// The head as the pump sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Smallest unfinished MSG_ID ≤ W.
    pub msg_id: i64,
    /// FAILED (backing off) or PENDING.
    pub failed: bool,
    /// Processing attempts started so far.
    pub attempts: i32,
    /// When a FAILED head is due again.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// First processing attempt (stamped once).
    pub processing_started_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of a text enum reads back from its name.
    fn round_trips<T>() -> bool
    where
        T: strum::VariantArray + Copy + PartialEq + Into<&'static str> + for<'a> TryFrom<&'a str>,
    {
        T::VARIANTS
            .iter()
            .all(|v| T::try_from((*v).into()).ok() == Some(*v))
    }

    /// One conversion each way, for every name the migrations allow.
    #[test]
    fn names_round_trip() {
        assert!(round_trips::<ProcState>());
        assert!(round_trips::<EventState>());
        assert!(round_trips::<ErrorClass>());
        assert!(round_trips::<Source>());
        assert!(round_trips::<AbandonReason>());
        assert!(round_trips::<RawSource>());
        assert_eq!(
            ProcState::try_from("pending").unwrap_err().to_string(),
            "`pending` is not a known proc_state.state"
        );
        assert!(Source::try_from("late").is_err());
    }

    /// The names are the migrations' and the API's, byte for byte (the derive spells them from
    /// the variants).
    #[test]
    fn stored_names_are_unchanged() {
        let cases = [
            (ProcState::names(), "PENDING,FAILED,SUCCEEDED,SKIPPED,DEAD"),
            (EventState::names(), "PENDING,SENT,DEAD"),
            (
                ErrorClass::names(),
                "MALFORMED,PROTOCOL,UNSUPPORTED,CODEC_ERROR,INFRA,EXHAUSTED,DUPLICATE",
            ),
            (Source::names(), "POLL,COMPAT,LATE"),
            (AbandonReason::names(), "MISSING_ROW,MAX_ATTEMPTS"),
            (RawSource::names(), "inbox,raw_copy"),
        ];
        for (names, want) in cases {
            assert_eq!(names.join(","), want);
        }
        assert_eq!(ProcState::Failed.to_string(), "FAILED");
    }

    /// The vocabulary is a leaf (telemetry names it, so it names nothing of the crate).
    #[test]
    fn rows_import_nothing_of_the_crate() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for file in [root.join("rows.rs"), root.join("rows/stock.rs")] {
            let text = std::fs::read_to_string(&file).expect("readable");
            let needle = concat!("crate", "::");
            for line in text.lines().filter(|l| l.contains(needle)) {
                assert!(
                    line.contains(concat!("$crate", "::rows::UnknownName")),
                    "{}: {line}",
                    file.display()
                );
            }
        }
    }

    #[test]
    fn only_late_rows_are_guarded() {
        assert!(Source::Late.is_late());
        assert!(!Source::Poll.is_late() && !Source::Compat.is_late());
    }

    #[test]
    fn unfinished_and_terminal() {
        let unfinished: Vec<_> = ProcState::ALL
            .iter()
            .filter(|s| s.is_unfinished())
            .collect();
        assert_eq!(unfinished, [&ProcState::Pending, &ProcState::Failed]);
        assert!(ProcState::ALL
            .iter()
            .all(|s| s.is_terminal() != s.is_unfinished()));
    }
}
