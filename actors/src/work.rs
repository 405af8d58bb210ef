//! The shape every actor's unit of work shares (a round, a sweep, a step): the work runs while
//! the mailbox waits, the actor then decides what comes next, and the asker gets the result
//! with the core step's error typed as a [`WorkError`].

use std::future::Future;

use actix::{Actor, ActorFutureExt, AtomicResponse, Context, WrapFuture};
use msgx_core::clock::SharedClock;
use msgx_core::inbox::Inbox;
use msgx_core::store::Store;

use crate::messages::WorkError;

/// Runs `work` as the actor's unit of work. It is an `AtomicResponse`: no second unit and no
/// `Shutdown` interleaves with it. `then` sees the result with the actor back in hand (it arms
/// the next run, emits telemetry); the asker receives the report as the message's answer type
/// and the core step's error as a [`WorkError`].
pub fn atomic<A, T, E, R>(
    actor: &A,
    work: impl Future<Output = Result<T, E>> + 'static,
    then: impl FnOnce(&Result<T, E>, &mut A, &mut Context<A>) + 'static,
) -> AtomicResponse<A, Result<R, WorkError>>
where
    A: Actor<Context = Context<A>>,
    T: Into<R> + 'static,
    E: Into<WorkError> + 'static,
    R: 'static,
{
    AtomicResponse::new(Box::pin(work.into_actor(actor).map(
        move |result, act, ctx| {
            then(&result, act, ctx);
            result.map(Into::into).map_err(Into::into)
        },
    )))
}

/// What the discovery-side actors' units of work (a poll round, a detection round, a sweep)
/// run on: the shared inbox, our own PostgreSQL and the clock, cloned whole into each unit's
/// future.
#[derive(Debug, Clone)]
pub(crate) struct Handles {
    pub(crate) inbox: Inbox,
    pub(crate) store: Store,
    pub(crate) clock: SharedClock,
}

impl Handles {
    pub(crate) fn new(inbox: Inbox, store: Store, clock: SharedClock) -> Self {
        Self {
            inbox,
            store,
            clock,
        }
    }
}
