//! Clients of the fleet: each request goes to the next gateway in the pool,
//! as a load balancer would send it, with an `Idempotency-Key`; a client
//! that loses its connection (or gets a 5xx) retries the same request, same
//! key, on the next gateway.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use serde_json::Value;
use skyport_callbacks::notify::MasterSecrets;
use skyport_core::status::{DeliveryState, StatusDocument};
use skyport_runtime::config::decode_secret;
use skyport_tests::delivery_request;
use skyport_tests::webhooks::{Receiver, verify_with_python};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::shape::{API_KEY, CALLBACK_SECRET};
use skyport_tests::fleet::Pool;

/// Requests in flight at once.
const CONCURRENCY: usize = 32;

/// One accepted request.
#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    pub(crate) id: String,
    /// The path and query of its status URL.
    pub(crate) status: String,
    /// Attempts it took (more than 1 when a gateway went away).
    pub(crate) attempts: u32,
}

/// The clients: a pool of gateways and a receiver for callbacks.
#[derive(Debug, Clone)]
pub(crate) struct Clients {
    pool: Pool,
    http: reqwest::Client,
    callbacks: String,
    next: Arc<AtomicUsize>,
    /// Request `n`'s pickup: the first's, and the spacing after it (unset:
    /// the request's own).
    pickups: Option<(time::OffsetDateTime, time::Duration)>,
}

impl Clients {
    pub(crate) fn new(pool: Pool, receiver: &Receiver) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("x-api-key", API_KEY.parse().unwrap());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .default_headers(headers)
            .build()
            .unwrap();
        Self {
            pool,
            http,
            callbacks: format!("http://{}/hooks", receiver.addr),
            next: Arc::default(),
            pickups: None,
        }
    }

    /// These clients, with request `n` picked up at `first` + `n` x `spacing`
    /// (its deadline two hours after).
    pub(crate) fn picked_up(self, first: time::OffsetDateTime, spacing: time::Duration) -> Self {
        Self {
            pickups: Some((first, spacing)),
            ..self
        }
    }

    /// The next gateway, round robin.
    fn gateway(&self) -> String {
        let pool = self.pool.read().unwrap();
        assert!(!pool.is_empty(), "no gateway in the pool");
        pool[self.next.fetch_add(1, Ordering::Relaxed) % pool.len()].clone()
    }

    /// Posts requests `tag`-`0..count`, each with a callback, `CONCURRENCY`
    /// at a time, at most `per_s` a second when given.
    pub(crate) async fn post(&self, tag: &str, count: usize, per_s: Option<u32>) -> Vec<Accepted> {
        let permits = Arc::new(Semaphore::new(CONCURRENCY));
        let mut posts = JoinSet::new();
        let started = Instant::now();
        for n in 0..count {
            if let Some(rate) = per_s {
                let due = started + Duration::from_secs_f64(n as f64 / f64::from(rate));
                tokio::time::sleep_until(due.into()).await;
            }
            let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
            let clients = self.clone();
            let id = format!("{tag}-{n}");
            posts.spawn(async move {
                let accepted = clients.post_one(&id, n).await;
                drop(permit);
                accepted
            });
        }
        posts.join_all().await
    }

    /// One request, retried on the next gateway with the same key until one answers 202.
    async fn post_one(&self, id: &str, n: usize) -> Accepted {
        let mut request = delivery_request(n);
        request["deliveryId"] = Value::String(id.to_owned());
        request["packageInfo"]["packageId"] = Value::String(format!("package-{id}"));
        request["callbackUrl"] = Value::String(format!("{}/{id}", self.callbacks));
        if let Some((first, spacing)) = self.pickups {
            let rfc3339 = |at: time::OffsetDateTime| {
                Value::String(
                    at.format(&time::format_description::well_known::Rfc3339)
                        .unwrap(),
                )
            };
            let pickup = first + spacing * u32::try_from(n).unwrap();
            request["pickupTime"] = rfc3339(pickup);
            request["deadline"] = rfc3339(pickup + time::Duration::hours(2));
        }
        let key = format!("key-{id}");
        let started = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let sent = self
                .http
                .post(format!("{}/api/deliveryrequests", self.gateway()))
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .body(request.to_string())
                .send()
                .await;
            match sent {
                Ok(response) if response.status() == 202 => {
                    let body: Value = response.json().await.unwrap();
                    let url = body["statusUrl"].as_str().unwrap();
                    let status = url[url.find("/api/").unwrap()..].to_owned();
                    return Accepted {
                        id: id.to_owned(),
                        status,
                        attempts,
                    };
                }
                Ok(response) if response.status().is_server_error() => {}
                Ok(response) => panic!(
                    "{id}: {} {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                ),
                Err(_) => {}
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{id}: no gateway accepted it within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The status document behind `accepted`, from any gateway; `None` while none answers.
    async fn status(&self, accepted: &Accepted) -> Option<StatusDocument> {
        let response = self
            .http
            .get(format!("{}{}", self.gateway(), accepted.status))
            .send()
            .await
            .ok()?;
        if response.status().is_server_error() {
            return None;
        }
        assert_eq!(response.status(), 200, "{}", accepted.id);
        response.json().await.ok()
    }

    /// Waits (at most `within`) until every delivery of `accepted` is in `state`.
    pub(crate) async fn wait_state(
        &self,
        accepted: &[Accepted],
        state: DeliveryState,
        within: Duration,
    ) {
        let started = Instant::now();
        let mut pending: Vec<Accepted> = accepted.to_vec();
        while !pending.is_empty() {
            assert!(
                started.elapsed() < within,
                "{} of {} not {state:?} after {within:?} (the first: {})",
                pending.len(),
                accepted.len(),
                pending[0].id
            );
            let mut left = Vec::new();
            for one in pending {
                let document = self.status(&one).await;
                if document.is_none_or(|d| d.state != state) {
                    left.push(one);
                }
            }
            pending = left;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Waits (at most `within`) until every delivery is terminal; their
    /// documents. Every request asks for a callback, which comes once its
    /// delivery is terminal: a status is read once its callback has come, so
    /// that polling thousands of them does not take the CPU the fleet needs.
    pub(crate) async fn wait_terminal(
        &self,
        receiver: &Receiver,
        accepted: &[Accepted],
        within: Duration,
    ) -> Vec<StatusDocument> {
        let started = Instant::now();
        let mut done: BTreeMap<usize, StatusDocument> = BTreeMap::new();
        loop {
            let called: BTreeSet<String> = receiver
                .received()
                .iter()
                .map(|hit| hit.message().0)
                .collect();
            let pending: Vec<usize> = (0..accepted.len())
                .filter(|i| !done.contains_key(i))
                .collect();
            if pending.is_empty() {
                return done.into_values().collect();
            }
            assert!(
                started.elapsed() < within,
                "{} of {} deliveries not terminal after {within:?} (the first: {})",
                pending.len(),
                accepted.len(),
                accepted[pending[0]].id
            );
            let permits = Arc::new(Semaphore::new(CONCURRENCY));
            let mut polls = JoinSet::new();
            for i in pending
                .into_iter()
                .filter(|i| called.contains(&accepted[*i].id))
            {
                let clients = self.clone();
                let one = accepted[i].clone();
                let permit = Arc::clone(&permits).acquire_owned().await.unwrap();
                polls.spawn(async move {
                    let document = clients.status(&one).await;
                    drop(permit);
                    (i, document)
                });
            }
            for (i, document) in polls.join_all().await {
                if let Some(document) = document.filter(|d| d.state.is_terminal()) {
                    done.insert(i, document);
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The secret the receiver of the chart's API key, `portal`, verifies its
/// callbacks with: derived from the fleet's master secret.
fn portal_secret() -> String {
    let master = decode_secret(CALLBACK_SECRET).unwrap();
    MasterSecrets::new(&[master])
        .unwrap()
        .principal_secrets("portal")[0]
        .expose_secret()
        .to_owned()
}

/// Every document is Scheduled.
pub(crate) fn assert_scheduled(documents: &[StatusDocument]) {
    for document in documents {
        assert_eq!(document.state, DeliveryState::Scheduled, "{document:?}");
    }
}

/// Waits (at most `within`) until the receiver holds a callback for each of
/// `accepted`; asserts that each came once and that every one verifies.
pub(crate) async fn expect_callbacks_once(
    receiver: &Receiver,
    accepted: &[Accepted],
    within: Duration,
) {
    let started = Instant::now();
    let wanted: BTreeSet<&str> = accepted.iter().map(|a| a.id.as_str()).collect();
    loop {
        let received = receiver.received();
        let mut per_delivery: BTreeMap<String, usize> = BTreeMap::new();
        for hit in &received {
            let id = hit.json()["data"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if wanted.contains(id.as_str()) {
                *per_delivery.entry(id).or_default() += 1;
            }
        }
        if per_delivery.len() == wanted.len() {
            let twice: Vec<_> = per_delivery.iter().filter(|(_, n)| **n > 1).collect();
            assert!(
                twice.is_empty(),
                "callbacks delivered more than once: {twice:?}"
            );
            let ours: Vec<_> = received
                .into_iter()
                .filter(|hit| {
                    wanted.contains(hit.json()["data"]["id"].as_str().unwrap_or_default())
                })
                .collect();
            assert_eq!(verify_with_python(&portal_secret(), &ours), wanted.len());
            return;
        }
        assert!(
            started.elapsed() < within,
            "{} of {} callbacks after {within:?}",
            per_delivery.len(),
            wanted.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
