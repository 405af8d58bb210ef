//! Graceful shutdown of one actor ([`crate::messages::Shutdown`]). Every actor runs its work as
//! an `AtomicResponse`, so by the time `Shutdown` is handled nothing is in flight: the actor
//! only has to stop taking work (cancel its timer) and stop. The dispatcher also writes the
//! outcome it carries (see `Handler<Shutdown> for Dispatcher`).

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

/// `impl Handler<Shutdown>` for an actor whose work is atomic and that keeps its timer in a
/// `next: NextRun` field.
#[macro_export]
macro_rules! stop_on_shutdown {
    ($actor:ty, $name:literal) => {
        impl actix::Handler<$crate::messages::Shutdown> for $actor {
            type Result = Result<(), $crate::messages::ShutdownError>;

            fn handle(
                &mut self,
                _: $crate::messages::Shutdown,
                ctx: &mut Self::Context,
            ) -> Self::Result {
                $crate::shutdown::stop(ctx, &mut self.next, $name);
                Ok(())
            }
        }
    };
}
