//! Start-up refusals that fail closed (issue 30): no Kafka configured, and a first start on a
//! fresh store whose inbox already holds history without a cutover decision. Kept apart from
//! the cutover seeding itself (`msgx_core::cutover`), which runs after these checks.

use msgx_core::cutover::CutoverMode;
use msgx_core::inbox::Inbox;
use msgx_core::settings::{KafkaSettings, Settings};
use msgx_core::store::event_scan::check_transactional_id;
use msgx_core::store::Store;

use crate::refusal::Refusal;

/// The compiled-in `kafka.ce_source`: good enough for the in-process cluster of a dev run,
/// refused anywhere else (a second deployment on the same topic would share it).
pub const DEFAULT_CE_SOURCE: &str = "/msgexchange";

/// `kafka.brokers` must be set: an unset key no longer means the in-process mock cluster,
/// which acknowledges events and loses them on exit; `embedded` says so explicitly (dev, demo,
/// tests). Outside `embedded`, `kafka.ce_source` must name the deployment: consumers tell
/// events apart by (`ce_source`, `ce_id`), so two deployments sharing a topic need two sources.
pub fn require_brokers(settings: &Settings) -> Result<(), Refusal> {
    let k = &settings.kafka;
    if k.brokers.trim().is_empty() {
        return Err(Refusal::config(
            "kafka.brokers is not set: give the site's brokers as host:port[,host:port] \
             (MSGX_KAFKA__BROKERS), or `embedded` for the in-process mock cluster of dev and \
             demo runs, which loses every event when the process ends",
        ));
    }
    if k.is_embedded() {
        return Ok(());
    }
    let source = k.ce_source.trim();
    let why = if source == DEFAULT_CE_SOURCE {
        format!("is the compiled default `{DEFAULT_CE_SOURCE}`")
    } else if let Some(host) = placeholder_host(source) {
        format!("`{source}` is a placeholder ({host} is a reserved example domain, RFC 2606)")
    } else {
        return Ok(());
    };
    Err(Refusal::config(format!(
        "kafka.ce_source {why}: name this deployment (kafka.ce_source or \
         MSGX_KAFKA__CE_SOURCE, a URI reference such as `//<airport>.<your domain>/msgexchange`), \
         so its events stay apart from any other deployment's on a shared topic"
    )))
}

/// The host of a `ce_source` like `//site.example/msgexchange` (or `scheme://…`) when it is a
/// documentation name (RFC 2606: `example`, `*.example`, `example.com|net|org` and their
/// subdomains): the packaged configuration ships one, which a site must replace.
fn placeholder_host(source: &str) -> Option<&str> {
    let rest = source.split_once("//")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.split(':').next()?.trim_end_matches('.');
    let lower = host.to_ascii_lowercase();
    let reserved = ["example", "example.com", "example.net", "example.org"];
    reserved
        .iter()
        .any(|r| lower == *r || lower.ends_with(&format!(".{r}")))
        .then_some(host)
}

/// On a fresh store (nothing discovered, processed or seeded yet) whose inbox already holds
/// rows, the start needs `pipeline.cutover_watermark`: starting at W = 0 would process and
/// mark the whole history, which the seed makes an explicit decision (`zero` says it).
pub async fn require_cutover_choice(
    store: &Store,
    inbox: &Inbox,
    mode: Option<CutoverMode>,
) -> anyhow::Result<()> {
    if mode.is_some() || !store.is_fresh().await? {
        return Ok(());
    }
    let Some((first, last)) = inbox.id_range().await? else {
        return Ok(());
    };
    Err(Refusal::config(format!(
        "first start on a fresh store, and the inbox already holds rows (ids {first}..{last}): \
         choose where to start — `msgexchange cutover plan --mode max` shows what a mode would \
         skip and read (also min, zero, or an id) — then set pipeline.cutover_watermark \
         (MSGX_PIPELINE__CUTOVER_WATERMARK); `zero` processes and marks the whole history"
    ))
    .into())
}

/// `exactly-once`: a configured `kafka.transactional_id` must be the one recorded for this
/// store's deployment (at its first exactly-once start): two ids would fence nothing. Empty
/// takes the recorded one (the dispatcher's start).
pub async fn require_transactional_id(store: &Store, k: &KafkaSettings) -> anyhow::Result<()> {
    if !k.exactly_once() {
        return Ok(());
    }
    let Some(recorded) = store.transactional_id().await? else {
        return Ok(());
    };
    check_transactional_id(&recorded, &k.transactional_id)
        .map_err(|e| Refusal::config(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::placeholder_host;

    /// The packaged configuration's placeholder and the documentation's names are refused; a
    /// site's own name (or one merely containing "example" in a label) is not.
    #[test]
    fn reserved_example_hosts_are_placeholders() {
        for (source, host) in [
            ("//site.example/msgexchange", "site.example"),
            ("//EXAMPLE.COM/x", "EXAMPLE.COM"),
            (
                "https://aodb.pek.example.org:8443/msgexchange",
                "aodb.pek.example.org",
            ),
            ("//user@example.net./m", "example.net"),
            ("//example", "example"),
        ] {
            assert_eq!(placeholder_host(source), Some(host), "{source}");
        }
        for source in [
            "//pek-aodb.airport.internal/msgexchange",
            "//examples.com/m",
            "//example.company/m",
            "/msgexchange",
            "urn:example:msgexchange",
            "//msgxt_cli_1.test/msgexchange",
        ] {
            assert_eq!(placeholder_host(source), None, "{source}");
        }
    }
}
