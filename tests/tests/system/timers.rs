//! Deliveries that book close to their time (`worker.booking_lead_s`): one
//! whose pickup is further away is Waiting, books nothing, and runs at
//! `runsAt` from the timer the status store keeps: across a restart, a
//! duplicate fire, a reschedule that moves it and a cancellation; on the
//! embedded store, and on Cosmos DB with Kafka and with Event Hubs.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use serde_json::{Value, json};
use skyport_core::event::{DeliveryDue, Event};
use skyport_core::ports::Lane;
use skyport_core::status::{DeliveryState, StatusDocument, Step};
use skyport_gateway::routes::deliveries::resources::Accepted;
use skyport_runtime::config::{Seconds, Settings};
use skyport_tests::{Client, TestApp, delivery_request, eventually, test_settings};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The lead: an hour before its pickup a delivery books.
const LEAD_S: u64 = 3_600;

fn waiting_settings(dir: &std::path::Path) -> Settings {
    let mut settings = test_settings(dir);
    settings.worker.booking_lead_s = Some(Seconds::new(LEAD_S));
    settings
}

/// Delivery `n`, picked up the lead and `in_s` seconds from now.
fn picked_up_in(n: usize, in_s: i64) -> Value {
    let pickup =
        OffsetDateTime::now_utc() + time::Duration::seconds(i64::try_from(LEAD_S).unwrap() + in_s);
    let mut request = delivery_request(n);
    request["pickupTime"] = json!(pickup.format(&Rfc3339).unwrap());
    request["deadline"] = json!(
        (pickup + time::Duration::hours(2))
            .format(&Rfc3339)
            .unwrap()
    );
    request
}

async fn document(client: &Client, status_url: &str) -> StatusDocument {
    client.status(status_url).await.json().await.unwrap()
}

/// The document once `done` holds for it.
async fn when(
    client: &Client,
    status_url: &str,
    what: &str,
    done: impl Fn(&StatusDocument) -> bool,
) -> StatusDocument {
    eventually(what, Duration::from_secs(30), || async {
        let document = document(client, status_url).await;
        done(&document).then_some(document)
    })
    .await
}

/// An all-in-one with the lead on (its data in `dir`), and a delivery
/// posted to it, picked up the lead and `in_s` seconds from now: its answer
/// and its document once Waiting.
async fn one_waiting(dir: &std::path::Path, in_s: i64) -> (TestApp, Accepted, StatusDocument) {
    let app = TestApp::spawn_with(waiting_settings(dir)).await;
    let accepted = app.client.post_delivery(&picked_up_in(0, in_s)).await;
    let waiting = when(&app.client, &accepted.status_url, "Waiting", |d| {
        d.state == DeliveryState::Waiting
    })
    .await;
    (app, accepted, waiting)
}

/// Reschedules the delivery behind `status_url` to `request`'s pickup and
/// deadline.
async fn move_to(client: &Client, status_url: &str, request: &Value) {
    let patch = json!({ "pickupTime": request["pickupTime"], "deadline": request["deadline"] });
    let path = &status_url[status_url.find("/api/").unwrap()..];
    let response = client
        .http
        .patch(format!(
            "{}{}",
            client.base,
            path.replacen("/status?", "?", 1)
        ))
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}

fn booked(app: &TestApp) -> u64 {
    app.simulator().stats().get(Step::Drone).created
}

#[tokio::test]
async fn a_delivery_far_from_its_pickup_waits_books_nothing_and_runs_at_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let (app, accepted, waiting) = one_waiting(dir.path(), 3).await;
    let runs_at = waiting.runs_at.unwrap();
    let pickup = waiting.request.as_ref().unwrap().pickup_time;
    assert_eq!(pickup - runs_at, time::Duration::seconds(3_600));
    assert_eq!(booked(&app), 0, "nothing is booked while it waits");
    let read: Value = app
        .client
        .status(&accepted.status_url)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(read["status"], "NotStarted");
    assert_eq!(read["terminal"], false);

    let scheduled = when(&app.client, &accepted.status_url, "Scheduled", |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    let first_step = scheduled.steps[0].at;
    assert!(first_step >= runs_at, "{first_step} before {runs_at}");
    assert!(
        first_step - runs_at < time::Duration::seconds(1),
        "the first step {} after runsAt",
        first_step - runs_at
    );
    assert_eq!(booked(&app), 1);

    // A duplicate fire, at the revision that ran, does nothing.
    fire(&app, &waiting).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(booked(&app), 1);
    assert_eq!(
        document(&app.client, &accepted.status_url).await.attempt,
        scheduled.attempt
    );
}

#[tokio::test]
async fn a_waiting_delivery_runs_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (app, accepted, _) = one_waiting(dir.path(), 4).await;
    let app = app.restart().await;
    app.expect_all_scheduled_once(&[accepted.status_url], Duration::from_secs(30))
        .await;
}

/// On `app` (its worker reading already): ten deliveries deferred a few
/// seconds, one rescheduled later and one cancelled while they wait. Each
/// of the others runs once at its time, the moved one at its new time, the
/// cancelled one never; a Waiting one is polled at its `runsAt`.
async fn deferred_moved_and_cancelled(app: &TestApp) {
    let warm = app.client.post_delivery(&picked_up_in(100, -60)).await;
    app.client
        .wait_for_terminal(
            std::slice::from_ref(&warm.status_url),
            Duration::from_secs(60),
        )
        .await;
    let booked_before = booked(app);
    let mut accepted = Vec::new();
    for n in 0..10 {
        accepted.push(app.client.post_delivery(&picked_up_in(n, 4)).await);
    }
    for delivery in &accepted {
        when(&app.client, &delivery.status_url, "Waiting", |d| {
            d.state == DeliveryState::Waiting
        })
        .await;
    }
    let polled = app.client.status(&accepted[0].status_url).await;
    let retry_after: u64 = polled.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=4).contains(&retry_after), "Retry-After {retry_after}");
    let (moved, cancelled) = (&accepted[0], &accepted[1]);
    // Six seconds later than asked.
    let later = picked_up_in(0, 10);
    move_to(&app.client, &moved.status_url, &later).await;
    let rescheduled = when(&app.client, &moved.status_url, "moved", |d| d.revision == 1).await;
    assert_eq!(rescheduled.state, DeliveryState::Waiting);
    let runs_at = rescheduled.runs_at.unwrap();
    assert!(runs_at > OffsetDateTime::now_utc() + time::Duration::seconds(3));
    assert_eq!(app.client.cancel(&cancelled.status_url).await.status(), 202);
    when(&app.client, &cancelled.status_url, "Cancelled", |d| {
        d.state == DeliveryState::Cancelled
    })
    .await;
    let others: Vec<String> = accepted[2..].iter().map(|a| a.status_url.clone()).collect();
    // Each service's count covers the warm-up delivery too.
    let ran = [&others[..], &[warm.status_url]].concat();
    app.expect_all_scheduled_once(&ran, Duration::from_secs(60))
        .await;
    for url in &others {
        let document = document(&app.client, url).await;
        assert!(document.steps[0].at >= document.runs_at.unwrap());
    }
    let ran_on_time = booked(app) - booked_before;
    assert_eq!(
        ran_on_time, 8,
        "the moved one waits, the cancelled one never runs"
    );
    let scheduled = when(&app.client, &moved.status_url, "Scheduled", |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    assert!(scheduled.steps[0].at >= runs_at);
    assert_eq!(booked(app) - booked_before, 9);
    assert_eq!(
        document(&app.client, &cancelled.status_url).await.state,
        DeliveryState::Cancelled
    );
}

#[tokio::test]
async fn a_reschedule_moves_a_waiting_delivery_and_a_cancellation_ends_one() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(waiting_settings(dir.path())).await;
    deferred_moved_and_cancelled(&app).await;
}

/// With no embedded store to keep one, the gateway's receipt key is configured.
const RECEIPT_KEY: &str = "a-receipt-key-for-the-timers-tests-0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_deliveries_run_on_cosmos_db_with_kafka() {
    let broker = skyport_tests::kafka::Broker::start(&["deliveries"], 4).await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = waiting_settings(dir.path());
    broker.configure(&mut settings, &["deliveries"]);
    settings.gateway.receipt_keys = vec![RECEIPT_KEY.into()];
    let app = TestApp::spawn_on_cosmos(settings).await;
    deferred_moved_and_cancelled(&app).await;
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_deliveries_run_on_cosmos_db_with_event_hubs() {
    let broker = skyport_tests::eventhubs_broker::EventHubsBroker::start(&[("d-0", 4)])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = crate::eventhubs::settings_on(&broker, &dir, &["d-0"]);
    settings.worker.booking_lead_s = Some(Seconds::new(LEAD_S));
    settings.gateway.receipt_keys = vec![RECEIPT_KEY.into()];
    let app = TestApp::spawn_on_cosmos(settings).await;
    deferred_moved_and_cancelled(&app).await;
    app.app.stop().await.unwrap();
    broker.stop().await;
}

#[tokio::test]
async fn a_delivery_near_its_pickup_books_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(waiting_settings(dir.path())).await;
    let accepted = app.client.post_delivery(&picked_up_in(0, -60)).await;
    let scheduled = when(&app.client, &accepted.status_url, "Scheduled", |d| {
        d.state == DeliveryState::Scheduled
    })
    .await;
    assert_eq!(scheduled.runs_at, None);
}

#[tokio::test]
async fn a_waiting_delivery_runs_when_its_time_comes_after_the_lead_is_turned_off_and_at_once_when_rescheduled()
 {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn_with(waiting_settings(dir.path())).await;
    let kept = app.client.post_delivery(&picked_up_in(0, 3)).await;
    let moved = app.client.post_delivery(&picked_up_in(1, 600)).await;
    for accepted in [&kept, &moved] {
        when(&app.client, &accepted.status_url, "Waiting", |d| {
            d.state == DeliveryState::Waiting
        })
        .await;
    }
    app.app.stop().await.unwrap();
    // The lead off: what waits still runs at its time, and a reschedule
    // books at once.
    let app = TestApp::spawn_with(test_settings(dir.path())).await;
    let later = picked_up_in(1, 700);
    move_to(&app.client, &moved.status_url, &later).await;
    app.expect_all_scheduled_once(
        &[kept.status_url, moved.status_url],
        Duration::from_secs(30),
    )
    .await;
}

/// Publishes the `DeliveryDue` of `waiting`'s timer now, as a timer would.
async fn fire(app: &TestApp, waiting: &StatusDocument) {
    let due = Event::DeliveryDue(DeliveryDue {
        delivery_id: waiting.id.clone(),
        revision: waiting.revision,
        runs_at: waiting.runs_at.unwrap(),
    });
    app.app
        .backends
        .ports
        .publisher
        .publish(due.outbound(Lane::Normal))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_reschedule_racing_a_fire_runs_the_delivery_once_at_the_latest_revision() {
    let dir = tempfile::tempdir().unwrap();
    let (app, accepted, waiting) = one_waiting(dir.path(), 30).await;
    // The fire and a reschedule to a pickup within the lead, at once: the
    // fire first runs it and the reschedule updates its bookings; the
    // reschedule first makes it due now and the fire finds another revision.
    let soon = picked_up_in(0, -60);
    tokio::join!(
        fire(&app, &waiting),
        move_to(&app.client, &accepted.status_url, &soon)
    );
    let scheduled = when(
        &app.client,
        &accepted.status_url,
        "Scheduled at revision 1",
        |d| d.state == DeliveryState::Scheduled && d.revision == 1,
    )
    .await;
    assert_eq!(scheduled.request.unwrap().pickup_time, {
        let at = soon["pickupTime"].as_str().unwrap();
        OffsetDateTime::parse(at, &Rfc3339).unwrap()
    });
    let stats = app.simulator().stats();
    let drone = stats.get(Step::Drone);
    assert_eq!(drone.created, 1, "{drone:?}");
    assert!(drone.updated <= 1, "{drone:?}");
}

#[tokio::test]
async fn a_cancel_racing_a_fire_ends_the_delivery_cancelled_with_nothing_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (app, accepted, waiting) = one_waiting(dir.path(), 30).await;
    let (_, cancel) = tokio::join!(
        fire(&app, &waiting),
        app.client.cancel(&accepted.status_url)
    );
    assert_eq!(cancel.status(), 202);
    when(&app.client, &accepted.status_url, "Cancelled", |d| {
        d.state == DeliveryState::Cancelled
    })
    .await;
    // Whatever ran first, nothing booked is left.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = app.simulator().stats();
    let drone = stats.get(Step::Drone);
    assert_eq!(drone.created, drone.deleted, "{drone:?}");
    assert_eq!(
        document(&app.client, &accepted.status_url).await.state,
        DeliveryState::Cancelled
    );
}
