//! Catalogue data: an asset's price and attributes, a reservation's
//! metadata, their bounds, and the attribute filters of the asset list.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema};
use utoipa::openapi::schema::{SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use super::FieldError;

/// An amount of money in minor units (cents) of an ISO 4217 currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// In minor units, 0 to 10^15: the currency's ISO 4217 exponent (2 for
    /// EUR, 0 for JPY) places the decimal point. holdfast compares amounts
    /// as integers of one currency and never converts or rounds them.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_000_i64, example = 250000)]
    pub amount: i64,
    /// ISO 4217, three upper-case letters.
    #[schema(pattern = "^[A-Z]{3}$", example = "EUR")]
    pub currency: String,
}

impl Price {
    pub const MAX_AMOUNT: i64 = 1_000_000_000_000_000;

    /// Checks a price given at `field`; every fault is added to `errors`.
    pub fn check(&self, field: &str, errors: &mut Vec<FieldError>) {
        if !(0..=Self::MAX_AMOUNT).contains(&self.amount) {
            errors.push(FieldError::new(
                format!("{field}.amount"),
                format!("must be an integer from 0 to {}", Self::MAX_AMOUNT),
            ));
        }
        if !is_currency(&self.currency) {
            errors.push(FieldError::new(
                format!("{field}.currency"),
                "must be an ISO 4217 code: three upper-case letters",
            ));
        }
    }

    /// Whether a payment of this amount pays for `self`: the same currency,
    /// at least the amount (tips and fees are the shop's business).
    pub fn paid_by(&self, paid: &Price) -> bool {
        paid.currency == self.currency && paid.amount >= self.amount
    }
}

/// Whether a commit's payment (`paid`, when the payment system says what
/// it took) pays for a reservation made at `price`: always, unless both are
/// known and the payment took another currency or less.
pub fn pays(price: Option<&Price>, paid: Option<&Price>) -> bool {
    match (price, paid) {
        (Some(price), Some(paid)) => price.paid_by(paid),
        _ => true,
    }
}

pub fn is_currency(text: &str) -> bool {
    text.len() == 3 && text.bytes().all(|b| b.is_ascii_uppercase())
}

/// One attribute's value: what a shop filters on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttributeValue {
    Bool(bool),
    Int(i64),
    Text(String),
}

impl AttributeValue {
    /// The longest text value, in characters.
    pub const TEXT_MAX: usize = 256;

    /// Its kind and its text, as the attribute index keeps them.
    pub fn indexed(&self) -> (&'static str, String) {
        match self {
            AttributeValue::Bool(b) => ("b", b.to_string()),
            AttributeValue::Int(i) => ("i", i.to_string()),
            AttributeValue::Text(s) => ("s", s.clone()),
        }
    }

    /// A filter's VALUE: an integer or `true`/`false` matches only that
    /// integer or boolean; one in double quotes only that string; any other
    /// text that string.
    pub fn from_filter(text: &str) -> Self {
        if let Some(quoted) = text
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
        {
            return AttributeValue::Text(quoted.to_owned());
        }
        match text {
            "true" => AttributeValue::Bool(true),
            "false" => AttributeValue::Bool(false),
            _ => match text.parse::<i64>() {
                Ok(i) if text == i.to_string() => AttributeValue::Int(i),
                _ => AttributeValue::Text(text.to_owned()),
            },
        }
    }
}

/// An asset's attributes, by key.
pub type Attributes = BTreeMap<String, AttributeValue>;

/// The most attributes an asset may have.
pub const ATTRIBUTES_MAX: usize = 32;

/// Whether `key` may name an attribute: `^[a-z][a-z0-9_]{0,31}$`.
pub fn is_attribute_key(key: &str) -> bool {
    let mut chars = key.chars();
    key.len() <= 32
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Attributes given at `field` as JSON, checked: at most 32 members, keys
/// of the pattern, values strings (up to 256 characters), integers or
/// booleans. With `removals`, a member set to null removes that key (JSON
/// Merge Patch) and is returned as `None`.
pub fn attributes_from(
    value: &Value,
    field: &str,
    removals: bool,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<String, Option<AttributeValue>> {
    let mut found = BTreeMap::new();
    let Some(members) = value.as_object() else {
        errors.push(FieldError::new(field, "must be an object"));
        return found;
    };
    if members.len() > ATTRIBUTES_MAX {
        errors.push(FieldError::new(
            field,
            format!("at most {ATTRIBUTES_MAX} attributes"),
        ));
    }
    for (key, value) in members {
        let at = format!("{field}.{key}");
        if !is_attribute_key(key) {
            errors.push(FieldError::new(
                at,
                "a key is a lower-case letter, then up to 31 lower-case letters, digits or _",
            ));
            continue;
        }
        let parsed = match value {
            Value::Null if removals => None,
            Value::Bool(b) => Some(AttributeValue::Bool(*b)),
            Value::Number(n) if n.is_i64() => n.as_i64().map(AttributeValue::Int),
            Value::String(s) if s.chars().count() <= AttributeValue::TEXT_MAX => {
                Some(AttributeValue::Text(s.clone()))
            }
            _ => {
                errors.push(FieldError::new(
                    at,
                    "must be a string of at most 256 characters, an integer or a boolean",
                ));
                continue;
            }
        };
        found.insert(key.clone(), parsed);
    }
    found
}

/// The attributes after a JSON Merge Patch: null members removed, the
/// others set, the rest kept. An error when more than 32 would remain.
pub fn merged(
    current: &Attributes,
    patch: BTreeMap<String, Option<AttributeValue>>,
) -> Result<Attributes, FieldError> {
    let mut merged = current.clone();
    for (key, value) in patch {
        match value {
            Some(value) => merged.insert(key, value),
            None => merged.remove(&key),
        };
    }
    if merged.len() > ATTRIBUTES_MAX {
        return Err(FieldError::new(
            "attributes",
            format!("an asset has at most {ATTRIBUTES_MAX} attributes"),
        ));
    }
    Ok(merged)
}

/// A reservation's metadata: the shop's own references (order id, basket).
pub type Metadata = BTreeMap<String, String>;

/// The most metadata members, and their size in all (keys and values, bytes).
pub const METADATA_MAX_MEMBERS: usize = 16;
pub const METADATA_MAX_BYTES: usize = 2048;

/// Checks metadata given at `field`.
pub fn check_metadata(metadata: &Metadata, field: &str, errors: &mut Vec<FieldError>) {
    if metadata.len() > METADATA_MAX_MEMBERS {
        errors.push(FieldError::new(
            field,
            format!("at most {METADATA_MAX_MEMBERS} members"),
        ));
    }
    let size: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > METADATA_MAX_BYTES {
        errors.push(FieldError::new(
            field,
            format!("at most {METADATA_MAX_BYTES} bytes of keys and values in all"),
        ));
    }
}

/// The schema of `attributes`.
pub fn attributes_schema() -> ObjectBuilder {
    attributes_schema_with(false)
}

/// The schema of `attributes` in a JSON Merge Patch: a null member removes
/// that key.
pub fn attributes_patch_schema() -> ObjectBuilder {
    attributes_schema_with(true).description(Some(
        "A JSON Merge Patch of the attributes: a member set to null removes that key, the \
         others are set, the rest kept.",
    ))
}

fn attributes_schema_with(removals: bool) -> ObjectBuilder {
    let mut value = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .max_length(Some(AttributeValue::TEXT_MAX)),
        )
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer)))
        .item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Boolean)));
    if removals {
        value = value.item(ObjectBuilder::new().schema_type(SchemaType::Type(Type::Null)));
    }
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::OneOf(
            value.build(),
        )))))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .pattern(Some("^[a-z][a-z0-9_]{0,31}$")),
        ))
        .max_properties(Some(ATTRIBUTES_MAX))
        .description(Some(
            "What a shop filters on (`make`, `year`, `region`, `plate_text`): at most 32 \
             members; keys are a lower-case letter then up to 31 lower-case letters, digits \
             or `_`; values strings of at most 256 characters, integers or booleans.",
        ))
        .examples([serde_json::json!({"region": "B", "digits": 4, "vanity": true})])
}

/// The schema of `metadata`.
pub fn metadata_schema() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .build(),
        )))))
        .max_properties(Some(METADATA_MAX_MEMBERS))
        .description(Some(
            "The shop's own references (order id, basket id): at most 16 string members, \
             2 KiB of keys and values in all. Shown to the client that owns the \
             reservation, to admins and to payments clients.",
        ))
        .examples([serde_json::json!({"order_id": "ord-5521"})])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_values_are_typed_as_the_contract_says() {
        assert_eq!(AttributeValue::from_filter("1"), AttributeValue::Int(1));
        assert_eq!(AttributeValue::from_filter("-12"), AttributeValue::Int(-12));
        assert_eq!(
            AttributeValue::from_filter("\"1\""),
            AttributeValue::Text("1".into())
        );
        assert_eq!(
            AttributeValue::from_filter("true"),
            AttributeValue::Bool(true)
        );
        assert_eq!(
            AttributeValue::from_filter("\"true\""),
            AttributeValue::Text("true".into())
        );
        assert_eq!(
            AttributeValue::from_filter("01"),
            AttributeValue::Text("01".into())
        );
        assert_eq!(
            AttributeValue::from_filter("B"),
            AttributeValue::Text("B".into())
        );
    }

    #[test]
    fn attribute_rules() {
        let mut errors = Vec::new();
        let given = serde_json::json!({"year": 2019, "make": "Volvo", "Bad": 1, "f": 1.5,
            "ok": true, "gone": null});
        let found = attributes_from(&given, "attributes", false, &mut errors);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["attributes.Bad", "attributes.f", "attributes.gone"]
        );
        assert_eq!(found.len(), 3);
        let mut errors = Vec::new();
        let patch = attributes_from(
            &serde_json::json!({"gone": null}),
            "attributes",
            true,
            &mut errors,
        );
        assert!(errors.is_empty());
        let current = Attributes::from([("gone".into(), AttributeValue::Int(1))]);
        assert!(merged(&current, patch).unwrap().is_empty());
        assert!(is_attribute_key("plate_text"));
        assert!(!is_attribute_key("9a"));
        assert!(!is_attribute_key(&"a".repeat(33)));
    }

    #[test]
    fn a_payment_pays_for_a_price_in_its_currency_at_least() {
        let price = Price {
            amount: 100,
            currency: "EUR".into(),
        };
        let paid = |amount, currency: &str| Price {
            amount,
            currency: currency.into(),
        };
        assert!(price.paid_by(&paid(100, "EUR")));
        assert!(price.paid_by(&paid(150, "EUR")));
        assert!(!price.paid_by(&paid(99, "EUR")));
        assert!(!price.paid_by(&paid(100, "USD")));
    }
}
