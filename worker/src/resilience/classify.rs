//! What a service's answer means: the one place that decides whether a
//! failure is worth retrying. Timeouts, connection errors, 408, 429 and 5xx
//! are transient; any other non-success answer is permanent, its code taken
//! from the service's problem document when it sends one.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderValue;
use serde_json::Value;

/// How one call ended.
#[derive(Debug)]
pub(crate) enum Attempt {
    Done(Value),
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    Permanent {
        code: String,
        message: String,
    },
}

/// The one place that decides what a service's answer means.
pub(crate) fn classify(status: StatusCode, body: &[u8], retry_after: Option<Duration>) -> Attempt {
    if status.is_success() {
        if body.is_empty() {
            return Attempt::Done(Value::Null);
        }
        return match serde_json::from_slice(body) {
            Ok(value) => Attempt::Done(value),
            Err(e) => Attempt::Permanent {
                code: "InvalidResponse".into(),
                message: format!("the service answered {status} with a body that is not JSON: {e}"),
            },
        };
    }
    let problem: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = |key: &str| problem.get(key).and_then(Value::as_str).map(str::to_owned);
    let message = text("detail")
        .or_else(|| text("title"))
        .unwrap_or_else(|| format!("the service answered {status}"));
    if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        Attempt::Transient {
            reason: format!("{status}: {message}"),
            retry_after,
        }
    } else {
        Attempt::Permanent {
            code: text("code").unwrap_or_else(|| format!("Http{}", status.as_u16())),
            message,
        }
    }
}

pub(crate) fn parse_retry_after(value: &HeaderValue) -> Option<Duration> {
    value
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(status: u16, body: &str) -> &'static str {
        let status = StatusCode::from_u16(status).expect("status");
        match classify(status, body.as_bytes(), None) {
            Attempt::Done(_) => "done",
            Attempt::Transient { .. } => "transient",
            Attempt::Permanent { .. } => "permanent",
        }
    }

    #[test]
    fn server_errors_timeouts_and_throttling_are_transient() {
        for status in [500, 502, 503, 504, 408, 429] {
            assert_eq!(kind(status, ""), "transient", "{status}");
        }
    }

    #[test]
    fn other_client_errors_are_permanent() {
        for status in [400, 403, 404, 409, 422] {
            assert_eq!(kind(status, ""), "permanent", "{status}");
        }
    }

    #[test]
    fn a_success_with_json_is_done_and_without_json_is_permanent() {
        assert_eq!(kind(201, r#"{"droneId":"d"}"#), "done");
        assert_eq!(kind(204, ""), "done");
        assert_eq!(kind(200, "<html>"), "permanent");
    }

    #[test]
    fn a_problem_document_gives_the_failure_its_code() {
        let body = r#"{"title":"Account suspended","code":"AccountSuspended","detail":"owner o-1 is suspended"}"#;
        match classify(StatusCode::FORBIDDEN, body.as_bytes(), None) {
            Attempt::Permanent { code, message } => {
                assert_eq!(code, "AccountSuspended");
                assert_eq!(message, "owner o-1 is suspended");
            }
            _ => panic!("expected a permanent failure"),
        }
    }
}
