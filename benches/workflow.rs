//! `cargo bench --bench workflow`: how fast the worker completes workflows.
//!
//! The whole system runs in one process on the embedded store, with the five
//! simulated services at 20 ms per call. The backlog is appended straight to
//! the stream through the `Publisher` port (the worker cannot tell how events
//! arrived), so the figures are the worker's, not the HTTP ingest's.
//!
//! 1. Throughput, rate limiter off: completed workflows/s over the whole run
//!    and in the best 1 s window.
//! 2. Rate limit at 1,000/s with a backlog far larger than that: workflows
//!    completed in a 10 s window against 10,000, and the backlog left after it.
//!
//! A benchmark, not a test: it prints numbers and asserts nothing about speed.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use skyport_shared::event::{DeliveryRequested, Event};
use skyport_tests::{TestApp, delivery_request, test_settings};
use time::OffsetDateTime;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        throughput(20_000).await;
        rate_limited(1_000).await;
    });
}

async fn app(rate_limit_per_s: u32) -> (tempfile::TempDir, TestApp) {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.simulator.latency_ms = 20;
    settings.simulator.jitter_ms = 0;
    settings.worker.rate_limit_per_s = rate_limit_per_s;
    settings.worker.checkpoint_interval_ms = 1_000;
    let app = TestApp::spawn_with(settings).await;
    (dir, app)
}

/// Appends `count` delivery requests to the stream, 256 at a time.
async fn preload(app: &TestApp, count: usize) -> Duration {
    let started = Instant::now();
    let publisher = Arc::clone(&app.app.backends.publisher);
    let mut appends = tokio::task::JoinSet::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(count.div_ceil(256)) {
        let publisher = Arc::clone(&publisher);
        let chunk = chunk.to_vec();
        appends.spawn(async move {
            for n in chunk {
                let request = serde_json::from_value(delivery_request(n)).unwrap();
                let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
                    delivery_id: format!("delivery-{n}"),
                    accepted_at: OffsetDateTime::now_utc(),
                    traceparent: None,
                    idempotency_key: None,
                    request,
                }));
                publisher.publish(event.outbound()).await.unwrap();
            }
        });
    }
    appends.join_all().await;
    started.elapsed()
}

async fn throughput(deliveries: usize) {
    let (_dir, app) = app(0).await;
    let counters = app.app.counters.clone();
    let started = Instant::now();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        loop {
            let done = counters.scheduled.load(Ordering::Relaxed);
            samples.push(done);
            if done >= deliveries as u64 {
                return samples;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let preloaded = preload(&app, deliveries).await;
    let samples = sampler.await.unwrap();
    let elapsed = started.elapsed();
    let best_second = samples
        .windows(11)
        .map(|w| w[10] - w[0])
        .max()
        .unwrap_or_default();
    println!(
        "workflow throughput: {deliveries} deliveries, 5 services at 20 ms per call, rate limit off: \
         {:.0} workflows/s ({:.1} s in all; appending them took {:.1} s); best 1 s window {best_second}",
        deliveries as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
        preloaded.as_secs_f64(),
    );
    print_commits(&app, elapsed);
    app.app.stop().await.unwrap();
}

async fn rate_limited(rate: u32) {
    let (_dir, app) = app(rate).await;
    let backlog = rate as usize * 20;
    preload(&app, backlog).await;
    // Let the limiter settle, then count over exactly 10 s.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counters = &app.app.counters;
    let before = counters.scheduled.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = counters.scheduled.load(Ordering::Relaxed);
    let done = after - before;
    let target = u64::from(rate) * 10;
    println!(
        "rate limit {rate}/s: {done} workflows in 10 s against {target} ({:+.2} %); {} of the {backlog} backlog still waiting",
        (done as f64 - target as f64) * 100.0 / target as f64,
        backlog as u64 - after,
    );
    app.app.stop().await.unwrap();
}

/// How the embedded store's group commit grouped: commits, writes per commit.
fn print_commits(app: &TestApp, elapsed: Duration) {
    let stats = app.app.backends.embedded.as_ref().unwrap().commit_stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    let operations = stats.operations.load(Ordering::Relaxed);
    println!(
        "  embedded store: {commits} commits ({:.0}/s) carrying {operations} writes ({:.1} per commit)",
        commits as f64 / elapsed.as_secs_f64(),
        operations as f64 / commits.max(1) as f64
    );
}
