//! The dashboard in a real browser (`skyport_tests::browser`) against the
//! real binary, its figures moving while the test posts deliveries, with
//! quotas on; its top clients name the one over its quota.
//!
//! It runs here, against a process of its own, because the dashboard shows
//! the process's metrics registry: in the system tests' process, another
//! system's circuits opening as it stops showed as this one's.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use skyport_tests::browser::{pages, publish, run_pages, screenshots};
use skyport_tests::delivery_request;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::spawn_skyport;

#[tokio::test]
async fn the_dashboard_shows_the_figures_moving_while_deliveries_are_posted() {
    let data = tempfile::tempdir().unwrap();
    let app = spawn_skyport(
        &data,
        &[
            // Calls of a few milliseconds and an occasional 503, as services have.
            "simulator.latency_ms=5".into(),
            "simulator.error_rate=0.02".into(),
            // Quotas none of the 97 owners reaches, and one client's that it does.
            "gateway.quotas.default_per_s=1000".into(),
            "gateway.quotas.clients.flood.per_s=2".into(),
        ],
        &[],
    )
    .await;

    // Deliveries at about 150/s for as long as the browser watches.
    let posting = CancellationToken::new();
    let poster = tokio::spawn({
        let client = app.client.clone();
        let posting = posting.clone();
        async move {
            let mut n = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !posting.is_cancelled() {
                tick.tick().await;
                let mut batch = JoinSet::new();
                for request in (n..n + 15).map(delivery_request) {
                    let client = client.clone();
                    batch.spawn(async move { client.post_delivery(&request).await });
                }
                n += 15;
                batch.join_all().await;
            }
            n
        }
    });
    // "flood" at about 20/s, most of it refused.
    let flooding = tokio::spawn({
        let client = app.client.clone();
        let posting = posting.clone();
        async move {
            let mut refused = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            for n in 1_000_000.. {
                if posting.is_cancelled() {
                    break;
                }
                tick.tick().await;
                let mut request = delivery_request(n);
                request["ownerId"] = "flood".into();
                let response = client
                    .post_raw("application/json", request.to_string())
                    .await;
                match response.status().as_u16() {
                    202 => {}
                    429 => refused += 1,
                    other => panic!("flood was answered {other}"),
                }
            }
            refused
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let out = screenshots();
    run_pages(
        "the dashboard in Chromium",
        pages(&["dashboard", &app.client.base, out.to_str().unwrap()]),
        dir.path(),
    )
    .await;
    posting.cancel();
    let posted = poster.await.unwrap();
    let refused = flooding.await.unwrap();
    println!(
        "{posted} deliveries posted while the browser watched; flood was refused {refused} times"
    );
    publish("dashboard.png");
    app.terminate().await;
}
