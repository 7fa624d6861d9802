//! The scale phase's rows, as issue 50's table has them, and what fails the run.

use super::{Scale, SerialPart, Spike, Tenth};
use crate::phases::{CEILING_TARGET, Verdict, describe, latency};

impl Scale {
    /// The rows of issue 50's table, in its order.
    pub(crate) fn verdicts(&self) -> Vec<Verdict> {
        let mut verdicts = vec![
            self.ingest_verdict(),
            self.spike_verdict("opened before it", &self.opened),
            self.spike_verdict("opened as it starts", &self.fresh),
        ];
        verdicts.extend(self.drain_verdicts());
        verdicts.push(self.serial_verdict());
        verdicts.push(self.sustained_verdict());
        verdicts
    }

    fn ingest_verdict(&self) -> Verdict {
        let ratio = self.ingest.requests_per_s / self.ceiling.requests_per_s.max(f64::MIN_POSITIVE);
        Verdict {
            what: format!(
                "scale: ingest with the worker on, closed loop at {} connections",
                self.connections
            ),
            measured: format!(
                "{:.0}/s against the bare handler's {:.0}/s: {ratio:.2} ×; {}; not 202: {}",
                self.ingest.requests_per_s,
                self.ceiling.requests_per_s,
                latency(self.ingest.latency.as_ref()),
                describe(&self.ingest.other_than("202"))
            ),
            target: "(16 cores: 0.45 ×, p99 7.4 ms)",
            met: None,
        }
    }

    fn spike_verdict(&self, what: &str, spike: &Spike) -> Verdict {
        let accepted = spike.posted.status("202");
        Verdict {
            what: format!(
                "scale: a spike of {}/s for {:.0} s on {} connections {what}",
                self.spike_rate, self.spike_seconds, self.spike_connections
            ),
            measured: format!(
                "{accepted} of {} → 202 ({:.0}/s sent); {}; not 202: {}; {} in the stream",
                spike.posted.requests,
                spike.posted.requests_per_s,
                latency(spike.posted.latency.as_ref()),
                describe(&spike.posted.other_than("202")),
                spike.published
            ),
            target: "every request 202, none lost",
            met: Some(accepted == spike.posted.requests && spike.published >= accepted),
        }
    }

    /// The backlog worked off, its last tenth against its first, and the
    /// cores by thread.
    fn drain_verdicts(&self) -> [Verdict; 3] {
        let drain = &self.drain;
        let (first, last) = (drain.tenths.first(), drain.tenths.last());
        let ratio = |of: fn(&Tenth) -> f64| match (first, last) {
            (Some(f), Some(l)) => of(l) / of(f).max(f64::MIN_POSITIVE),
            _ => 0.0,
        };
        let cpu_ratio = ratio(|t| t.cpu_us);
        [
            Verdict {
                what: "scale: the spike's backlog worked off".into(),
                measured: format!(
                    "{} in {:.1} s: {:.0} workflows/s (first tenth {:.0}/s, last {:.0}/s), {:.0} µs of \
                     the process's CPU a workflow; {} Scheduled, {} Failed",
                    drain.backlog,
                    drain.seconds,
                    drain.backlog as f64 / drain.seconds.max(f64::MIN_POSITIVE),
                    first.map_or(0.0, |t| t.workflows_per_s),
                    last.map_or(0.0, |t| t.workflows_per_s),
                    drain.cores * drain.seconds * 1e6 / drain.backlog.max(1) as f64,
                    drain.scheduled,
                    drain.failed
                ),
                target: "(16 cores: about 5,800/s)",
                met: None,
            },
            Verdict {
                what: "scale: the drain's last tenth against its first".into(),
                measured: format!(
                    "{cpu_ratio:.3} × the CPU a workflow ({:.0} against {:.0} µs), {:.3} × the rate",
                    last.map_or(0.0, |t| t.cpu_us),
                    first.map_or(0.0, |t| t.cpu_us),
                    ratio(|t| t.workflows_per_s)
                ),
                target: "CPU within 10 %",
                met: Some((cpu_ratio - 1.0).abs() <= 0.1),
            },
            Verdict {
                what: "scale: cores busy while the backlog is worked off, by thread".into(),
                measured: format!(
                    "{:.2} of {} cores: {}; the committer busy {:.0} % of the time",
                    drain.cores,
                    std::thread::available_parallelism().map_or(0, usize::from),
                    drain
                        .threads
                        .iter()
                        .take(8)
                        .map(|t| format!("{} ({}) {:.2}", t.name, t.count, t.cores))
                        .collect::<Vec<_>>()
                        .join(", "),
                    drain.committer_busy * 100.0
                ),
                target: "(16 cores: 9.2 busy)",
                met: None,
            },
        ]
    }

    fn serial_verdict(&self) -> Verdict {
        let serial = &self.drain.serial;
        let judged: Vec<&SerialPart> = serial.iter().filter(|p| p.judged).collect();
        let lowest = judged
            .iter()
            .map(|p| p.ceiling())
            .fold(f64::INFINITY, f64::min);
        let shown = |p: &SerialPart| {
            let count = if p.count > 1 {
                format!(" ({})", p.count)
            } else {
                String::new()
            };
            let note = if p.judged {
                ""
            } else {
                " (group commit: at this rate, not saturated)"
            };
            format!(
                "{}{count} {:.1} µs → {:.0}/s{note}",
                p.part,
                p.us,
                p.ceiling()
            )
        };
        Verdict {
            what: "scale: serial parts, µs a workflow and the ceiling it sets".into(),
            measured: serial.iter().map(shown).collect::<Vec<_>>().join("; "),
            target: "≥ 15,000/s each",
            met: Some(!judged.is_empty() && lowest >= CEILING_TARGET),
        }
    }

    fn sustained_verdict(&self) -> Verdict {
        let sustained = &self.sustained;
        Verdict {
            what: format!(
                "scale: {}/s for {:.0} s, open loop, the worker beside it",
                sustained.rate, sustained.seconds
            ),
            measured: format!(
                "{} of {} → 202; {}; not 202: {}; taken {:.0}/s, worked off {:.0}/s, the backlog \
                 growing {:.0}/s ({} at the end)",
                sustained.posted.status("202"),
                sustained.posted.requests,
                latency(sustained.posted.latency.as_ref()),
                describe(&sustained.posted.other_than("202")),
                sustained.taken_per_s,
                sustained.worked_off_per_s,
                sustained.backlog_slope,
                sustained.backlog_at_end
            ),
            target: "every request 202; worked off as fast as taken",
            met: Some(
                sustained.posted.status("202") == sustained.posted.requests
                    && sustained.worked_off_per_s >= 0.98 * sustained.taken_per_s,
            ),
        }
    }

    /// What fails the run: anything accepted and not durable, or Failed; in
    /// a smoke run, a part that accepted nothing.
    pub(crate) fn failures(&self, full: bool) -> Vec<String> {
        let mut failures = Vec::new();
        let parts = [
            ("ingest", &self.ingest, self.ingest_published),
            (
                "the spike on opened connections",
                &self.opened.posted,
                self.opened.published,
            ),
            (
                "the spike on new connections",
                &self.fresh.posted,
                self.fresh.published,
            ),
            (
                "the sustained rate",
                &self.sustained.posted,
                self.sustained.published,
            ),
        ];
        for (what, posted, published) in parts {
            let accepted = posted.status("202");
            if published < accepted {
                failures.push(format!(
                    "scale, {what}: {accepted} accepted but {published} in the stream"
                ));
            }
            if !full && accepted == 0 {
                failures.push(format!("scale, {what}: nothing accepted"));
            }
        }
        if self.drain.failed > 0 {
            failures.push(format!(
                "scale: {} of the spike's deliveries Failed",
                self.drain.failed
            ));
        }
        failures
    }
}
