//! The stored state of one flight and its per-field versions.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::codec::model::Field;

/// The version of one stored field: which message last set or cleared it.
///
/// A later rule (late-message compensation, SPEC §6 G1) compares these to refuse stale writes;
/// the rules here only stamp them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldVersion {
    /// The message's send time (`DDTM`, as UTC): its business time.
    pub at: DateTime<Utc>,
    /// The message's inbox id (`MSG_ID`).
    pub msg_id: i64,
}

/// The current state of one flight.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Flight {
    /// `FLID`, the flight's identity.
    pub flid: String,
    /// The fields that hold a value (a cleared field is absent). JSON keys are the tags (`GATE`).
    #[serde(with = "field_map")]
    pub fields: BTreeMap<Field, String>,
    /// The version of every field a message has set or cleared (a cleared field keeps its
    /// version, so a stale write cannot resurrect it). JSON keys are the tags.
    #[serde(with = "field_map")]
    pub versions: BTreeMap<Field, FieldVersion>,
}

impl Flight {
    /// A flight with no fields.
    pub fn new(flid: impl Into<String>) -> Flight {
        Flight {
            flid: flid.into(),
            ..Flight::default()
        }
    }

    /// The value of a field, if it holds one.
    pub fn get(&self, field: Field) -> Option<&str> {
        self.fields.get(&field).map(String::as_str)
    }

    /// The master flight id when this flight is a code-share (`MFID` set and non-empty).
    pub fn master(&self) -> Option<&str> {
        self.get(Field::Mfid).filter(|m| !m.is_empty())
    }

    /// The flight identity (Kafka key, event `flight_key`): the `FLID`, which our message
    /// format makes mandatory. See [`fallback_key`] for formats without one.
    pub fn key(&self) -> &str {
        &self.flid
    }

    /// `fields` and `versions` as the JSON text the store keeps (tags as keys), written
    /// straight from the maps: the outcome statement binds one pair per flight it writes, so
    /// no `serde_json::Value` is built and cloned on the way.
    pub fn columns_json(&self) -> Result<(String, String), serde_json::Error> {
        Ok((
            serde_json::to_string(&TagMap(&self.fields))?,
            serde_json::to_string(&TagMap(&self.versions))?,
        ))
    }
}

/// A map keyed by [`Field`], serialized as [`field_map`] does (for [`Flight::columns_json`]).
struct TagMap<'a, V>(&'a BTreeMap<Field, V>);

impl<V: Serialize> Serialize for TagMap<'_, V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        field_map::serialize(self.0, serializer)
    }
}

/// The flight identity for a format without `FLID` (identity rule: "FLID, else carrier +
/// number + schedule date + direction"), spelled `AWCD|FLNO|FEXD|FLIO`, e.g. `MU|5101|20261130|D`.
///
/// Unused with the assumed XML format (`FLID` is required there, a message without it is
/// MALFORMED); kept so a replacement codec for the real SIS format has one agreed spelling.
pub fn fallback_key(awcd: &str, flno: &str, fexd: &str, flio: &str) -> String {
    format!("{awcd}|{flno}|{fexd}|{flio}")
}

/// Serde for a map keyed by [`Field`], using the element tags as keys (`Field` itself has no
/// serde impls).
pub(crate) mod field_map {
    use std::collections::BTreeMap;

    use serde::de::Error as _;
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::codec::model::Field;

    /// Writes `{TAG: value}`.
    pub fn serialize<S: Serializer, V: Serialize>(
        map: &BTreeMap<Field, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_map(Some(map.len()))?;
        for (field, value) in map {
            out.serialize_entry(field.tag(), value)?;
        }
        out.end()
    }

    /// Reads `{TAG: value}`; an unknown tag is an error.
    pub fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<Field, V>, D::Error> {
        let raw = BTreeMap::<String, V>::deserialize(deserializer)?;
        raw.into_iter()
            .map(|(tag, value)| {
                Field::from_tag(&tag)
                    .map(|field| (field, value))
                    .ok_or_else(|| D::Error::custom(format!("unknown flight field {tag:?}")))
            })
            .collect()
    }
}
