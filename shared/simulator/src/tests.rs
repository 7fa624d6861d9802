//! End-to-end tests of the simulated services over real HTTP/1.1 on a loopback socket; every
//! exchange is bounded by a timeout so a hung server fails the test instead of stalling it.
#![allow(clippy::unwrap_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::routes::third_party_required;
use skyport_core::status::Step;

use crate::{Behaviour, Simulator, SimulatorOptions, SimulatorStats};

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

async fn start(options: SimulatorOptions) -> (Simulator, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let simulator = Simulator::new(options);
    tokio::spawn(simulator.clone().serve(listener, CancellationToken::new()));
    (simulator, addr)
}

async fn send(addr: SocketAddr, method: &str, path: &str, key: Option<&str>, body: &str) -> Reply {
    tokio::time::timeout(
        Duration::from_secs(5),
        exchange(addr, method, path, key, body),
    )
    .await
    .expect("the simulator answers within 5 s")
}

/// One request per connection (`Connection: close`), so the response ends at EOF.
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let key = key
        .map(|key| format!("Idempotency-Key: {key}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: simulator\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{key}\r\n{body}",
        body.len()
    );
    let mut pending = request.as_bytes();
    while !pending.is_empty() {
        stream.writable().await.unwrap();
        match stream.try_write(pending) {
            Ok(written) => pending = &pending[written..],
            Err(error) if error.kind() == ErrorKind::WouldBlock => {}
            Err(error) => panic!("write failed: {error}"),
        }
    }
    let mut response = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        stream.readable().await.unwrap();
        match stream.try_read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => response.extend_from_slice(&buffer[..read]),
            Err(error) if error.kind() == ErrorKind::WouldBlock => {}
            Err(error) => panic!("read failed: {error}"),
        }
    }
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Reply {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

fn package(delivery_id: &str, tag: &str) -> String {
    json!({ "deliveryId": delivery_id, "size": "small", "weight": 2.5, "tag": tag }).to_string()
}

#[tokio::test]
async fn creating_then_replaying_counts_one_created_and_one_replayed() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    let body = package("d1", "fragile");

    let first = send(addr, "PUT", "/package/api/packages/p1", Some("k1"), &body).await;
    let second = send(addr, "PUT", "/package/api/packages/p1", Some("k1"), &body).await;

    assert_eq!(first.status, 201);
    assert_eq!(second.status, 200);
    assert_eq!(first.json(), second.json());
    assert_eq!(
        first.json(),
        json!({ "id": "p1", "deliveryId": "d1", "size": "small", "weight": 2.5, "tag": "fragile" })
    );
    let stats = simulator.stats();
    assert_eq!(stats.package.calls, 2);
    assert_eq!(stats.package.created, 1);
    assert_eq!(stats.package.replayed, 1);
}

#[tokio::test]
async fn an_update_changes_a_booking_once_per_key_and_a_missing_one_is_a_404() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    let path = "/drone/api/bookings/d1";
    let booked = send(
        addr,
        "PUT",
        path,
        Some("d1:drone"),
        r#"{"pickupTime":"10:00"}"#,
    )
    .await;
    assert_eq!(booked.status, 201);
    let drone = booked.json()["droneId"].clone();
    let patch = r#"{"pickupTime":"11:00"}"#;
    let first = send(addr, "PATCH", path, Some("d1:drone:r1"), patch).await;
    let again = send(addr, "PATCH", path, Some("d1:drone:r1"), patch).await;
    assert_eq!((first.status, again.status), (200, 200));
    assert_eq!(first.json()["pickupTime"], "11:00");
    assert_eq!(
        first.json()["droneId"],
        drone,
        "the same drone stays booked"
    );
    assert_eq!(first.json(), again.json());
    let replayed = send(
        addr,
        "PUT",
        path,
        Some("d1:drone"),
        r#"{"pickupTime":"10:00"}"#,
    )
    .await;
    assert_eq!(
        replayed.json()["pickupTime"],
        "11:00",
        "the booking as it is now"
    );
    let missing = send(addr, "PATCH", "/drone/api/bookings/none", Some("k"), patch).await;
    assert_eq!(missing.status, 404);
    let stats = simulator.stats();
    assert_eq!(stats.drone.updated, 1);
    assert_eq!(stats.drone.replayed, 2);
}

#[tokio::test]
async fn an_identical_body_without_a_key_is_a_replay() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    let body = json!({ "pickup": "A", "dropoff": "B" }).to_string();

    let first = send(
        addr,
        "PUT",
        "/delivery/api/deliveries/d1",
        Some("k1"),
        &body,
    )
    .await;
    let second = send(addr, "PUT", "/delivery/api/deliveries/d1", None, &body).await;

    assert_eq!((first.status, second.status), (201, 200));
    assert_eq!(
        second.json(),
        json!({ "id": "d1", "pickup": "A", "dropoff": "B" })
    );
    assert_eq!(simulator.stats().delivery.replayed, 1);
}

#[tokio::test]
async fn a_different_key_with_a_different_body_is_a_conflict() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;

    send(
        addr,
        "PUT",
        "/package/api/packages/p1",
        Some("k1"),
        &package("d1", "a"),
    )
    .await;
    let clash = send(
        addr,
        "PUT",
        "/package/api/packages/p1",
        Some("k2"),
        &package("d1", "b"),
    )
    .await;

    assert_eq!(clash.status, 409);
    assert_eq!(
        clash.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(clash.json()["code"], "Conflict");
    let stats = simulator.stats();
    assert_eq!((stats.package.created, stats.package.conflicts), (1, 1));
}

#[tokio::test]
async fn a_suspended_owner_is_forbidden_and_nothing_is_created() {
    let options = SimulatorOptions {
        suspended_owners: vec!["mallory".to_owned()],
        ..SimulatorOptions::default()
    };
    let (simulator, addr) = start(options).await;
    let body = json!({ "deliveryId": "d1" }).to_string();

    let refused = send(
        addr,
        "PUT",
        "/account/api/accounts/mallory/authorizations/d1",
        None,
        &body,
    )
    .await;
    let granted = send(
        addr,
        "PUT",
        "/account/api/accounts/alice/authorizations/d1",
        None,
        &body,
    )
    .await;

    assert_eq!(refused.status, 403);
    let problem = refused.json();
    assert_eq!(problem["code"], "AccountSuspended");
    assert_eq!(problem["status"], 403);
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(granted.status, 201);
    assert_eq!(
        granted.json(),
        json!({ "ownerId": "alice", "deliveryId": "d1", "active": true })
    );
    let stats = simulator.stats();
    assert_eq!((stats.account.calls, stats.account.created), (2, 1));
}

#[tokio::test]
async fn an_error_rate_of_one_answers_503_and_creates_nothing() {
    let options = SimulatorOptions {
        behaviour: Behaviour {
            error_rate: 1.0,
            ..Behaviour::default()
        },
        ..SimulatorOptions::default()
    };
    let (simulator, addr) = start(options).await;

    let reply = send(addr, "PUT", "/drone/api/bookings/d1", Some("k1"), "{}").await;

    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.json()["status"], 503);
    let stats = simulator.stats();
    assert_eq!(stats.drone.calls, 1);
    assert_eq!(stats.drone.injected_failures, 1);
    assert_eq!(stats.drone.created, 0);
}

#[tokio::test]
async fn set_behaviour_changes_one_service_live() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    let failing = Behaviour {
        latency: Duration::from_millis(5),
        error_rate: 1.0,
        ..Behaviour::default()
    };

    simulator.set_behaviour(Step::Drone, failing);
    let started = Instant::now();
    let failed = send(addr, "PUT", "/drone/api/bookings/d1", Some("k1"), "{}").await;
    let waited = started.elapsed();
    let other = send(addr, "PUT", "/delivery/api/deliveries/d1", Some("k1"), "{}").await;
    simulator.set_behaviour(Step::Drone, Behaviour::default());
    let healed = send(addr, "PUT", "/drone/api/bookings/d1", Some("k1"), "{}").await;

    assert_eq!(failed.status, 503);
    assert!(
        waited >= Duration::from_millis(5),
        "latency applied: {waited:?}"
    );
    assert_eq!(other.status, 201);
    assert_eq!(healed.status, 201);
}

#[tokio::test]
async fn a_drone_booking_replay_returns_the_same_drone_id() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    let body = json!({ "pickup": "A" }).to_string();

    let first = send(addr, "PUT", "/drone/api/bookings/d1", Some("k1"), &body).await;
    let other = send(addr, "PUT", "/drone/api/bookings/d2", Some("k2"), &body).await;
    let replay = send(addr, "PUT", "/drone/api/bookings/d1", Some("k1"), &body).await;

    assert_eq!((first.status, replay.status), (201, 200));
    let drone_id = first.json()["droneId"].clone();
    assert!(drone_id.as_str().unwrap().starts_with("drone-"));
    assert_eq!(replay.json()["droneId"], drone_id);
    assert_ne!(other.json()["droneId"], drone_id);
    assert_eq!(replay.json()["deliveryId"], "d1");
    assert_eq!(simulator.stats().drone.created, 2);
}

#[tokio::test]
async fn deleting_twice_counts_one_deletion_and_still_answers_204() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    send(
        addr,
        "PUT",
        "/package/api/packages/p1",
        Some("k1"),
        &package("d1", "a"),
    )
    .await;

    let first = send(addr, "DELETE", "/package/api/packages/p1", None, "").await;
    let second = send(addr, "DELETE", "/package/api/packages/p1", None, "").await;
    let recreated = send(
        addr,
        "PUT",
        "/package/api/packages/p1",
        Some("k1"),
        &package("d1", "a"),
    )
    .await;

    assert_eq!((first.status, second.status), (204, 204));
    assert_eq!(recreated.status, 201);
    let stats = simulator.stats();
    assert_eq!(stats.package.deleted, 1);
    assert_eq!(stats.package.created, 2);
}

#[tokio::test]
async fn the_stats_endpoint_round_trips_into_simulator_stats() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;
    send(
        addr,
        "PUT",
        "/package/api/packages/p1",
        Some("k1"),
        &package("d1", "a"),
    )
    .await;
    send(addr, "DELETE", "/drone/api/bookings/d9", None, "").await;

    let reply = send(addr, "GET", "/_sim/stats", None, "").await;

    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("\"thirdParty\""));
    assert!(reply.body.contains("\"injectedFailures\""));
    let stats: SimulatorStats = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(stats, simulator.stats());
    assert_eq!(stats.get(Step::Package).created, 1);
    assert_eq!(stats.get(Step::Drone).calls, 1);
}

#[tokio::test]
async fn malformed_json_is_a_bad_request_and_creates_nothing() {
    let (simulator, addr) = start(SimulatorOptions::default()).await;

    let broken = send(
        addr,
        "PUT",
        "/delivery/api/deliveries/d1",
        None,
        "{\"pickup\":",
    )
    .await;
    let not_object = send(addr, "PUT", "/drone/api/bookings/d1", None, "[1]").await;

    assert_eq!((broken.status, not_object.status), (400, 400));
    assert_eq!(
        broken.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(broken.json()["code"], "BadRequest");
    let stats = simulator.stats();
    assert_eq!(stats.delivery.created + stats.drone.created, 0);
}

#[tokio::test]
async fn an_unknown_path_is_not_found() {
    let (_simulator, addr) = start(SimulatorOptions::default()).await;

    let reply = send(addr, "GET", "/nowhere", None, "").await;

    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["code"], "NotFound");
}

#[tokio::test]
async fn a_third_party_assessment_depends_only_on_the_locations() {
    let (_simulator, addr) = start(SimulatorOptions::default()).await;
    let body = json!({ "pickupLocation": "Seattle", "dropoffLocation": "Redmond" }).to_string();

    let first = send(addr, "PUT", "/thirdparty/api/assessments/d1", None, &body).await;
    let second = send(addr, "PUT", "/thirdparty/api/assessments/d2", None, &body).await;

    assert_eq!((first.status, second.status), (201, 201));
    let (first, second) = (first.json(), second.json());
    assert_eq!(first["deliveryId"], "d1");
    assert_eq!(first["required"], second["required"]);
    let expected_carrier = if first["required"] == true {
        json!("Contoso Freight")
    } else {
        Value::Null
    };
    assert_eq!(first["carrier"], expected_carrier);
}

#[test]
fn about_one_route_in_ten_needs_a_third_party() {
    let required = (0..1000)
        .filter(|n| third_party_required(&json!(format!("pickup-{n}")), &json!("hub")))
        .count();
    assert!((50..=150).contains(&required), "{required} of 1000");
}
