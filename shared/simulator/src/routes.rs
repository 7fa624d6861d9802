//! HTTP surface of the simulator: every service call pays its service's current `Behaviour`
//! before any state is read or written, so an injected failure never has a side effect.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Map, Value, json};
use skyport_runtime::{telemetry, trace_span};
use tracing::Instrument;

use xxhash_rust::xxh3::xxh3_64;

use crate::store::{PutOutcome, UpdateOutcome};
use skyport_core::status::Step;

use crate::state::{ServiceCounters, ServiceState, Services, SimulatorStats};

type SimState = Arc<Services>;
type Outcome = Result<Response, Problem>;

const IDEMPOTENCY_KEY: &str = "idempotency-key";
const CARRIER: &str = "Contoso Freight";
/// About one delivery in this many needs a third-party carrier.
const THIRD_PARTY_ONE_IN: u64 = 10;

pub(crate) fn router(services: SimState) -> Router {
    Router::new()
        .route(
            "/account/api/accounts/{owner_id}/authorizations/{delivery_id}",
            put(put_authorization),
        )
        .route(
            "/package/api/packages/{id}",
            put(put_package).delete(delete_package),
        )
        .route(
            "/delivery/api/deliveries/{id}",
            put(put_delivery)
                .delete(delete_delivery)
                .patch(patch_delivery),
        )
        .route("/thirdparty/api/assessments/{id}", put(put_assessment))
        .route(
            "/drone/api/bookings/{id}",
            put(put_booking).delete(delete_booking).patch(patch_booking),
        )
        .route_layer(middleware::from_fn(traced))
        .route("/_sim/stats", get(stats))
        .fallback(not_found)
        .with_state(services)
}

/// Runs a service call in a server span that continues the caller's
/// `traceparent`, so a trace shows what each call cost on the service's side.
async fn traced(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    let span = trace_span!(
        "simulated service",
        otel.name = %format_args!("{} {route}", request.method()),
        otel.kind = "server",
    );
    let traceparent = request
        .headers()
        .get(telemetry::TRACEPARENT)
        .and_then(|v| v.to_str().ok());
    telemetry::continue_trace(&span, traceparent);
    next.run(request).instrument(span).await
}

async fn put_authorization(
    State(services): State<SimState>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let service = admit(&services, Step::Account).await?;
    let Path((owner_id, delivery_id)) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(&headers)?;
    optional_object(body)?;
    if services.suspended_owners.contains(&owner_id) {
        return Err(Problem::new(
            StatusCode::FORBIDDEN,
            "Account suspended",
            "AccountSuspended",
            format!("account {owner_id} is suspended and cannot authorize deliveries"),
        ));
    }
    // Length-prefixing keeps the composite id unambiguous whatever characters the ids contain.
    let id = format!("{}:{owner_id}{delivery_id}", owner_id.len());
    // The path alone determines an authorization, so every repeat is a replay whatever its body.
    Ok(store_put(
        service,
        id,
        key,
        &Value::Null,
        || json!({ "ownerId": owner_id, "deliveryId": delivery_id, "active": true }),
    ))
}

async fn put_package(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let service = admit(&services, Step::Package).await?;
    let Path(id) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(&headers)?;
    let fields = object(body)?;
    let delivery_id = match fields.get("deliveryId") {
        Some(Value::String(delivery_id)) => delivery_id.clone(),
        _ => return Err(Problem::bad_request("deliveryId must be a string")),
    };
    let field = |name: &str| fields.get(name).cloned().unwrap_or(Value::Null);
    let (size, weight, tag) = (field("size"), field("weight"), field("tag"));
    Ok(store_put(
        service,
        id.clone(),
        key,
        &Value::Object(fields),
        || json!({ "id": id, "deliveryId": delivery_id, "size": size, "weight": weight, "tag": tag }),
    ))
}

async fn put_delivery(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let service = admit(&services, Step::Delivery).await?;
    let Path(id) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(&headers)?;
    let fields = object(body)?;
    let request = Value::Object(fields.clone());
    Ok(store_put(service, id.clone(), key, &request, || {
        let mut resource = fields;
        // The path names the resource; a body "id" must not be able to contradict it.
        resource.insert("id".to_owned(), Value::String(id));
        Value::Object(resource)
    }))
}

async fn put_assessment(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let service = admit(&services, Step::ThirdParty).await?;
    let Path(delivery_id) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(&headers)?;
    let fields = object(body)?;
    let location = |name: &str| match fields.get(name) {
        Some(Value::Null) | None => Err(Problem::bad_request(format!("{name} is required"))),
        Some(location) => Ok(location.clone()),
    };
    let required =
        third_party_required(&location("pickupLocation")?, &location("dropoffLocation")?);
    Ok(store_put(
        service,
        delivery_id.clone(),
        key,
        &Value::Object(fields),
        || {
            json!({
                "deliveryId": delivery_id,
                "required": required,
                "carrier": required.then_some(CARRIER),
            })
        },
    ))
}

async fn put_booking(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let service = admit(&services, Step::Drone).await?;
    let Path(delivery_id) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(&headers)?;
    let request = Value::Object(object(body)?);
    Ok(store_put(
        service,
        delivery_id.clone(),
        key,
        &request,
        || {
            // Drawn only on creation, so every replay reports the drone that was actually booked.
            let drone = services.next_drone.fetch_add(1, Ordering::Relaxed);
            json!({ "deliveryId": delivery_id, "droneId": format!("drone-{drone}") })
        },
    ))
}

async fn patch_delivery(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    update(&services, Step::Delivery, path, &headers, body).await
}

async fn patch_booking(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    update(&services, Step::Drone, path, &headers, body).await
}

/// A reschedule: sets the body's fields on an existing resource, once per
/// idempotency key; 404 when there is none (it was never made, or undone).
async fn update(
    services: &Services,
    service: Step,
    path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Outcome {
    let state = admit(services, service).await?;
    let Path(id) = path.map_err(Problem::bad_path)?;
    let key = idempotency_key(headers)?;
    let fields = object(body)?;
    refused(state, &id)?;
    match state.store.update(&id, key, &fields) {
        UpdateOutcome::Updated(body) => {
            ServiceCounters::bump(&state.counters.updated);
            Ok(json_response(StatusCode::OK, body))
        }
        UpdateOutcome::Replayed(body) => {
            ServiceCounters::bump(&state.counters.replayed);
            Ok(json_response(StatusCode::OK, body))
        }
        UpdateOutcome::Missing => Err(Problem::new(
            StatusCode::NOT_FOUND,
            "Not found",
            "NotFound",
            format!("no {} resource {id}", service.as_str()),
        )),
    }
}

async fn delete_package(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
) -> Outcome {
    delete(&services, Step::Package, path).await
}

async fn delete_delivery(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
) -> Outcome {
    delete(&services, Step::Delivery, path).await
}

async fn delete_booking(
    State(services): State<SimState>,
    path: Result<Path<String>, PathRejection>,
) -> Outcome {
    delete(&services, Step::Drone, path).await
}

async fn stats(State(services): State<SimState>) -> axum::Json<SimulatorStats> {
    axum::Json(services.stats())
}

async fn not_found() -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        "Not found",
        "NotFound",
        "no simulated service route matches this path".to_owned(),
    )
}

/// Counts the call and applies the service's behaviour; `Err` is the injected 503.
async fn admit(services: &Services, service: Step) -> Result<&ServiceState, Problem> {
    let state = services.service(service);
    ServiceCounters::bump(&state.counters.calls);
    let behaviour = state.behaviour();
    let delay = behaviour.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if behaviour.should_fail() {
        ServiceCounters::bump(&state.counters.injected_failures);
        return Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service unavailable",
            "ServiceUnavailable",
            format!(
                "injected failure of the simulated {} service",
                service.as_str()
            ),
        ));
    }
    Ok(state)
}

/// Compensation: removing a missing resource succeeds too, so retried DELETEs are harmless.
async fn delete(
    services: &Services,
    service: Step,
    path: Result<Path<String>, PathRejection>,
) -> Outcome {
    let state = admit(services, service).await?;
    let Path(id) = path.map_err(Problem::bad_path)?;
    if state.store.remove(&id) {
        ServiceCounters::bump(&state.counters.deleted);
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn store_put(
    state: &ServiceState,
    id: String,
    key: Option<String>,
    request: &Value,
    create: impl FnOnce() -> Value,
) -> Response {
    if let Err(refusal) = refused(state, &id) {
        return refusal.into_response();
    }
    match state.store.put(id, key, request, create) {
        PutOutcome::Created(body) => {
            ServiceCounters::bump(&state.counters.created);
            json_response(StatusCode::CREATED, body)
        }
        PutOutcome::Replayed(body) => {
            ServiceCounters::bump(&state.counters.replayed);
            json_response(StatusCode::OK, body)
        }
        PutOutcome::Conflict => {
            ServiceCounters::bump(&state.counters.conflicts);
            Problem::new(
                StatusCode::CONFLICT,
                "Conflict",
                "Conflict",
                "the resource exists with a different idempotency key and a different body"
                    .to_owned(),
            )
            .into_response()
        }
    }
}

/// The 422 of an id in the service's `rejected_ids`, counted.
fn refused(state: &ServiceState, id: &str) -> Result<(), Problem> {
    if !state.behaviour().rejected_ids.contains(id) {
        return Ok(());
    }
    ServiceCounters::bump(&state.counters.rejected);
    Err(Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Rejected",
        "Rejected",
        format!("the simulated service refuses {id}"),
    ))
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    headers
        .get(IDEMPOTENCY_KEY)
        .map(|value| {
            value
                .to_str()
                .map(str::to_owned)
                .map_err(|_| Problem::bad_request("Idempotency-Key must be visible ASCII"))
        })
        .transpose()
}

/// Validates a body that may be empty but, when present, must be a JSON object.
fn optional_object(body: Result<Bytes, BytesRejection>) -> Result<(), Problem> {
    let body = body.map_err(|rejection| Problem::bad_request(rejection.body_text()))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    parse_object(&body).map(drop)
}

fn object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, Problem> {
    let body = body.map_err(|rejection| Problem::bad_request(rejection.body_text()))?;
    parse_object(&body)
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, Problem> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(Problem::bad_request("the body must be a JSON object")),
        Err(error) => Err(Problem::bad_request(format!("invalid JSON body: {error}"))),
    }
}

/// Deterministic in the two locations, so the same route always gets the same answer.
pub(super) fn third_party_required(pickup: &Value, dropoff: &Value) -> bool {
    let route = format!("{pickup}\u{0}{dropoff}");
    xxh3_64(route.as_bytes()).is_multiple_of(THIRD_PARTY_ONE_IN)
}

/// An RFC 9457 problem document.
struct Problem {
    status: StatusCode,
    title: &'static str,
    code: &'static str,
    detail: String,
}

impl Problem {
    fn new(status: StatusCode, title: &'static str, code: &'static str, detail: String) -> Self {
        Self {
            status,
            title,
            code,
            detail,
        }
    }

    fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "Malformed request",
            "BadRequest",
            detail.into(),
        )
    }

    fn bad_path(rejection: PathRejection) -> Self {
        Self::bad_request(rejection.body_text())
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = json!({
            "type": "about:blank",
            "title": self.title,
            "status": self.status.as_u16(),
            "code": self.code,
            "detail": self.detail,
        });
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            )],
            body.to_string(),
        )
            .into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
