//! (10) The fleet phases, `fleet-kafka` and `fleet-eventhubs`: what each
//! process costs past one machine's shape, on one stream.
//!
//! 1. All in one (gateway and worker in this process, the simulated services
//!    in their own at 20 ms) on the embedded stream and store: the baseline,
//!    the end-to-end phase's shape.
//! 2. The same on the stream (tansu, or the Event Hubs test broker, each a
//!    process of its own, reached directly), status on the embedded store:
//!    the rate against (1); then (1) again, posted at the rate (2) ran at,
//!    and Skyport's CPU per workflow against that: the embedded store's
//!    group commit carries fewer writes a commit at a lower rate, so the
//!    CPU a workflow costs depends on the rate as well as on the stream.
//! 3. The same with status on Cosmos DB (the SDK's emulator served over
//!    HTTP, a process of its own) and callbacks on, their change-feed
//!    processor reading every status write as the fleet's workers do: what
//!    a fleet worker is compared with.
//! 4. The gateway alone on the stream and Cosmos DB, in this process: printed
//!    beside what a fleet gateway is compared with (5).
//! 5. The fleet as the Helm chart installs it (`skyport_tests::fleet`): one
//!    gateway and 1, 2 and 3 workers as processes of the real binaries, its
//!    own broker and emulator, the services at 20 ms; a backlog posted at
//!    once with the workers stopped, then drained, each process's CPU time
//!    and peak memory read from `/proc`, the broker's, the emulator's and
//!    the services' apart; and the capacity plan's prediction for the same
//!    shape's drain beside what it measured. Just before each run, the same
//!    fleet without workers takes the same backlog: its gateway alone, a
//!    process of its own, what the run's gateway is held against.

mod chart;
mod results;

pub(crate) use chart::chart;
pub(crate) use results::{FleetPhase, FleetRun, GatewayAlone, StreamRun};

use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use skyport_core::status::StatusDocument;
use skyport_tests::kafka::Broker;

use skyport::plan::{self, Costs, Shape};

use crate::bench::{BODY, Bench, SERVICE_LATENCY_MS, micros_to_terminal};
use crate::cpu::CpuTime;
use crate::memory;
use crate::phases::cosmos_cost::{cosmos_keys, spent_by_processes};
use crate::poster::{self, Schedule};
use crate::servers::GatewayOnly;
use skyport_tests::fleet::servers::Server;
use skyport_tests::fleet::shape::{API_KEY, CALLBACK_SECRET, Stream, change_feed_timings};
use skyport_tests::fleet::{Fleet, HUB_PARTITIONS, HUBS, KAFKA_PARTITIONS, Member, Options};

/// Partitions of the all-in-one runs' streams, as many as the embedded stream's.
const PARTITIONS: u32 = 8;
/// The hubs of the all-in-one runs on Event Hubs: two of four partitions each.
const AIO_HUB_PARTITIONS: u32 = 4;
/// The connections the fleet phases post over, as the end-to-end phase.
const CONNECTIONS: u32 = 64;
/// A SAS connection string for the Event Hubs test broker, which takes any key.
const BENCH_CONNECTION_STRING: &str = "Endpoint=sb://skyport-bench.servicebus.windows.net/;SharedAccessKeyName=bench;SharedAccessKey=YmVuY2gta2V5";
/// `worker.max_in_flight` of the chart's CI values, which the fleet runs.
const FLEET_MAX_IN_FLIGHT: u32 = 128;
/// How long a fleet stays idle before a run, for what its processes spend idle.
const IDLE: Duration = Duration::from_secs(5);
/// Deliveries a fleet run follows one at a time, once idle, for a workflow's latency.
const LATENCY_PROBES: u32 = 10;
/// How long a fleet run's workers may stay stopped while its backlog is
/// posted (a fleet's gateway took its 20,000 requests in 2 to 9 s here).
const PAUSE: Duration = Duration::from_secs(15);
/// How often a fleet run reads its workers' counts.
const SAMPLE: Duration = Duration::from_millis(200);

/// The stream's broker of the all-in-one runs, a process of its own.
#[derive(Debug)]
enum StreamServer {
    Kafka(Broker),
    EventHubs(Server),
}

impl StreamServer {
    fn pid(&self) -> u32 {
        match self {
            Self::Kafka(broker) => broker.pid(),
            Self::EventHubs(server) => server.pid(),
        }
    }
}

impl Bench {
    /// (10): the phase on `stream`.
    pub(crate) async fn fleet(&self, stream: Stream) -> anyhow::Result<FleetPhase> {
        let name = stream.name();
        let embedded = self
            .end_to_end_on(&format!("fleet-{name}-embedded"), &[])
            .await?;
        let runs = ["aio", "aio-cosmos", "gateway"];
        let broker = match stream {
            Stream::Kafka => StreamServer::Kafka(Broker::start_direct(&runs, PARTITIONS).await),
            Stream::EventHubs => {
                let hubs: Vec<String> = runs
                    .iter()
                    .flat_map(|run| (0..2).map(move |h| format!("{run}-{h}:{AIO_HUB_PARTITIONS}")))
                    .collect();
                let mut role = vec!["eventhubs"];
                role.extend(hubs.iter().map(String::as_str));
                StreamServer::EventHubs(Server::start(&role).await)
            }
        };
        let on = |run: &str| stream_keys(&broker, run);
        let on_stream = self
            .stream_run(
                &format!("fleet-{name}-stream"),
                on("aio"),
                &broker,
                None,
                self.plan.end_to_end,
            )
            .await?;
        // The embedded stream at the rate the stream ran at: group commit
        // groups fewer writes a commit at a lower rate, so Skyport's CPU per
        // workflow is compared at one rate, not at each stream's own.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a rate of a few thousand a second"
        )]
        let stream_rate = on_stream.end_to_end.workflows_per_s.round().max(1.0) as u32;
        let embedded_paced = self
            .end_to_end_of(
                &format!("fleet-{name}-embedded-paced"),
                &[],
                self.plan.end_to_end,
                Some(stream_rate),
            )
            .await?;
        let cosmos = Server::start(&["cosmos"]).await;
        let mut keys = on("aio-cosmos");
        keys.extend(cosmos_keys(&cosmos.address));
        // Callbacks on, as in the fleet: the change-feed processor reads every status write.
        keys.push(("callbacks.secrets", format!("[\"{CALLBACK_SECRET}\"]")));
        keys.extend(change_feed_timings());
        let on_cosmos = self
            // As many as a fleet drains: the emulator slows as a container grows.
            .stream_run(
                &format!("fleet-{name}-cosmos"),
                keys,
                &broker,
                Some(&cosmos),
                self.plan.fleet_requests,
            )
            .await?;
        // On the same stream and store as a fleet's gateway, a database of its own.
        let mut keys = on("gateway");
        keys.extend(cosmos_keys(&cosmos.address));
        keys.push(("cosmos.database", "gateway-alone".to_owned()));
        let gateway_alone = self.gateway_on_stream(name, keys, &broker).await?;
        cosmos.stop().await;
        drop(broker);
        let mut runs = Vec::new();
        for workers in self.plan.fleet_workers.clone() {
            runs.push(self.fleet_run(stream, workers).await?);
        }
        predict(stream, &mut runs);
        Ok(FleetPhase {
            stream: name.to_owned(),
            embedded,
            embedded_paced: Some(embedded_paced),
            on_stream,
            on_cosmos,
            gateway_alone,
            runs,
        })
    }

    /// All in one on the stream `keys` name; the broker's (and the
    /// emulator's) CPU time over the run, apart.
    async fn stream_run(
        &self,
        phase: &str,
        keys: Vec<(&'static str, String)>,
        broker: &StreamServer,
        cosmos: Option<&Server>,
        requests: u64,
    ) -> anyhow::Result<StreamRun> {
        let before = (
            CpuTime::of(broker.pid())?,
            cosmos.map(|c| CpuTime::of(c.pid())).transpose()?,
        );
        let end_to_end = self.end_to_end_of(phase, &keys, requests, None).await?;
        let per_workflow = |s: f64| s * 1e6 / end_to_end.completed.max(1) as f64;
        let broker_cpu_us_per_workflow =
            per_workflow(CpuTime::of(broker.pid())?.since(before.0).own_s);
        let emulator_cpu_us_per_workflow = match (cosmos, before.1) {
            (Some(cosmos), Some(before)) => {
                Some(per_workflow(CpuTime::of(cosmos.pid())?.since(before).own_s))
            }
            _ => None,
        };
        Ok(StreamRun {
            end_to_end,
            broker_cpu_us_per_workflow,
            emulator_cpu_us_per_workflow,
        })
    }

    /// The gateway alone on the stream: distinct requests posted closed loop,
    /// its CPU time per accepted request. It asks for an API key, as the
    /// chart's gateways do, and each request carries the fleet's.
    async fn gateway_on_stream(
        &self,
        name: &str,
        mut keys: Vec<(&'static str, String)>,
        broker: &StreamServer,
    ) -> anyhow::Result<GatewayAlone> {
        let requests = self.plan.end_to_end;
        eprintln!(
            "fleet on {name}: the gateway alone, {requests} requests at {CONNECTIONS} connections"
        );
        keys.extend([
            ("gateway.auth.enabled", "true".to_owned()),
            ("gateway.auth.api_keys.portal.key", API_KEY.to_owned()),
            (
                "gateway.auth.api_keys.portal.scopes",
                "[\"deliveries.read\", \"deliveries.write\"]".to_owned(),
            ),
        ]);
        memory::reset_peak()?;
        let gateway =
            GatewayOnly::start(&self.settings(&format!("fleet-{name}-gateway"), &keys)?).await?;
        let before = (CpuTime::this()?, CpuTime::of(broker.pid())?);
        let posted = poster::post_with_key(
            &gateway.url,
            Schedule::Requests(requests),
            CONNECTIONS,
            API_KEY,
        )
        .await?;
        let own = CpuTime::this()?.since(before.0).own_s;
        let broker_s = CpuTime::of(broker.pid())?.since(before.1).own_s;
        let peak_rss_mib = memory::peak_mib()?;
        gateway.stop().await?;
        let accepted = posted.status("202");
        Ok(GatewayAlone {
            requests,
            accepted,
            accepted_per_s: accepted as f64 / posted.seconds,
            cpu_us_per_request: own * 1e6 / accepted.max(1) as f64,
            broker_cpu_us_per_request: broker_s * 1e6 / accepted.max(1) as f64,
            peak_rss_mib,
        })
    }

    /// One gateway and `workers` workers as the chart installs them: a
    /// backlog of `fleet_requests` posted at once, then drained.
    async fn fleet_run(&self, stream: Stream, workers: usize) -> anyhow::Result<FleetRun> {
        let requests = self.plan.fleet_requests;
        let name = stream.name();
        eprintln!("fleet on {name}: 1 gateway, {workers} workers, {requests} requests");
        let mut options = Options::new(1, workers);
        options.service_latency_ms = SERVICE_LATENCY_MS;
        // As the all-in-one runs call them.
        options.keys.push(("services.protocol", "h2c".to_owned()));
        // A worker stopped while the backlog is posted keeps its partitions
        // and leases: expiries well past the pause.
        let expiry = (2 * PAUSE.as_millis()).to_string();
        options.keys.extend([
            ("kafka.session_timeout_ms", expiry.clone()),
            ("eventhubs.partition_expiration_ms", expiry.clone()),
            ("change_feed.expiry_ms", expiry),
        ]);
        let gateway_alone_us = self
            .gateway_process_alone(stream, &options, requests)
            .await?;
        let fleet = Fleet::start(stream, &options).await;
        fleet.wait_spread(Duration::from_secs(120)).await;
        let gateway = &fleet.gateways[0];
        let (broker_pid, emulator_pid) = fleet.server_pids();
        let pids: Vec<u32> = [
            gateway.pid(),
            broker_pid,
            emulator_pid,
            fleet.simulator.pid(),
        ]
        .into_iter()
        .chain(fleet.workers.iter().map(|w| w.pid()))
        .collect();
        let cpu_now = || {
            pids.iter()
                .map(|pid| CpuTime::of(*pid))
                .collect::<anyhow::Result<Vec<_>>>()
        };
        // What each process spends with nothing to do (leases, polls,
        // metrics), before the load.
        let idle_before = cpu_now()?;
        tokio::time::sleep(IDLE).await;
        let before = cpu_now()?;
        let idle: Vec<f64> = before
            .iter()
            .zip(&idle_before)
            .map(|(now, then)| now.since(*then).own_s / IDLE.as_secs_f64())
            .collect();
        // The poster is the only child waited for meanwhile.
        let poster_before = CpuTime::this()?;
        let url = format!("{}/api/deliveryrequests", gateway.base);
        // The backlog is posted with the workers stopped (for at most
        // `PAUSE`), so the gateway takes it on the cores as the gateway alone
        // does, not beside workers draining it; its CPU once the last request
        // is answered is what it spent taking them. Then the workers drain it.
        let workers_pids: Vec<u32> = fleet.workers.iter().map(Member::pid).collect();
        let started = Instant::now();
        signal(&workers_pids, Signal::SIGSTOP)?;
        let post = poster::post_with_key(&url, Schedule::Requests(requests), CONNECTIONS, API_KEY);
        tokio::pin!(post);
        let within_pause = tokio::time::timeout(PAUSE, &mut post).await;
        let gateway_posted = CpuTime::of(gateway.pid());
        let resumed = (Instant::now(), cpu_now()?);
        signal(&workers_pids, Signal::SIGCONT)?;
        let post = async {
            match within_pause {
                Ok(posted) => (posted, true),
                Err(_) => (post.await, false),
            }
        };
        let sample = async {
            let deadline = started + self.plan.drain_timeout;
            let (mut in_flight, mut samples) = (0.0, 0u32);
            loop {
                tokio::time::sleep(SAMPLE).await;
                let done = terminal(&fleet).await;
                if done.0 + done.1 >= requests || Instant::now() >= deadline {
                    break (done, in_flight / f64::from(samples.max(1)));
                }
                in_flight += fleet.workers_metric("skyport_events_in_flight{").await;
                samples += 1;
            }
        };
        let ((posted, posted_in_pause), ((scheduled, failed), mean_in_flight)) =
            tokio::join!(post, sample);
        let (seconds, drain_s) = (
            started.elapsed().as_secs_f64(),
            resumed.0.elapsed().as_secs_f64(),
        );
        let posted = posted?;
        // Past the pause, the gateway's CPU while it posted is not apart.
        let gateway_posting_s = posted_in_pause
            .then(|| gateway_posted.map(|cpu| cpu.since(before[0]).own_s))
            .transpose()?;
        let end = cpu_now()?;
        let since = |from: &[CpuTime]| -> Vec<f64> {
            end.iter()
                .zip(from)
                .map(|(end, from)| end.since(*from).own_s)
                .collect()
        };
        let (cpu, drain) = (since(&before), since(&resumed.1));
        let poster_s = CpuTime::this()?.since(poster_before).children_s;
        let rss: Vec<f64> = pids
            .iter()
            .map(|pid| memory::peak_mib_of(*pid))
            .collect::<anyhow::Result<_>>()?;
        let workflow_latency_ms = probe_latency(&gateway.base).await?;
        let request_units = spent_by_processes(fleet.gateways.iter().chain(&fleet.workers)).await;
        fleet.stop().await;
        let completed = scheduled + failed;
        let accepted = posted.status("202");
        let per_workflow = |s: f64| s * 1e6 / completed.max(1) as f64;
        Ok(FleetRun {
            workers,
            requests,
            accepted,
            completed,
            failed,
            seconds,
            drain_s,
            posting_s: posted.seconds,
            accepted_per_s: accepted as f64 / posted.seconds,
            workflows_per_s: completed as f64 / drain_s,
            gateway_cpu_us_per_request: cpu[0] * 1e6 / accepted.max(1) as f64,
            gateway_posting_cpu_us_per_request: gateway_posting_s
                .map(|s| s * 1e6 / accepted.max(1) as f64),
            gateway_alone_cpu_us_per_request: Some(gateway_alone_us),
            worker_cpu_us_per_workflow: per_workflow(cpu[4..].iter().sum()),
            broker_cpu_us_per_workflow: per_workflow(cpu[1]),
            emulator_cpu_us_per_workflow: per_workflow(cpu[2]),
            services_cpu_us_per_workflow: per_workflow(cpu[3]),
            poster_cpu_us_per_workflow: per_workflow(poster_s),
            // The poster is done by then (unless the posting outlasted the
            // pause): the other processes are the broker, the emulator and
            // the services.
            drain_gateway_cpu_us_per_workflow: per_workflow(drain[0]),
            drain_others_cpu_us_per_workflow: per_workflow(drain[1..4].iter().sum()),
            gateway_idle_cores: idle[0],
            workers_idle_cores: idle[4..].iter().sum(),
            gateway_rss_mib: rss[0],
            worker_rss_mib: rss[4..].iter().copied().fold(0.0, f64::max),
            mean_in_flight,
            workflow_latency_ms,
            workflow_overhead_ms: workflow_latency_ms - 5.0 * SERVICE_LATENCY_MS as f64,
            predicted_workflows_per_s: 0.0,
            predicted_seconds: 0.0,
            request_units,
        })
    }

    /// The fleet's gateway with no workers beside it, just before a run: the
    /// same binary, configuration, broker and emulator as the run's gateway,
    /// `requests` posted with its API key; its CPU time per accepted
    /// request. The run's gateway is held against this rather than only
    /// against the gateway alone in this process minutes earlier: this
    /// machine's speed moves from minute to minute (the same gateway's CPU a
    /// request by a third).
    async fn gateway_process_alone(
        &self,
        stream: Stream,
        options: &Options,
        requests: u64,
    ) -> anyhow::Result<f64> {
        let name = stream.name();
        eprintln!("fleet on {name}: its gateway alone, {requests} requests");
        let mut options = options.clone();
        options.workers = 0;
        let fleet = Fleet::start(stream, &options).await;
        let gateway = &fleet.gateways[0];
        let url = format!("{}/api/deliveryrequests", gateway.base);
        tokio::time::sleep(IDLE).await;
        let before = CpuTime::of(gateway.pid())?;
        let posted =
            poster::post_with_key(&url, Schedule::Requests(requests), CONNECTIONS, API_KEY).await?;
        let own = CpuTime::of(gateway.pid())?.since(before).own_s;
        fleet.stop().await;
        Ok(own * 1e6 / posted.status("202").max(1) as f64)
    }
}

/// A workflow's time with the fleet idle, in ms: [`LATENCY_PROBES`]
/// deliveries posted one after another to the gateway at `base`, each read
/// until terminal (with reads that wait for it), then timed from its
/// status document's timestamps: from its acceptance to its terminal write.
/// (A read that waits answers up to `change_feed.poll_interval_ms` after
/// the write, on Cosmos DB.)
async fn probe_latency(base: &str) -> anyhow::Result<f64> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut total_us = 0.0;
    for n in 0..LATENCY_PROBES {
        let body = BODY
            .replace("\"pkg-1\"", &format!("\"pkg-probe-{n}\""))
            .replace("\"owner-1\"", &format!("\"owner-probe-{n}\""));
        let started = Instant::now();
        let response = http
            .post(format!("{base}/api/deliveryrequests"))
            .header("content-type", "application/json")
            .header("x-api-key", API_KEY)
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(
            response.status() == 202,
            "a latency probe got {}",
            response.status()
        );
        let accepted: serde_json::Value = response.json().await?;
        let url = accepted["statusUrl"]
            .as_str()
            .context("a 202 without a statusUrl")?;
        let status = &url[url.find("/api/").context("a statusUrl without /api/")?..];
        let document = loop {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(60),
                "a latency probe was not terminal within 60 s"
            );
            let document: StatusDocument = http
                .get(format!("{base}{status}&wait=10"))
                .header("x-api-key", API_KEY)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            if document.state.is_terminal() {
                break document;
            }
        };
        total_us += f64::from(micros_to_terminal(&document));
    }
    Ok(total_us / 1e3 / f64::from(LATENCY_PROBES))
}

/// What the capacity plan's model predicts for each run's drain: the costs
/// of the first run's (the fewest workers), each process's per workflow
/// while the workers drained (the gateway's then is what it spends idle),
/// in the shape of each, on the cores every process shares here.
fn predict(stream: Stream, runs: &mut [FleetRun]) {
    let Some(first) = runs.first() else {
        return;
    };
    let costs = Costs {
        gateway_cpu_us_per_request: first.drain_gateway_cpu_us_per_workflow,
        worker_cpu_us_per_workflow: first.worker_cpu_us_per_workflow,
        workflow_overhead_ms: first.workflow_overhead_ms.max(0.0),
        gateway_rss_mib: Some(first.gateway_rss_mib),
        worker_rss_mib: Some(first.worker_rss_mib),
        cosmos_ru: None,
    };
    let others = first.drain_others_cpu_us_per_workflow;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    for run in runs {
        let prediction = plan::predict(
            &costs,
            &Shape {
                workers: u32::try_from(run.workers).unwrap_or(u32::MAX),
                partitions: fleet_partitions(stream),
                max_in_flight: FLEET_MAX_IN_FLIGHT,
                cores_per_worker: cores,
                service_latency_ms: SERVICE_LATENCY_MS as f64,
                shared_cores: Some(cores),
                other_cpu_us_per_workflow: others,
                backlog: run.completed as f64,
            },
        );
        run.predicted_workflows_per_s = prediction.workflows_per_s;
        run.predicted_seconds = prediction.drain_s;
    }
}

/// Sends `signal` to each of `pids`.
fn signal(pids: &[u32], signal: Signal) -> anyhow::Result<()> {
    for pid in pids {
        let pid = Pid::from_raw(i32::try_from(*pid)?);
        nix::sys::signal::kill(pid, signal)
            .with_context(|| format!("cannot send {signal} to {pid}"))?;
    }
    Ok(())
}

/// Deliveries the fleet's workers brought to Scheduled, and to Failed.
async fn terminal(fleet: &Fleet) -> (u64, u64) {
    let count = |outcome: &str| format!("skyport_workflow_events_total{{outcome=\"{outcome}\"}}");
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (
        fleet.workers_metric(&count("scheduled")).await as u64,
        fleet.workers_metric(&count("failed")).await as u64,
    )
}

/// The keys of the all-in-one run `run` on `broker`: its own topic, or its
/// own two hubs, and its own consumer group (a group that another run left
/// would hold the next one's join back until its member expired).
fn stream_keys(broker: &StreamServer, run: &str) -> Vec<(&'static str, String)> {
    let group = ("worker.consumer_group", format!("bench-{run}"));
    let mut keys = match broker {
        StreamServer::Kafka(broker) => vec![
            ("stream.backend", "kafka".to_owned()),
            ("kafka.brokers", format!("[\"{}\"]", broker.address)),
            ("kafka.topics", format!("[\"{run}\"]")),
            // A group's first join here takes about half its session
            // timeout: 3 s rather than 23 s at the default 45 s, as the fleet.
            ("kafka.session_timeout_ms", "6000".to_owned()),
            ("kafka.drain_timeout_ms", "5000".to_owned()),
        ],
        StreamServer::EventHubs(server) => vec![
            ("stream.backend", "eventhubs".to_owned()),
            ("eventhubs.hubs", format!("[\"{run}-0\", \"{run}-1\"]")),
            ("eventhubs.auth", "connection_string".to_owned()),
            (
                "eventhubs.connection_string",
                format!("\"{BENCH_CONNECTION_STRING}\""),
            ),
            ("eventhubs.custom_endpoint", server.address.clone()),
            ("eventhubs.update_interval_ms", "1000".to_owned()),
        ],
    };
    keys.push(group);
    keys
}

/// The fleet's partitions on `stream` (`tests/fleet`'s topic and hubs).
fn fleet_partitions(stream: Stream) -> u32 {
    match stream {
        Stream::Kafka => KAFKA_PARTITIONS,
        Stream::EventHubs => u32::try_from(HUBS.len()).unwrap_or(u32::MAX) * HUB_PARTITIONS,
    }
}
