//! Routing and batching: how each member of a group is written, decided without I/O on the
//! group's one load (planned on it and joining the batch, a terminal row joining it — DEAD, or
//! a duplicate of another message's identity —, finished elsewhere, or writing on its own), and
//! the batch that members join until their one outcome statement.

use std::time::{Duration, Instant};

use super::read_ahead::Prepared;
use super::{Member, PumpCore, StepOutcome};
use crate::codec::DecodedMessage;
use crate::flight;
use crate::pump::stages::Stage;
use crate::store::batch::{PlannedWrite, TerminalWrite};
use crate::store::{GroupLoad, GroupTx, StoreError};

/// How a member is written (see [`PumpCore::route`]).
pub(super) enum Route {
    /// Planned on the group's load: joins the batch (written alone when it carries a
    /// schedule snapshot).
    Planned(PlannedWrite),
    /// Ends without business work — DEAD (malformed, missing text) or SKIPPED(DUPLICATE), its
    /// identity held by another message: a terminal row that joins the batch.
    Terminal(TerminalWrite),
    /// No longer unfinished in the load: nothing to write.
    Elsewhere,
    /// Writes on its own: FAILED, or business work with its own load.
    Own(Prepared),
}

/// A member routed for its write, with the time its routing took (part of its `took`).
pub(super) struct Routed {
    pub(super) member: Member,
    pub(super) route: Route,
    pub(super) routing: Duration,
}

/// Members waiting for their one outcome statement: the planned writes, the terminal rows of
/// members ending without business work (DEAD, a duplicate SKIPPED), and in member order the
/// provisional outcomes with what each one is in the batch (for the one-by-one fallback).
#[derive(Default)]
pub(super) struct Batch {
    pub(super) writes: Vec<PlannedWrite>,
    pub(super) terminals: Vec<TerminalWrite>,
    pub(super) members: Vec<(Pending, StepOutcome)>,
}

/// What a member is in the batch.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pending {
    /// The next of the planned writes, with its attempt number (for a FAILED outcome in the
    /// fallback).
    Planned(i32),
    /// The next of the terminal rows.
    Terminal,
    /// Finished elsewhere meanwhile: no write, it rides along so the outcomes stay in member
    /// order.
    Rides,
}

impl Batch {
    pub(super) fn push(&mut self, attempts: i32, write: PlannedWrite, step: StepOutcome) {
        self.writes.push(write);
        self.members.push((Pending::Planned(attempts), step));
    }

    pub(super) fn terminal(&mut self, write: TerminalWrite, step: StepOutcome) {
        self.terminals.push(write);
        self.members.push((Pending::Terminal, step));
    }

    pub(super) fn ride(&mut self, step: StepOutcome) {
        self.members.push((Pending::Rides, step));
    }

    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

impl PumpCore {
    /// Every prepared member's route, in order (pure: planning on the load applies each plan
    /// to it for the members after).
    pub(super) fn route_stage(
        &mut self,
        members: &[Member],
        prepared: Vec<Prepared>,
        mut load: Option<GroupLoad>,
    ) -> Vec<Routed> {
        members
            .iter()
            .zip(prepared)
            .map(|(m, p)| {
                let started = Instant::now();
                let route = self.route(m, p, &mut load);
                Routed {
                    member: *m,
                    route,
                    routing: started.elapsed(),
                }
            })
            .collect()
    }

    /// How a member is written, decided on the group's load without I/O: a DEAD one is a
    /// terminal row; a decoded member that is not `LATE` is checked (still unfinished, identity
    /// free) and planned on the load, which then holds its changes for the members after it.
    fn route(&mut self, m: &Member, prepared: Prepared, cache: &mut Option<GroupLoad>) -> Route {
        let msg_id = m.row.head.msg_id;
        if m.row.source.is_late() {
            // A LATE row loads for itself (guarded path), and so do the members after it.
            *cache = None;
        }
        let (Prepared::Decoded(msg), Some(load)) = (&prepared, cache.as_mut()) else {
            return match prepared {
                Prepared::Dead(class, detail) => {
                    Route::Terminal(self.dead_row(msg_id, class, detail))
                }
                prepared => Route::Own(prepared),
            };
        };
        if !load.states.get(&msg_id).is_some_and(|s| s.is_unfinished()) {
            return Route::Elsewhere;
        }
        let msg_type = type_label(msg);
        let key = msg.identity_key(self.cfg.identity_with_date, self.cfg.tz);
        if let Some(&holder) = load.holders.get(&key).filter(|h| **h != msg_id) {
            return Route::Terminal(self.duplicate_row(msg_id, holder, &msg_type, &key));
        }
        let timer = self.stages.time(Stage::Plan);
        let current = load.current(&flight::flights_to_load(msg));
        let plan = flight::plan(msg, msg_id, &current);
        load.apply(msg_id, &key, &plan);
        drop(timer);
        Route::Planned(PlannedWrite {
            msg_id,
            msg_type,
            identity: key,
            plan,
            now: self.clock.now(),
        })
    }

    /// One load for the decoded members before the first `LATE` one (those take the guarded
    /// path with a load of their own); None when there is none.
    pub(super) async fn load_group(
        &self,
        tx: &mut GroupTx,
        members: &[Member],
        prepared: &[Prepared],
    ) -> Result<Option<GroupLoad>, StoreError> {
        let (mut ids, mut keys, mut flids) = (Vec::new(), Vec::new(), Vec::<String>::new());
        for (m, p) in members.iter().zip(prepared) {
            if m.row.source.is_late() {
                break;
            }
            if let Prepared::Decoded(msg) = p {
                ids.push(m.row.head.msg_id);
                keys.push(msg.identity_key(self.cfg.identity_with_date, self.cfg.tz));
                for f in flight::flights_to_load(msg) {
                    if !flids.contains(&f) {
                        flids.push(f);
                    }
                }
            }
        }
        if ids.is_empty() {
            return Ok(None);
        }
        Ok(Some(tx.load_group(&ids, &keys, &flids).await?))
    }
}

/// `TYPE` or `TYPE-STYP`, for the row and logs.
pub(super) fn type_label(msg: &DecodedMessage) -> String {
    if msg.meta.subtype.is_empty() {
        msg.meta.msg_type.clone()
    } else {
        format!("{}-{}", msg.meta.msg_type, msg.meta.subtype)
    }
}
