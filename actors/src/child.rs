//! The actor table as code: every child the supervisor runs is a [`Child`], and its
//! [`Child::name`] is the one spelling telemetry (`msgx_actor_restarts_total{child}`), the
//! shutdown registry in `Wiring` and the supervisor (logs, `/readyz`) use. The enum is declared
//! once, in `msgx_core::telemetry` (which registers the `child` series from it), in start
//! order; its names are derived from the variants. An actor type says which child it is
//! (`supervisor::Supervised::CHILD`, like kameo's `Actor::name`), and
//! `supervisor::ChildFactory::of` is the one way the service starts a child. A leaf module:
//! the wiring and the supervisor both name children.

pub use msgx_core::telemetry::Child;

#[cfg(test)]
mod doc_table;
