//! W3C Trace Context (`traceparent`, `tracestate`) and the trace of one message.
//!
//! A message's hops run in different actors, at different times, possibly in different
//! processes (a restart, a standby that took over): no span object can be handed from one to
//! the next. So the message's trace id and the span id of its first span (the inbox commit)
//! are *derived* from its identity — the deployment's `ce_source` and the inbox id — and every
//! hop rebuilds the same context on its own. A message registered through the compat entry
//! with a `traceparent` keeps the caller's trace id instead (stored with the row, migration
//! 0023); its first span is then the caller's child.

use std::fmt;

use sha2::{Digest, Sha256};

/// A W3C `traceparent` (version 00): trace id, parent span id, flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// Trace flags; bit 0 is "sampled".
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header as W3C Trace Context says a receiver must: version `ff`
    /// and malformed values are refused (`None`: the caller's trace is not continued); a
    /// future version is read by its first four fields.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let mut parts = raw.splitn(5, '-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        if version.len() != 2 || !is_lower_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 has exactly four fields; a later version may append more.
        if version == "00" && rest.is_some() {
            return None;
        }
        let trace_id: [u8; 16] = hex_bytes(trace)?;
        let span_id: [u8; 8] = hex_bytes(span)?;
        let [flags] = hex_bytes::<1>(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The sampled flag.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lower-case hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }
}

/// A `tracestate` worth carrying on: at most 512 characters of printable ASCII (W3C's limit);
/// anything else is dropped rather than passed to every consumer.
pub fn valid_tracestate(raw: &str) -> bool {
    !raw.is_empty() && raw.len() <= 512 && raw.chars().all(|c| (' '..='~').contains(&c))
}

/// The trace of one message: what every hop rebuilds from the message's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageTrace {
    /// The message's first span (the inbox commit) as a parent for the later hops, and as
    /// `ce_traceparent` on its events: the trace the message started.
    pub root: TraceParent,
    /// The caller's span when the message came through the compat entry with a
    /// `traceparent`: the inbox commit span's parent.
    pub caller: Option<TraceParent>,
    /// The caller's `tracestate`, carried on unchanged.
    pub state: Option<String>,
}

impl MessageTrace {
    /// The trace of inbox message `msg_id` of the deployment `source`: continued from the
    /// stored caller context if there is one (and it parses), else derived from the identity;
    /// sampled by `ratio` on the trace id unless a caller decided.
    pub fn derive(
        source: &str,
        msg_id: i64,
        stored: Option<&str>,
        state: Option<&str>,
        ratio: f64,
    ) -> Self {
        let caller = stored.and_then(TraceParent::parse);
        let (trace_id, flags) = match caller {
            Some(c) => (c.trace_id, c.flags & 1),
            None => {
                let id = derived_trace_id(source, msg_id);
                (id, u8::from(ratio_sampled(&id, ratio)))
            }
        };
        let root = TraceParent {
            trace_id,
            span_id: derived_root_span(source, msg_id, &trace_id),
            flags,
        };
        Self {
            root,
            caller,
            state: caller
                .and(state)
                .filter(|s| valid_tracestate(s))
                .map(str::to_string),
        }
    }
}

/// The trace-id ratio decision (the same rule as OpenTelemetry's `TraceIdRatioBased`): the
/// trace id's last 8 bytes, shifted right by one, below `ratio` × 2^63. Every actor and every
/// process decides the same for one trace id.
pub fn ratio_sampled(trace_id: &[u8; 16], ratio: f64) -> bool {
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let bound = (ratio.clamp(0.0, 1.0) * (1u64 << 63) as f64) as u64;
    (u64::from_be_bytes(low) >> 1) < bound
}

fn derived_trace_id(source: &str, msg_id: i64) -> [u8; 16] {
    let d = digest(&["msgx-trace-v1", source, &msg_id.to_string()]);
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[..16]);
    if id == [0; 16] {
        id[15] = 1; // never the invalid id (2^-128, but the rule is absolute)
    }
    id
}

fn derived_root_span(source: &str, msg_id: i64, trace_id: &[u8; 16]) -> [u8; 8] {
    let d = digest(&["msgx-root-v1", source, &msg_id.to_string(), &hex(trace_id)]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

/// SHA-256 over the parts, each followed by a NUL (no two part lists collide).
fn digest(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_and_prints_as_w3c_says() {
        let tp = TraceParent::parse(TP).expect("valid");
        assert_eq!(tp.to_string(), TP);
        assert!(tp.sampled());
        assert_eq!(tp.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.span_id_hex(), "00f067aa0ba902b7");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
        // A later version is read by its first four fields.
        assert!(TraceParent::parse(&format!("01{}-more", &TP[2..])).is_some());
    }

    #[test]
    fn a_message_trace_is_the_same_in_every_actor_and_process() {
        let a = MessageTrace::derive("/msgexchange", 42, None, None, 1.0);
        let b = MessageTrace::derive("/msgexchange", 42, None, None, 1.0);
        assert_eq!(a, b);
        assert!(a.root.sampled() && a.caller.is_none());
        let other_id = MessageTrace::derive("/msgexchange", 43, None, None, 1.0);
        let other_site = MessageTrace::derive("/other", 42, None, None, 1.0);
        assert_ne!(a.root.trace_id, other_id.root.trace_id);
        assert_ne!(a.root.trace_id, other_site.root.trace_id);
        // Ratio 0 samples nothing.
        assert!(!MessageTrace::derive("/msgexchange", 42, None, None, 0.0)
            .root
            .sampled());
    }

    #[test]
    fn a_callers_context_is_continued() {
        let t = MessageTrace::derive("/msgexchange", 7, Some(TP), Some("vendor=x"), 0.0);
        let caller = TraceParent::parse(TP).unwrap();
        assert_eq!(t.caller, Some(caller));
        assert_eq!(t.root.trace_id, caller.trace_id);
        assert_ne!(t.root.span_id, caller.span_id);
        // The caller sampled it: ratio 0 does not override a parent's decision.
        assert!(t.root.sampled());
        assert_eq!(t.state.as_deref(), Some("vendor=x"));
        // A malformed stored value starts the derived trace instead.
        let d = MessageTrace::derive("/msgexchange", 7, Some("junk"), Some("vendor=x"), 1.0);
        assert_eq!(d, MessageTrace::derive("/msgexchange", 7, None, None, 1.0));
    }

    #[test]
    fn the_ratio_keeps_about_that_share() {
        let kept = (0..10_000)
            .filter(|i| {
                MessageTrace::derive("/msgexchange", *i, None, None, 0.1)
                    .root
                    .sampled()
            })
            .count();
        assert!((800..1200).contains(&kept), "{kept} of 10000 at 0.1");
    }
}
