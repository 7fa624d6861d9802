//! The `Prefer` request header (RFC 7240): the preferences the gateway
//! honours, `wait=N` on a status read and `respond-async` on a POST.
//! Preferences it does not know, or cannot parse, are ignored, as the RFC
//! asks.

use std::time::Duration;

use axum::http::HeaderMap;

/// The header a client states its preferences in.
pub const PREFER: &str = "prefer";

/// The header that says which preferences were honoured.
pub const PREFERENCE_APPLIED: &str = "preference-applied";

/// The longest wait a status read may ask for.
pub const MAX_WAIT_S: u64 = 30;

/// Each preference of `headers`: its name, lower-cased, and its value
/// (unquoted; empty when it has none), its parameters dropped.
fn preferences(headers: &HeaderMap) -> impl Iterator<Item = (String, String)> + '_ {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| {
            let preference = preference.split(';').next()?.trim();
            let (name, value) = preference.split_once('=').unwrap_or((preference, ""));
            let name = name.trim().to_ascii_lowercase();
            (!name.is_empty()).then(|| (name, value.trim().trim_matches('"').to_owned()))
        })
}

/// The wait `headers` prefer: whole seconds, at least 1 and at most
/// [`MAX_WAIT_S`] (a longer one is shortened, as the RFC lets a server do).
pub fn wait(headers: &HeaderMap) -> Option<Duration> {
    preferences(headers)
        .filter(|(name, _)| name == "wait")
        .find_map(|(_, seconds)| seconds.parse::<u64>().ok().filter(|s| *s >= 1))
        .map(|seconds| Duration::from_secs(seconds.min(MAX_WAIT_S)))
}

/// Whether `headers` prefer an asynchronous answer (`respond-async`).
pub fn respond_async(headers: &HeaderMap) -> bool {
    preferences(headers).any(|(name, _)| name == "respond-async")
}

/// The wait a `?wait=` value asks for: whole seconds from 1 to [`MAX_WAIT_S`].
pub fn wait_from_query(value: &str) -> Option<Duration> {
    value
        .parse::<u64>()
        .ok()
        .filter(|s| (1..=MAX_WAIT_S).contains(s))
        .map(Duration::from_secs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn prefer(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(PREFER, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_wait_is_whole_seconds_from_1_to_30_in_the_query_and_shortened_in_prefer() {
        assert_eq!(wait_from_query("5"), Some(Duration::from_secs(5)));
        assert_eq!(wait_from_query("30"), Some(Duration::from_secs(30)));
        for refused in ["0", "31", "-1", "1.5", "", "five"] {
            assert_eq!(wait_from_query(refused), None, "{refused}");
        }
        assert_eq!(wait(&prefer(&["wait=10"])), Some(Duration::from_secs(10)));
        assert_eq!(
            wait(&prefer(&["respond-async, wait=120"])),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            wait(&prefer(&["handling=lenient", "Wait = \"3\"; x=y"])),
            Some(Duration::from_secs(3))
        );
        for ignored in [
            "wait=0",
            "wait=soon",
            "respond-async",
            "handling=lenient",
            "",
        ] {
            assert_eq!(wait(&prefer(&[ignored])), None, "{ignored}");
        }
    }

    #[test]
    fn respond_async_is_a_preference_among_others() {
        assert!(respond_async(&prefer(&["respond-async"])));
        assert!(respond_async(&prefer(&["wait=5, Respond-Async"])));
        assert!(respond_async(&prefer(&["wait=5", "respond-async; x=1"])));
        assert!(!respond_async(&prefer(&["wait=5"])));
        assert!(!respond_async(&HeaderMap::new()));
    }
}
