//! `msgexchange status` of a newer binary against a store still at the older schema (a rolling
//! upgrade, issue 30): the full report needs this binary's schema, so it says where the upgrade
//! stands instead — the versions, who holds the lease, and what happens next.

use msgx_core::settings::Settings;
use msgx_core::store::schema::{self, SchemaProbe};
use msgx_core::store::{SchemaState, StoreError};

/// `Some(report)` when `failed` is a schema refusal and the store is behind this binary (the
/// report is printed instead of the refusal); `None` otherwise (the refusal stands).
pub async fn behind(settings: &Settings, failed: &anyhow::Error, json: bool) -> Option<String> {
    let is_schema = failed
        .chain()
        .any(|c| matches!(c.downcast_ref::<StoreError>(), Some(StoreError::Schema(_))));
    if !is_schema {
        return None;
    }
    let probe = schema::probe(&settings.store).await.ok()?;
    let SchemaState::Behind {
        store,
        binary,
        pending,
    } = &probe.state
    else {
        return None;
    };
    Some(if json {
        render_json(&probe, *store, *binary, pending)
    } else {
        render_text(&probe, *store, *binary, pending)
    })
}

fn render_text(probe: &SchemaProbe, store: i64, binary: i64, pending: &[i64]) -> String {
    let lease = match &probe.lease {
        Some((epoch, Some(holder))) => format!("held by {holder} (epoch {epoch})"),
        _ => "not held".into(),
    };
    format!(
        "schema: the store is at version {store}, this binary's is {binary} (pending: {pending:?})\n\
         upgrade: not migrated yet — an instance of this version stands by and migrates once it \
         holds the lease; `msgexchange migrate` applies them now (the running older release \
         keeps working: every migration keeps the previous release working)\n\
         lease: {lease}\n"
    )
}

fn render_json(probe: &SchemaProbe, store: i64, binary: i64, pending: &[i64]) -> String {
    let (epoch, holder) = match &probe.lease {
        Some((epoch, holder)) => (Some(*epoch), holder.clone()),
        None => (None, None),
    };
    let doc = serde_json::json!({
        "schema": { "store": store, "binary": binary, "pending": pending },
        "upgrade": "waiting for the lease holder of this version, or `msgexchange migrate`",
        "lease": { "epoch": epoch, "holder": holder },
    });
    format!("{doc:#}\n")
}
