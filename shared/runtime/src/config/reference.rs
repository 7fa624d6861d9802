//! The configuration reference, `docs/configuration.md`, checked against the
//! settings types: the keys its table lists are exactly the keys [`Settings`]
//! accepts, as its JSON schema (derived from the types, serde's names and
//! attributes included) describes them.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Map, Value};

use super::Settings;

/// What a map's key stands for in a dotted key (`gateway.auth.api_keys.NAME.key`).
const MAP_KEY: &str = "NAME";

/// The reference, from this crate's directory.
const REFERENCE: &str = "../../docs/configuration.md";

/// Every key `Settings` accepts, dotted, a map's keys as [`MAP_KEY`].
fn accepted_keys() -> BTreeSet<String> {
    let schema = schemars::schema_for!(Settings);
    let root = schema.as_value();
    let empty = Map::new();
    let definitions = root
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut keys = BTreeSet::new();
    collect(root, definitions, "", &mut keys);
    keys
}

/// Adds the keys under `schema` to `keys`: a table's fields, a map's values
/// under [`MAP_KEY`], or `prefix` itself for a value.
fn collect(
    schema: &Value,
    definitions: &Map<String, Value>,
    prefix: &str,
    keys: &mut BTreeSet<String>,
) {
    let schema = resolve(schema, definitions);
    let join = |name: &str| {
        if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}.{name}")
        }
    };
    if let Some(fields) = schema.get("properties").and_then(Value::as_object) {
        for (name, field) in fields {
            collect(field, definitions, &join(name), keys);
        }
    } else if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        collect(values, definitions, &join(MAP_KEY), keys);
    } else {
        keys.insert(prefix.to_owned());
    }
}

/// The schema a value is read with: a reference followed, an `Option`'s
/// null branch dropped. A choice among several (an enum's variants) stays as
/// it is: a value, not a table.
fn resolve<'a>(schema: &'a Value, definitions: &'a Map<String, Value>) -> &'a Value {
    if let Some(name) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        && let Some(definition) = definitions.get(name)
    {
        return resolve(definition, definitions);
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = schema.get(combinator).and_then(Value::as_array) {
            let mut not_null = branches
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) != Some("null"));
            if let (Some(only), None) = (not_null.next(), not_null.next()) {
                return resolve(only, definitions);
            }
        }
    }
    schema
}

/// One key as the table's first column writes it, in backticks: a key, or
/// `PREFIX.*` for every key under a prefix (`worker.http.*`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    Key(String),
    Prefix(String),
}

impl Row {
    fn covers(&self, key: &str) -> bool {
        match self {
            Self::Key(row) => row == key,
            Self::Prefix(prefix) => key
                .strip_prefix(prefix.as_str())
                .is_some_and(|rest| rest.starts_with('.')),
        }
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Key(key) => f.write_str(key),
            Self::Prefix(prefix) => write!(f, "{prefix}.*"),
        }
    }
}

/// The keys of the table whose header is `| key | default | meaning |`:
/// every backticked name in each row's first cell.
fn table_rows(markdown: &str) -> Vec<Row> {
    let lines = markdown
        .lines()
        .skip_while(|line| !line.replace(' ', "").starts_with("|key|default|meaning|"))
        .skip(2);
    let mut rows = Vec::new();
    for line in lines.take_while(|line| line.starts_with('|')) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        for name in cell.split('`').skip(1).step_by(2) {
            rows.push(match name.strip_suffix(".*") {
                Some(prefix) => Row::Prefix(prefix.to_owned()),
                None => Row::Key(name.to_owned()),
            });
        }
    }
    rows
}

/// What differs between the table and the types, one line each.
fn differences(keys: &BTreeSet<String>, rows: &[Row]) -> Vec<String> {
    let mut problems = Vec::new();
    for key in keys {
        if !rows.iter().any(|row| row.covers(key)) {
            problems.push(format!("`{key}` is accepted but has no row"));
        }
    }
    let mut seen = BTreeSet::new();
    for row in rows {
        if !keys.iter().any(|key| row.covers(key)) {
            problems.push(format!("`{row}` has a row but is not a key"));
        }
        if !seen.insert(row) {
            problems.push(format!("`{row}` has two rows"));
        }
    }
    problems
}

#[test]
fn the_schema_names_nested_tables_and_map_keys_with_a_placeholder() {
    let keys = accepted_keys();
    for key in [
        "profile",
        "gateway.max_body_bytes",
        "gateway.http.max_header_bytes",
        "gateway.auth.api_keys.NAME.key",
        "gateway.auth.jwt.jwks_url",
        "kafka.properties.NAME",
        "cosmos.throughput_groups.NAME.target_fraction",
        "worker.http.idle_timeout_ms",
    ] {
        assert!(keys.contains(key), "{key} not among {keys:?}");
    }
    assert!(!keys.contains("gateway"), "a table is not a key");
    assert!(
        !keys.contains("gateway.auth.jwt"),
        "an optional table is not a key"
    );
}

#[test]
fn a_row_names_a_key_or_every_key_under_a_prefix() {
    let rows = table_rows(
        "| key | default | meaning |\n|---|---|---|\n\
         | `a.b` / `a.c` | `1` | two keys, `not.a.key` in the meaning |\n\
         | `w.http.*` | as `a.*` | a prefix |\n\nafter the table\n| `x` |\n",
    );
    assert_eq!(
        rows,
        [
            Row::Key("a.b".into()),
            Row::Key("a.c".into()),
            Row::Prefix("w.http".into()),
        ]
    );
    let keys = ["a.b", "w.http.x", "w.httpx", "z"].map(String::from).into();
    assert_eq!(
        differences(&keys, &rows),
        [
            "`w.httpx` is accepted but has no row",
            "`z` is accepted but has no row",
            "`a.c` has a row but is not a key",
        ]
    );
}

#[test]
fn the_configuration_reference_lists_every_key_and_only_keys() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE);
    let markdown =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rows = table_rows(&markdown);
    assert!(
        !rows.is_empty(),
        "no `| key | default | meaning |` table in docs/configuration.md"
    );
    let problems = differences(&accepted_keys(), &rows);
    assert!(
        problems.is_empty(),
        "docs/configuration.md's table and the settings types differ:\n{}",
        problems.join("\n")
    );
}
