//! Who currently receives what. The supervisor rebuilds a crashed child with a new address;
//! senders look their receivers up here at send time instead of keeping stale addresses.

use std::sync::{Arc, RwLock};

use actix::Recipient;

use crate::child::Child;
use crate::messages::{
    EventsQueued, HolesReleased, HousekeepNow, MarksConfirmed, PollNow, Shutdown, Step,
    TerminalCommitted, WatermarkMoved,
};

/// The current receivers.
#[derive(Default)]
pub struct Receivers {
    /// Told when W moves (the pump; tests add their own).
    pub watermark: Vec<Recipient<WatermarkMoved>>,
    /// Told which hole ids were released.
    pub holes: Vec<Recipient<HolesReleased>>,
    /// The current poller (to ask for a round now).
    pub poller: Option<Recipient<PollNow>>,
    /// The current pump (tests ask it for a step).
    pub pump: Option<Recipient<Step>>,
    /// Told when the pump commits a terminal row (the backfill sweeper wakes early).
    pub terminal: Vec<Recipient<TerminalCommitted>>,
    /// Told when a sweep confirmed marks (the purge watch reads on soon).
    pub confirmed: Vec<Recipient<MarksConfirmed>>,
    /// Told when the pump commits events (the dispatcher wakes at once).
    pub events: Vec<Recipient<EventsQueued>>,
    /// The current housekeeper (tests and tools start a retention job now).
    pub housekeeper: Option<Recipient<HousekeepNow>>,
    /// Each child's current [`Shutdown`] receiver, by child name (the supervisor's graceful
    /// shutdown asks them in reverse start order).
    pub shutdown: Vec<(&'static str, Recipient<Shutdown>)>,
}

impl Receivers {
    /// Records (or replaces, after a restart) the shutdown receiver of `child`, under its name
    /// (the supervisor's `start` does, for every child it starts).
    pub fn set_shutdown(&mut self, child: Child, r: Recipient<Shutdown>) {
        self.shutdown.retain(|(name, _)| *name != child.name());
        self.shutdown.push((child.name(), r));
    }
}

/// Shared, swappable wiring.
#[derive(Clone, Default)]
pub struct Wiring(Arc<RwLock<Receivers>>);

impl Wiring {
    /// Tells every watermark receiver.
    pub fn watermark_moved(&self, msg: WatermarkMoved) {
        self.tell(|r| &r.watermark, msg);
    }

    /// Tells every hole receiver.
    pub fn holes_released(&self, msg: HolesReleased) {
        self.tell(|r| &r.holes, msg);
    }

    /// Tells every terminal-row receiver.
    pub fn terminal_committed(&self, msg: TerminalCommitted) {
        self.tell(|r| &r.terminal, msg);
    }

    /// Tells every confirmed-marks receiver.
    pub fn marks_confirmed(&self, msg: MarksConfirmed) {
        self.tell(|r| &r.confirmed, msg);
    }

    /// Tells every event receiver.
    pub fn events_queued(&self, msg: EventsQueued) {
        self.tell(|r| &r.events, msg);
    }

    fn tell<M>(&self, list: impl FnOnce(&Receivers) -> &Vec<Recipient<M>>, msg: M)
    where
        M: actix::Message + Copy + Send + 'static,
        M::Result: Send,
    {
        for r in list(&self.read()) {
            r.do_send(msg);
        }
    }

    /// Replaces the receivers (the supervisor after a (re)start).
    pub fn update(&self, f: impl FnOnce(&mut Receivers)) {
        let mut guard = self.0.write().unwrap_or_else(|p| p.into_inner());
        f(&mut guard);
    }

    /// The current poller address, if one runs.
    pub fn poller(&self) -> Option<Recipient<PollNow>> {
        self.read().poller.clone()
    }

    /// The current pump address, if one runs.
    pub fn pump(&self) -> Option<Recipient<Step>> {
        self.read().pump.clone()
    }

    /// The current housekeeper address, if one runs.
    pub fn housekeeper(&self) -> Option<Recipient<HousekeepNow>> {
        self.read().housekeeper.clone()
    }

    /// The shutdown receiver of `child`, if it registered one.
    pub fn shutdown_of(&self, child: &str) -> Option<Recipient<Shutdown>> {
        self.read()
            .shutdown
            .iter()
            .find(|(name, _)| *name == child)
            .map(|(_, r)| r.clone())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Receivers> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }
}
