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

    /// Arms the timer for a wake-up (another actor said there is work): at the earliest `gap`
    /// after the last step's start (`last_start`; at once when none ran yet or the gap has
    /// passed), unless the armed timer already fires sooner. Many wakes within a gap are one
    /// step, not one step each.
    pub fn arm_woken<A, M>(
        &mut self,
        ctx: &mut Context<A>,
        msg: M,
        last_start: Option<Instant>,
        gap: Duration,
    ) -> Duration
    where
        A: Actor<Context = Context<A>> + Handler<M>,
        M: Message + 'static,
    {
        let since_last = last_start.map_or(gap, |t| t.elapsed());
        let after = gap.saturating_sub(since_last);
        self.arm(ctx, msg, after, true);
        after
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
