//! Decoding raw inbox text into [`model::DecodedMessage`]. The codec sits behind the
//! [`Codec`] trait so the real SIS format can replace the assumed XML format
//! (docs/message-format.md) without touching the pump or the flight rules.

pub mod model;
pub mod xml;

pub use model::DecodedMessage;

/// Why a message could not be decoded, by what should happen to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// Not well-formed, no META, a required field missing or unparsable, a body missing,
    /// `FLID` missing, larger than the configured limit: DEAD (MALFORMED), never retried.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Well-formed, but a TYPE or STYP this codec does not know: FAILED (UNSUPPORTED), retried
    /// with backoff and replayable once the codec learns it.
    #[error("unsupported message: {0}")]
    Unsupported(String),
    /// Well-formed and known, but the codec cannot handle a field yet: FAILED (CODEC_ERROR).
    #[error("codec cannot handle the message: {0}")]
    Codec(String),
}

/// A decoder of raw inbox text.
pub trait Codec: Send + Sync + std::fmt::Debug {
    /// Decodes one message. Must never panic, whatever the input.
    fn decode(&self, raw: &str) -> Result<DecodedMessage, CodecError>;
}
