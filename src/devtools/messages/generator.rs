//! The [`Generator`]: its state, its public API and the random drawing helpers. The bodies of
//! each type are rendered in the sibling `render_*` and `malformed` modules.

use chrono::{NaiveDateTime, Timelike};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::flights::Flight;
use super::kind::{MalformedKind, MessageKind, Mix};

/// FLOP subtypes and their relative frequency in a busy airport feed.
const FLOP_WEIGHTS: [(&str, f64); 7] = [
    ("UPDT", 40.0),
    ("DELY", 15.0),
    ("GATE", 12.0),
    ("STND", 10.0),
    ("ARRE", 10.0),
    ("DEPE", 10.0),
    ("CANC", 3.0),
];

/// Deterministic generator of upstream messages (see the module docs).
#[derive(Debug, Clone)]
pub struct Generator {
    /// Every random decision comes from here, so a seed reproduces a run.
    pub(super) rng: StdRng,
    /// Last `SEQN` issued; incremented for every message (the sender numbers all it sends).
    pub(super) seq: u64,
    /// `SNDR` of every message; identity is sender + type + subtype + sequence.
    pub(super) sender: String,
    /// Known flights (masters and code-shares), oldest first, so updates and deletes hit them.
    pub(super) flights: Vec<Flight>,
    /// Recently deleted ids, for idempotent re-deletes of absent flights.
    pub(super) deleted: Vec<String>,
    /// Next `FLID` to hand out; ids are never reused.
    pub(super) next_flid: u64,
    /// Next `RQID` for `SCHD`/`RESP`.
    pub(super) next_rqid: u64,
}

impl Generator {
    /// A generator sending as `AODB`, its sequence and flight ids derived from `seed`.
    pub fn new(seed: u64) -> Self {
        Self::with_sender(seed, "AODB")
    }

    /// A generator sending as `sender` (e.g. `CIIMS`).
    pub fn with_sender(seed: u64, sender: impl Into<String>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // Seed-derived starting points keep runs with different seeds from colliding on
        // identity (sender + type + subtype + sequence) in the same inbox.
        let seq = rng.random_range(100_000..900_000_000u64);
        let next_flid = rng.random_range(10_000_000..90_000_000u64);
        let next_rqid = rng.random_range(1_000..900_000u64);
        Self {
            rng,
            seq,
            sender: sender.into(),
            flights: Vec::new(),
            deleted: Vec::new(),
            next_flid,
            next_rqid,
        }
    }

    /// The `SNDR` this generator writes.
    pub fn sender(&self) -> &str {
        &self.sender
    }

    /// The `SEQN` of the last rendered message (the next one gets a larger number).
    // Tests only: production never asks.
    #[cfg(test)]
    pub fn last_seqn(&self) -> u64 {
        self.seq
    }

    /// Draws the next message kind from `mix`.
    pub fn next_kind(&mut self, mix: &Mix) -> MessageKind {
        let w = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let table = [
            (w(mix.malformed), 0u8),
            (w(mix.unknown_type), 1),
            (w(mix.schd_dnld), 2),
            (w(mix.schd_resp), 3),
            (w(mix.schd_adft), 4),
            (w(mix.flop), 5),
            (w(mix.fdel), 6),
            (w(mix.adft), 7),
        ];
        let total: f64 = table.iter().map(|(x, _)| x).sum();
        if total <= 0.0 {
            return MessageKind::Flop("UPDT");
        }
        let mut r = self.rng.random::<f64>() * total;
        let mut pick = 5;
        for (weight, id) in table {
            if weight > 0.0 && r < weight {
                pick = id;
                break;
            }
            r -= weight;
        }
        match pick {
            0 => {
                let i = self.rng.random_range(0..MalformedKind::ALL.len());
                MessageKind::Malformed(MalformedKind::ALL[i])
            }
            1 => MessageKind::UnknownType,
            2 => MessageKind::SchdDnld,
            3 => MessageKind::SchdResp,
            4 => MessageKind::SchdAdft,
            6 => MessageKind::Fdel,
            7 => MessageKind::Adft,
            _ => MessageKind::Flop(self.flop_subtype()),
        }
    }

    /// Draws and renders one message: the kind and its XML text.
    pub fn next_message(&mut self, mix: &Mix, now_local: NaiveDateTime) -> (MessageKind, String) {
        let kind = self.next_kind(mix);
        let text = self.render(kind, now_local);
        (kind, text)
    }

    /// Renders one UTF-8 XML message of `kind`, sent at `now_local` (airport local time).
    /// Well-formed kinds update the flight pool the way the downstream state would change.
    pub fn render(&mut self, kind: MessageKind, now_local: NaiveDateTime) -> String {
        let now = now_local.with_nanosecond(0).unwrap_or(now_local);
        self.top_up(now);
        self.seq += 1;
        match kind {
            MessageKind::SchdDnld => self.render_schedule(now, false, 0),
            MessageKind::SchdResp => self.render_schedule(now, true, 0),
            MessageKind::SchdAdft => self.render_add(now, true),
            MessageKind::Flop(styp) => self.render_flop(now, styp),
            MessageKind::Fdel => self.render_fdel(now),
            MessageKind::Adft => self.render_add(now, false),
            MessageKind::UnknownType => self.render_unknown(now),
            MessageKind::Malformed(m) => self.render_malformed(now, m),
        }
    }

    /// Renders a well-formed `SCHD`/`DNLD` of at least `min_bytes` (e.g. 1 MiB): a big
    /// airport's full-day schedule, to exercise large `LONGTEXT` rows. The extra flights are
    /// not kept in the pool.
    pub fn render_huge(&mut self, now_local: NaiveDateTime, min_bytes: usize) -> String {
        let now = now_local.with_nanosecond(0).unwrap_or(now_local);
        self.top_up(now);
        self.seq += 1;
        self.render_schedule(now, false, min_bytes)
    }

    // ---- drawing helpers -------------------------------------------------------------------

    pub(super) fn flop_subtype(&mut self) -> &'static str {
        let total: f64 = FLOP_WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut r = self.rng.random::<f64>() * total;
        for (s, w) in FLOP_WEIGHTS {
            if r < w {
                return s;
            }
            r -= w;
        }
        "UPDT"
    }

    pub(super) fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p.clamp(0.0, 1.0))
    }

    pub(super) fn pick_str<const N: usize>(&mut self, from: [&'static str; N]) -> &'static str {
        from[self.rng.random_range(0..N)]
    }

    pub(super) fn gate(&mut self) -> String {
        let pier = self.pick_str(["A", "B", "C", "D"]);
        format!("{pier}{}", self.rng.random_range(1..40))
    }

    pub(super) fn stand(&mut self) -> String {
        self.rng.random_range(101..330).to_string()
    }

    pub(super) fn belt(&mut self) -> String {
        format!("{:02}", self.rng.random_range(1..24))
    }
}
