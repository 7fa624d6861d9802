//! Callbacks survive a SIGKILL: the real binary is killed while every
//! callback is still being retried against a receiver that is down, and
//! started again on the same data directory once the receiver is back. Every
//! delivery's callback reaches the receiver (at least once, signed) and every
//! status document records it Delivered.
//!
//! The receiver runs in this test process, so what it recorded outlives the
//! killed child.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyport_core::status::{CallbackState, DeliveryState, StatusDocument};
use skyport_tests::webhooks::{
    Behaviour, Receiver, message_ids, post_with_callbacks, verify_with_python,
};
use skyport_tests::{CONCURRENCY, ChildApp, Client};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::configured_args;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const REQUESTS: usize = 200;
/// How long the receiver answers 503: long enough for the first process to
/// schedule every delivery and try each callback at least once, and to be
/// killed with time to spare before the receiver comes back, with the other
/// process tests running beside it on two busy cores (12 s left one run
/// 4 of 200 callbacks short).
const OUTAGE: Duration = Duration::from_secs(24);
/// The margin the kill must leave before the outage ends, so that every POST
/// the first process made was answered 503.
const KILL_MARGIN: Duration = Duration::from_secs(2);
/// How long a change-feed lease that is not renewed stays its owner's.
const LEASE_EXPIRY: Duration = Duration::from_secs(60);
/// How long the restarted process gets to deliver every callback: well under
/// [`LEASE_EXPIRY`], so it cannot pass by waiting for the dead owner's lease
/// to expire.
const REDELIVERY_WAIT: Duration = Duration::from_secs(40);

/// The configuration file of both processes.
///
/// Both run under the same `change_feed.instance_name`, as a pod of a
/// StatefulSet or a service restarted in place would: the restarted process
/// finds the lease the killed one held still recorded as its own and takes
/// it back at once, instead of waiting out `expiry_ms` (its default name,
/// host and process id, would differ from the killed one's). The expiry is
/// left long ([`LEASE_EXPIRY`]) and the wait after the restart bounded well
/// below it, so the test fails if that immediate takeover does not happen.
fn config() -> String {
    format!(
        r#"
[simulator]
latency_ms = 1

[worker]
checkpoint_interval_ms = 200

[callbacks]
secrets = ["{SECRET}"]
allow = ["127.0.0.0/8"]
retry_for_ms = 120000
backoff_initial_ms = 100
backoff_max_ms = 1000

[change_feed]
instance_name = "callbacks-crash-test"
poll_interval_ms = 100
acquire_interval_ms = 500
renew_interval_ms = 1000
expiry_ms = {expiry}
estimate_interval_ms = 500
"#,
        expiry = LEASE_EXPIRY.as_millis()
    )
}

/// The status documents behind `urls`, in order.
async fn documents(client: &Client, urls: &[String]) -> Vec<StatusDocument> {
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut gets = JoinSet::new();
    for (i, url) in urls.iter().enumerate() {
        let (client, url) = (client.clone(), url.clone());
        let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
        gets.spawn(async move {
            let response = client.status(&url).await;
            assert_eq!(response.status(), 200, "{url}");
            let document: StatusDocument = response.json().await.unwrap();
            drop(permit);
            (i, document)
        });
    }
    let mut documents = gets.join_all().await;
    documents.sort_by_key(|(i, _)| *i);
    documents.into_iter().map(|(_, d)| d).collect()
}

/// Polls the documents behind `urls` until `done` holds for every one;
/// panics with `what` and the first one it does not hold for after `within`.
async fn wait_for_documents(
    client: &Client,
    urls: &[String],
    what: &str,
    within: Duration,
    done: impl Fn(&StatusDocument) -> bool,
) -> Vec<StatusDocument> {
    let deadline = Instant::now() + within;
    loop {
        let documents = documents(client, urls).await;
        let Some(waiting) = documents.iter().find(|d| !done(d)) else {
            return documents;
        };
        assert!(
            Instant::now() < deadline,
            "{} of {} documents are not {what} after {within:?}; for one: state {:?}, callback {:?}",
            documents.iter().filter(|d| !done(d)).count(),
            documents.len(),
            waiting.state,
            waiting.callback
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the document's Scheduled state has a callback outcome in `state`.
fn callback_is(document: &StatusDocument, state: CallbackState) -> bool {
    document.state == DeliveryState::Scheduled
        && document
            .callback
            .as_ref()
            .is_some_and(|c| c.announced == DeliveryState::Scheduled && c.state == state)
}

/// POSTs per message id in `received`.
fn per_id(received: &[skyport_tests::webhooks::Received]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for callback in received {
        *counts.entry(callback.id.as_str()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_pending_at_a_kill_are_all_delivered_after_the_restart() {
    let started = Instant::now();
    let binary = Path::new(env!("CARGO_BIN_EXE_skyport"));
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("skyport.toml");
    std::fs::write(&config_file, config()).unwrap();
    let data = dir.path().join("data");
    let up_at = Instant::now() + OUTAGE;
    let receiver = Receiver::start(
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        Behaviour::UnavailableUntil(up_at),
    )
    .await;

    let first = ChildApp::spawn(
        binary,
        &configured_args(&config_file, &data),
        dir.path().join("first.log"),
    )
    .await;
    let urls = post_with_callbacks(&first.client, REQUESTS, None, |n| {
        receiver.url("127.0.0.1", &format!("d{n}"))
    })
    .await;
    assert_eq!(urls.len(), REQUESTS);
    // Every delivery Scheduled, and its callback tried and failed at least
    // once: the notifier records Pending on its first retry.
    let scheduled = wait_for_documents(
        &first.client,
        &urls,
        "Scheduled with their callback Pending",
        OUTAGE - KILL_MARGIN * 2,
        |d| callback_is(d, CallbackState::Pending),
    )
    .await;
    // And retried: every callback was POSTed at least twice.
    let retry_deadline = up_at - KILL_MARGIN * 2;
    while per_id(&receiver.received())
        .values()
        .filter(|n| **n >= 2)
        .count()
        < REQUESTS
    {
        assert!(
            Instant::now() < retry_deadline,
            "the callbacks were not all retried during the outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<String> = scheduled.iter().map(|d| d.id.clone()).collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        REQUESTS,
        "each delivery has an id of its own"
    );
    first.kill().await;
    let killed_at = Instant::now();
    assert!(
        killed_at + KILL_MARGIN < up_at,
        "the first process was killed {:?} before the receiver came back; \
         its POSTs may have been acknowledged",
        up_at.saturating_duration_since(killed_at)
    );
    // Restart once the receiver answers again. Everything the killed
    // process sent arrived before it died, during the outage: a 503.
    tokio::time::sleep(
        up_at.saturating_duration_since(Instant::now()) + Duration::from_millis(100),
    )
    .await;
    let before = receiver.received();
    let refused_ids = per_id(&before);
    assert_eq!(
        refused_ids.len(),
        REQUESTS,
        "every callback was tried (and refused) before the kill; none was acknowledged"
    );
    let restarted_at = Instant::now();
    let second = ChildApp::spawn(
        binary,
        &configured_args(&config_file, &data),
        dir.path().join("second.log"),
    )
    .await;
    // Each delivery's Scheduled callback, by the delivery it names.
    let expected: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let deadline = restarted_at + REDELIVERY_WAIT;
    let after = loop {
        let received = receiver.received();
        let acknowledged: BTreeSet<String> = received[before.len()..]
            .iter()
            .map(|r| r.message().0)
            .collect();
        if expected.iter().all(|id| acknowledged.contains(*id)) {
            break received[before.len()..].to_vec();
        }
        assert!(
            Instant::now() < deadline,
            "{} of {REQUESTS} callbacks were acknowledged within {REDELIVERY_WAIT:?} of the restart \
             (the lease expires after {LEASE_EXPIRY:?}); see {}",
            expected
                .iter()
                .filter(|id| acknowledged.contains(**id))
                .count(),
            second.stderr.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let acknowledged_in = restarted_at.elapsed();
    let delivered = wait_for_documents(
        &second.client,
        &urls,
        "recording their callback Delivered",
        deadline.saturating_duration_since(Instant::now()),
        |d| callback_is(d, CallbackState::Delivered),
    )
    .await;
    let recorded_in = restarted_at.elapsed();
    let log = second.terminate().await;
    let acquired: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Acquired a change-feed lease"))
        .collect();
    assert!(
        acquired.iter().any(|l| l.contains("callbacks-crash-test")),
        "the restarted process took the lease back from its former self: {acquired:?}"
    );
    let received = receiver.received();
    receiver.stop().await;

    let acked_ids = per_id(&after);
    let duplicate_acks: usize = acked_ids.values().map(|n| n - 1).sum();
    let recorded_attempts: u32 = delivered
        .iter()
        .map(|d| d.callback.as_ref().map_or(0, |c| c.attempts))
        .sum();
    let across = refused_ids
        .keys()
        .filter(|id| acked_ids.contains_key(*id))
        .count();
    println!(
        "callbacks across a SIGKILL: {REQUESTS} deliveries; {} POSTs in all; \
         before the kill {} POSTs (all 503) for {} distinct ids; \
         after the restart {} POSTs (all 2xx) for {} distinct ids, {duplicate_acks} duplicate acknowledgements; \
         {across} ids POSTed by both processes; killed {:?} before the receiver came back; \
         all acknowledged {acknowledged_in:?} and all recorded Delivered {recorded_in:?} after the restart; \
         the documents record {recorded_attempts} attempts in all; {:?} in all",
        received.len(),
        before.len(),
        refused_ids.len(),
        after.len(),
        acked_ids.len(),
        up_at.saturating_duration_since(killed_at),
        started.elapsed(),
    );
    for callback in &after {
        let body = callback.json();
        assert_eq!(body["type"], "delivery.scheduled", "{body}");
        assert_eq!(body["data"]["state"], "Scheduled", "{body}");
        assert!(
            expected.contains(body["data"]["id"].as_str().unwrap()),
            "{body}"
        );
    }
    // One opaque id a message, the same from the killed process and the restarted one.
    assert_eq!(message_ids(&received).len(), REQUESTS);
    for document in &delivered {
        let outcome = document.callback.as_ref().unwrap();
        assert!(
            outcome.delivered_at.is_some() && outcome.last_error.is_none(),
            "{}: {outcome:?}",
            document.id
        );
        // One attempt recorded by the killed process (its Pending), at least
        // one more by the restarted one: the count carries across the crash.
        assert!(outcome.attempts >= 2, "{}: {outcome:?}", document.id);
    }
    assert_eq!(
        verify_with_python(SECRET, &received),
        received.len(),
        "every callback, refused or acknowledged, verifies"
    );
}
