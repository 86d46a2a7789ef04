use std::fmt;

use ulid::Ulid;
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};

/// Text without control characters, as buyer ids and payment references are.
const PRINTABLE: &str = "^[^\\x00-\\x1F\\x7F-\\x9F]+$";

/// How a text value is documented: a string matching `pattern`, shown with
/// `example`.
pub fn text_schema(pattern: &str, example: &str) -> ObjectBuilder {
    // The document shows `example`, as the schemas derived for fields do.
    #[allow(deprecated)]
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .example(Some(example.into()))
        .pattern(Some(pattern))
}

/// Printable text of 1 to `max` characters, shown with `example`.
pub fn printable_schema(max: usize, example: &str) -> ObjectBuilder {
    text_schema(PRINTABLE, example)
        .min_length(Some(1))
        .max_length(Some(max))
}

macro_rules! string_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_inner(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_newtype!(
    /// An asset id chosen by the operator: `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`.
    AssetId
);
string_newtype!(
    /// The buyer, opaque to holdfast: 1 to 64 characters, no control characters.
    BuyerId
);
string_newtype!(
    /// The payment system's reference: 1 to 128 characters, no control characters.
    PaymentReference
);
string_newtype!(
    /// A client-chosen key that makes a POST safe to retry: 1 to 255 printable ASCII characters.
    IdempotencyKey
);

impl AssetId {
    pub const MAX_LEN: usize = 64;
    pub const PATTERN: &'static str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$";

    pub fn schema() -> ObjectBuilder {
        text_schema(Self::PATTERN, "EQ-88392")
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        let mut chars = s.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
        let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if first_ok && rest_ok && s.len() <= Self::MAX_LEN {
            Ok(Self(s.to_owned()))
        } else {
            Err(
                "must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-', starting with a \
                letter or digit"
                    .into(),
            )
        }
    }
}

fn bounded_text(s: &str, max: usize) -> Result<String, String> {
    let n = s.chars().count();
    if n == 0 || n > max {
        return Err(format!("must be 1 to {max} characters"));
    }
    if s.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(s.to_owned())
}

impl BuyerId {
    pub const MAX_LEN: usize = 64;

    pub fn parse(s: &str) -> Result<Self, String> {
        bounded_text(s, Self::MAX_LEN).map(Self)
    }
}

impl PaymentReference {
    pub const MAX_LEN: usize = 128;

    pub fn parse(s: &str) -> Result<Self, String> {
        bounded_text(s, Self::MAX_LEN).map(Self)
    }
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > Self::MAX_LEN || !s.bytes().all(|b| (0x20..=0x7e).contains(&b))
        {
            return Err(format!(
                "the Idempotency-Key header must be 1 to {} printable ASCII characters",
                Self::MAX_LEN
            ));
        }
        Ok(Self(s.to_owned()))
    }
}

macro_rules! ulid_id {
    ($(#[$meta:meta])* $name:ident, $prefix:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Ulid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;
            pub const PATTERN: &'static str = concat!("^", $prefix, "[0-9A-HJKMNP-TV-Z]{26}$");

            pub fn generate() -> Self {
                Self(Ulid::new())
            }

            /// A new id whose time is `at` (the database's clock), not this
            /// process's: ids then sort as their rows' creation times do.
            pub fn at(at: chrono::DateTime<chrono::Utc>) -> Self {
                Self(Ulid::from_datetime(at.into()))
            }

            /// The least id that [`Self::at`] can make at `at` or later: a
            /// range of ids from it is a range of creation times.
            pub fn floor(at: chrono::DateTime<chrono::Utc>) -> Self {
                let ms = u64::try_from(at.timestamp_millis()).unwrap_or_default();
                Self(Ulid::from_parts(ms, 0))
            }

            /// Accepts exactly the prefix followed by a 26-character ULID.
            pub fn parse(s: &str) -> Option<Self> {
                let rest = s.strip_prefix($prefix)?;
                if rest.len() != 26 {
                    return None;
                }
                Ulid::from_string(rest).ok().map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }
    };
}

ulid_id!(
    /// `res_` followed by a ULID.
    ReservationId,
    "res_"
);
ulid_id!(
    /// `rf_` followed by a ULID.
    RefundId,
    "rf_"
);
ulid_id!(
    /// `evt_` followed by a ULID.
    EventId,
    "evt_"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// `accepts` takes every text of `valid` and refuses every one of `invalid`.
    fn check(accepts: impl Fn(&str) -> bool, valid: &[&str], invalid: &[&str]) {
        for text in valid {
            assert!(accepts(text), "refused {text:?}");
        }
        for text in invalid {
            assert!(!accepts(text), "accepted {text:?}");
        }
    }

    #[test]
    fn asset_ids_follow_the_pattern() {
        let (longest, too_long) = ("a".repeat(64), "a".repeat(65));
        check(
            |text| AssetId::parse(text).is_ok(),
            &["EQ-88392", "a", &longest],
            &[&too_long, "", "-lead", "has space", "ünï"],
        );
    }

    #[test]
    fn reservation_ids_round_trip_and_reject_others() {
        let id = ReservationId::generate();
        let text = id.to_string();
        assert_eq!(text.len(), 30);
        assert_eq!(ReservationId::parse(&text), Some(id));
        assert_eq!(ReservationId::parse(&text.replace("res_", "rf_")), None);
        assert_eq!(ReservationId::parse("res_short"), None);
    }

    #[test]
    fn ids_made_at_a_time_sort_from_its_floor() {
        let t0 = chrono::DateTime::from_timestamp_millis(1_790_000_000_123).unwrap();
        let t1 = t0 + chrono::Duration::milliseconds(1);
        let floor = ReservationId::floor(t1).to_string();
        for _ in 0..50 {
            assert!(ReservationId::at(t0).to_string() < floor);
            assert!(ReservationId::at(t1).to_string() >= floor);
        }
        let id = ReservationId::at(t0);
        assert_eq!(ReservationId::parse(&id.to_string()), Some(id));
    }

    #[test]
    fn idempotency_keys_are_printable_ascii_up_to_255() {
        let (longest, too_long) = ("k".repeat(255), "k".repeat(256));
        check(
            |text| IdempotencyKey::parse(text).is_ok(),
            &["k-1", &longest],
            &[&too_long, "", "tab\there", "é"],
        );
    }

    #[test]
    fn text_fields_count_characters_not_bytes() {
        assert!(BuyerId::parse(&"é".repeat(64)).is_ok());
        assert!(BuyerId::parse(&"é".repeat(65)).is_err());
        assert!(PaymentReference::parse("pay\n1").is_err());
    }
}
