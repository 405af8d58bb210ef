//! The pump (SPEC §4, seed §3 flow ②③): one head at a time, strictly by MSG_ID.
//!
//! - [`rules`]: what to do with the head and how long to back off (pure);
//! - [`outcome`]: how an attempt ended;
//! - [`step`]: one pump step (a group of heads, one commit) over the adapters — the actor only
//!   decides when to call it ([`PumpCore::step_group`]); its stages (read-ahead, routing and
//!   batching, writes) in files of their own under it;
//! - [`stages`]: where a step's time goes, recorded by the step itself.

pub mod drain;
pub mod outcome;
pub mod rules;
pub mod stages;
pub mod step;

pub use outcome::{ErrorClass, Outcome};
pub use rules::{HeadDecision, HeadRules};
pub use step::{PumpConfig, PumpCore, StepOutcome};
