//! Graceful shutdown of one actor ([`crate::messages::Shutdown`]). Every actor runs its work as
//! an `AtomicResponse`, so by the time `Shutdown` is handled nothing is in flight: the actor
//! only has to stop taking work (cancel its timer) and stop ([`crate::child_actor!`] declares
//! that handler). The dispatcher also writes the outcome it carries, within the deadline (see
//! `Handler<Shutdown> for Dispatcher`).

use actix::{Actor, ActorContext, Context};

use crate::next_run::NextRun;

/// Cancels the pending wake-up and stops the actor.
pub fn stop<A>(ctx: &mut Context<A>, next: &mut NextRun, actor: &'static str)
where
    A: Actor<Context = Context<A>>,
{
    next.cancel(ctx);
    ctx.stop();
    tracing::info!(actor, "stopped for shutdown");
}
