//! A JSON value kept as its compact text.
//!
//! A capability's input schema is read rarely (a Tier 2 rendering, a call's
//! argument check, a reply) but held for every capability for the life of
//! the catalog. As a `serde_json::Value` tree (ordered maps, one allocation
//! per string and per object) a small schema weighs about ten times its
//! compact text; kept as the text, it is parsed again when read.
//!
//! On the wire and in storage it is the JSON value itself, so replacing a
//! `Value` by a `CompactJson` changes no format.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;

/// A JSON value held as its compact text (keys in their original order).
#[derive(Clone)]
pub struct CompactJson(Box<str>);

impl CompactJson {
    /// The value `value`, kept as compact text.
    pub fn new(value: &Value) -> CompactJson {
        CompactJson(value.to_string().into_boxed_str())
    }

    /// The value, parsed from the text.
    pub fn value(&self) -> Value {
        // The text was written from a `Value`, so it parses; `Null` is never
        // reached but keeps this total.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// The compact text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The keys of the top-level `properties` object, in their order (a
    /// schema's parameter names); empty when there is none.
    pub fn property_names(&self) -> Vec<String> {
        match self.value() {
            Value::Object(mut schema) => match schema.remove("properties") {
                Some(Value::Object(properties)) => properties.into_iter().map(|(name, _)| name).collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }
}

impl From<Value> for CompactJson {
    fn from(value: Value) -> CompactJson {
        CompactJson::new(&value)
    }
}

impl From<&Value> for CompactJson {
    fn from(value: &Value) -> CompactJson {
        CompactJson::new(value)
    }
}

/// Equal when the values are equal (objects compare as maps, whatever their
/// key order), as `Value`s do.
impl PartialEq for CompactJson {
    fn eq(&self, other: &CompactJson) -> bool {
        self.0 == other.0 || self.value() == other.value()
    }
}

impl PartialEq<Value> for CompactJson {
    fn eq(&self, other: &Value) -> bool {
        self.value() == *other
    }
}

impl fmt::Debug for CompactJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for CompactJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for CompactJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CompactJson, D::Error> {
        Value::deserialize(deserializer).map(CompactJson::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn keeps_the_value_and_its_key_order() {
        let schema = json!({"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}});
        let compact = CompactJson::new(&schema);
        assert_eq!(compact.value(), schema);
        assert_eq!(compact.property_names(), vec!["z", "a"]);
        assert_eq!(
            compact.as_str(),
            r#"{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}}}"#
        );
        assert!(CompactJson::new(&json!({"type": "object"})).property_names().is_empty());
        assert!(CompactJson::new(&json!([1, 2])).property_names().is_empty());
    }

    #[test]
    fn equality_is_the_values_not_the_texts() {
        let one = CompactJson::new(&json!({"a": 1, "b": 2}));
        let other = CompactJson::new(&json!({"b": 2, "a": 1}));
        assert_eq!(one, other);
        assert_ne!(one, CompactJson::new(&json!({"a": 1})));
        assert_eq!(one, json!({"a": 1, "b": 2}));
    }

    fn json_values() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            // Quarters are exact in binary, so the text round trip keeps them.
            (-4000i32..4000).prop_map(|quarters| Value::from(f64::from(quarters) / 4.0)),
            "\\PC{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::vec(("[a-z]{0,6}", inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Through JSON and through msgpack (the store's format), a
        /// `CompactJson` reads back as the value it was made from.
        #[test]
        fn round_trips_through_json_and_msgpack(value in json_values()) {
            let compact = CompactJson::new(&value);
            prop_assert_eq!(compact.value(), value.clone());
            let through_json: CompactJson = serde_json::from_str(&serde_json::to_string(&compact).unwrap()).unwrap();
            prop_assert_eq!(&through_json, &compact);
            prop_assert_eq!(through_json.as_str(), compact.as_str());
            let packed = rmp_serde::to_vec_named(&compact).unwrap();
            let through_msgpack: CompactJson = rmp_serde::from_slice(&packed).unwrap();
            prop_assert_eq!(through_msgpack.value(), value);
        }
    }
}
