//! A JSON Schema walker shared by the OpenAPI and MCP mappers.
//!
//! It follows local `$ref`s (`#/...` JSON pointers) cycle-safely and at most
//! [`MAX_REF_HOPS`] deep, merges `allOf` / `oneOf` / `anyOf` branches, looks
//! through arrays to their items, and lists nested inline objects as dotted
//! field paths down to [`MAX_NEST_DEPTH`] levels. A `$ref` it cannot resolve
//! is treated as an empty schema: one broken reference never sinks a source.

use serde_json::Value;
use std::collections::BTreeSet;

/// How many `$ref` hops one resolution may take: the ceiling of
/// `limits.max_ref_hops`, which a document is checked against first
/// ([`longest_ref_chain`]).
pub const MAX_REF_HOPS: usize = 32;
/// How many levels of inline nested objects become dotted field paths.
pub const MAX_NEST_DEPTH: usize = 3;
/// How many composition levels (`allOf` in `allOf`...) are merged.
pub const MAX_COMPOSITION_DEPTH: usize = 16;
/// How many enum values of one field are kept.
pub const MAX_ENUM_VALUES: usize = 32;
/// The longest enum value (in characters) kept.
pub const MAX_ENUM_VALUE_CHARS: usize = 64;

static EMPTY: Value = Value::Null;

/// One property of an object schema after composition is merged.
#[derive(Clone, Debug)]
pub struct Property<'a> {
    pub name: String,
    pub schema: &'a Value,
    pub doc: String,
}

/// One field found under a schema: a dotted path and what it refers to.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldPath {
    /// `assignee` or `milestone.title`.
    pub path: String,
    pub doc: String,
    /// The named schema the field's value is (or is an array of), when it is a `$ref`.
    pub refers_to: Option<String>,
    /// The field's enum values (strings only), as [`Resolver::enum_values`] finds them.
    pub values: Vec<String>,
}

/// The most `$ref` hops any reference in `document` takes to resolve: a
/// `$ref` to a schema that is itself a `$ref` is two. A chain ends at a target
/// that is no `$ref`, cannot be found, or was met before on the chain (a
/// cycle). Linear in the document and its references (each reference's
/// length is worked out once); no recursion, so any depth is safe.
pub fn longest_ref_chain(document: &Value) -> usize {
    let resolver = Resolver::new(document);
    let mut lengths: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut longest = 0;
    let mut stack = vec![document];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                    longest = longest.max(resolver.chain_length(reference, &mut lengths));
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    longest
}

/// Resolves references against one root document.
#[derive(Clone, Copy, Debug)]
pub struct Resolver<'a> {
    root: &'a Value,
}

impl<'a> Resolver<'a> {
    /// Returns a resolver for references inside `root`.
    pub fn new(root: &'a Value) -> Resolver<'a> {
        Resolver { root }
    }

    /// Returns the value at a local reference `#/a/b~1c`, if any.
    pub fn pointer(&self, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(pointer)
    }

    /// The hops `{"$ref": reference}` takes to resolve (see
    /// [`longest_ref_chain`]), with the lengths already known in `lengths`,
    /// to which it adds every reference it walked.
    fn chain_length(&self, reference: &'a str, lengths: &mut std::collections::HashMap<&'a str, usize>) -> usize {
        let mut walked: Vec<&'a str> = Vec::new();
        let mut on_chain: BTreeSet<&'a str> = BTreeSet::new();
        let mut current = reference;
        let rest = loop {
            if let Some(&known) = lengths.get(current) {
                break known;
            }
            if !on_chain.insert(current) {
                break 0;
            }
            walked.push(current);
            match self.pointer(current).and_then(|target| target.get("$ref")).and_then(Value::as_str) {
                Some(next) => current = next,
                None => break 0,
            }
        };
        let n = walked.len();
        for (i, walked) in walked.into_iter().enumerate() {
            lengths.entry(walked).or_insert(n - i + rest);
        }
        lengths.get(reference).copied().unwrap_or(rest)
    }

    /// Follows a chain of `$ref`s; an unresolvable or cyclic chain gives `null`.
    pub fn resolve(&self, schema: &'a Value) -> &'a Value {
        let mut current = schema;
        for _ in 0..MAX_REF_HOPS {
            match current.get("$ref").and_then(Value::as_str) {
                Some(reference) => match self.pointer(reference) {
                    Some(target) => current = target,
                    None => return &EMPTY,
                },
                None => return current,
            }
        }
        &EMPTY
    }

    /// Returns the schema of an array's items (resolved), or the schema itself.
    pub fn element(&self, schema: &'a Value) -> &'a Value {
        let resolved = self.resolve(schema);
        match resolved.get("items") {
            Some(items) if resolved.get("properties").is_none() => self.resolve(items),
            _ => resolved,
        }
    }

    /// Returns the name of the schema a `$ref` (or an array of one) points at.
    pub fn ref_name(&self, schema: &Value) -> Option<String> {
        let direct = schema.get("$ref").or_else(|| schema.get("items").and_then(|items| items.get("$ref")));
        if let Some(reference) = direct.and_then(Value::as_str) {
            return reference.rsplit('/').next().map(|name| name.replace("~1", "/").replace("~0", "~"));
        }
        // `allOf: [{$ref}]` wrappers (used to attach `nullable` or a description) count too.
        for key in ["allOf", "oneOf", "anyOf"] {
            if let Some(branches) = schema.get(key).and_then(Value::as_array) {
                if branches.len() == 1 {
                    return self.ref_name(&branches[0]);
                }
            }
        }
        None
    }

    /// Returns a schema's string enum values (through `$ref`s, an array's items and one-branch
    /// compositions), trimmed, deduplicated, at most [`MAX_ENUM_VALUES`] of at most
    /// [`MAX_ENUM_VALUE_CHARS`] characters each.
    pub fn enum_values(&self, schema: &'a Value) -> Vec<String> {
        let mut current = self.element(schema);
        for _ in 0..MAX_COMPOSITION_DEPTH {
            if current.get("enum").is_some() {
                break;
            }
            let single = ["allOf", "oneOf", "anyOf"]
                .iter()
                .filter_map(|key| current.get(*key).and_then(Value::as_array))
                .find(|branches| branches.len() == 1);
            match single {
                Some(branches) => current = self.element(&branches[0]),
                None => break,
            }
        }
        let mut out: Vec<String> = Vec::new();
        for value in current.get("enum").and_then(Value::as_array).into_iter().flatten() {
            let Some(text) = value.as_str().map(str::trim) else { continue };
            if text.is_empty() || text.chars().count() > MAX_ENUM_VALUE_CHARS || out.iter().any(|seen| seen == text) {
                continue;
            }
            out.push(text.to_string());
            if out.len() == MAX_ENUM_VALUES {
                break;
            }
        }
        out
    }

    /// Lists an object schema's properties with composition merged; first definition wins.
    pub fn properties(&self, schema: &'a Value) -> Vec<Property<'a>> {
        let mut out = Vec::new();
        let mut seen_names = BTreeSet::new();
        let mut seen_refs = BTreeSet::new();
        self.collect_properties(schema, 0, &mut seen_refs, &mut seen_names, &mut out);
        out
    }

    fn collect_properties(
        &self,
        schema: &'a Value,
        depth: usize,
        seen_refs: &mut BTreeSet<String>,
        seen_names: &mut BTreeSet<String>,
        out: &mut Vec<Property<'a>>,
    ) {
        if depth > MAX_COMPOSITION_DEPTH {
            return;
        }
        let mut current = schema;
        for _ in 0..MAX_REF_HOPS {
            match current.get("$ref").and_then(Value::as_str) {
                Some(reference) => {
                    if !seen_refs.insert(reference.to_string()) {
                        return;
                    }
                    match self.pointer(reference) {
                        Some(target) => current = target,
                        None => return,
                    }
                }
                None => break,
            }
        }
        if let Some(map) = current.get("properties").and_then(Value::as_object) {
            for (name, property) in map {
                if seen_names.insert(name.clone()) {
                    let doc = description(property).or_else(|| description(self.resolve(property)));
                    out.push(Property { name: name.clone(), schema: property, doc: doc.unwrap_or_default() });
                }
            }
        }
        for key in ["allOf", "oneOf", "anyOf"] {
            if let Some(branches) = current.get(key).and_then(Value::as_array) {
                for branch in branches {
                    self.collect_properties(branch, depth + 1, seen_refs, seen_names, out);
                }
            }
        }
    }

    /// Lists every field path under an object schema: top-level properties, then
    /// inline nested objects as `outer.inner`; named (`$ref`) values are not inlined.
    pub fn field_paths(&self, schema: &'a Value) -> Vec<FieldPath> {
        let mut out = Vec::new();
        self.collect_paths(schema, "", 0, &mut out);
        out
    }

    fn collect_paths(&self, schema: &'a Value, prefix: &str, depth: usize, out: &mut Vec<FieldPath>) {
        for property in self.properties(schema) {
            let path = format!("{prefix}{}", property.name);
            let refers_to = self.ref_name(property.schema);
            let values = self.enum_values(property.schema);
            out.push(FieldPath { path: path.clone(), doc: property.doc.clone(), refers_to: refers_to.clone(), values });
            if refers_to.is_none() && depth + 1 < MAX_NEST_DEPTH {
                let element = self.element(property.schema);
                self.collect_paths(element, &format!("{path}."), depth + 1, out);
            }
        }
    }
}

/// Returns a schema's `description` (or `title`), trimmed, if non-empty.
pub fn description(schema: &Value) -> Option<String> {
    ["description", "title", "summary"]
        .iter()
        .filter_map(|key| schema.get(*key).and_then(Value::as_str))
        .map(str::trim)
        .find(|text| !text.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(root: &Value, schema: &Value) -> Vec<String> {
        Resolver::new(root).field_paths(schema).into_iter().map(|field| field.path).collect()
    }

    #[test]
    fn all_of_and_refs_are_merged() {
        let root = json!({"defs": {
            "Base": {"properties": {"gid": {"type": "string"}}},
            "Task": {"allOf": [{"$ref": "#/defs/Base"}, {"properties": {"name": {}, "meta": {"properties": {"depth": {}}}}}]}
        }});
        assert_eq!(paths(&root, &json!({"$ref": "#/defs/Task"})), ["gid", "name", "meta", "meta.depth"]);
    }

    #[test]
    fn cycles_and_dangling_refs_terminate() {
        let root = json!({"defs": {
            "A": {"allOf": [{"$ref": "#/defs/B"}], "properties": {"a": {"$ref": "#/defs/A"}}},
            "B": {"allOf": [{"$ref": "#/defs/A"}], "properties": {"b": {}}},
            "Loop": {"$ref": "#/defs/Loop"}
        }});
        assert_eq!(paths(&root, &json!({"$ref": "#/defs/A"})), ["a", "b"]);
        assert!(paths(&root, &json!({"$ref": "#/defs/Loop"})).is_empty());
        assert!(paths(&root, &json!({"$ref": "#/nowhere"})).is_empty());
        assert_eq!(Resolver::new(&root).resolve(&json!({"$ref": "#/defs/Loop"})), &Value::Null);
    }

    #[test]
    fn refs_name_the_entity_and_are_not_inlined() {
        let root = json!({"d": {"User": {"properties": {"login": {}}}}});
        let schema = json!({"properties": {"assignee": {"allOf": [{"$ref": "#/d/User"}], "nullable": true},
            "assignees": {"type": "array", "items": {"$ref": "#/d/User"}}}});
        let fields = Resolver::new(&root).field_paths(&schema);
        assert_eq!(fields.len(), 2);
        assert!(fields.iter().all(|field| field.refers_to.as_deref() == Some("User")));
    }

    #[test]
    fn enum_values_are_found_through_refs_items_and_wrappers() {
        let root = json!({"d": {"State": {"type": "string", "enum": ["open", " closed ", "open", "", 3]}}});
        let schema = json!({"properties": {
            "state": {"$ref": "#/d/State"},
            "states": {"type": "array", "items": {"$ref": "#/d/State"}},
            "wrapped": {"allOf": [{"$ref": "#/d/State"}], "nullable": true},
            "plain": {"type": "string"}
        }});
        let fields = Resolver::new(&root).field_paths(&schema);
        let values = |name: &str| fields.iter().find(|field| field.path == name).unwrap().values.clone();
        assert_eq!(values("state"), ["open", "closed"]);
        assert_eq!(values("states"), ["open", "closed"]);
        assert_eq!(values("wrapped"), ["open", "closed"]);
        assert!(values("plain").is_empty());
        let many: Vec<String> = (0..100).map(|at| format!("v{at}")).collect();
        let long = json!({"enum": many});
        assert_eq!(Resolver::new(&Value::Null).enum_values(&long).len(), MAX_ENUM_VALUES);
    }

    #[test]
    fn deep_nesting_stops_at_the_limit() {
        let mut schema = json!({"properties": {"leaf": {}}});
        for level in 0..10 {
            schema = json!({"properties": {format!("l{level}"): schema}});
        }
        let found = paths(&Value::Null, &schema);
        assert_eq!(found.len(), MAX_NEST_DEPTH);
    }
}
