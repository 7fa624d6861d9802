//! Drives a running Skyport gateway through the Rust client generated from
//! openapi/openapi.json by openapi-generator (`-g rust`: reqwest, async) into
//! target/sdk/rust/skyport-client. tests/tests/system/openapi_clients.rs generates
//! it, builds this crate and runs it; by hand, once that test has generated it:
//!
//! ```sh
//! CARGO_TARGET_DIR=target/sdk/rust/target cargo run --locked \
//!     --manifest-path tests/clients/rust/Cargo.toml -- http://127.0.0.1:8080
//! ```
//!
//! Posts a delivery request, reads its status (getDeliveryStatus with the id and
//! receipt of the 202, held with `wait`) until it is terminal and Scheduled,
//! posts a batch and a request that waits for its outcome, cancels another one,
//! and checks that a bad body (422) and a malformed receipt (404) fail with the
//! client's typed error carrying a Problem. SKYPORT_API_KEY, when set, is sent
//! as X-API-Key (and a request without it must fail with a 401 Problem). Prints
//! what it saw; exits 1 on any mismatch.
//!
//! The generated functions return the parsed body alone, neither the status of
//! a success nor any header: the Python and TypeScript drivers check those.

use std::fmt::Debug;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeDelta};
use reqwest::header::{ACCEPT, HeaderMap, HeaderValue};
use skyport_client::apis::configuration::{ApiKey, Configuration};
use skyport_client::apis::deliveries_api::{
    self, CreateDeliveryRequestError, GetDeliveryStatusError,
};
use skyport_client::apis::{Error, ResponseContent};
use skyport_client::models::{
    Accepted, ChangeOutcome, ConfirmationType, DeliveryRequest, DeliveryRequestBatch,
    DeliveryState, DeliveryStatus, PackageInfo, PackageSize, Problem, Reschedule,
};

const POLL_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long a status read is held for a change (under the client's 10 s timeout).
const WAIT_S: i32 = 5;

/// The checks made so far: each prints a line, and those that failed are kept.
#[derive(Default)]
struct Checks {
    mismatches: Vec<String>,
}

impl Checks {
    fn expect(&mut self, condition: bool, what: impl Into<String>) {
        let what = what.into();
        println!("{}{what}", if condition { "ok      " } else { "MISMATCH " });
        if !condition {
            self.mismatches.push(what);
        }
    }
}

/// The generated error enums: a variant per documented error status, each carrying
/// a Problem, and `UnknownValue` for a body that is not one. They are
/// `#[serde(untagged)]`, so the variant is the first whose payload parses —
/// `Status400` for every Problem, whatever the status (which is
/// `ResponseContent::status`): the variant says the body is a Problem, not which.
trait TypedError: Debug {
    fn problem(&self) -> Option<&Problem>;
}

impl TypedError for CreateDeliveryRequestError {
    fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Status400(problem)
            | Self::Status401(problem)
            | Self::Status403(problem)
            | Self::Status408(problem)
            | Self::Status409(problem)
            | Self::Status413(problem)
            | Self::Status415(problem)
            | Self::Status422(problem)
            | Self::Status429(problem)
            | Self::Status431(problem)
            | Self::Status503(problem) => Some(problem),
            Self::UnknownValue(_) => None,
        }
    }
}

impl TypedError for GetDeliveryStatusError {
    fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Status400(problem)
            | Self::Status401(problem)
            | Self::Status403(problem)
            | Self::Status404(problem)
            | Self::Status410(problem)
            | Self::Status431(problem)
            | Self::Status503(problem) => Some(problem),
            Self::UnknownValue(_) => None,
        }
    }
}

/// The client's configuration for `base_url`, sending `key` as X-API-Key when there is one.
fn configuration(base_url: &str, key: Option<&str>) -> reqwest::Result<Configuration> {
    // The generated client sends no Accept of its own (reqwest's `*/*`) and parses JSON
    // only, so it asks for JSON where a resource has other representations too.
    let mut headers = HeaderMap::new();
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, application/problem+json"),
    );
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .build()?;
    Ok(Configuration {
        base_path: base_url.to_owned(),
        client,
        api_key: key.map(|key| ApiKey {
            prefix: None,
            key: key.to_owned(),
        }),
        ..Configuration::default()
    })
}

/// A request for a delivery with a client-chosen id, unique to this run.
fn delivery_request(weight: f64) -> DeliveryRequest {
    let unique = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let pickup_time =
        DateTime::parse_from_rfc3339("2030-01-01T10:00:00Z").expect("an RFC 3339 literal");
    let mut package = PackageInfo::new(format!("pkg-{unique:x}"), PackageSize::Large, weight);
    package.tag = Some(Some("rust-client".to_owned()));
    let mut request = DeliveryRequest::new(
        pickup_time + TimeDelta::hours(2),
        "47.6101,-122.2015".to_owned(),
        "owner-rust".to_owned(),
        package,
        "47.6423,-122.1368".to_owned(),
        pickup_time,
    );
    // Nullable fields are an Option of an Option: `Some(None)` sends `null`.
    request.delivery_id = Some(Some(format!("rs-{unique}")));
    request.expedited = Some(false);
    request.confirmation_required = Some(ConfirmationType::Voice);
    request
}

/// Prints a failed call: the status and body of an error response, or the error.
fn report<E>(what: &str, error: &Error<E>) {
    match error {
        Error::ResponseError(response) => {
            println!(
                "{what} -> {} {}",
                response.status.as_u16(),
                response.content
            );
        }
        other => println!("{what} -> {other}"),
    }
}

async fn post(
    checks: &mut Checks,
    configuration: &Configuration,
    request: DeliveryRequest,
) -> Option<Accepted> {
    let delivery_id = request.delivery_id.clone().flatten();
    let result = deliveries_api::create_delivery_request(configuration, request, None, None).await;
    if let Err(error) = &result {
        report("POST", error);
    }
    checks.expect(
        result.is_ok(),
        "a valid request is accepted (the client returns an Accepted)",
    );
    let accepted = result.ok()?;
    println!("POST -> {accepted:?}");
    checks.expect(
        delivery_id.as_ref() == Some(&accepted.delivery_id),
        "the Accepted names the client-chosen deliveryId",
    );
    checks.expect(
        accepted.status == DeliveryState::Accepted,
        "the Accepted says Accepted",
    );
    checks.expect(
        !accepted.receipt.is_empty(),
        "the Accepted carries a receipt",
    );
    checks.expect(
        accepted.status_url.ends_with(&format!(
            "/api/deliveryrequests/{}/status?receipt={}",
            accepted.delivery_id, accepted.receipt
        )),
        "statusUrl is the status resource of the delivery, with its receipt",
    );
    Some(accepted)
}

/// Polls until the status is terminal; with `cancelled`, a Scheduled one is
/// polled on, as a cancelled Scheduled delivery is undone and then Cancelled.
async fn poll_until_terminal(
    checks: &mut Checks,
    configuration: &Configuration,
    accepted: &Accepted,
    cancelled: bool,
) -> Option<DeliveryStatus> {
    let deadline = Instant::now() + POLL_TIMEOUT;
    let mut seen: Vec<DeliveryState> = Vec::new();
    loop {
        let status = match deliveries_api::get_delivery_status(
            configuration,
            &accepted.delivery_id,
            &accepted.receipt,
            // Held until the status differs from the one current at arrival.
            Some(WAIT_S),
            None,
            None,
            None,
        )
        .await
        {
            Ok(status) => status,
            Err(error) => {
                report("GET status", &error);
                checks.expect(
                    false,
                    "the status of an accepted delivery parses as a DeliveryStatus",
                );
                return None;
            }
        };
        if seen.last() != Some(&status.state) {
            seen.push(status.state);
        }
        if status.terminal && !(cancelled && status.state == DeliveryState::Scheduled) {
            println!("GET status -> {status:?}");
            let seen: Vec<String> = seen.iter().map(ToString::to_string).collect();
            println!("states seen: {}", seen.join(" -> "));
            return Some(status);
        }
        if Instant::now() > deadline {
            checks.expect(
                false,
                format!(
                    "the delivery is terminal within {POLL_TIMEOUT:?} (still {})",
                    status.state
                ),
            );
            return None;
        }
        if status.terminal {
            // A Scheduled delivery being cancelled: a terminal status is
            // answered at once, so wait before reading again.
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Moves a Scheduled delivery an hour later and reads until its revision is 1.
async fn reschedule(checks: &mut Checks, configuration: &Configuration, accepted: &Accepted) {
    let pickup_time =
        DateTime::parse_from_rfc3339("2030-01-01T11:00:00Z").expect("an RFC 3339 literal");
    let mut later = Reschedule::new();
    later.pickup_time = Some(pickup_time);
    later.deadline = Some(pickup_time + TimeDelta::hours(2));
    let result = deliveries_api::reschedule_delivery_request(
        configuration,
        &accepted.delivery_id,
        &accepted.receipt,
        later,
        None,
        Some("rust-driver-move"),
    )
    .await;
    if let Err(error) = &result {
        report("PATCH", error);
    }
    checks.expect(
        result.is_ok_and(|answer| answer.delivery_id == accepted.delivery_id),
        "a reschedule is accepted (the client returns the delivery's Accepted)",
    );
    let deadline = Instant::now() + POLL_TIMEOUT;
    loop {
        let read = deliveries_api::get_delivery_status(
            configuration,
            &accepted.delivery_id,
            &accepted.receipt,
            Some(WAIT_S),
            None,
            None,
            None,
        )
        .await;
        match read {
            Ok(status) if status.revision == Some(1) => {
                println!("rescheduled: {:?}", status.changes);
                checks.expect(
                    status.state == DeliveryState::Scheduled,
                    "a rescheduled delivery stays Scheduled",
                );
                checks.expect(
                    status.changes.as_deref().is_some_and(|changes| {
                        changes.len() == 1 && changes[0].outcome == ChangeOutcome::Applied
                    }),
                    "its history holds the change, applied",
                );
                return;
            }
            Ok(_) if Instant::now() < deadline => {}
            Ok(_) => {
                checks.expect(false, "the reschedule is applied within the time limit");
                return;
            }
            Err(error) => {
                report("GET status", &error);
                checks.expect(false, "the status of a rescheduled delivery answers 200");
                return;
            }
        }
    }
}

/// Checks that `result` is an error response of `status` whose body the client
/// parsed into its typed error, carrying a Problem with that status and `code`.
fn expect_problem<T: Debug, E: TypedError>(
    checks: &mut Checks,
    result: Result<T, Error<E>>,
    status: u16,
    code: &str,
    what: &str,
) -> Option<Problem> {
    let ResponseContent {
        status: answered,
        content,
        entity,
    } = match result {
        Err(Error::ResponseError(response)) => response,
        Err(error) => {
            println!("{what} -> {error}");
            checks.expect(false, format!("{what} fails with an error response"));
            return None;
        }
        Ok(value) => {
            println!("{what} -> succeeded: {value:?}");
            checks.expect(false, format!("{what} fails with an error response"));
            return None;
        }
    };
    println!("{what} -> {} {content}", answered.as_u16());
    println!("{what}: the client's typed error is {entity:?}");
    checks.expect(
        answered.as_u16() == status,
        format!("{what} answers {status}"),
    );
    let problem = entity.as_ref().and_then(TypedError::problem);
    checks.expect(
        problem.is_some(),
        format!("{what} parses as a typed error variant carrying a Problem"),
    );
    let problem = problem?;
    checks.expect(
        problem.status == i32::from(status),
        format!("{what}: Problem.status is {status}"),
    );
    checks.expect(
        problem.code == code,
        format!("{what}: Problem.code is {code}"),
    );
    Some(problem.clone())
}

/// Posts a batch of a valid and an invalid request: each answered on its own,
/// the valid one runs to Scheduled.
async fn batch(checks: &mut Checks, client: &Configuration) {
    let batch = DeliveryRequestBatch::new(vec![delivery_request(2.5), delivery_request(-1.0)]);
    let answer = match deliveries_api::create_delivery_request_batch(client, batch, None).await {
        Ok(answer) => answer,
        Err(error) => {
            report("POST batch", &error);
            checks.expect(false, "a batch is answered 200 with its results");
            return;
        }
    };
    println!("POST batch -> {answer:?}");
    checks.expect(answer.results.len() == 2, "a batch answers each request");
    let [first, second] = answer.results.as_slice() else {
        return;
    };
    checks.expect(
        second.status == 422
            && second
                .problem
                .as_ref()
                .is_some_and(|problem| problem.code == "ValidationFailed"),
        "the invalid request is answered with its own 422 Problem",
    );
    let accepted = first.accepted.as_deref().filter(|_| first.status == 202);
    checks.expect(accepted.is_some(), "the valid request is accepted");
    if let Some(accepted) = accepted
        && let Some(status) = poll_until_terminal(checks, client, accepted, false).await
    {
        checks.expect(
            status.state == DeliveryState::Scheduled,
            "the batch's delivery ends Scheduled",
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> reqwest::Result<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    let [_, base_url] = args.as_slice() else {
        eprintln!("usage: skyport-rust-driver BASE_URL");
        return Ok(ExitCode::from(2));
    };
    let base_url = base_url.trim_end_matches('/');
    let key = std::env::var("SKYPORT_API_KEY")
        .ok()
        .filter(|key| !key.is_empty());
    let client = configuration(base_url, key.as_deref())?;
    let mut checks = Checks::default();

    println!("== a delivery request through the generated client, against {base_url}");
    if let Some(accepted) = post(&mut checks, &client, delivery_request(2.5)).await
        && let Some(status) = poll_until_terminal(&mut checks, &client, &accepted, false).await
    {
        checks.expect(
            status.state == DeliveryState::Scheduled,
            format!("the delivery ends Scheduled (got {})", status.state),
        );
        checks.expect(
            status.id == accepted.delivery_id,
            "the status is of the delivery posted",
        );
        checks.expect(
            matches!(&status.drone_id, Some(Some(drone)) if !drone.is_empty()),
            "a Scheduled delivery names its drone",
        );
        checks.expect(
            status.links.param_self == accepted.status_url,
            "links.self is the statusUrl",
        );
        println!("== the delivery in a listing");
        match deliveries_api::list_delivery_requests(
            &client,
            None,
            None,
            None,
            None,
            Some(500),
            None,
        )
        .await
        {
            Ok(page) => checks.expect(
                page.items
                    .iter()
                    .any(|item| item.id == accepted.delivery_id),
                "the listing holds the delivery, newest first",
            ),
            Err(error) => {
                report("GET list", &error);
                checks.expect(false, "a listing answers 200");
            }
        }
        println!("== the delivery rescheduled");
        reschedule(&mut checks, &client, &accepted).await;
    }

    println!("== a batch: two requests, the second invalid");
    batch(&mut checks, &client).await;

    println!("== a POST that waits for its outcome");
    let result =
        deliveries_api::create_delivery_request(&client, delivery_request(2.5), None, Some("wait=10"))
            .await;
    match &result {
        Ok(answer) => println!("POST (Prefer: wait=10) -> {answer:?}"),
        Err(error) => report("POST (Prefer: wait=10)", error),
    }
    checks.expect(
        result.is_ok_and(|answer| {
            answer.status == DeliveryState::Scheduled
                && answer
                    .outcome
                    .is_some_and(|outcome| outcome.terminal && outcome.drone_id.is_some())
        }),
        "a POST with Prefer: wait=10 is answered with its outcome, Scheduled",
    );

    println!("== a cancelled delivery request");
    if let Some(accepted) = post(&mut checks, &client, delivery_request(1.0)).await {
        let result = deliveries_api::cancel_delivery_request(
            &client,
            &accepted.delivery_id,
            &accepted.receipt,
        )
        .await;
        match &result {
            Ok(cancelled) => println!("DELETE -> {cancelled:?}"),
            Err(error) => report("DELETE", error),
        }
        checks.expect(
            result.is_ok_and(|cancelled| cancelled.delivery_id == accepted.delivery_id),
            "a cancellation is accepted (the client returns the delivery's Accepted)",
        );
        if let Some(status) = poll_until_terminal(&mut checks, &client, &accepted, true).await {
            checks.expect(
                status.state == DeliveryState::Cancelled,
                format!("the delivery ends Cancelled (got {})", status.state),
            );
        }
    }

    println!("== a bad request: weight -1");
    let result =
        deliveries_api::create_delivery_request(&client, delivery_request(-1.0), None, None).await;
    if let Some(problem) = expect_problem(
        &mut checks,
        result,
        422,
        "ValidationFailed",
        "POST with weight -1",
    ) {
        let fields: Vec<String> = problem
            .errors
            .unwrap_or_default()
            .into_iter()
            .map(|error| error.field)
            .collect();
        checks.expect(
            fields == ["packageInfo.weight"],
            format!("the 422 names packageInfo.weight (got {fields:?})"),
        );
    }

    println!("== a malformed receipt");
    let result = deliveries_api::get_delivery_status(
        &client,
        "rs-unknown",
        "not-a-receipt",
        None,
        None,
        None,
        None,
    )
    .await;
    expect_problem(
        &mut checks,
        result,
        404,
        "NotFound",
        "GET status with a malformed receipt",
    );

    if key.is_some() {
        println!("== no credentials");
        let anonymous = configuration(base_url, None)?;
        let result =
            deliveries_api::create_delivery_request(&anonymous, delivery_request(2.5), None, None)
                .await;
        expect_problem(
            &mut checks,
            result,
            401,
            "Unauthorized",
            "POST without credentials",
        );
    }

    if checks.mismatches.is_empty() {
        println!("\nthe generated Rust client drove the gateway as the spec says");
        return Ok(ExitCode::SUCCESS);
    }
    println!("\n{} mismatch(es):", checks.mismatches.len());
    for mismatch in &checks.mismatches {
        println!("  {mismatch}");
    }
    Ok(ExitCode::FAILURE)
}
