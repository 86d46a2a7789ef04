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
