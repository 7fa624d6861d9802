//! A disk that fails under the embedded store (no space left, injected in
//! its file layer): the gateway answers 503 with `Retry-After` and a
//! problem, never a panic or a hang; appends resume when the fault clears,
//! and what was refused never reappears. The worker's status writes that
//! keep failing hand their events back to the stream, which reads them
//! again (the same scenario runs on Kafka, where that is a seek, and on
//! Event Hubs).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::{Millis, Settings};
use skyport_tests::{TestApp, delivery_request, eventually, test_settings};
use skyport_worker::metrics::{self, PartitionLabels};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_answers_503_with_retry_after_and_appends_resume_when_it_clears() {
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::spawn(&dir).await;
    let before = app.published();
    app.embedded().faults().fail_writes(true);
    for n in 0..3 {
        let response = app
            .client
            .post_raw("application/json", delivery_request(n).to_string())
            .await;
        assert_eq!(response.status(), 503);
        assert!(response.headers().contains_key("retry-after"));
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
    }
    assert_eq!(app.published(), before, "nothing refused was written");
    app.embedded().faults().fail_writes(false);
    let accepted = app.client.post_delivery(&delivery_request(10)).await;
    app.client
        .wait_for_state(
            &accepted.status_url,
            DeliveryState::Scheduled,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(app.published(), before + 1);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_whose_status_writes_keep_failing_are_read_again_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    handed_back_events_are_read_again_and_end_scheduled(test_settings(dir.path())).await;
}

/// Times the partitions of this process were read again from a handed-back event.
fn rewinds(partitions: u32) -> u64 {
    (0..partitions)
        .map(|partition| {
            metrics::global()
                .consumer_rewinds
                .get_or_create(&PartitionLabels {
                    lane: "normal",
                    partition,
                })
                .get()
        })
        .sum()
}

/// Twenty deliveries are under way when the disk under the embedded store
/// fills: their status writes fail, and after
/// `worker.redeliver_after_failures` failures in a row each event is handed
/// back to the stream (a nack) and read again from there. Once the disk
/// recovers every one ends Scheduled, each service having created each
/// delivery once.
pub(crate) async fn handed_back_events_are_read_again_and_end_scheduled(mut settings: Settings) {
    settings.worker.redeliver_after_failures = 3;
    // Five calls of 1 s: the deliveries are still running when the disk fills.
    settings.simulator.latency_ms = Millis::new(1_000);
    settings.simulator.jitter_ms = Millis::new(0);
    let app = TestApp::spawn_with(settings).await;
    let partitions = app.embedded().partitions();
    let rewinds_before = rewinds(partitions);
    let accepted = app.client.post_many(20).await;
    let urls: Vec<String> = accepted.iter().map(|a| a.status_url.clone()).collect();
    eventually(
        "every delivery Processing",
        Duration::from_secs(30),
        || async {
            for url in &urls {
                let document: StatusDocument = app.client.status(url).await.json().await.ok()?;
                (document.state == DeliveryState::Processing).then_some(())?;
            }
            Some(())
        },
    )
    .await;
    app.embedded().faults().fail_writes(true);
    let tally = &app.app.tally;
    eventually(
        "every event handed back at least once",
        Duration::from_secs(60),
        || async { (tally.nacked.load(Ordering::Relaxed) >= 20).then_some(()) },
    )
    .await;
    app.embedded().faults().fail_writes(false);
    app.expect_all_scheduled_once(&urls, Duration::from_secs(120))
        .await;
    let nacked = tally.nacked.load(Ordering::Relaxed);
    let rewound = rewinds(partitions) - rewinds_before;
    println!("handed back {nacked} times; partitions read again {rewound} times (in this process)");
    assert!(rewound >= 1, "the partitions were read again");
    app.app.stop().await.unwrap();
}
