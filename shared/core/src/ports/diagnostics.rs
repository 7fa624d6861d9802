//! What `/readyz` lists as degraded without turning unready.

/// A part of the process that can say why it is degraded, for `/readyz`.
pub trait Diagnostics: std::fmt::Debug + Send + Sync + 'static {
    /// What is wrong now, one sentence each (empty when all is well).
    fn degraded(&self) -> Vec<String>;
}
