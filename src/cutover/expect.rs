//! What a cutover may refuse (issue 29 item 5): an `<id>` the inbox has not handed out yet,
//! and a stock that changed between the approved `cutover plan` and the seeding.
//!
//! `cutover plan` prints W and a short **stock token**: a hash of (W, the count of rows at or
//! below W, the highest of them, the sum of their ids). The operator approves both and sets
//! `pipeline.cutover_expect = "<W>:<token>"`; the seeding then seeds exactly that W and
//! recomputes the token over the stock it reads, refusing to start when a row was committed
//! (or purged) at or below W meanwhile — such a row would otherwise be skipped as stock without
//! anyone having seen it.

use std::fmt;

use super::CutoverMode;

/// A stock token: 12 hex digits of FNV-1a 64 over `w:rows:last:sum`. Not a secret, only a
/// change detector (stable across releases: never `std`'s hasher).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockToken(String);

impl StockToken {
    /// The token of a stock: `rows` rows at or below `w`, the highest `last`, ids summing
    /// (wrapping) to `sum`.
    pub fn of(w: i64, rows: i64, last: Option<i64>, sum: u64) -> Self {
        let text = format!("{w}:{rows}:{}:{sum}", last.unwrap_or(0));
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(format!("{:012x}", h >> 16))
    }

    /// The hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `pipeline.cutover_expect`: the W and token of an approved plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutoverExpect {
    /// The approved W.
    pub w: i64,
    /// The approved stock token.
    pub token: String,
}

impl CutoverExpect {
    /// Parses `"<W>:<token>"`; empty means "no expectation".
    pub fn parse(raw: &str) -> Result<Option<Self>, String> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(None);
        }
        let bad = || {
            format!(
                "`{raw}` is not `<W>:<token>` as `msgexchange cutover plan` prints it \
                 (e.g. `4711:0123456789ab`)"
            )
        };
        let (w, token) = raw.split_once(':').ok_or_else(bad)?;
        let w: i64 = w.trim().parse().map_err(|_| bad())?;
        let token = token.trim().to_ascii_lowercase();
        if w < 0 || token.len() != 12 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        Ok(Some(Self { w, token }))
    }

    /// The expectation fits the mode: an `<id>` must be that W (checked at start).
    pub fn fits(&self, mode: CutoverMode) -> Result<(), String> {
        match mode {
            CutoverMode::Id(id) if id != self.w => Err(format!(
                "expects W = {} but pipeline.cutover_watermark is {id}: set both from the same \
                 `cutover plan` output",
                self.w
            )),
            _ => Ok(()),
        }
    }

    /// The W to seed for `mode`, which computed `now` from the inbox as it is: the approved
    /// one. `max` may have moved up since the plan (rows above the approved W are simply
    /// read); any other mode must give the approved W again.
    pub fn w_to_seed(&self, mode: CutoverMode, now: i64) -> Result<i64, String> {
        let moved = match mode {
            CutoverMode::Max => now < self.w,
            _ => now != self.w,
        };
        if moved {
            return Err(format!(
                "cutover refused: mode {mode} gives W = {now} now, but the approved plan \
                 (pipeline.cutover_expect) says W = {}; the inbox changed since the plan — run \
                 `msgexchange cutover plan --mode {mode}` again and approve the new W:token",
                self.w
            ));
        }
        Ok(self.w)
    }

    /// Compares the token of the stock read now with the approved one.
    pub fn check(&self, now: &StockToken) -> Result<(), String> {
        if now.as_str() == self.token {
            return Ok(());
        }
        Err(format!(
            "cutover refused: the stock at or below W = {} changed since the approved plan \
             (token now {now}, approved {}): rows were committed or purged at or below W after \
             the plan, and they would be skipped unseen — run `msgexchange cutover plan` again, \
             review it, and set pipeline.cutover_expect to the new W:token",
            self.w, self.token
        ))
    }
}

/// Why `mode` cannot be honoured on an inbox whose highest id is `head` and whose next
/// `AUTO_INCREMENT` is `next_id` (None when the server does not say): an `<id>` the inbox has
/// not handed out yet — above both the head and the last id allocated. Its W would pass ids
/// that do not exist yet, whose rows would be taken for late commits or never read at all.
pub fn beyond_head(mode: CutoverMode, head: Option<i64>, next_id: Option<i64>) -> Option<String> {
    let CutoverMode::Id(id) = mode else {
        return None;
    };
    let handed_out = head.unwrap_or(0).max(next_id.map_or(0, |n| n - 1));
    (id > handed_out).then(|| {
        let head = head.map_or_else(|| "none (empty inbox)".to_string(), |h| h.to_string());
        let next = next_id.map_or_else(|| "unknown".to_string(), |n| n.to_string());
        format!(
            "cutover refused: {id} is above the inbox's head (MAX(id) = {head}, next \
             AUTO_INCREMENT = {next}): ids up to {id} have not been handed out, and the rows \
             that get them would be skipped or taken for late commits — choose `max` or an id \
             at or below {handed_out} (`msgexchange cutover plan --mode max`)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_the_inbox_has_not_handed_out_is_refused() {
        let id = CutoverMode::Id;
        let refused = beyond_head(id(200_010), Some(10), Some(11)).expect("refused");
        assert!(
            refused.contains("200010 is above the inbox's head (MAX(id) = 10"),
            "{refused}"
        );
        assert!(refused.contains("`max`"), "{refused}");
        assert_eq!(beyond_head(id(10), Some(10), Some(11)), None);
        assert!(beyond_head(id(11), Some(10), Some(11)).is_some());
        // Handed out but not visible (rolled back, purged, in flight): a gap, honoured.
        assert_eq!(beyond_head(id(14), Some(10), Some(15)), None);
        assert!(beyond_head(id(15), Some(10), Some(15)).is_some());
        assert!(beyond_head(id(5), None, None).is_some(), "empty inbox");
        assert_eq!(beyond_head(id(0), None, None), None);
        assert_eq!(beyond_head(CutoverMode::Max, Some(10), Some(11)), None);
    }

    #[test]
    fn the_token_changes_with_any_row_at_or_below_w() {
        let t = StockToken::of(100, 90, Some(99), 4000);
        assert_eq!(t.as_str().len(), 12);
        assert_eq!(t, StockToken::of(100, 90, Some(99), 4000), "stable");
        assert_ne!(t, StockToken::of(100, 91, Some(99), 4050));
        assert_ne!(t, StockToken::of(100, 90, Some(100), 4000));
        assert_ne!(t, StockToken::of(100, 90, Some(99), 4001));
        assert_ne!(t, StockToken::of(101, 90, Some(99), 4000));
    }

    #[test]
    fn expectation_parses_fits_and_checks() {
        assert_eq!(CutoverExpect::parse(" "), Ok(None));
        let token = StockToken::of(10, 10, Some(10), 55);
        let e = CutoverExpect::parse(&format!("10:{token}"))
            .expect("parses")
            .expect("set");
        assert_eq!(e.w, 10);
        assert!(CutoverExpect::parse("10").is_err());
        assert!(CutoverExpect::parse("x:0123456789ab").is_err());
        assert!(CutoverExpect::parse("10:xyz").is_err());
        assert!(e.fits(CutoverMode::Id(10)).is_ok());
        assert!(e.fits(CutoverMode::Id(11)).is_err());
        assert!(e.fits(CutoverMode::Max).is_ok());
        assert_eq!(
            e.w_to_seed(CutoverMode::Max, 25),
            Ok(10),
            "max seeds the approved W"
        );
        assert!(e.w_to_seed(CutoverMode::Max, 9).is_err());
        assert!(e.w_to_seed(CutoverMode::Min, 11).is_err());
        assert!(e.check(&token).is_ok());
        let changed = e
            .check(&StockToken::of(10, 11, Some(10), 58))
            .expect_err("changed");
        assert!(
            changed.contains("changed since the approved plan"),
            "{changed}"
        );
    }
}
