//! Where a receiver starts: the selector filter on its source, and a cursor into
//! a partition's log that honours it.

use fe2o3_amqp::types::messaging::FilterSet;
use fe2o3_amqp::types::primitives::Value;

use super::Record;

/// The filter key the SDK puts on a receiver's source.
const SELECTOR_FILTER: &str = "apache.org:selector-filter:string";

/// Where a receiver starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StartPosition {
    /// After the last event stored when the link attached (`x-opt-offset > '@latest'`).
    Latest,
    /// At the first event whose `field` is `>` (or `>=`) `value`.
    From {
        field: Field,
        inclusive: bool,
        value: i64,
    },
}

/// The annotation a start expression compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    Offset,
    SequenceNumber,
    /// Milliseconds since the Unix epoch.
    EnqueuedTime,
}

impl StartPosition {
    /// The start position of a source's filter set. No selector filter means
    /// the start of the partition, as on the service.
    pub(super) fn from_filter(filter: Option<&FilterSet>) -> Result<Self, String> {
        let Some(selector) = filter.and_then(|filter| filter.get(SELECTOR_FILTER)) else {
            return Ok(Self::From {
                field: Field::Offset,
                inclusive: false,
                value: -1,
            });
        };
        let expression = match selector {
            Value::Described(described) => match &described.value {
                Value::String(expression) => expression,
                other => return Err(format!("the selector filter is not a string: {other:?}")),
            },
            Value::String(expression) => expression,
            other => return Err(format!("the selector filter is not a string: {other:?}")),
        };
        Self::parse(expression)
    }

    /// Parses `amqp.annotation.<name> <op> '<value>'` where `<op>` is `>` or `>=`
    /// (spaces around the operator optional), as `StartPosition::start_expression`
    /// in `azure_messaging_eventhubs` writes it.
    pub(super) fn parse(expression: &str) -> Result<Self, String> {
        let unsupported = || format!("unsupported start expression: {expression:?}");
        let rest = expression
            .trim()
            .strip_prefix("amqp.annotation.")
            .ok_or_else(unsupported)?;
        let name_end = rest
            .find(|c: char| c.is_whitespace() || c == '>' || c == '=' || c == '<')
            .ok_or_else(unsupported)?;
        let (name, rest) = rest.split_at(name_end);
        let rest = rest.trim_start();
        let (inclusive, rest) = match rest.strip_prefix(">=") {
            Some(rest) => (true, rest),
            None => (false, rest.strip_prefix('>').ok_or_else(unsupported)?),
        };
        let value = rest
            .trim()
            .strip_prefix('\'')
            .and_then(|value| value.strip_suffix('\''))
            .ok_or_else(unsupported)?;
        let field = match name {
            "x-opt-offset" if value == "@latest" => return Ok(Self::Latest),
            "x-opt-offset" => Field::Offset,
            "x-opt-sequence-number" => Field::SequenceNumber,
            "x-opt-enqueued-time" => Field::EnqueuedTime,
            _ => return Err(unsupported()),
        };
        let value = value.parse().map_err(|_| unsupported())?;
        Ok(Self::From {
            field,
            inclusive,
            value,
        })
    }

    fn matches(self, record: &Record) -> bool {
        let Self::From {
            field,
            inclusive,
            value,
        } = self
        else {
            return true;
        };
        let actual = match field {
            Field::Offset => record.offset,
            Field::SequenceNumber => record.event.sequence_number,
            Field::EnqueuedTime => record.enqueued_ms,
        };
        actual > value || (inclusive && actual == value)
    }
}

/// A receiver's position in a partition's log.
#[derive(Debug)]
pub(super) enum Cursor {
    /// Looking for the first record the start position matches, from `next`.
    Seeking { start: StartPosition, next: usize },
    /// Delivering every record from this index on.
    At(usize),
}

impl Cursor {
    /// A cursor for a link attaching while the log holds `stored` records.
    pub(super) fn new(start: StartPosition, stored: usize) -> Self {
        match start {
            StartPosition::Latest => Self::At(stored),
            start => Self::Seeking { start, next: 0 },
        }
    }

    /// The next `max` records to deliver, moving past them.
    pub(super) fn take<'log>(&mut self, log: &'log [Record], max: usize) -> &'log [Record] {
        if let Self::Seeking { start, next } = *self {
            let found = log
                .get(next..)
                .and_then(|rest| rest.iter().position(|record| start.matches(record)));
            *self = match found {
                Some(at) => Self::At(next + at),
                None => Self::Seeking {
                    start,
                    next: log.len(),
                },
            };
        }
        let Self::At(from) = *self else {
            return &[];
        };
        let batch = log
            .get(from..)
            .map_or(&[][..], |rest| &rest[..rest.len().min(max)]);
        *self = Self::At(from + batch.len());
        batch
    }
}
