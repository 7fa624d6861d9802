//! A rolling upgrade to event schema version 2, in the rollout rule's order
//! (docs/operations.md): the workers first, with the gateways still writing
//! version 1, then the gateways. Every event a gateway writes during the
//! rollout is read by this build's worker and by the codec of the build
//! before it (kept in `skyport_tests::schema_v1`), and events an old gateway
//! writes are run by this build's worker: nothing is lost. Only once every
//! worker reads version 2 do the gateways write it — which an old worker
//! would refuse, and that is why the order matters.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use skyport::Backends;
use skyport_core::event::Event;
use skyport_core::ports::Lane;
use skyport_core::ports::{EventProperties, OutboundEvent, Position, PublishError, Publisher};
use skyport_core::status::DeliveryState;
use skyport_gateway::receipt::Receipts;
use skyport_runtime::config::Settings;
use skyport_tests::schema_v1;
use skyport_tests::{TestApp, delivery_request, test_settings};
use time::OffsetDateTime;

const WAIT: Duration = Duration::from_secs(60);
const EACH: usize = 40;

/// The stream as the gateway writes to it, keeping every payload it takes.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Publisher>,
    payloads: Mutex<Vec<Bytes>>,
}

#[async_trait]
impl Publisher for Recording {
    async fn publish(&self, event: OutboundEvent) -> Result<Position, PublishError> {
        let payload = event.payload.clone();
        let position = self.inner.publish(event).await?;
        self.payloads.lock().unwrap().push(payload);
        Ok(position)
    }

    async fn ready(&self) -> bool {
        self.inner.ready().await
    }
}

/// The app on `settings`, its gateway's writes recorded.
async fn recorded(settings: &Settings) -> (TestApp, Arc<Recording>) {
    let mut backends = Backends::open(settings).await.unwrap();
    let recording = Arc::new(Recording {
        inner: Arc::clone(&backends.ports.publisher),
        payloads: Mutex::new(Vec::new()),
    });
    backends.ports.publisher = recording.clone();
    (
        TestApp::spawn_on(settings.clone(), backends).await,
        recording,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_in_the_rules_order_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    // The workers run this build; the gateways still write version 1.
    settings.gateway.event_schema_version = 1;
    let (app, recording) = recorded(&settings).await;
    let mut urls = Vec::new();
    for n in 0..EACH {
        urls.push(
            app.client
                .post_delivery(&delivery_request(n))
                .await
                .status_url,
        );
    }
    // A gateway of the old build, beside it, writes as it always did.
    let store = app.embedded();
    let receipts = Receipts::new(&[store.receipt_key()]);
    for n in EACH..2 * EACH {
        let id = format!("delivery-{n}");
        let old = schema_v1::Event::DeliveryRequested(Box::new(schema_v1::DeliveryRequested {
            delivery_id: id.clone(),
            accepted_at: OffsetDateTime::now_utc(),
            traceparent: None,
            idempotency_key: None,
            request: serde_json::from_value(delivery_request(n)).unwrap(),
        }));
        let event = OutboundEvent {
            key: id.clone(),
            payload: old.encode().into(),
            properties: EventProperties {
                traceparent: None,
                idempotency_key: None,
                schema_version: schema_v1::SCHEMA_VERSION,
            },
            lane: skyport_core::ports::Lane::Normal,
        };
        Publisher::publish(&*store, event).await.unwrap();
        let receipt = receipts.sign(&id, OffsetDateTime::now_utc(), Lane::Normal, None);
        urls.push(format!(
            "/api/deliveryrequests/{id}/status?receipt={receipt}"
        ));
    }
    // This build's worker runs what both gateways wrote.
    for url in &urls {
        app.client
            .wait_for_state(url, DeliveryState::Scheduled, WAIT)
            .await;
    }
    // And a worker of the old build reads what this build's gateway wrote.
    let written = recording.payloads.lock().unwrap().clone();
    assert_eq!(written.len(), EACH);
    for payload in &written {
        let read = schema_v1::Event::decode(payload);
        assert!(
            read.is_ok(),
            "{read:?}: {}",
            String::from_utf8_lossy(payload)
        );
    }
    app.app.stop().await.unwrap();
    // The store belongs to one process at a time: let go of it.
    drop((store, recording));

    // Every worker runs this build: the gateways write version 2.
    settings.gateway.event_schema_version = 2;
    let (app, recording) = recorded(&settings).await;
    let mut later = Vec::new();
    for n in 2 * EACH..3 * EACH {
        later.push(
            app.client
                .post_delivery(&delivery_request(n))
                .await
                .status_url,
        );
    }
    let documents = app.client.wait_for_terminal(&later, WAIT).await;
    assert!(
        documents
            .iter()
            .all(|d| d.state == DeliveryState::Scheduled)
    );
    let written = recording.payloads.lock().unwrap().clone();
    assert_eq!(written.len(), EACH);
    for payload in &written {
        assert!(Event::decode(payload).is_ok(), "this build reads version 2");
        assert!(
            schema_v1::Event::decode(payload).is_err(),
            "a worker of the old build would refuse it: the gateways switch last"
        );
    }
    app.app.stop().await.unwrap();
}
