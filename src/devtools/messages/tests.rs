use chrono::{NaiveDate, NaiveDateTime};

use super::pool::POOL_MAX;
use super::xml::escape;
use super::*;

fn now() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2026, 11, 30)
        .and_then(|d| d.and_hms_opt(9, 30, 0))
        .expect("valid time")
}

/// Minimal well-formedness check: balanced, matching tags, one root, valid entities, no
/// raw `<` in text. Enough for what the generator writes (no CDATA, comments or DTDs).
fn well_formed(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut stack: Vec<String> = Vec::new();
    let mut roots = 0;
    while i < b.len() {
        match b[i] {
            b'<' => {
                let close = s[i..].find('>').ok_or("unterminated tag")? + i;
                let inner = &s[i + 1..close];
                if let Some(pi) = inner.strip_prefix('?') {
                    if !pi.ends_with('?') || i != 0 {
                        return Err("bad processing instruction".into());
                    }
                } else if let Some(name) = inner.strip_prefix('/') {
                    let open = stack.pop().ok_or("end tag without start")?;
                    if open != name.trim() {
                        return Err(format!("</{name}> closes <{open}>"));
                    }
                } else {
                    let self_closing = inner.ends_with('/');
                    let body = inner.trim_end_matches('/');
                    let name = body.split_whitespace().next().unwrap_or("");
                    let valid = name
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
                    if !valid {
                        return Err(format!("bad tag <{inner}>"));
                    }
                    if stack.is_empty() {
                        roots += 1;
                    }
                    if !self_closing {
                        stack.push(name.to_string());
                    }
                }
                i = close + 1;
            }
            b'&' => {
                let rest = &s[i..];
                let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| rest.starts_with(e));
                if !ok {
                    return Err("raw &".into());
                }
                i += 1;
            }
            c => {
                if stack.is_empty() && !c.is_ascii_whitespace() {
                    return Err("text outside the root".into());
                }
                i += 1;
            }
        }
    }
    if !stack.is_empty() {
        return Err(format!("unclosed {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} roots"));
    }
    Ok(())
}

/// Text of the first `<tag>…</tag>`.
fn text_of<'a>(s: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = s.find(&open)? + open.len();
    let end = s[start..].find(&format!("</{tag}>"))? + start;
    Some(&s[start..end])
}

#[test]
fn well_formed_kinds_have_msg_and_meta() {
    let mut g = Generator::new(7);
    for _ in 0..20 {
        for kind in MessageKind::all_but_malformed() {
            let m = g.render(kind, now());
            well_formed(&m).unwrap_or_else(|e| panic!("{kind:?}: {e}\n{m}"));
            assert!(m.contains("<MSG>"), "{kind:?}");
            assert!(m.trim_end().ends_with("</MSG>"), "{kind:?}");
            let meta = text_of(&m, "META").expect("META");
            assert_eq!(text_of(meta, "SNDR"), Some("AODB"));
            assert_eq!(text_of(meta, "RCVR"), Some("MSGX"));
            assert!(text_of(meta, "SEQN").expect("SEQN").parse::<u64>().is_ok());
            assert_eq!(text_of(meta, "DDTM"), Some("20261130093000"));
            let ty = text_of(meta, "TYPE").expect("TYPE");
            match kind.type_code() {
                Some(t) => assert_eq!(ty, t),
                None => assert!(UNKNOWN_TYPES.contains(&ty)),
            }
            if let Some(st) = kind.subtype() {
                assert_eq!(text_of(meta, "STYP"), Some(st), "{kind:?}");
            }
            // The body element of the type follows META.
            assert!(m.contains(&format!("<{ty}>")), "{kind:?}: {m}");
        }
    }
}

#[test]
fn bodies_follow_appendix_a() {
    let mut g = Generator::new(11);
    let (mut masters, mut shares) = (false, false);
    for _ in 0..5 {
        let dnld = g.render(MessageKind::SchdDnld, now());
        let schd = text_of(&dnld, "SCHD").expect("SCHD");
        assert!(text_of(schd, "DATE").is_some());
        assert!(schd.matches("<FLIGHT>").count() >= 3, "several flights");
        masters |= schd.contains("<MFID/>") || schd.contains("<MFID></MFID>");
        shares |= schd
            .split("<MFID>")
            .skip(1)
            .any(|r| !r.starts_with("</MFID>"));
    }
    assert!(
        masters && shares,
        "masters with empty MFID, code-shares carrying one"
    );
    let resp = g.render(MessageKind::SchdResp, now());
    assert!(text_of(&resp, "RQID").is_some());
    assert!(text_of(&resp, "FLIGHTS").is_some());
    let adft = g.render(MessageKind::SchdAdft, now());
    assert!(text_of(&adft, "SCHD").is_some_and(|b| b.contains("<FLIGHT>")));
    assert!(!adft.contains("<FLIGHTS>"));
    let fdel = g.render(MessageKind::Fdel, now());
    assert!(text_of(&fdel, "FDEL")
        .and_then(|b| text_of(b, "FLID"))
        .is_some());
    let a = g.render(MessageKind::Adft, now());
    assert!(text_of(&a, "ADFT")
        .and_then(|b| text_of(b, "FLID"))
        .is_some());
    for s in FLOP_SUBTYPES {
        let m = g.render(MessageKind::Flop(s), now());
        let flight = text_of(&m, "FLOP")
            .and_then(|b| text_of(b, "FLIGHT"))
            .expect("FLIGHT");
        assert!(
            text_of(flight, "FLID").is_some_and(|f| !f.is_empty()),
            "{s}"
        );
    }
}

#[test]
fn flop_uses_not_carried_and_clear() {
    let mut g = Generator::new(3);
    let mut empty = false;
    let mut clear = false;
    for _ in 0..400 {
        let m = g.render(MessageKind::Flop("UPDT"), now());
        let m2 = g.render(MessageKind::Flop("CANC"), now());
        for s in [&m, &m2] {
            empty |= s.contains("/>") && !s.contains("xsi:nil") || s.contains("></");
            clear |= s.contains(">-</");
        }
    }
    assert!(empty && clear);
}

#[test]
fn seqn_increases() {
    let mut g = Generator::new(1);
    let mix = Mix::well_formed();
    let mut last = 0;
    for _ in 0..500 {
        let (_, m) = g.next_message(&mix, now());
        let seqn: u64 = text_of(&m, "SEQN").expect("SEQN").parse().expect("integer");
        assert!(seqn > last);
        assert_eq!(seqn, g.last_seqn());
        last = seqn;
    }
}

#[test]
fn malformed_kinds_lack_what_they_claim() {
    let mut g = Generator::new(5);
    for _ in 0..60 {
        for kind in MalformedKind::ALL {
            let m = g.render(MessageKind::Malformed(kind), now());
            match kind {
                MalformedKind::NotWellFormed => {
                    assert!(well_formed(&m).is_err(), "{m}");
                    assert!(m.contains("<META>"), "only the XML is broken");
                }
                MalformedKind::Truncated => {
                    assert!(well_formed(&m).is_err(), "{m}");
                    assert!(!m.contains("</MSG>"));
                    assert!(!m.is_empty());
                }
                MalformedKind::NoMeta => {
                    well_formed(&m).expect("well-formed");
                    assert!(!m.contains("<META"));
                    assert!(m.contains("<FLOP>"));
                }
                MalformedKind::MissingSeqn => {
                    well_formed(&m).expect("well-formed");
                    let meta = text_of(&m, "META").expect("META");
                    assert!(!meta.contains("SEQN"));
                    assert!(text_of(meta, "DDTM").is_some());
                }
                MalformedKind::BadDdtm => {
                    well_formed(&m).expect("well-formed");
                    let ddtm = text_of(&m, "DDTM").expect("DDTM present");
                    assert!(
                        NaiveDateTime::parse_from_str(ddtm, TIME_FORMAT).is_err(),
                        "{ddtm}"
                    );
                }
                MalformedKind::MissingFlid => {
                    well_formed(&m).expect("well-formed");
                    assert!(!m.contains("FLID"), "{m}");
                    assert!(text_of(&m, "SEQN").is_some());
                }
            }
        }
    }
}

#[test]
fn fdel_hits_masters_with_code_shares_and_cascades() {
    let mut g = Generator::new(9);
    let mut master_deletes = 0;
    let mut absent_deletes = 0;
    for _ in 0..300 {
        let before = g.flights.clone();
        let m = g.render(MessageKind::Fdel, now());
        let flid = text_of(&m, "FLID").expect("FLID").to_string();
        let known = before.iter().any(|f| f.flid == flid);
        if before
            .iter()
            .any(|f| f.mfid.as_deref() == Some(flid.as_str()))
        {
            master_deletes += 1;
        }
        if !known {
            absent_deletes += 1;
        }
        assert!(g
            .flights
            .iter()
            .all(|f| f.flid != flid && f.mfid.as_deref() != Some(flid.as_str())));
        // Keep masters with code-shares coming.
        let _ = g.render(MessageKind::SchdDnld, now());
    }
    assert!(master_deletes > 20, "{master_deletes}");
    assert!(absent_deletes > 5, "{absent_deletes}");
}

#[test]
fn deterministic_for_a_seed() {
    let run = |seed| {
        let mut g = Generator::new(seed);
        let mix = Mix::default();
        (0..300)
            .map(|_| g.next_message(&mix, now()))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

#[test]
fn default_mix_is_realistic() {
    let mut g = Generator::new(2);
    let mix = Mix::default();
    let n = 20_000;
    let kinds: Vec<_> = (0..n).map(|_| g.next_kind(&mix)).collect();
    let count = |p: &dyn Fn(&MessageKind) -> bool| kinds.iter().filter(|k| p(k)).count();
    let flop = count(&|k| matches!(k, MessageKind::Flop(_)));
    let malformed = count(&|k| k.is_malformed());
    let unknown = count(&|k| *k == MessageKind::UnknownType);
    assert!(flop > n * 88 / 100, "{flop}");
    assert!((n / 100..n * 3 / 100).contains(&malformed), "{malformed}");
    assert!((n / 200..n * 2 / 100).contains(&unknown), "{unknown}");
    assert!(count(&|k| *k == MessageKind::Flop("UPDT")) > flop / 3);
    let zero = Mix {
        malformed: 0.0,
        unknown_type: 0.0,
        schd_dnld: 0.0,
        schd_resp: 0.0,
        schd_adft: 0.0,
        flop: 0.0,
        fdel: -1.0,
        adft: f64::NAN,
    };
    assert_eq!(g.next_kind(&zero), MessageKind::Flop("UPDT"));
    let wf = Mix::well_formed();
    assert!((0..2000).all(|_| {
        let k = g.next_kind(&wf);
        !k.is_malformed() && k != MessageKind::UnknownType
    }));
}

#[test]
fn text_is_escaped() {
    assert_eq!(
        escape("A1&A2 <x> \"q\" 'a'"),
        "A1&amp;A2 &lt;x&gt; &quot;q&quot; &apos;a&apos;"
    );
    let mut g = Generator::new(4);
    let mut escaped = false;
    for _ in 0..2000 {
        let m = g.render(MessageKind::Flop("GATE"), now());
        well_formed(&m).unwrap_or_else(|e| panic!("{e}\n{m}"));
        escaped |= m.contains("&amp;");
    }
    assert!(escaped, "a gate with & shows up escaped");
}

#[test]
fn huge_schedule_is_large_and_well_formed() {
    let mut g = Generator::new(6);
    let m = g.render_huge(now(), 1 << 20);
    assert!(m.len() >= 1 << 20);
    well_formed(&m).expect("well-formed");
    assert!(g.flights.len() <= POOL_MAX);
    assert_eq!(text_of(&m, "STYP"), Some("DNLD"));
}

#[test]
fn unsupported_flop_subtype_renders() {
    let mut g = Generator::with_sender(8, "CIIMS");
    let m = g.render(MessageKind::Flop("ZZZZ"), now());
    well_formed(&m).expect("well-formed");
    assert_eq!(text_of(&m, "STYP"), Some("ZZZZ"));
    assert_eq!(text_of(&m, "SNDR"), Some("CIIMS"));
}
