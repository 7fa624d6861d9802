//! What `/readyz` lists as degraded without turning unready, and the reports
//! a part of the process gives operators.

use async_trait::async_trait;
use serde_json::Value;

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

    /// The JSON document served at `/admin/{path}`, if this part serves `path`.
    async fn inspect(&self, _path: &str) -> Option<Result<Value, String>> {
        None
    }
}
