use chrono::{DateTime, SecondsFormat, Utc};

/// An instant, always UTC, with microsecond precision (what PostgreSQL keeps).
pub type Timestamp = DateTime<Utc>;

/// RFC 3339 in UTC with a fixed number of fraction digits, so that timestamps
/// compare as text and read the same on every backend.
pub fn format_timestamp(t: &Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

pub(crate) mod serde_ts {
    use super::{format_timestamp, Timestamp};
    use serde::Serializer;

    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_timestamp(t))
    }

    pub mod option {
        use super::super::{format_timestamp, Timestamp};
        use serde::Serializer;

        pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&format_timestamp(t)),
                None => s.serialize_none(),
            }
        }
    }
}

/// An RFC 3339 instant within the years 1 to 9999 once its offset is
/// applied: what both databases store and every reader formats back.
pub fn parse_instant(text: &str) -> Result<Timestamp, String> {
    use chrono::Datelike;
    let instant = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|_| "must be an RFC 3339 date-time, e.g. 2026-12-01T09:00:00Z".to_owned())?;
    if !(1..=9999).contains(&instant.year()) {
        return Err(
            "must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC".to_owned(),
        );
    }
    Ok(instant)
}
