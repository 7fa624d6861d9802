//! The process's long-lived tasks, measured: each kind ([`Task`]) is
//! instrumented with a `tokio-metrics` `TaskMonitor`, and the exposition
//! shows the time its tasks spent in poll
//! (`skyport_task_poll_seconds_total{task}`), how many polls
//! (`skyport_task_polls_total{task}`) and how many run now
//! (`skyport_tasks{task}`). Such a task runs on one thread at a time, so it
//! is a serial part of every workflow it serves: its poll time per workflow
//! sets its ceiling, 10⁶ ÷ µs.

use std::sync::LazyLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio_metrics::TaskMonitor;

use crate::metrics;

/// A kind of long-lived task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// The worker's side of an HTTP/2 connection to the services: all its framing.
    H2cClient,
    /// The simulated services' side of an HTTP/2 connection.
    H2cServer,
    /// A partition's loop in the worker: reads, starts workflows, checkpoints.
    Partition,
}

impl Task {
    const ALL: [Self; 3] = [Self::H2cClient, Self::H2cServer, Self::Partition];

    /// Its `task` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::H2cClient => "h2c_client",
            Self::H2cServer => "h2c_server",
            Self::Partition => "partition",
        }
    }

    /// The monitor its tasks are instrumented with
    /// (`monitor().instrument(future)` before spawning it).
    pub fn monitor(self) -> &'static TaskMonitor {
        &monitors().0[self as usize]
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

/// One monitor per [`Task`], in the order of [`Task::ALL`].
#[derive(Debug)]
struct Monitors([TaskMonitor; 3]);

/// The monitors, registered in the process's exposition the first time one is read.
fn monitors() -> &'static Monitors {
    static MONITORS: LazyLock<&'static Monitors> = LazyLock::new(|| {
        let monitors: &'static Monitors =
            Box::leak(Box::new(Monitors(Task::ALL.map(|_| TaskMonitor::new()))));
        let mut registry = metrics::component();
        registry.register_collector(Box::new(monitors));
        metrics::global().register(registry);
        monitors
    });
    &MONITORS
}

impl Collector for &'static Monitors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let totals: Vec<_> = Task::ALL
            .iter()
            .map(|task| (task.as_str(), task.monitor().cumulative()))
            .collect();
        let mut metric = encoder.encode_descriptor(
            "task_poll_seconds",
            "Time the process's long-lived tasks spent in poll, by kind (each runs on one thread at a time)",
            None,
            MetricType::Counter,
        )?;
        for (task, total) in &totals {
            ConstCounter::new(total.total_poll_duration.as_secs_f64())
                .encode(metric.encode_family(&TaskLabels { task })?)?;
        }
        let mut metric = encoder.encode_descriptor(
            "task_polls",
            "Times the process's long-lived tasks were polled, by kind",
            None,
            MetricType::Counter,
        )?;
        for (task, total) in &totals {
            ConstCounter::new(total.total_poll_count)
                .encode(metric.encode_family(&TaskLabels { task })?)?;
        }
        let mut metric = encoder.encode_descriptor(
            "tasks",
            "Long-lived tasks running now, by kind",
            None,
            MetricType::Gauge,
        )?;
        for (task, total) in &totals {
            let running = total.instrumented_count.saturating_sub(total.dropped_count);
            ConstGauge::new(i64::try_from(running).unwrap_or(i64::MAX))
                .encode(metric.encode_family(&TaskLabels { task })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_monitored_tasks_polls_are_counted_and_shown() {
        let task = Task::H2cServer;
        let before = task.monitor().cumulative();
        let (tell, told) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(task.monitor().instrument(async move {
            let _ = told.await;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }));
        tokio::task::yield_now().await;
        tell.send(()).unwrap_or_default();
        running.await.unwrap_or_default();
        let after = task.monitor().cumulative();
        assert!(after.total_poll_count >= before.total_poll_count + 2);
        assert!(
            after.total_poll_duration - before.total_poll_duration
                >= std::time::Duration::from_millis(20)
        );
        let text = metrics::global().render();
        for series in [
            "skyport_task_poll_seconds_total{task=\"h2c_server\"}",
            "skyport_task_polls_total{task=\"partition\"}",
            "skyport_tasks{task=\"h2c_client\"}",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
    }
}
