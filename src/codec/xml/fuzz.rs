//! Property tests: the decoder never panics, on arbitrary text and on the fixtures mutated the
//! ways real inbox rows get damaged (cut off, bytes lost or repeated, stray markup).

use proptest::prelude::*;
use proptest::sample::Index;

use super::tests::{class, codec, Class, FIXTURES};
use super::*;

/// Cases per property: enough to hit the mutation kinds on every fixture many times, small
/// enough to keep the module well under ten seconds.
const CASES: u32 = 2_000;

/// Stray markup and text a damaged or hostile message may contain.
const INSERTS: &[&str] = &[
    "<",
    ">",
    "&",
    "]]>",
    "&amp;",
    "&#0;",
    "&#x10FFFF;",
    "&bogus;",
    "<![CDATA[",
    "<![CDATA[-]]>",
    "<!--",
    "-->",
    "<?xml version=\"1.0\"?>",
    "<!DOCTYPE MSG>",
    "\u{feff}",
    "\u{0}",
    "\r\n",
    "-",
    " xsi:nil=\"true\"",
    "<GATE xsi:nil=\"true\"/>",
    "<GATE>-</GATE>",
    "<GATE/>",
    "<FLID>1</FLID>",
    "<FLID/>",
    "<FLIGHT>",
    "</FLIGHT>",
    "<FLIGHT><FLID>9</FLID></FLIGHT>",
    "<META>",
    "</META>",
    "<MSG>",
    "</MSG>",
    "<X><Y>",
    "</Y></X>",
    "<TYPE>FLOP</TYPE>",
    "<STYP>ZZZZ</STYP>",
    "<DDTM>20261345256199</DDTM>",
    "<FEXD>2026-11-30</FEXD>",
    "延误 <30min>",
];

/// Tags for random elements.
const TAGS: &[&str] = &[
    "MSG", "META", "SNDR", "SEQN", "DDTM", "TYPE", "STYP", "SCHD", "DATE", "RQID", "FLIGHTS",
    "FLIGHT", "FLOP", "FDEL", "ADFT", "FLID", "GATE", "STOT", "FLIO", "MFID", "RMRK", "x:y",
];

#[derive(Debug, Clone)]
enum Mutation {
    /// Cut the message at a position.
    Truncate(Index),
    /// Delete up to `len` bytes from a position.
    Delete(Index, usize),
    /// Repeat up to `len` bytes from a position right after themselves.
    Duplicate(Index, usize),
    /// Insert one of [`INSERTS`] at a position.
    Insert(Index, Index),
    /// Insert a random element (`open`, `close` or empty) of one of [`TAGS`] with a value.
    Tag(Index, Index, u8, String),
    /// Repeat a whole line (the fixtures hold one element per line).
    DupLine(Index),
    /// Delete a whole line.
    DelLine(Index),
    /// Insert a balanced element of one of [`TAGS`] with a value at the start of a line.
    LineElement(Index, Index, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Weighted towards whole-line edits, which keep the document well-formed more often and
    // so reach the META and body rules, not only the XML checks.
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::Truncate),
        2 => (any::<Index>(), 1..64usize).prop_map(|(i, n)| Mutation::Delete(i, n)),
        2 => (any::<Index>(), 1..256usize).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(i, k)| Mutation::Insert(i, k)),
        2 => (any::<Index>(), any::<Index>(), 0..4u8, "[-A-Z0-9 &<>;]{0,8}")
            .prop_map(|(i, k, shape, v)| Mutation::Tag(i, k, shape, v)),
        3 => any::<Index>().prop_map(Mutation::DupLine),
        3 => any::<Index>().prop_map(Mutation::DelLine),
        4 => (any::<Index>(), any::<Index>(), "[-A-Z0-9 ]{0,14}")
            .prop_map(|(i, k, v)| Mutation::LineElement(i, k, v)),
    ]
}

/// The largest char boundary of `s` at or before the position `i` selects.
fn boundary(s: &str, i: &Index) -> usize {
    let mut at = if s.is_empty() {
        0
    } else {
        i.index(s.len() + 1)
    };
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The largest char boundary of `s` at or before `at`.
fn floor(s: &str, at: usize) -> usize {
    let mut at = at.min(s.len());
    while at > 0 && !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The byte range of the line `i` selects, its newline included.
fn line(s: &str, i: &Index) -> std::ops::Range<usize> {
    let starts: Vec<usize> = std::iter::once(0)
        .chain(s.match_indices('\n').map(|(at, _)| at + 1))
        .filter(|&at| at < s.len())
        .collect();
    if starts.is_empty() {
        return 0..0;
    }
    let start = *i.get(&starts);
    let end = s[start..].find('\n').map_or(s.len(), |n| start + n + 1);
    start..end
}

fn apply(s: &mut String, m: &Mutation) {
    match m {
        Mutation::Truncate(i) => {
            let at = boundary(s, i);
            s.truncate(at);
        }
        Mutation::Delete(i, n) => {
            let from = boundary(s, i);
            let to = floor(s, from + n);
            s.replace_range(from..to, "");
        }
        Mutation::Duplicate(i, n) => {
            let from = boundary(s, i);
            let to = floor(s, from + n);
            let piece = s[from..to].to_string();
            s.insert_str(to, &piece);
        }
        Mutation::Insert(i, k) => {
            let at = boundary(s, i);
            s.insert_str(at, k.get::<&str>(INSERTS));
        }
        Mutation::Tag(i, k, shape, v) => {
            let at = boundary(s, i);
            let tag = *k.get::<&str>(TAGS);
            let text = match shape {
                0 => format!("<{tag}>{v}</{tag}>"),
                1 => format!("<{tag}>{v}"),
                2 => format!("{v}</{tag}>"),
                _ => format!("<{tag}/>"),
            };
            s.insert_str(at, &text);
        }
        Mutation::DupLine(i) => {
            let r = line(s, i);
            let piece = s[r.clone()].to_string();
            s.insert_str(r.end, &piece);
        }
        Mutation::DelLine(i) => {
            let r = line(s, i);
            s.replace_range(r, "");
        }
        Mutation::LineElement(i, k, v) => {
            let at = line(s, i).start;
            let tag = *k.get::<&str>(TAGS);
            s.insert_str(at, &format!("<{tag}>{v}</{tag}>\n"));
        }
    }
}

/// Decodes and checks what must hold for any input: no panic (the call returns), the same
/// answer twice, and an error always says why.
fn check(raw: &str) -> Class {
    let c = codec();
    let first = c.decode(raw);
    assert_eq!(first, c.decode(raw), "decoding is deterministic");
    if let Err(CodecError::Malformed(m) | CodecError::Unsupported(m) | CodecError::Codec(m)) =
        &first
    {
        assert!(!m.is_empty());
    }
    class(&first)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn arbitrary_text_never_panics(s in ".*") {
        check(&s);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn markup_soup_never_panics(parts in prop::collection::vec((any::<Index>(), any::<Index>(), "[a-zA-Z0-9 ]{0,6}"), 0..40)) {
        // Random sequences of the format's own tags and stray markup.
        let mut s = String::new();
        for (k, t, text) in &parts {
            s.push_str(k.get::<&str>(INSERTS));
            s.push_str(&format!("<{}>{text}", *t.get::<&str>(TAGS)));
        }
        check(&s);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let (name, raw, _) = which.get(&FIXTURES);
        let mut s = raw.to_string();
        for m in &mutations {
            apply(&mut s, m);
        }
        let got = check(&s);
        // A byte-order mark in front never changes the answer (unless there already is one).
        if !s.starts_with('\u{feff}') {
            let bom = format!("\u{feff}{s}");
            prop_assert_eq!(codec().decode(&bom), codec().decode(&s), "{} {:?}", name, mutations);
        }
        prop_assert!(matches!(got, Class::Ok | Class::Malformed | Class::Unsupported | Class::Codec));
    }

    #[test]
    fn fixture_cut_anywhere_is_malformed(which in any::<Index>(), at in any::<Index>()) {
        // Cutting a complete message before its end tag never yields a message.
        let (name, raw, _) = which.get(&FIXTURES);
        let end = raw.rfind("</MSG>").unwrap_or(raw.len());
        let cut = floor(raw, at.index(end.max(1)));
        prop_assert_eq!(check(&raw[..cut]), Class::Malformed, "{} cut at {}", name, cut);
    }
}

/// The mutations are worth running: besides breaking messages they keep enough of them
/// intact to reach every outcome class (a deterministic sample, so the counts are stable).
#[test]
fn mutations_reach_every_class() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (any::<Index>(), prop::collection::vec(mutation(), 1..4));
    let mut counts = std::collections::HashMap::new();
    for _ in 0..3_000 {
        let Ok(tree) = strategy.new_tree(&mut runner) else {
            continue;
        };
        let (which, mutations) = tree.current();
        let (_, raw, _) = which.get(&FIXTURES);
        let mut s = raw.to_string();
        for m in &mutations {
            apply(&mut s, m);
        }
        *counts.entry(check(&s)).or_insert(0usize) += 1;
    }
    for class in [
        Class::Ok,
        Class::Malformed,
        Class::Unsupported,
        Class::Codec,
    ] {
        assert!(
            counts.get(&class).copied().unwrap_or(0) > 0,
            "{class:?} never reached: {counts:?}"
        );
    }
}
