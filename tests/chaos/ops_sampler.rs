//! SPEC §11 judged while it happens (issue 52 item 4): a sampler beside each sequence reads
//! the stores every [`PERIOD`] — the inbox's rows and marks as the DB owner sees them, then
//! W and every record in one PostgreSQL snapshot, then the harness's own ledger — and judges
//! the invariants an end state cannot show:
//! - **mark only terminal**: a row marked in the inbox is terminal in our store (read after the
//!   mark, so a mark seen always precedes the state read); a service that marks early and
//!   finishes later leaves the same end state, but not the same moments;
//! - **terminal irreversible**: a record seen terminal stays terminal with its state, unless an
//!   operator replay the harness ran covers it;
//! - **marks monotonic**: a mark seen stays (empty → value only) while its row is there;
//! - **W never passes an existing row early**: W is not past an insert the harness holds open
//!   unless `max_commit_delay` has elapsed since the first insert above it began (the
//!   earliest moment a hole could be seen) — timed by the harness, never by the service;
//! - **W and enqueue in one transaction**: in one snapshot, every row of the ledger committed
//!   well inside `max_commit_delay` (so never a released hole) and at or below W has its
//!   record, and no record (but COMPAT's) lies above W.
//!
//! Nothing the service says about itself is read: not its lists, counters, logs or lease row.
//! Each check's first violating moment (time since the sequence started and UTC) is printed
//! at once and kept, with how many samples violated it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{MySqlPool, PgPool};

use super::ops_writers::Ledger;
use crate::ops_reference::Written;

/// How often the stores are sampled.
pub const PERIOD: Duration = Duration::from_millis(250);

/// A commit this much inside `max_commit_delay` is never a released hole (the test times its
/// inserts from its own side of the connection).
const QUICK_MARGIN_MS: u64 = 500;

/// Slack under `max_commit_delay` for "W passed a held row too early": the insert above is
/// timed from before it was sent, so the service cannot have seen it sooner.
const EARLY_SLACK_MS: u64 = 150;

const TERMINAL: [&str; 3] = ["SUCCEEDED", "SKIPPED", "DEAD"];

/// What the harness shares with the sampler while the sequence runs.
#[derive(Clone, Default)]
pub struct Shared {
    /// Rows an operator replay was asked for (ids, or a class's whole range): they may be
    /// reopened with their first run's mark.
    pub replayed: Arc<Mutex<BTreeSet<i64>>>,
    /// Inserts held open now: id → when the insert was sent (removed before the commit or
    /// rollback is sent).
    pub open: Arc<Mutex<BTreeMap<i64, Instant>>>,
    /// Plan B rotation generation: odd while the inbox table is being swapped (marks are
    /// reconciled after the rename, so they may vanish for a moment).
    pub rotating: Arc<AtomicU64>,
}

impl Shared {
    /// The rotation starts (the sampler skips its samples until [`Shared::rotated`]).
    pub fn rotating(&self) {
        self.rotating.fetch_add(1, Ordering::SeqCst);
    }

    /// The rotation is done.
    pub fn rotated(&self) {
        self.rotating.fetch_add(1, Ordering::SeqCst);
    }
}

/// One check's record over the sequence.
#[derive(Debug, Default)]
struct Found {
    first: String,
    samples: usize,
}

/// The sampler of one sequence.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<State>,
}

/// What a sampler hands back: its verdicts, and the timing facts it read.
pub struct Outcome {
    pub samples: usize,
    /// One line per violated check (its first moment).
    pub violations: Vec<String>,
    /// Held inserts W passed while they were still open, and when it was first seen: their
    /// holes were released before the commit, so they must arrive LATE (SPEC §3 step 4).
    pub passed_open: BTreeMap<i64, Instant>,
    /// Per record, the sample in which it was first seen terminal: a row seen terminal in a
    /// snapshot where another was not yet was processed before it (the reference model's
    /// bound on where a late row goes, read by the harness, not the service's stamps).
    pub first_done: HashMap<i64, usize>,
}

/// What a sampler reads and knows.
pub struct Inputs {
    /// The inbox's URL (the sampler opens a connection of its own, so it never waits for
    /// the harness's pools or holds one of theirs).
    pub my_url: String,
    /// Our store's URL.
    pub pg_url: String,
    pub ledger: Ledger,
    pub holes: Arc<Mutex<BTreeSet<i64>>>,
    pub shared: Shared,
    /// Cutover stock (skipped or premarked): not ours, marked by the previous system.
    pub stock: BTreeSet<i64>,
    /// A legacy simulator writes rows the ledger does not know.
    pub foreign_writers: bool,
    pub delay_ms: u64,
    pub started: Instant,
    pub tag: String,
}

/// One sample's reads.
struct Sample {
    /// Every inbox row: id → mark.
    inbox: HashMap<i64, Option<String>>,
    w: i64,
    /// Every record: id → (state, source).
    records: HashMap<i64, (String, String)>,
    /// Before the snapshot was taken (a commit that returned earlier is in it).
    before: Instant,
    /// After W was read (the snapshot is no later).
    at: Instant,
}

impl Sampler {
    pub fn start(inputs: Inputs) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = tokio::spawn(async move {
            let mut s = State::default();
            let pools = tokio::join!(
                MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect(&inputs.my_url),
                PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&inputs.pg_url)
            );
            let (owner, store) = match pools {
                (Ok(m), Ok(p)) => (m, p),
                (m, p) => {
                    let e = format!("{:?} / {:?}", m.err(), p.err());
                    s.found.entry("sampler_connect").or_default().first = e;
                    return s;
                }
            };
            while !flag.load(Ordering::SeqCst) {
                let gen = inputs.shared.rotating.load(Ordering::SeqCst);
                if gen.is_multiple_of(2) {
                    if let Some(sample) = read(&owner, &store).await {
                        // A rotation that began meanwhile voids the sample.
                        if inputs.shared.rotating.load(Ordering::SeqCst) == gen {
                            s.judge(&inputs, &sample, gen);
                        }
                    }
                }
                tokio::time::sleep(PERIOD).await;
            }
            owner.close().await;
            store.close().await;
            s
        });
        Sampler { stop, handle }
    }

    /// Stops sampling: one line per violated check (its first moment), none when all held,
    /// and the facts read.
    pub async fn finish(self) -> Outcome {
        self.stop.store(true, Ordering::SeqCst);
        let s = match self.handle.await {
            Ok(s) => s,
            Err(e) => {
                return Outcome {
                    samples: 0,
                    violations: vec![format!("sampler: the sampler task failed: {e}")],
                    passed_open: BTreeMap::new(),
                    first_done: HashMap::new(),
                }
            }
        };
        let samples = s.samples;
        let violations = s
            .found
            .into_iter()
            .map(|(check, f)| {
                format!(
                    "sampler: {check} violated in {} of {samples} samples; first: {}",
                    f.samples, f.first
                )
            })
            .collect();
        Outcome {
            samples,
            violations,
            passed_open: s.passed_open,
            first_done: s.first_done,
        }
    }
}

/// The inbox first, then one PostgreSQL snapshot: a mark seen precedes the state read.
async fn read(owner: &MySqlPool, store: &PgPool) -> Option<Sample> {
    let inbox: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT CMINMSGS_ID, CAST(CMINMSGS_STATUS AS CHAR) FROM CMINMSGS")
            .fetch_all(owner)
            .await
            .ok()?; // renamed away for a moment: no sample
    let before = Instant::now();
    let mut tx = store.begin().await.ok()?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await
        .ok()?;
    let w: i64 = sqlx::query_scalar("SELECT w FROM inbox_cursor")
        .fetch_one(&mut *tx)
        .await
        .ok()?;
    let at = Instant::now();
    let records: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT msg_id, state, source FROM proc_state_all")
            .fetch_all(&mut *tx)
            .await
            .ok()?;
    tx.commit().await.ok()?;
    Some(Sample {
        inbox: inbox.into_iter().collect(),
        w,
        records: records
            .into_iter()
            .map(|(id, st, src)| (id, (st, src)))
            .collect(),
        before,
        at,
    })
}

#[derive(Default)]
struct State {
    samples: usize,
    found: BTreeMap<&'static str, Found>,
    /// Records seen terminal, with their state.
    terminal: HashMap<i64, String>,
    /// Marks seen, within one rotation generation.
    marks: HashMap<i64, String>,
    marks_gen: u64,
    /// Held inserts W passed while open: first seen.
    passed_open: BTreeMap<i64, Instant>,
    /// Records first seen terminal: the sample's number ([`Outcome::first_done`]).
    first_done: HashMap<i64, usize>,
}

impl State {
    fn judge(&mut self, i: &Inputs, s: &Sample, gen: u64) {
        self.samples += 1;
        // Read after the sample: a row replayed or held meanwhile is still known here.
        let replayed = i.shared.replayed.lock().expect("replayed").clone();
        let open = i.shared.open.lock().expect("open").clone();
        let ledger = i.ledger.lock().expect("ledger").clone();
        let holes = i.holes.lock().expect("holes").clone();
        let mut v: Vec<(&'static str, String)> = Vec::new();
        self.mark_only_terminal(i, s, &replayed, &mut v);
        self.terminal_irreversible(s, &replayed, &mut v);
        self.marks_monotonic(s, gen, &mut v);
        for id in open.keys().filter(|id| **id <= s.w) {
            self.passed_open.entry(*id).or_insert(s.at);
        }
        if !i.foreign_writers {
            w_past_open(i, s, &open, &ledger, &mut v);
        }
        w_and_enqueue(i, s, &ledger, &holes, &mut v);
        for (check, what) in v {
            let t = i.started.elapsed().as_secs_f64();
            let f = self.found.entry(check).or_default();
            if f.samples == 0 {
                f.first = format!(
                    "+{t:.2}s ({}) sample {}: {what}",
                    chrono::Utc::now().format("%H:%M:%S%.3f"),
                    self.samples
                );
                eprintln!("ops: {} sampler: FIRST {check}: {}", i.tag, f.first);
            }
            f.samples += 1;
        }
    }

    fn mark_only_terminal(
        &self,
        i: &Inputs,
        s: &Sample,
        replayed: &BTreeSet<i64>,
        v: &mut Vec<(&'static str, String)>,
    ) {
        let mut bad: Vec<String> = Vec::new();
        for (id, mark) in &s.inbox {
            if mark.is_none() || i.stock.contains(id) || replayed.contains(id) {
                continue;
            }
            match s.records.get(id) {
                Some((st, _)) if TERMINAL.contains(&st.as_str()) => {}
                Some((st, _)) => bad.push(format!("{id} marked while {st}")),
                None => bad.push(format!("{id} marked with no record")),
            }
        }
        if !bad.is_empty() {
            bad.sort();
            v.push(("mark_only_terminal", bad.join(", ")));
        }
    }

    fn terminal_irreversible(
        &mut self,
        s: &Sample,
        replayed: &BTreeSet<i64>,
        v: &mut Vec<(&'static str, String)>,
    ) {
        let mut bad = Vec::new();
        for (id, was) in &self.terminal {
            if replayed.contains(id) {
                continue;
            }
            match s.records.get(id) {
                Some((st, _)) if st == was => {}
                Some((st, _)) => bad.push(format!("{id} {was} → {st}")),
                None => bad.push(format!("{id} {was} → no record")),
            }
        }
        for (id, (st, _)) in &s.records {
            if TERMINAL.contains(&st.as_str()) {
                self.terminal.entry(*id).or_insert_with(|| st.clone());
                self.first_done.entry(*id).or_insert(self.samples);
            }
        }
        if !bad.is_empty() {
            bad.sort();
            v.push(("terminal_irreversible", bad.join(", ")));
        }
    }

    fn marks_monotonic(&mut self, s: &Sample, gen: u64, v: &mut Vec<(&'static str, String)>) {
        if gen != self.marks_gen {
            self.marks.clear(); // a rotation copied the table: start again from this one
            self.marks_gen = gen;
        }
        let mut bad = Vec::new();
        for (id, mark) in &s.inbox {
            match (self.marks.get(id), mark) {
                (Some(was), Some(now)) if was != now => bad.push(format!("{id} {was} → {now}")),
                (Some(was), None) => bad.push(format!("{id} {was} → empty")),
                (None, Some(now)) => {
                    self.marks.insert(*id, now.clone());
                }
                _ => {}
            }
        }
        if !bad.is_empty() {
            bad.sort();
            v.push(("marks_monotonic", bad.join(", ")));
        }
    }
}

/// W is past an insert held open, earlier than `max_commit_delay` after the first insert above
/// it was sent: the hole was released before it could have been seen for that long.
fn w_past_open(
    i: &Inputs,
    s: &Sample,
    open: &BTreeMap<i64, Instant>,
    ledger: &[Written],
    v: &mut Vec<(&'static str, String)>,
) {
    let mut bad = Vec::new();
    for id in open.keys().filter(|id| **id <= s.w) {
        let above = ledger
            .iter()
            .filter(|w| w.id > *id)
            .filter_map(|w| w.opened)
            .min();
        let seen_for = above.map(|a| s.at.saturating_duration_since(a));
        let early = seen_for.is_none_or(|d| {
            d + Duration::from_millis(EARLY_SLACK_MS) < Duration::from_millis(i.delay_ms)
        });
        if early {
            bad.push(format!(
                "W {} past held {id} {} ms after the first insert above it began",
                s.w,
                seen_for.map_or("(none)".into(), |d| d.as_millis().to_string())
            ));
        }
    }
    if !bad.is_empty() {
        v.push(("w_past_open_row", bad.join(", ")));
    }
}

/// In one snapshot: every quick commit of the ledger at or below W has its record; no record
/// but COMPAT's above W.
fn w_and_enqueue(
    i: &Inputs,
    s: &Sample,
    ledger: &[Written],
    holes: &BTreeSet<i64>,
    v: &mut Vec<(&'static str, String)>,
) {
    let quick = Duration::from_millis(i.delay_ms.saturating_sub(QUICK_MARGIN_MS));
    let mut bad: Vec<String> = ledger
        .iter()
        .filter(|w| w.id <= s.w && !holes.contains(&w.id) && !i.stock.contains(&w.id))
        .filter(|w| match (w.opened, w.committed_at) {
            // Committed before the snapshot, quickly: never a hole W could pass.
            (Some(o), Some(c)) => c < s.before && c.saturating_duration_since(o) < quick,
            _ => false,
        })
        .filter(|w| !s.records.contains_key(&w.id))
        .map(|w| format!("{} ≤ W {} has no record", w.id, s.w))
        .collect();
    bad.extend(
        s.records
            .iter()
            .filter(|(id, (_, src))| **id > s.w && src != "COMPAT")
            .map(|(id, (st, src))| format!("record {id} ({st}, {src}) above W {}", s.w)),
    );
    if !bad.is_empty() {
        bad.sort();
        v.push(("w_and_enqueue", bad.join(", ")));
    }
}

#[cfg(test)]
fn inputs(foreign_writers: bool) -> Inputs {
    Inputs {
        my_url: String::new(),
        pg_url: String::new(),
        ledger: Ledger::default(),
        holes: Arc::default(),
        shared: Shared::default(),
        stock: BTreeSet::new(),
        foreign_writers,
        delay_ms: 2000,
        started: Instant::now(),
        tag: "t".into(),
    }
}

#[cfg(test)]
fn sample(w: i64, inbox: &[(i64, Option<&str>)], records: &[(i64, &str)]) -> Sample {
    let now = Instant::now();
    Sample {
        inbox: inbox
            .iter()
            .map(|(id, m)| (*id, m.map(String::from)))
            .collect(),
        w,
        records: records
            .iter()
            .map(|(id, st)| (*id, (st.to_string(), "POLL".to_string())))
            .collect(),
        before: now,
        at: now,
    }
}

#[cfg(test)]
fn row(id: i64, opened: Instant, committed: Option<Instant>) -> Written {
    Written {
        id,
        msg: crate::ops_msgs::Msg::Unknown { n: id },
        committed: committed.is_some(),
        opened: Some(opened),
        committed_at: committed,
    }
}

/// The "marked early, finished later" class: a mark on a row that is not terminal is caught
/// in the moment, a replayed row's kept mark is not, and a terminal record that changes is.
#[test]
fn a_mark_on_an_unfinished_row_and_a_terminal_change_are_caught_in_the_moment() {
    let i = inputs(false);
    let mut st = State::default();
    let s = sample(
        3,
        &[(1, Some("PROCESSED")), (2, Some("PROCESSED")), (3, None)],
        &[(1, "SUCCEEDED"), (2, "FAILED"), (3, "DEAD")],
    );
    st.judge(&i, &s, 0);
    assert_eq!(
        st.found.keys().copied().collect::<Vec<_>>(),
        ["mark_only_terminal"]
    );
    assert!(st.found["mark_only_terminal"]
        .first
        .contains("2 marked while FAILED"));
    // Row 2 replayed: its kept mark is allowed. Row 3 leaves DEAD without a replay; row 1's
    // mark disappears.
    i.shared.replayed.lock().expect("replayed").insert(2);
    let s = sample(
        3,
        &[(1, None), (2, Some("PROCESSED")), (3, None)],
        &[(1, "SUCCEEDED"), (2, "PENDING"), (3, "PENDING")],
    );
    st.judge(&i, &s, 0);
    assert_eq!(st.found["mark_only_terminal"].samples, 1);
    assert!(st.found["terminal_irreversible"]
        .first
        .contains("3 DEAD → PENDING"));
    assert!(st.found["marks_monotonic"]
        .first
        .contains("1 PROCESSED → empty"));
}

/// W past a held insert before `max_commit_delay` since the first insert above it is caught;
/// after it, it is a released hole (and the row is noted as one W passed while open); a
/// quick commit at or below W without a record is caught, and a record above W.
#[test]
fn w_past_a_held_row_too_early_and_w_without_enqueue_are_caught() {
    let i = inputs(false);
    let t0 = Instant::now() - Duration::from_secs(10);
    {
        let mut l = i.ledger.lock().expect("ledger");
        l.push(row(5, t0, None));
        l.push(row(
            6,
            Instant::now() - Duration::from_millis(300),
            Some(Instant::now()),
        ));
    }
    i.shared.open.lock().expect("open").insert(5, t0);
    let mut st = State::default();
    let mut s = sample(6, &[(6, None)], &[(6, "PENDING")]);
    s.before = Instant::now() + Duration::from_millis(10);
    st.judge(&i, &s, 0);
    assert!(st.found["w_past_open_row"].first.contains("past held 5"));
    assert!(st.passed_open.contains_key(&5));
    // Row 6 committed quickly and W is at 6, but it has no record; 9 lies above W.
    let mut s = sample(6, &[(6, None)], &[(9, "PENDING")]);
    s.before = Instant::now() + Duration::from_millis(10);
    st.judge(&i, &s, 0);
    let f = &st.found["w_and_enqueue"].first;
    assert!(
        f.contains("6 ≤ W 6 has no record") && f.contains("record 9"),
        "{f}"
    );
    // The first insert above 5 began over max_commit_delay ago: a released hole, no violation.
    let mut late = State::default();
    i.ledger.lock().expect("ledger")[1].opened = Some(t0);
    let mut s = sample(6, &[(6, None)], &[(6, "PENDING")]);
    s.at = t0 + Duration::from_millis(2500);
    late.judge(&i, &s, 0);
    assert!(
        late.found.is_empty(),
        "{:?}",
        late.found.keys().collect::<Vec<_>>()
    );
}
