//! What `skyport-worker` serves its operator on `worker.listen` (the admin
//! routes: `/healthz`, `/readyz`, `/metrics`), over real HTTP on 127.0.0.1,
//! with the worker's readiness, beside a whole system that just scheduled a
//! delivery.
//!
//! The only system this binary runs in its own process: the registry is the
//! process's, and another system stopping here would take its partitions'
//! series away.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skyport_core::status::DeliveryState;
use skyport_runtime::admin::{self, Admin};
use skyport_tests::{TestApp, delivery_request, scrape_metrics};
use skyport_worker::Worker;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_worker_serves_probes_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    // A second worker on the same ports, never run: its intake is paused by hand.
    let worker = Worker::new(
        &app.app.backends.ports,
        app.app.services_url.clone(),
        &app.settings.services,
        app.settings.worker.clone(),
    )
    .unwrap();
    let intake = worker.pauses();
    let stopping = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop_serving = CancellationToken::new();
    let router = admin::router(
        Admin::new(Arc::new(worker.readiness(stopping.clone(), Vec::new())), 1),
        true,
    );
    let server = tokio::spawn({
        let http = app.settings.worker.http.clone();
        let stop_serving = stop_serving.clone();
        async move { admin::serve(listener, router, &http, stop_serving).await }
    });

    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    app.client
        .wait_for_state(
            &accepted.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;

    let get = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            let response = reqwest::get(url).await.unwrap();
            let status = response.status().as_u16();
            let content_type = response.headers()["content-type"]
                .to_str()
                .unwrap()
                .to_owned();
            (
                status,
                content_type,
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, _, body) = get("/healthz").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    intake.pause(
        "circuit:drone",
        "the drone service's circuit is open".into(),
    );
    let (status, _, body) = get("/readyz").await;
    assert_eq!(
        status, 200,
        "paused intake is degraded, not unready: {body}"
    );
    assert_eq!(body["status"], "ready");
    assert!(body["degraded"][0].as_str().unwrap().contains("drone"));

    let families = scrape_metrics(&base).await;
    let outcomes: Vec<&str> = families["skyport_workflow_events"]
        .iter()
        .map(|labels| labels["outcome"].as_str())
        .collect();
    assert!(outcomes.contains(&"scheduled"), "{families:#?}");
    assert!(families.contains_key("skyport_events_in_flight"));
    assert!(families.contains_key("skyport_checkpoint_age_seconds"));
    // The dashboard's data is the same registry, read the same moment.
    let (status, _, snapshot) = get("/dashboard/data").await;
    assert_eq!(status, 200);
    let scheduled = snapshot["metrics"]["skyport_workflow_events_total"]
        .as_array()
        .unwrap()
        .iter()
        .find(|sample| sample["labels"]["outcome"] == "scheduled")
        .map(|sample| sample["value"].as_f64().unwrap());
    assert!(scheduled >= Some(1.0), "{snapshot}");
    let page = reqwest::get(format!("{base}/dashboard")).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("dashboard.js"));

    stopping.cancel();
    let (status, content_type, body) = get("/readyz").await;
    assert_eq!(status, 503, "a draining worker is unready: {body}");
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(body["detail"], "the worker is stopping");
    let (status, content_type, _) = get("/nowhere").await;
    assert_eq!(
        (status, content_type.as_str()),
        (404, "application/problem+json")
    );

    stop_serving.cancel();
    server.await.unwrap();
    app.app.stop().await.unwrap();
}
