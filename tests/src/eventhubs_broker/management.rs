//! Answers to requests on the `$cbs` and `$management` nodes.

use fe2o3_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message, Properties};
use fe2o3_amqp::types::primitives::{Array, OrderedMap, SimpleValue, Timestamp, Value};

use super::{Hub, State, lock, unix_ms};

/// The AMQP timestamp the service uses for "never" (year 1 CE); the SDK reads it as `None`.
const NEVER_MS: i64 = -62_135_596_800_000;

/// A request/response node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    Cbs,
    Management,
}

impl Node {
    pub(super) fn of(address: &str) -> Option<Self> {
        match address.rsplit('/').next() {
            Some("$cbs") => Some(Self::Cbs),
            Some("$management") => Some(Self::Management),
            _ => None,
        }
    }
}

/// The response to `request`, correlated with it.
pub(super) fn respond(
    node: Node,
    state: &State,
    request: &Message<Body<Value>>,
) -> Message<Body<Value>> {
    let operation = string_property(request, "operation");
    let (status, description, body) = match (node, operation) {
        (Node::Cbs, Some("put-token")) => {
            let name = string_property(request, "name").unwrap_or_default();
            lock(&state.tokens).push(name.to_owned());
            (202, "Accepted".to_owned(), Value::Null)
        }
        (Node::Management, Some("READ")) => read(state, request),
        (_, operation) => (
            501,
            format!("the test broker does not implement {operation:?} on {node:?}"),
            Value::Null,
        ),
    };
    let correlation_id = request.properties.as_ref().and_then(|properties| {
        properties
            .message_id
            .clone()
            .or_else(|| properties.correlation_id.clone())
    });
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            message_id: None,
            user_id: None,
            to: None,
            subject: None,
            reply_to: None,
            correlation_id,
            content_type: None,
            content_encoding: None,
            absolute_expiry_time: None,
            creation_time: None,
            group_id: None,
            group_sequence: None,
            reply_to_group_id: None,
        }),
        application_properties: Some(
            ApplicationProperties::builder()
                .insert("status-code", SimpleValue::Int(status))
                .insert("status-description", SimpleValue::String(description))
                .build(),
        ),
        body: Body::Value(AmqpValue(body)),
        footer: None,
    }
}

fn read(state: &State, request: &Message<Body<Value>>) -> (i32, String, Value) {
    let Some(name) = string_property(request, "name") else {
        return (400, "READ needs a name".to_owned(), Value::Null);
    };
    let Some(hub) = state.hub(name) else {
        return (404, format!("no event hub named {name:?}"), Value::Null);
    };
    match string_property(request, "type") {
        Some("com.microsoft:eventhub") => (200, "OK".to_owned(), hub_properties(hub)),
        Some("com.microsoft:partition") => {
            let Some(id) = string_property(request, "partition") else {
                return (
                    400,
                    "READ of a partition needs a partition".to_owned(),
                    Value::Null,
                );
            };
            match partition_properties(hub, id) {
                Some(properties) => (200, "OK".to_owned(), properties),
                None => (
                    404,
                    format!("event hub {name:?} has no partition {id:?}"),
                    Value::Null,
                ),
            }
        }
        other => (400, format!("unknown entity type {other:?}"), Value::Null),
    }
}

fn hub_properties(hub: &Hub) -> Value {
    map([
        ("name", Value::String(hub.name.clone())),
        ("type", Value::String("com.microsoft:eventhub".to_owned())),
        (
            "created_at",
            Value::Timestamp(Timestamp::from_milliseconds(unix_ms(hub.created_at))),
        ),
        (
            "partition_count",
            Value::Int(i32::try_from(hub.partitions.len()).unwrap_or(i32::MAX)),
        ),
        (
            "partition_ids",
            Value::Array(Array(
                (0..hub.partitions.len())
                    .map(|id| Value::String(id.to_string()))
                    .collect(),
            )),
        ),
    ])
}

fn partition_properties(hub: &Hub, id: &str) -> Option<Value> {
    let partition = hub.partition(id)?;
    let log = lock(&partition.log);
    let last = log.records.last();
    Some(map([
        ("name", Value::String(hub.name.clone())),
        ("type", Value::String("com.microsoft:partition".to_owned())),
        ("partition", Value::String(id.to_owned())),
        ("begin_sequence_number", Value::Long(0)),
        (
            "last_enqueued_sequence_number",
            Value::Long(last.map_or(-1, |record| record.event.sequence_number)),
        ),
        ("last_enqueued_sequence_number_epoch", Value::Long(0)),
        (
            "last_enqueued_offset",
            Value::String(
                last.map_or_else(|| "-1".to_owned(), |record| record.event.offset.clone()),
            ),
        ),
        (
            "last_enqueued_time_utc",
            Value::Timestamp(Timestamp::from_milliseconds(
                last.map_or(NEVER_MS, |record| record.enqueued_ms),
            )),
        ),
        ("is_partition_empty", Value::Bool(last.is_none())),
    ]))
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(Value::String(key.to_owned()), value);
    }
    Value::Map(map)
}

fn string_property<'m>(message: &'m Message<Body<Value>>, key: &str) -> Option<&'m str> {
    match message.application_properties.as_ref()?.0.get(key)? {
        SimpleValue::String(value)
        | SimpleValue::Symbol(fe2o3_amqp::types::primitives::Symbol(value)) => Some(value.as_str()),
        _ => None,
    }
}
