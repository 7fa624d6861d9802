//! What `/readyz` lists as degraded without turning unready, and the reports
//! a part of the process gives operators.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

/// What an operator asks of a report that lists documents: a page of at
/// most `limit`, after `cursor` (the `next` of the page before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportQuery {
    pub limit: usize,
    pub cursor: Option<String>,
}

/// Why a report was not given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The query cannot be answered as asked (a cursor this part never
    /// gave out): the operator's to fix.
    #[error("{0}")]
    Invalid(String),
    /// What the report reads cannot be read now: ask again later.
    #[error("{0}")]
    Unavailable(String),
}

/// A part of the process that can say why it is degraded, for `/readyz`,
/// and what it is doing, for operators.
#[async_trait]
pub trait Diagnostics: std::fmt::Debug + Send + Sync + 'static {
    /// What is wrong now, one sentence each (empty when all is well).
    fn degraded(&self) -> Vec<String>;

    /// A short summary by name, listed under `details` in `/readyz`.
    fn details(&self) -> Vec<(&'static str, Value)> {
        Vec::new()
    }

    /// The JSON document served at `/admin/{path}`, if this part serves
    /// `path`; a report that lists documents answers the page `query` asks.
    async fn inspect(
        &self,
        _path: &str,
        _query: &ReportQuery,
    ) -> Option<Result<Value, ReportError>> {
        None
    }
}

/// The `details` of every part, by name.
pub fn details_of(parts: &[Arc<dyn Diagnostics>]) -> BTreeMap<String, Value> {
    parts
        .iter()
        .flat_map(|part| part.details())
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}

/// What the first part that serves `path` reports there.
pub async fn inspect_parts(
    parts: &[Arc<dyn Diagnostics>],
    path: &str,
    query: &ReportQuery,
) -> Option<Result<Value, ReportError>> {
    for part in parts {
        if let Some(found) = part.inspect(path, query).await {
            return Some(found);
        }
    }
    None
}
