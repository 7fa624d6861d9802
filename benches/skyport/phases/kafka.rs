//! (9) The Kafka phase: the gateway alone against the ceiling and end to end
//! with the stream on a local tansu broker (memory engine, installed as the
//! tests install it): Skyport's cost on Kafka, not a production broker's speed.

use serde::{Deserialize, Serialize};
use skyport_tests::kafka::Broker;

use crate::bench::{Bench, KAFKA_PARTITIONS};
use crate::load::Measured;
use crate::memory;
use crate::phases::end_to_end::EndToEnd;
use crate::phases::{Verdict, describe};
use crate::servers::{Ceiling, GatewayOnly};

/// The stream on Kafka (a local tansu broker on its memory engine: what
/// Skyport costs on Kafka, not what a production broker does).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct KafkaRun {
    pub(crate) partitions: u32,
    pub(crate) ingest: Vec<KafkaIngest>,
    pub(crate) end_to_end: EndToEnd,
}

/// The gateway alone on Kafka against the ceiling, at one connection count.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct KafkaIngest {
    pub(crate) connections: u32,
    pub(crate) ceiling: Measured,
    pub(crate) skyport: Measured,
    pub(crate) ratio: f64,
    pub(crate) peak_rss_mib: f64,
}

impl Bench {
    /// The stream on Kafka: a local tansu broker (memory engine) with
    /// [`KAFKA_PARTITIONS`] partitions; the gateway alone against the ceiling
    /// at each connection count, then end to end.
    pub(crate) async fn kafka(&self) -> anyhow::Result<KafkaRun> {
        // A topic per measurement, so none reads what another wrote.
        let topics: Vec<String> = self
            .plan
            .connections
            .iter()
            .map(|c| format!("ingest-{c}"))
            .chain(std::iter::once("end-to-end".to_owned()))
            .collect();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let broker = Broker::start(&names, KAFKA_PARTITIONS).await;
        let on_kafka = |topic: &str| -> (String, Vec<(&'static str, String)>) {
            (
                format!("kafka-{topic}"),
                vec![
                    ("stream.backend", "kafka".to_owned()),
                    ("kafka.brokers", format!("[\"{}\"]", broker.address)),
                    ("kafka.topics", format!("[\"{topic}\"]")),
                ],
            )
        };
        let mut ingest = Vec::new();
        for connections in self.plan.connections {
            eprintln!("Kafka: the ceiling, closed loop at {connections} connections");
            let ceiling = Ceiling::start().await?;
            let bare = self
                .load(&ceiling.url, self.closed_loop(connections))
                .await?;
            ceiling.stop().await?;
            eprintln!("Kafka: the gateway alone, closed loop at {connections} connections");
            memory::reset_peak()?;
            let (phase, keys) = on_kafka(&format!("ingest-{connections}"));
            let gateway = GatewayOnly::start(&self.settings(&phase, &keys)?).await?;
            let skyport = self
                .load(&gateway.url, self.closed_loop(connections))
                .await?;
            let peak_rss_mib = memory::peak_mib()?;
            gateway.stop().await?;
            ingest.push(KafkaIngest {
                connections,
                ratio: skyport.requests_per_s / bare.requests_per_s,
                ceiling: bare,
                skyport,
                peak_rss_mib,
            });
        }
        let (phase, keys) = on_kafka("end-to-end");
        let end_to_end = self.end_to_end_on(&phase, &keys).await?;
        Ok(KafkaRun {
            partitions: KAFKA_PARTITIONS,
            ingest,
            end_to_end,
        })
    }
}

impl KafkaRun {
    /// No targets: Skyport's cost on Kafka.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        for row in &self.ingest {
            verdicts.push(Verdict {
                what: format!(
                    "Kafka (tansu, memory engine, {} partitions): gateway alone at {} connections",
                    self.partitions, row.connections
                ),
                measured: format!(
                    "{:.0}/s against {:.0}/s: {:.2} × the ceiling; p50 {:.2} ms, p99 {:.2} ms; \
                     not 202: {}; peak RSS {:.0} MiB",
                    row.skyport.requests_per_s,
                    row.ceiling.requests_per_s,
                    row.ratio,
                    row.skyport.p50_ms,
                    row.skyport.p99_ms,
                    describe(&crate::load::other_than(
                        &row.skyport.statuses,
                        &row.skyport.errors,
                        "202"
                    )),
                    row.peak_rss_mib
                ),
                target: "(Skyport's cost on Kafka)",
                met: None,
            });
        }
        let e = &self.end_to_end;
        verdicts.push(Verdict {
            what: "Kafka: end to end, 5 services at 20 ms".into(),
            measured: format!(
                "{:.0} workflows/s Scheduled ({} in {:.1} s, {} Failed; best second {}); peak RSS {:.0} MiB",
                e.workflows_per_s, e.completed, e.seconds, e.failed, e.best_second, e.peak_rss_mib
            ),
            target: "(Skyport's cost on Kafka)",
            met: None,
        });
        verdicts
    }

    /// What fails the run: an accepted request not completed end to end, or
    /// one Failed; in a smoke run, nothing completed.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        let e = &self.end_to_end;
        if e.completed < e.accepted || e.failed > 0 || (!full && e.completed == 0) {
            failures.push(format!(
                "Kafka end to end: {} of {} accepted completed, {} Failed",
                e.completed, e.accepted, e.failed
            ));
        }
        failures
    }
}
