//! A real Prometheus for the tests (Debian's, installed on first use by
//! [`crate::tools::prometheus`]): [`Prometheus::scraping`] starts one on
//! 127.0.0.1 that scrapes targets each second, with `namespace` and `pod`
//! added by relabelling as a Kubernetes scrape adds them; [`selectors`]
//! finds every series selector in PromQL, so a test can ask the server
//! which of them match nothing.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::{eventually, tools};

/// A Prometheus server, killed when dropped.
#[derive(Debug)]
pub struct Prometheus {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    http: reqwest::Client,
    _server: Child,
}

/// A target to scrape: its `host:port`, and the `namespace` and `pod` its
/// series get.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub address: &'a str,
    pub namespace: &'a str,
    pub pod: &'a str,
}

impl Prometheus {
    /// Starts Prometheus on a free port of 127.0.0.1, its data and log in
    /// `dir`, scraping `targets` every second under job `skyport`.
    ///
    /// # Panics
    /// When Prometheus cannot be installed, or is not ready within 30 s.
    pub async fn scraping(targets: &[Target<'_>], dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap_or_else(|e| panic!("no free port: {e}"))
            .port();
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, scrape_config(targets))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
        let log = std::fs::File::create(dir.join("prometheus.log"))
            .unwrap_or_else(|e| panic!("cannot create the log in {}: {e}", dir.display()));
        let server = Command::new(tools::prometheus())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("the log: {e}")))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus: {e}"));
        let prometheus = Self {
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _server: server,
        };
        let ready = format!("{}/-/ready", prometheus.base);
        eventually("Prometheus ready", Duration::from_secs(30), || async {
            let answer = prometheus.http.get(&ready).send().await.ok()?;
            answer.status().is_success().then_some(())
        })
        .await;
        prometheus
    }

    /// The result of an instant query, as the API's `data.result`.
    ///
    /// # Panics
    /// When Prometheus does not answer it with success.
    pub async fn query(&self, promql: &str) -> Vec<Value> {
        let answer = self.api("query", &[("query", promql.to_owned())]).await;
        answer["result"].as_array().cloned().unwrap_or_default()
    }

    /// The series `selector` matches over the last 10 minutes.
    ///
    /// # Panics
    /// When Prometheus does not answer with success (a selector it cannot parse).
    pub async fn series(&self, selector: &str) -> Vec<Value> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let start = now.saturating_sub(600).to_string();
        let answer = self
            .api(
                "series",
                &[("match[]", selector.to_owned()), ("start", start)],
            )
            .await;
        answer.as_array().cloned().unwrap_or_default()
    }

    /// The `data` of the API's answer at `endpoint` to `parameters`.
    async fn api(&self, endpoint: &str, parameters: &[(&str, String)]) -> Value {
        let url = reqwest::Url::parse_with_params(
            &format!("{}/api/v1/{endpoint}", self.base),
            parameters,
        )
        .unwrap_or_else(|e| panic!("{endpoint} {parameters:?}: {e}"));
        let answer: Value = self
            .http
            .get(url.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(
            answer["status"], "success",
            "{endpoint} {parameters:?}: {answer}"
        );
        answer["data"].clone()
    }
}

/// The configuration: one job, its targets relabelled with their
/// `namespace` and `pod`.
fn scrape_config(targets: &[Target<'_>]) -> String {
    let mut config = String::from(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: skyport\n    static_configs:\n",
    );
    for target in targets {
        config.push_str(&format!(
            "      - targets: [\"{}\"]\n        labels: {{__meta_namespace: \"{}\", __meta_pod: \"{}\"}}\n",
            target.address, target.namespace, target.pod
        ));
    }
    config.push_str(
        "    relabel_configs:\n      - source_labels: [__meta_namespace]\n        target_label: namespace\n      - source_labels: [__meta_pod]\n        target_label: pod\n",
    );
    config
}

/// Every series selector in `promql` whose metric name starts with
/// `skyport_` or is `up`: the name with its `{…}` matchers, if any.
pub fn selectors(promql: &str) -> Vec<String> {
    let bytes = promql.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let c = bytes[at];
        if c == b'"' || c == b'\'' {
            at = skip_string(bytes, at);
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == b'_') {
            at += 1;
            continue;
        }
        let start = at;
        while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
            at += 1;
        }
        let name = &promql[start..at];
        let mut next = at;
        while next < bytes.len() && bytes[next] == b' ' {
            next += 1;
        }
        let is_series = name.starts_with("skyport_") || name == "up";
        if !is_series || bytes.get(next) == Some(&b'(') {
            continue;
        }
        if bytes.get(next) == Some(&b'{') {
            let end = matchers_end(bytes, next);
            found.push(format!("{name}{}", &promql[next..end]));
            at = end;
        } else {
            found.push(name.to_owned());
        }
    }
    found
}

/// The index after the string opened at `at`.
fn skip_string(bytes: &[u8], at: usize) -> usize {
    let quote = bytes[at];
    let mut i = at + 1;
    while i < bytes.len() && bytes[i] != quote {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The index after the `}` closing the matchers opened at `at`.
fn matchers_end(bytes: &[u8], at: usize) -> usize {
    let mut i = at + 1;
    while i < bytes.len() && bytes[i] != b'}' {
        i = if bytes[i] == b'"' {
            skip_string(bytes, i)
        } else {
            i + 1
        };
    }
    (i + 1).min(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::selectors;

    #[test]
    fn selectors_are_found_with_their_matchers_and_functions_are_not() {
        let promql = r#"histogram_quantile(0.99, sum by (le) (rate(skyport_http_request_duration_seconds_bucket{route="/api/{x}",class="2xx"}[5m]))) > 0.025 and on() (up{job="skyport"} == 1) or skyport_breaker_state == 2 unless "skyport_not_a_series""#;
        assert_eq!(
            selectors(promql),
            [
                r#"skyport_http_request_duration_seconds_bucket{route="/api/{x}",class="2xx"}"#,
                r#"up{job="skyport"}"#,
                "skyport_breaker_state",
            ]
        );
    }
}
