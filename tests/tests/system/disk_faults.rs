//! A disk that fails under the embedded stream (no space left, injected in
//! the log's file layer): the gateway answers 503 with `Retry-After` and a
//! problem, never a panic or a hang; appends resume when the fault clears,
//! and what was refused never reappears.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use skyport_core::status::DeliveryState;
use skyport_tests::{TestApp, delivery_request};

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
