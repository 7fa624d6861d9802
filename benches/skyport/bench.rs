//! The bench itself: [`Bench`], whose methods are the phases' runs (each in
//! its phase's file under `phases/`), with what they share: the body every
//! request carries, the simulated services' latency, the system they run, and
//! the helpers that read each delivery's time to terminal.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use skyport_core::ports::StartFrom;
use skyport_core::status::StatusDocument;
use skyport_runtime::config::Settings;

use crate::Plan;
use crate::load::{self, Load, Measured};
use crate::servers::{self, AllInOne, Simulated};

/// The body every request carries: the README's example.
pub(crate) const BODY: &str = r#"{"ownerId":"owner-1","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","packageInfo":{"packageId":"pkg-1","size":"Small","weight":2.5}}"#;

/// How long each simulated service takes to answer.
pub(crate) const SERVICE_LATENCY_MS: u64 = 20;

/// The connections the open-loop phases send over (oha or the poster): at
/// 10,000 requests/s, answers may take 25 ms before a request waits for a
/// connection (its wait counts in its latency either way).
pub(crate) const OPEN_LOOP_CONNECTIONS: u32 = 256;

/// Partitions of the Kafka phase's topic, as many as the embedded stream's.
pub(crate) const KAFKA_PARTITIONS: u32 = 8;

/// A phase's process: the load generator, the plan, and the data
/// directory its stores open in.
pub(crate) struct Bench {
    pub(crate) oha: PathBuf,
    pub(crate) plan: Plan,
    pub(crate) data: PathBuf,
}

impl Bench {
    pub(crate) async fn load(&self, url: &str, load: Load) -> anyhow::Result<Measured> {
        load::run(self.oha.clone(), url.to_owned(), BODY.to_owned(), load).await
    }

    pub(crate) fn closed_loop(&self, connections: u32) -> Load {
        Load {
            connections,
            duration: self.plan.closed_loop,
            rate: None,
        }
    }

    /// The embedded default with a fresh data directory for `phase`.
    pub(crate) fn settings(
        &self,
        phase: &str,
        keys: &[(&str, String)],
    ) -> anyhow::Result<Settings> {
        servers::settings(&self.data.join(phase), keys)
    }

    /// Gateway and worker, with the simulated services (20 ms per call) in
    /// a process of their own; stop both with [`Bench::stop`].
    ///
    /// The calls go over HTTP/2 (`services.protocol` h2c).
    ///
    /// The worker runs at nice 0 here: the poster and the services stand in
    /// for other machines, and a worker yielding the CPU to them (as it
    /// yields to its own gateway, `worker.nice`) would measure the two cores'
    /// sharing, not the worker. The all-in-one phase keeps the default.
    pub(crate) async fn system(
        &self,
        phase: &str,
        rate_limit_per_s: u32,
        extra: &[(&str, String)],
    ) -> anyhow::Result<(AllInOne, Simulated)> {
        let services = Simulated::start(SERVICE_LATENCY_MS).await?;
        let mut keys = vec![
            ("services.base_url", services.url.clone()),
            ("worker.rate_limit_per_s", rate_limit_per_s.to_string()),
            ("worker.nice", "0".to_owned()),
        ];
        // The simulated services speak HTTP/2 over cleartext, so the bench
        // configures it, as an operator would for services that do; a
        // `SKYPORT__SERVICES__PROTOCOL` variable chooses otherwise.
        if std::env::var_os("SKYPORT__SERVICES__PROTOCOL").is_none() {
            keys.push(("services.protocol", "h2c".to_owned()));
        }
        keys.extend_from_slice(extra);
        let settings = self.settings(phase, &keys)?;
        Ok((AllInOne::start(settings).await?, services))
    }

    pub(crate) async fn stop(system: AllInOne, services: Simulated) -> anyhow::Result<()> {
        system.stop().await?;
        services.stop().await
    }

    /// Waits until every request accepted so far, and every event in the
    /// stream (a request whose answer was lost on the way still counts), is
    /// terminal; how long that took. Accepted means durable: one still not
    /// terminal after `plan.drain_timeout` counts as lost, and fails the phase.
    pub(crate) async fn drain(&self, system: &AllInOne, accepted: u64) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let durable = system.published().max(accepted);
            let terminal = system.terminal();
            if terminal >= durable {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(
                started.elapsed() < self.plan.drain_timeout,
                "all in one: {} of {durable} accepted requests lost (not terminal after {} s; \
                 {} Scheduled, {} Failed)",
                durable - terminal,
                self.plan.drain_timeout.as_secs(),
                system.scheduled(),
                system.failed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// As users run it, the worker is up before the load comes: a phase's
    /// clock starts once it reads every partition (on Kafka, after the
    /// group's first join and rebalance).
    pub(crate) async fn await_partitions(
        phase: &str,
        system: &AllInOne,
        partitions: u32,
    ) -> anyhow::Result<()> {
        let joining = Instant::now();
        while system.partitions_read() < partitions as usize {
            anyhow::ensure!(
                joining.elapsed() < Duration::from_secs(120),
                "the worker read {} of {partitions} partitions after 120 s",
                system.partitions_read()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "{phase}: the worker reads all {partitions} partitions after {:.1} s",
            joining.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Each terminal delivery's time from its acceptance (`createdAt`, the time
/// the gateway stamped on its event) to its terminal write (`updatedAt`), in
/// microseconds.
pub(crate) async fn terminal_times(system: &AllInOne) -> anyhow::Result<Vec<u32>> {
    Ok(terminal_documents(system)
        .await?
        .iter()
        .map(micros_to_terminal)
        .collect())
}

/// A terminal delivery's time from its acceptance to its terminal write, in microseconds.
pub(crate) fn micros_to_terminal(document: &StatusDocument) -> u32 {
    let micros = (document.updated_at - document.created_at).whole_microseconds();
    u32::try_from(micros.max(0)).unwrap_or(u32::MAX)
}

/// Every terminal delivery's status document, the last version of each, read
/// through the store's change feed.
pub(crate) async fn terminal_documents(system: &AllInOne) -> anyhow::Result<Vec<StatusDocument>> {
    let changes = system.app.backends.store.changes();
    let mut documents = HashMap::new();
    for range in changes.ranges().await? {
        let mut from: Option<String> = None;
        loop {
            let page = changes
                .read(&range, from.as_deref(), StartFrom::Beginning, 10_000)
                .await?;
            if page.changes.is_empty() && page.skipped == 0 {
                break;
            }
            for change in page.changes {
                let document: StatusDocument = serde_json::from_value(change.document)?;
                if document.state.is_terminal() {
                    documents.insert(document.id.clone(), document);
                }
            }
            from = Some(page.continuation);
        }
    }
    Ok(documents.into_values().collect())
}
