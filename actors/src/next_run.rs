//! The one timer an actor keeps for "run the next step then": re-arming replaces it, so a
//! step never runs twice because two reasons to run it arrived.

use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, SpawnHandle};

/// An actor's pending "next step" timer.
#[derive(Debug, Default)]
pub struct NextRun {
    /// The armed timer and when it fires.
    timer: Option<(SpawnHandle, Instant)>,
}

impl NextRun {
    /// Arms the timer to send `msg` to the actor after `after`, replacing the armed one —
    /// unless `only_if_sooner` and the armed one already fires no later.
    pub fn arm<A, M>(&mut self, ctx: &mut Context<A>, msg: M, after: Duration, only_if_sooner: bool)
    where
        A: Actor<Context = Context<A>> + Handler<M>,
        M: Message + 'static,
    {
        let at = Instant::now() + after;
        if let Some((timer, when)) = self.timer.take() {
            if only_if_sooner && when <= at {
                self.timer = Some((timer, when));
                return;
            }
            ctx.cancel_future(timer);
        }
        self.timer = Some((ctx.notify_later(msg, after), at));
    }

    /// Disarms the timer (the step is running now).
    pub fn cancel<A>(&mut self, ctx: &mut Context<A>)
    where
        A: Actor<Context = Context<A>>,
    {
        if let Some((timer, _)) = self.timer.take() {
            ctx.cancel_future(timer);
        }
    }
}
