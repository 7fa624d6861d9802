//! The status resource as a page, for a person who opens a status URL in a
//! browser: the state, the five steps on a timeline with their times and
//! call counts, the failure or the compensation, the callback's outcome. It
//! is the same resource, negotiated on `Accept`: a client that does not ask
//! for HTML before JSON gets JSON. The page runs no script and loads
//! nothing; while the delivery is in flight it reloads itself after
//! `Retry-After` seconds.

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use skyport_core::status::{CallbackState, DeliveryState, Step, StepOutcome, StepResult};
use time::OffsetDateTime;
use time::macros::format_description;

use super::resources::DeliveryStatus;

/// No script, nothing fetched: the page's own style and nothing else.
const POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                      base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const STYLE: &str = include_str!("status_page.css");

/// Whether the request's `Accept` header prefers HTML to JSON: `text/html`
/// (or XHTML) named, with a quality above JSON's (a browser's `*/*;q=0.8`).
/// Ties, wildcards alone and no header at all mean JSON.
pub fn prefers_html(headers: &HeaderMap) -> bool {
    let mut html: f32 = 0.0;
    // The quality JSON gets, and how specific the range that gave it was.
    let mut json: (f32, u8) = (0.0, 0);
    for value in headers.get_all(header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0)
                .clamp(0.0, 1.0);
            match media.as_str() {
                "text/html" | "application/xhtml+xml" => html = html.max(quality),
                "application/json" => json = (quality, 3),
                "application/*" if json.1 < 2 => json = (quality, 2),
                "*/*" if json.1 < 1 => json = (quality, 1),
                _ => {}
            }
        }
    }
    html > 0.0 && html > json.0
}

/// The page of `status`; `refresh_s` reloads it while the delivery is in flight.
pub fn respond(status: &DeliveryStatus, refresh_s: Option<u32>) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(POLICY),
            ),
        ],
        page(status, refresh_s).into_string(),
    )
        .into_response()
}

fn page(status: &DeliveryStatus, refresh_s: Option<u32>) -> Markup {
    let document = &status.document;
    let state = state_name(document.state);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(seconds) = refresh_s {
                    meta http-equiv="refresh" content=(seconds);
                }
                title { "Delivery " (document.id) ": " (state) }
                link rel="icon" href="data:,";
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                main {
                    p.kicker { "Skyport delivery" }
                    h1 { (document.id) }
                    p.state.(state.to_ascii_lowercase()) data-state=(state) { (state) }
                    dl.facts {
                        dt { "Accepted" } dd { (clock(document.created_at)) }
                        dt { "Updated" } dd { (clock(document.updated_at)) }
                        @if document.attempt > 0 {
                            dt { "Attempts" } dd { (document.attempt) }
                        }
                        @if let Some(drone) = &document.drone_id {
                            dt { "Drone" } dd.drone { (drone) }
                        }
                        @if let Some(package) = &document.package_id {
                            dt { "Package" } dd { (package) }
                        }
                        @if let Some(required) = document.third_party_required {
                            dt { "Third-party transport" } dd { (if required { "required" } else { "not required" }) }
                        }
                        @if let Some(at) = document.cancel_requested_at {
                            dt { "Cancellation asked" } dd { (clock(at)) }
                        }
                    }
                    @if let Some(failure) = &document.failure {
                        section.failure {
                            h2 { "Failed at " (step_name(failure.step)) }
                            p.reason { (failure.message) }
                            p.code { "Code: " code { (failure.code) } }
                        }
                    }
                    @if compensated(&document.steps) {
                        p.compensation { "The steps that had succeeded were undone." }
                    }
                    h2 { "Steps" }
                    ol.timeline {
                        @for step in timeline(&document.steps) {
                            (step_item(step, document.created_at))
                        }
                    }
                    @if let Some(url) = &document.callback_url {
                        section.callback {
                            h2 { "Callback" }
                            p { "To " code { (url) } }
                            @if let Some(callback) = &document.callback {
                                p.(callback_class(callback.state)) {
                                    (callback_name(callback.state)) " (announcing " (state_name(callback.announced)) ")"
                                    " after " (callback.attempts)
                                    (if callback.attempts == 1 { " attempt" } else { " attempts" })
                                    @if let Some(at) = callback.delivered_at {
                                        ", " (clock(at))
                                    }
                                }
                                @if let Some(error) = &callback.last_error {
                                    p.reason { "Last error: " (error) }
                                }
                            } @else if document.state.is_terminal() {
                                p { "Sent as the delivery ended. Only a callback that had to be retried is recorded here." }
                            } @else {
                                p { "Sent once the delivery is over." }
                            }
                        }
                    }
                    @if let Some(seconds) = refresh_s {
                        p.note { "This page reloads every " (seconds) " s until the delivery is over." }
                    }
                }
            }
        }
    }
}

/// A step as the timeline shows it: what it did, or that it has not run.
enum Entry<'a> {
    Ran(&'a StepOutcome),
    NotRun(Step),
}

/// The steps in the order they ran, then those that have not.
fn timeline(steps: &[StepOutcome]) -> Vec<Entry<'_>> {
    let mut entries: Vec<Entry<'_>> = steps.iter().map(Entry::Ran).collect();
    entries.extend(
        Step::ALL
            .into_iter()
            .filter(|step| steps.iter().all(|o| o.step != *step))
            .map(Entry::NotRun),
    );
    entries
}

fn step_item(entry: Entry<'_>, accepted: OffsetDateTime) -> Markup {
    match entry {
        Entry::Ran(outcome) => {
            let result = result_name(outcome.result);
            let after = (outcome.at - accepted).as_seconds_f64().max(0.0);
            html! {
                li.step.(result.to_ascii_lowercase()) data-step=(outcome.step.as_str()) {
                    span.name { (step_name(outcome.step)) }
                    span.result { (result) }
                    span.calls { (outcome.calls) (if outcome.calls == 1 { " call" } else { " calls" }) }
                    span.time { (time_of_day(outcome.at)) " · +" (format!("{after:.3}")) " s" }
                    @if let Some(detail) = &outcome.detail {
                        span.detail { (detail) }
                    }
                }
            }
        }
        Entry::NotRun(step) => html! {
            li.step.pending data-step=(step.as_str()) {
                span.name { (step_name(step)) }
                span.result { "not run" }
            }
        },
    }
}

fn compensated(steps: &[StepOutcome]) -> bool {
    steps.iter().any(|o| o.result == StepResult::Compensated)
}

fn clock(at: OffsetDateTime) -> String {
    at.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute]:[second].[subsecond digits:3] UTC"
    ))
    .unwrap_or_else(|_| at.to_string())
}

/// A step's time: its day is the acceptance's, shown above.
fn time_of_day(at: OffsetDateTime) -> String {
    at.format(format_description!(
        "[hour]:[minute]:[second].[subsecond digits:3]"
    ))
    .unwrap_or_else(|_| at.to_string())
}

fn state_name(state: DeliveryState) -> &'static str {
    match state {
        DeliveryState::Accepted => "Accepted",
        DeliveryState::Processing => "Processing",
        DeliveryState::Scheduled => "Scheduled",
        DeliveryState::Failed => "Failed",
        DeliveryState::Cancelled => "Cancelled",
        DeliveryState::Waiting => "Waiting",
    }
}

fn step_name(step: Step) -> &'static str {
    match step {
        Step::Account => "Account",
        Step::Package => "Package",
        Step::Delivery => "Delivery",
        Step::ThirdParty => "Third-party transport",
        Step::Drone => "Drone",
    }
}

fn result_name(result: StepResult) -> &'static str {
    match result {
        StepResult::Succeeded => "Succeeded",
        StepResult::Failed => "Failed",
        StepResult::Compensated => "Compensated",
    }
}

fn callback_name(state: CallbackState) -> &'static str {
    match state {
        CallbackState::Pending => "Pending",
        CallbackState::Delivered => "Delivered",
        CallbackState::DeadLettered => "Dead-lettered",
    }
}

fn callback_class(state: CallbackState) -> &'static str {
    match state {
        CallbackState::Pending => "callback-pending",
        CallbackState::Delivered => "callback-delivered",
        CallbackState::DeadLettered => "callback-dead-lettered",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use skyport_core::status::{CallbackOutcome, Failure, StatusDocument};
    use time::Duration;

    use super::*;
    use crate::routes::deliveries::resources::Links;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn a_browser_gets_html_and_everything_else_json() {
        for browser in [
            "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8",
            "text/html",
            "application/json;q=0.5, text/html",
            "application/xhtml+xml",
        ] {
            assert!(prefers_html(&accept(browser)), "{browser}");
        }
        for client in [
            "application/json",
            "*/*",
            "application/json, text/html",
            "text/html;q=0.5, application/json",
            "text/html;q=0, */*",
            "text/*",
            "text/html;q=0.8, application/*",
            "not a media type",
        ] {
            assert!(!prefers_html(&accept(client)), "{client}");
        }
        assert!(!prefers_html(&HeaderMap::new()));
    }

    fn status(state: DeliveryState) -> DeliveryStatus {
        let accepted = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let mut document = StatusDocument::accepted(String::from("d-<42>"), accepted);
        document.state = state;
        document.attempt = 1;
        DeliveryStatus {
            terminal: state.is_terminal(),
            status: state.into(),
            document,
            links: Links {
                status: "http://example/status".into(),
                cancel: None,
            },
        }
    }

    fn outcome(step: Step, result: StepResult, after_ms: i64, calls: u32) -> StepOutcome {
        StepOutcome {
            step,
            result,
            at: OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
                + Duration::milliseconds(after_ms),
            calls,
            detail: None,
        }
    }

    #[test]
    fn a_scheduled_delivery_shows_its_five_steps_and_its_drone() {
        let mut status = status(DeliveryState::Scheduled);
        status.document.steps = Step::ALL
            .into_iter()
            .enumerate()
            .map(|(i, step)| outcome(step, StepResult::Succeeded, 10 * i as i64 + 5, 1))
            .collect();
        status.document.steps[2].calls = 3;
        status.document.drone_id = Some("drone-7".into());
        let page = page(&status, None).into_string();
        assert_eq!(page.matches("<li class=\"step succeeded\"").count(), 5);
        assert!(page.contains("drone-7"), "{page}");
        assert!(page.contains("3 calls"), "{page}");
        assert!(page.contains("+0.025 s"), "{page}");
        assert!(page.contains("08:00:00.045 · +0.045 s"), "{page}");
        assert!(!page.contains("http-equiv=\"refresh\""), "{page}");
        // The id is escaped, never markup.
        assert!(page.contains("d-&lt;42&gt;"), "{page}");
        assert!(!page.contains("d-<42>"), "{page}");
    }

    #[test]
    fn a_failed_delivery_shows_the_step_the_reason_and_what_was_undone() {
        let mut status = status(DeliveryState::Failed);
        status.document.steps = vec![
            outcome(Step::Account, StepResult::Compensated, 5, 1),
            outcome(Step::Package, StepResult::Failed, 9, 4),
        ];
        status.document.failure = Some(Failure {
            step: Step::Package,
            code: "PackageTooHeavy".into(),
            message: "the package weighs <b>more</b> than a drone lifts".into(),
        });
        let page = page(&status, None).into_string();
        assert!(page.contains("Failed at Package"), "{page}");
        assert!(
            page.contains("the package weighs &lt;b&gt;more&lt;/b&gt;"),
            "{page}"
        );
        assert!(page.contains("PackageTooHeavy"), "{page}");
        assert!(page.contains("were undone"), "{page}");
        assert_eq!(page.matches("class=\"step pending\"").count(), 3);
    }

    #[test]
    fn an_unfinished_delivery_reloads_itself_and_a_callback_is_reported() {
        let mut status = status(DeliveryState::Processing);
        status.document.callback_url = Some("https://client.example/hook".into());
        status.document.callback = Some(CallbackOutcome {
            state: CallbackState::Pending,
            announced: DeliveryState::Scheduled,
            attempts: 2,
            last_error: Some("503 Service Unavailable".into()),
            delivered_at: None,
            retrying_since: None,
        });
        let page = page(&status, Some(2)).into_string();
        assert!(
            page.contains("<meta http-equiv=\"refresh\" content=\"2\">"),
            "{page}"
        );
        assert!(page.contains("https://client.example/hook"), "{page}");
        assert!(
            page.contains("Pending (announcing Scheduled) after 2 attempts"),
            "{page}"
        );
        assert!(page.contains("503 Service Unavailable"), "{page}");
        let response = respond(&status, Some(2));
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
        assert!(
            response.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .starts_with("default-src 'none'")
        );
    }
}
