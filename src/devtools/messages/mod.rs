//! Realistic upstream (AODB/CIIMS) XML messages as SPEC Appendix A assumes them, for the
//! upstream simulator, tests and benchmarks.
//!
//! A [`Generator`] keeps a small pool of flights (masters, some with code-shares) so that
//! updates and deletes hit flights that earlier messages created, the way a real feed does.
//! It is deterministic for a seed: the same seed and the same sequence of calls give the same
//! messages byte for byte. The service never calls this module.

mod flights;
mod generator;
mod kind;
mod malformed;
mod pool;
mod render_common;
mod render_fdel;
mod render_flop;
mod render_schd;
mod render_unknown;
mod xml;

pub use generator::Generator;
pub use kind::{MalformedKind, MessageKind, Mix};

/// The FLOP subtypes the generator draws from (the codec's default list of known subtypes).
pub const FLOP_SUBTYPES: [&str; 7] = ["UPDT", "ARRE", "DEPE", "GATE", "STND", "CANC", "DELY"];

/// Well-formed `TYPE` values that are not in Appendix A, so the codec must answer UNSUPPORTED.
pub const UNKNOWN_TYPES: [&str; 3] = ["XXXX", "BLLS", "CKIN"];

/// `DDTM` / `STOT` / `ETOT` / `ATOT` layout: local airport time, `YYYYMMDDHHMMSS`.
pub const TIME_FORMAT: &str = "%Y%m%d%H%M%S";

/// `FEXD` / schedule `DATE` layout: `YYYYMMDD`.
pub const DATE_FORMAT: &str = "%Y%m%d";

#[cfg(test)]
mod tests;
