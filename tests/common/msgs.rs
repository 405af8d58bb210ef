//! Hand-written upstream messages in the assumed format (docs/message-format.md).

fn meta(seqn: i64, ty: &str, styp: &str) -> String {
    // DDTM moves with SEQN so later messages are later in business time.
    let ddtm = format!(
        "20261130{:02}{:02}{:02}",
        8 + (seqn / 3600) % 12,
        (seqn / 60) % 60,
        seqn % 60
    );
    let styp = if styp.is_empty() {
        String::new()
    } else {
        format!("<STYP>{styp}</STYP>")
    };
    format!("<META><SNDR>AODB</SNDR><RCVR>MSGX</RCVR><SEQN>{seqn}</SEQN><DDTM>{ddtm}</DDTM><TYPE>{ty}</TYPE>{styp}</META>")
}

fn flight(flid: &str, fields: &[(&str, &str)]) -> String {
    let body: String = fields
        .iter()
        .map(|(k, v)| format!("<{k}>{v}</{k}>"))
        .collect();
    format!("<FLIGHT><FLID>{flid}</FLID>{body}</FLIGHT>")
}

/// `FLOP/UPDT` carrying these fields.
pub fn flop(seqn: i64, flid: &str, fields: &[(&str, &str)]) -> String {
    format!(
        "<MSG>{}<FLOP>{}</FLOP></MSG>",
        meta(seqn, "FLOP", "UPDT"),
        flight(flid, fields)
    )
}

/// `FDEL`.
pub fn fdel(seqn: i64, flid: &str) -> String {
    format!(
        "<MSG>{}<FDEL><FLID>{flid}</FLID></FDEL></MSG>",
        meta(seqn, "FDEL", "")
    )
}

/// `ADFT`.
pub fn adft(seqn: i64, flid: &str, fields: &[(&str, &str)]) -> String {
    format!(
        "<MSG>{}<ADFT>{}</ADFT></MSG>",
        meta(seqn, "ADFT", ""),
        flight(flid, fields)
    )
}

/// `SCHD/DNLD` for 2026-11-30.
pub fn schedule(seqn: i64, flights: &[(&str, &[(&str, &str)])]) -> String {
    let body: String = flights
        .iter()
        .map(|(f, fields)| flight(f, fields))
        .collect();
    format!(
        "<MSG>{}<SCHD><DATE>20261130</DATE><FLIGHTS>{body}</FLIGHTS></SCHD></MSG>",
        meta(seqn, "SCHD", "DNLD")
    )
}

/// A well-formed message of a type nobody knows.
pub fn unknown_type(seqn: i64) -> String {
    format!("<MSG>{}<XXXX/></MSG>", meta(seqn, "XXXX", ""))
}
