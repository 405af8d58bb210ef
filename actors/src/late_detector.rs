//! LateDetector, stage 0: receives the ids the poller released as permanent holes, logs and
//! counts them. The durable watch list and the inbox re-check come with the late-arrival issue.

use actix::{Actor, Context, Handler};

use crate::messages::HolesReleased;

/// Watches released hole ids.
#[derive(Debug, Default)]
pub struct LateDetector;

impl Actor for LateDetector {
    type Context = Context<Self>;
}

impl Handler<HolesReleased> for LateDetector {
    type Result = ();

    fn handle(&mut self, msg: HolesReleased, _: &mut Self::Context) {
        msgx_core::telemetry::late_watch_received(msg.first, msg.last);
    }
}
