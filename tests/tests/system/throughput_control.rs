//! Cosmos DB throughput control groups on the SDK's in-memory emulator with
//! its throttling on: how close the achieved request units per second come
//! to a group's target (local, a fraction of the offer, and a global group
//! shared by three processes that come and go), the priority a group buys
//! for status reads under a flood of status writes, and a client's status
//! read refused by its group as 503 + Retry-After.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use skyport_azure::cosmos::CosmosStore;
use skyport_azure::cosmos::emulator::Emulator;
use skyport_azure::cosmos::request_units::Operation;
use skyport_core::ports::{Precondition, StatusStore, StatusStoreError};
use skyport_core::status::StatusDocument;
use skyport_runtime::config::{CosmosSettings, GroupScope, Millis, ThroughputGroupSettings, Work};
use skyport_tests::{TestApp, delivery_request, test_settings};
use time::OffsetDateTime;
use tokio::task::JoinSet;

fn group(work: &[Work]) -> ThroughputGroupSettings {
    ThroughputGroupSettings {
        container: "status".into(),
        work: work.to_vec(),
        ..ThroughputGroupSettings::default()
    }
}

fn settings(throughput: u32, groups: &[(&str, ThroughputGroupSettings)]) -> CosmosSettings {
    CosmosSettings {
        bulk_max_wait_ms: Millis::new(5),
        throughput: Some(throughput),
        throughput_groups: groups
            .iter()
            .map(|(name, group)| ((*name).to_owned(), group.clone()))
            .collect::<BTreeMap<_, _>>(),
        ..CosmosSettings::default()
    }
}

/// `writers` tasks creating status documents as fast as the store takes
/// them: a backlog of the worker's status writes.
fn flood(store: &Arc<CosmosStore>, writers: usize, name: &str) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for writer in 0..writers {
        let store = Arc::clone(store);
        let name = name.to_owned();
        tasks.spawn(async move {
            for n in 0.. {
                let id = format!("{name}-{writer}-{n}");
                let document = StatusDocument::accepted(id, OffsetDateTime::UNIX_EPOCH);
                StatusStore::put(&*store, &document, Precondition::IfNoneMatch)
                    .await
                    .unwrap();
            }
        });
    }
    tasks
}

/// Request units charged to `group` in this store so far.
fn spent(store: &CosmosStore, group: &str) -> f64 {
    store
        .throughput_groups()
        .into_iter()
        .find(|g| g.name == group)
        .unwrap()
        .spent
}

/// RU/s each store spent on `group` over `window`.
async fn rates(stores: &[&Arc<CosmosStore>], group: &str, window: Duration) -> Vec<f64> {
    let before: Vec<f64> = stores.iter().map(|s| spent(s, group)).collect();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let seconds = started.elapsed().as_secs_f64();
    stores
        .iter()
        .zip(before)
        .map(|(s, before)| (spent(s, group) - before) / seconds)
        .collect()
}

fn within(measured: f64, target: f64, tolerance: f64) -> bool {
    (measured - target).abs() <= target * tolerance
}

/// One process's group `bulk` on a container of `container_ru` under 64
/// writers: asserts its budget, then RU/s within 10 % of it over `window`,
/// requests held rather than sent, and no 429 from the emulator.
async fn holds_its_budget(
    bulk: ThroughputGroupSettings,
    container_ru: u32,
    budget: f64,
    window: Duration,
) {
    let emulator = Emulator::new(true).unwrap();
    let store = emulator
        .store(&settings(container_ru, &[("bulk", bulk)]))
        .await
        .unwrap();
    assert_eq!(store.throughput_groups()[0].budget, Some(budget));
    let mut writers = flood(&store, 64, "writer");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rate = rates(&[&store], "bulk", window).await[0];
    writers.abort_all();
    let report = store.throughput_groups().remove(0);
    let throttled = store.request_units().throttled_count();
    println!(
        "a group of {budget} RU/s on a {container_ru} RU/s container, 64 writers: {rate:.1} RU/s \
         over {window:?} ({:+.1} %), {} requests held for a later cycle, {throttled} 429s from the emulator",
        (rate / budget - 1.0) * 100.0,
        report.delayed
    );
    assert!(within(rate, budget, 0.10), "{rate:.1} RU/s");
    assert!(report.delayed > 0, "the backlog was held, not sent");
    assert_eq!(throttled, 0, "the emulator answered no 429");
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_group_holds_the_worker_within_ten_percent_of_its_target() {
    let bulk = ThroughputGroupSettings {
        target_ru_per_s: Some(200),
        ..group(&[Work::StatusWrites])
    };
    holds_its_budget(bulk, 1_000, 200.0, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarter_of_a_1200_ru_container_is_300_ru_per_second() {
    let bulk = ThroughputGroupSettings {
        target_fraction: Some(0.25),
        ..group(&[Work::StatusWrites])
    };
    holds_its_budget(bulk, 1_200, 300.0, Duration::from_secs(15)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_a_global_group_and_take_over_the_share_of_one_that_goes() {
    let shared = ThroughputGroupSettings {
        target_ru_per_s: Some(600),
        scope: GroupScope::Global,
        ..group(&[Work::StatusWrites])
    };
    let settings = settings(4_000, &[("bulk", shared)]);
    let renew = settings.throughput_control.renew_interval_ms.duration();
    let expire = settings.throughput_control.expire_interval_ms.duration();
    let emulator = Emulator::new(true).unwrap();
    let a = emulator.store(&settings).await.unwrap();
    let b = emulator.store(&settings).await.unwrap();
    let c = emulator.store(&settings).await.unwrap();
    let mut flooding = [flood(&a, 32, "a"), flood(&b, 32, "b"), flood(&c, 32, "c")];

    tokio::time::sleep(renew * 3).await;
    let three = rates(&[&a, &b, &c], "bulk", Duration::from_secs(15)).await;
    let total: f64 = three.iter().sum();
    println!("three processes: {three:.1?} RU/s, total {total:.1}");
    for rate in &three {
        assert!(within(*rate, 200.0, 0.15), "{three:?}");
    }
    assert!(within(total, 600.0, 0.10), "{total}");

    // C stops: it removes its item, and A and B take its share.
    flooding[2].abort_all();
    c.close().await;
    tokio::time::sleep(renew * 3).await;
    let two = rates(&[&a, &b], "bulk", Duration::from_secs(15)).await;
    let total: f64 = two.iter().sum();
    println!("C stopped: {two:.1?} RU/s, total {total:.1}");
    for rate in &two {
        assert!(within(*rate, 300.0, 0.15), "{two:?}");
    }
    assert!(within(total, 600.0, 0.10), "{total}");

    // B is killed: its item stays until it expires, then A has it all.
    flooding[1].abort_all();
    b.halt_throughput_control();
    tokio::time::sleep(expire + renew + Duration::from_secs(1)).await;
    let one = rates(&[&a], "bulk", Duration::from_secs(10)).await[0];
    println!("B killed: A {one:.1} RU/s after B's item expired");
    assert!(within(one, 600.0, 0.15), "{one}");
    assert_eq!(a.throughput_groups()[0].share, 1.0);
    for store in [&a, &b, &c] {
        assert_eq!(store.request_units().throttled_count(), 0);
    }
    flooding[0].abort_all();
    a.close().await;
}

/// Reads one status document every 10 ms for `window`: the latencies of
/// those answered, and how many were refused.
async fn poll(store: &Arc<CosmosStore>, id: &str, window: Duration) -> (Vec<Duration>, usize) {
    let mut latencies = Vec::new();
    let mut refused = 0;
    let started = Instant::now();
    while started.elapsed() < window {
        let began = Instant::now();
        match StatusStore::get(&**store, id).await {
            Ok(found) => {
                assert!(found.is_some());
                latencies.push(began.elapsed());
            }
            Err(StatusStoreError::Unavailable(_)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    latencies.sort();
    (latencies, refused)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What a flood of status writes did, and the status reads beside it.
#[derive(Debug)]
struct Flooded {
    read_p50: Duration,
    read_p99: Duration,
    refused: usize,
    writes_per_s: u64,
    service_429s: u64,
    /// Document requests that asked for (High, Low) priority.
    priorities: (u64, u64),
}

/// Status reads every 10 ms for 10 s while 64 writers flood a 400 RU/s container.
async fn reads_under_a_write_flood(groups: &[(&str, ThroughputGroupSettings)]) -> Flooded {
    let emulator = Emulator::new(true).unwrap();
    let store = emulator.store(&settings(400, groups)).await.unwrap();
    let document = StatusDocument::accepted("polled".to_owned(), OffsetDateTime::UNIX_EPOCH);
    StatusStore::put(&*store, &document, Precondition::IfNoneMatch)
        .await
        .unwrap();
    let mut writers = flood(&store, 64, "flood");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (written_before, _) = store.request_units().spent(Operation::Write);
    let throttled_before = store.request_units().throttled_count();
    let (latencies, refused) = poll(&store, "polled", Duration::from_secs(10)).await;
    writers.abort_all();
    let (written, _) = store.request_units().spent(Operation::Write);
    let flooded = Flooded {
        read_p50: percentile(&latencies, 0.5),
        read_p99: percentile(&latencies, 0.99),
        refused,
        writes_per_s: (written - written_before) / 10,
        service_429s: store.request_units().throttled_count() - throttled_before,
        priorities: emulator.wire().by_priority(),
    };
    store.close().await;
    flooded
}

/// The emulator charges point reads but never throttles them (only writes
/// meet its per-partition budget), so there the flood cannot delay reads
/// through 429s; what the groups change there is that the writes stay
/// under the container's limit, and that every request says its priority,
/// which a real account uses to throttle the low-priority writes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_priority_writes_leave_room_for_high_priority_reads() {
    let without = reads_under_a_write_flood(&[]).await;
    let bulk = ThroughputGroupSettings {
        target_fraction: Some(0.25),
        ..group(&[Work::StatusWrites])
    };
    let clients = ThroughputGroupSettings {
        priority: Some(skyport_runtime::config::Priority::High),
        ..group(&[Work::StatusReads])
    };
    let with = reads_under_a_write_flood(&[("bulk", bulk), ("clients", clients)]).await;
    for (what, flooded) in [("without groups", &without), ("with groups", &with)] {
        println!(
            "a flood of status writes on 400 RU/s, {what}: status reads p50 {:?} p99 {:?} ({} refused); \
             {} writes/s, {} 429s from the emulator; requests asking for (high, low) priority {:?}",
            flooded.read_p50,
            flooded.read_p99,
            flooded.refused,
            flooded.writes_per_s,
            flooded.service_429s,
            flooded.priorities
        );
    }
    // The bound: a status read's p99 stays within 50 ms under the flood.
    assert_eq!(with.refused, 0);
    assert!(with.read_p99 <= Duration::from_millis(50), "{with:?}");
    assert!(without.service_429s > 0, "{without:?}");
    // The writes stay under the container's limit (the emulator's 1 s
    // windows are not the group's cycles: two cycles' writes to one physical
    // partition may meet in one window, rarely).
    assert!(
        with.service_429s * 100 <= with.writes_per_s * 10,
        "at most 1 % of the writes throttled by the emulator: {with:?}"
    );
    let (high, low) = with.priorities;
    assert!(
        high >= 500,
        "every status read asks for high priority: {with:?}"
    );
    assert!(
        low >= with.writes_per_s * 10,
        "every status write asks for low priority: {with:?}"
    );
    assert_eq!(without.priorities, (0, 0), "no group, no priority header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_read_over_its_groups_budget_is_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.cosmos = self::settings(
        1_000,
        &[(
            "clients",
            ThroughputGroupSettings {
                target_ru_per_s: Some(2),
                ..group(&[Work::StatusReads])
            },
        )],
    );
    let app = TestApp::spawn_on_cosmos(settings).await;
    let accepted = app.client.post_delivery(&delivery_request(1)).await;
    // Once its document exists (the emulator charges nothing for a read
    // that finds none), thirty reads at once meet the group's 2 RU in the
    // same cycle.
    app.client
        .wait_for_terminal(
            std::slice::from_ref(&accepted.status_url),
            Duration::from_secs(60),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reads = (0..30).map(|_| async {
        let response = app.client.status(&accepted.status_url).await;
        (
            response.status().as_u16(),
            response.headers().get("retry-after").cloned(),
        )
    });
    let answers = futures_util::future::join_all(reads).await;
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 503)
        .collect();
    println!(
        "thirty status reads at once on a 2 RU/s group: {} answered, {} refused with 503",
        answers.len() - refused.len(),
        refused.len()
    );
    assert!(
        answers.iter().any(|(status, _)| *status == 200),
        "{answers:?}"
    );
    assert!(!refused.is_empty(), "{answers:?}");
    // The group's own wait, in whole seconds: its next cycle with budget.
    assert!(
        refused.iter().all(|(_, retry)| matches!(
            retry.as_ref().and_then(|v| v.to_str().ok()),
            Some("1" | "2")
        )),
        "{answers:?}"
    );
    let text = reqwest::get(format!("http://{}/metrics", app.app.gateway_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("skyport_throughput_group_throttled_total{group=\"clients\"}"),
        "{text}"
    );
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fraction_without_an_offer_fails_the_start_or_runs_uncontrolled_as_asked() {
    let emulator = Emulator::new(true).unwrap();
    let fraction = ThroughputGroupSettings {
        target_fraction: Some(0.5),
        ..group(&[Work::StatusWrites])
    };
    // Containers created with no throughput of their own: no offer to take a fraction of.
    let mut no_offer = settings(400, &[("bulk", fraction.clone())]);
    no_offer.throughput = None;
    let error = emulator.store(&no_offer).await.unwrap_err();
    let message = std::iter::successors(Some(&error as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .map(ToString::to_string)
    .collect::<Vec<_>>()
    .join(": ");
    println!("{message}");
    assert!(
        message.starts_with("cosmos.throughput_groups.bulk:"),
        "{message}"
    );
    assert!(message.contains("target_ru_per_s"), "{message}");

    // With an absolute target too, the group runs on it.
    let mut with_target = no_offer.clone();
    with_target
        .throughput_groups
        .get_mut("bulk")
        .unwrap()
        .target_ru_per_s = Some(100);
    let store = emulator.store(&with_target).await.unwrap();
    assert_eq!(store.throughput_groups()[0].budget, Some(100.0));
    store.close().await;

    // Asked to continue: the start goes on and the group's work is uncontrolled.
    let mut continuing = no_offer;
    continuing
        .throughput_groups
        .get_mut("bulk")
        .unwrap()
        .on_init_error = skyport_runtime::config::OnInitError::Continue;
    let store = emulator.store(&continuing).await.unwrap();
    let report = store.throughput_groups().remove(0);
    assert_eq!((report.budget, report.allocated), (None, None));
    let document = StatusDocument::accepted("uncontrolled".to_owned(), OffsetDateTime::UNIX_EPOCH);
    StatusStore::put(&*store, &document, Precondition::IfNoneMatch)
        .await
        .unwrap();
    store.close().await;
}
