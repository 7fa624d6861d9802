//! An error and every source under it on one line, `outer: cause: root`: what
//! a log field or a recorded failure shows, so that no cause is lost when an
//! error is turned into text.

/// `error`'s message followed by each of its sources', joined by `": "`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_source_follows_the_message() {
        let error = Outer(Middle(std::io::Error::other("root")));
        assert_eq!(error_chain(&error), "outer: middle: root");
    }

    #[test]
    fn an_error_without_a_source_is_its_message() {
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
