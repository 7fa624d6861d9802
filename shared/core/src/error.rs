//! The error every port boxes its sources in, so that no adapter's types leak out.

/// A source error, boxed so that no adapter's types leak out of it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
