//! Pure parts of the outbound path: the `SCHD`/`RQST` request text, its request id, the
//! look-up pattern the reconciler uses, and when the daily request is due (airport local time,
//! injected "now").

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

/// `META/TYPE` (and `REQ_TRACK.kind`) of the schedule request.
pub const KIND_SCHEDULE: &str = "SCHD";
/// `META/STYP` of a request.
pub const SUBTYPE_REQUEST: &str = "RQST";

/// What a schedule request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRequest {
    /// `META/SNDR`: our sender name.
    pub sender: String,
    /// `META/RCVR`.
    pub receiver: String,
    /// `META/SEQN`: the `REQ_TRACK` id.
    pub seqn: i64,
    /// `META/RQID`: echoed by upstream in the `SCHD`/`RESP` answer.
    pub rqid: String,
    /// `META/DDTM`: send time in airport local time.
    pub sent_local: NaiveDateTime,
    /// `SCHD/DATE`: the day asked about.
    pub date: NaiveDate,
}

impl ScheduleRequest {
    /// The message text (SPEC Appendix A envelope; one line).
    pub fn to_xml(&self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
             <MSG><META><SNDR>{sndr}</SNDR><RCVR>{rcvr}</RCVR><SEQN>{seqn}</SEQN>\
             <DDTM>{ddtm}</DDTM><TYPE>{ty}</TYPE><STYP>{styp}</STYP><RQID>{rqid}</RQID></META>\
             <SCHD><DATE>{date}</DATE></SCHD></MSG>",
            sndr = escape(&self.sender),
            rcvr = escape(&self.receiver),
            seqn = self.seqn,
            ddtm = self.sent_local.format("%Y%m%d%H%M%S"),
            ty = KIND_SCHEDULE,
            styp = SUBTYPE_REQUEST,
            rqid = escape(&self.rqid),
            date = self.date.format("%Y%m%d"),
        )
    }
}

/// The request id: `<sender>-<REQ_TRACK id>-<8 hex digits>`. The id makes it unique in our
/// store; the random part keeps two stores (a re-created database, a test instance writing the
/// same table) from producing the same text.
pub fn rqid(sender: &str, id: i64, nonce: u32) -> String {
    format!("{sender}-{id}-{nonce:08X}")
}

/// The `LIKE … ESCAPE '!'` pattern that finds `<RQID>rqid</RQID>` anywhere in a message. The
/// closing tag is part of the pattern, so `MSGX-1-…` never matches `MSGX-10-…`.
pub fn rqid_like_pattern(rqid: &str) -> String {
    let mut escaped = String::with_capacity(rqid.len() + 2);
    for c in escape(rqid).chars() {
        if matches!(c, '!' | '%' | '_') {
            escaped.push('!');
        }
        escaped.push(c);
    }
    format!("%<RQID>{escaped}</RQID>%")
}

/// The airport-local date of `now`.
pub fn local_date(now: DateTime<Utc>, tz: Tz) -> NaiveDate {
    now.with_timezone(&tz).date_naive()
}

/// The airport-local wall time of `now` (DDTM, COUTMSGS creation time).
pub fn local_time(now: DateTime<Utc>, tz: Tz) -> NaiveDateTime {
    now.with_timezone(&tz).naive_local()
}

/// The day the daily request is due for at `now`: today (local) once the local time has
/// reached `at`, else `None`. Whether today's request was already made is the caller's
/// question (REQ_TRACK).
pub fn daily_due(now: DateTime<Utc>, at: NaiveTime, tz: Tz) -> Option<NaiveDate> {
    let local = now.with_timezone(&tz);
    (local.time() >= at).then(|| local.date_naive())
}

/// The first instant strictly after `now` at which the local time is `at`. A local time the
/// zone skips that day (a DST gap) runs at the first valid local time after it; an ambiguous
/// one (a DST fold) at its earlier instant.
pub fn next_daily_run(now: DateTime<Utc>, at: NaiveTime, tz: Tz) -> DateTime<Utc> {
    let mut day = local_date(now, tz);
    // At most two days ahead (today not passed yet / tomorrow); three for safety with folds.
    for _ in 0..3 {
        let run = resolve_local(day.and_time(at), tz);
        if run > now {
            return run;
        }
        day = day.succ_opt().unwrap_or(day);
    }
    now + Duration::days(1)
}

/// A local wall time as an instant: earliest of a fold; the first valid minute after a gap.
fn resolve_local(local: NaiveDateTime, tz: Tz) -> DateTime<Utc> {
    let mut t = local;
    // Gaps are at most a few hours; step by minutes until the wall time exists.
    for _ in 0..(24 * 60) {
        if let Some(instant) = tz.from_local_datetime(&t).earliest() {
            return instant.with_timezone(&Utc);
        }
        t += Duration::minutes(1);
    }
    Utc.from_utc_datetime(&local)
}

/// Minimal XML text escaping (our values are letters, digits and `-`; this is a guard).
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    fn shanghai() -> Tz {
        "Asia/Shanghai".parse().expect("tz")
    }

    fn hm(h: u32, m: u32) -> NaiveTime {
        NaiveTime::from_hms_opt(h, m, 0).expect("time")
    }

    fn request() -> ScheduleRequest {
        ScheduleRequest {
            sender: "MSGX".into(),
            receiver: "AODB".into(),
            seqn: 42,
            rqid: rqid("MSGX", 42, 0xBEEF),
            sent_local: NaiveDate::from_ymd_opt(2026, 11, 30)
                .expect("date")
                .and_hms_opt(2, 30, 5)
                .expect("time"),
            date: NaiveDate::from_ymd_opt(2026, 11, 30).expect("date"),
        }
    }

    #[test]
    fn schedule_request_text_is_exact() {
        assert_eq!(
            request().to_xml(),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><MSG><META><SNDR>MSGX</SNDR>\
             <RCVR>AODB</RCVR><SEQN>42</SEQN><DDTM>20261130023005</DDTM><TYPE>SCHD</TYPE>\
             <STYP>RQST</STYP><RQID>MSGX-42-0000BEEF</RQID></META>\
             <SCHD><DATE>20261130</DATE></SCHD></MSG>"
        );
    }

    /// The text is well-formed XML whose META and body read back as built.
    #[test]
    fn schedule_request_is_well_formed_and_reads_back() {
        use quick_xml::events::Event;
        let xml = request().to_xml();
        let mut reader = quick_xml::Reader::from_str(&xml);
        let mut path: Vec<String> = Vec::new();
        let mut leaves: Vec<(String, String)> = Vec::new();
        loop {
            match reader.read_event().expect("well-formed") {
                Event::Start(e) => {
                    path.push(String::from_utf8_lossy(e.name().as_ref()).into_owned())
                }
                Event::End(_) => {
                    path.pop();
                }
                Event::Text(t) => leaves.push((
                    path.join("/"),
                    String::from_utf8_lossy(t.as_ref()).into_owned(),
                )),
                Event::Eof => break,
                _ => {}
            }
        }
        assert!(path.is_empty(), "every element closed");
        let get = |p: &str| leaves.iter().find(|(k, _)| k == p).map(|(_, v)| v.as_str());
        assert_eq!(get("MSG/META/SNDR"), Some("MSGX"));
        assert_eq!(get("MSG/META/RCVR"), Some("AODB"));
        assert_eq!(get("MSG/META/SEQN"), Some("42"));
        assert_eq!(get("MSG/META/DDTM"), Some("20261130023005"));
        assert_eq!(get("MSG/META/TYPE"), Some("SCHD"));
        assert_eq!(get("MSG/META/STYP"), Some("RQST"));
        assert_eq!(get("MSG/META/RQID"), Some("MSGX-42-0000BEEF"));
        assert_eq!(get("MSG/SCHD/DATE"), Some("20261130"));
    }

    #[test]
    fn text_values_are_escaped() {
        let r = ScheduleRequest {
            sender: "A<&>B".into(),
            ..request()
        };
        assert!(r.to_xml().contains("<SNDR>A&lt;&amp;&gt;B</SNDR>"));
    }

    #[test]
    fn rqid_and_its_pattern() {
        assert_eq!(rqid("MSGX", 7, 0x1A2B), "MSGX-7-00001A2B");
        assert_eq!(
            rqid_like_pattern("MSGX-7-00001A2B"),
            "%<RQID>MSGX-7-00001A2B</RQID>%"
        );
        // LIKE wildcards and the escape character itself are escaped.
        assert_eq!(rqid_like_pattern("a_b%c!d"), "%<RQID>a!_b!%c!!d</RQID>%");
        // The pattern matches the text as written in the message (escaped XML).
        assert_eq!(rqid_like_pattern("x<y"), "%<RQID>x&lt;y</RQID>%");
    }

    /// The local day `y-m-d`.
    fn day(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).expect("valid date")
    }

    #[test]
    fn daily_due_in_airport_local_time() {
        let tz = shanghai();
        // (now in UTC, time of day, the local day due, if any)
        let cases = [
            // 02:29:59 local (18:29:59 UTC the day before): not yet.
            ("2026-11-29T18:29:59Z", hm(2, 30), None),
            // 02:30:00 local: due for the local day, not the UTC one.
            ("2026-11-29T18:30:00Z", hm(2, 30), Some(day(2026, 11, 30))),
            // Later the same local day: still due for that day (a late start asks at once).
            ("2026-11-30T15:59:59Z", hm(2, 30), Some(day(2026, 11, 30))),
            // Just after local midnight: the new day is not due yet.
            ("2026-11-30T16:00:00Z", hm(2, 30), None),
            // 00:00 is due from local midnight on.
            ("2026-11-30T16:00:00Z", hm(0, 0), Some(day(2026, 12, 1))),
        ];
        for (now, at, due) in cases {
            assert_eq!(daily_due(utc(now), at, tz), due, "{now} at {at}");
        }
    }

    /// Checks [`next_daily_run`] at `at` in `tz` for each (now, expected run), both in UTC.
    fn assert_next_runs(tz: Tz, at: NaiveTime, cases: &[(&str, &str)]) {
        for (now, run) in cases {
            assert_eq!(next_daily_run(utc(now), at, tz), utc(run), "{now}");
        }
    }

    #[test]
    fn next_daily_run_is_strictly_after_now() {
        assert_next_runs(
            shanghai(),
            hm(2, 30),
            &[
                // Before today's time: today at 02:30 local = 18:30 UTC the day before.
                ("2026-11-29T17:00:00Z", "2026-11-29T18:30:00Z"),
                // Exactly at it, and after it: tomorrow.
                ("2026-11-29T18:30:00Z", "2026-11-30T18:30:00Z"),
                ("2026-11-30T03:00:00Z", "2026-11-30T18:30:00Z"),
                // Across a month and year end.
                ("2026-12-31T19:00:00Z", "2027-01-01T18:30:00Z"),
            ],
        );
    }

    #[test]
    fn next_daily_run_handles_dst_gaps_and_folds() {
        let berlin: Tz = "Europe/Berlin".parse().expect("tz");
        assert_next_runs(
            berlin,
            hm(2, 30),
            &[
                // 2026-03-29 02:30 does not exist in Berlin (02:00 → 03:00 CEST): runs at 03:00
                // CEST.
                ("2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"),
                // 2026-10-25 02:30 happens twice: the earlier (CEST, 00:30 UTC).
                ("2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z"),
            ],
        );
        // Due on the gap day once the local clock passed the time.
        assert_eq!(
            daily_due(utc("2026-03-29T01:00:00Z"), hm(2, 30), berlin),
            Some(day(2026, 3, 29))
        );
    }

    #[test]
    fn local_date_and_time_use_the_zone() {
        let tz = shanghai();
        let t = utc("2026-11-29T18:30:05Z");
        assert_eq!(local_date(t, tz), day(2026, 11, 30));
        assert_eq!(local_time(t, tz).to_string(), "2026-11-30 02:30:05");
    }
}
