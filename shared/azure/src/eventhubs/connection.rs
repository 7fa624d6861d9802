//! A hub's AMQP connection for publishing, on `azure_core_amqp`'s public API,
//! whose partition senders report each transfer's outcome: the SDK's
//! `ProducerClient::send_batch` (0.15) answers `Ok` when the service answers
//! Released or Modified, neither of which means stored, and no public API of
//! the SDK tells them apart. Links are authorised as the SDK authorises them
//! (a CBS `put-token` named by the link's address), and the tokens are put
//! again before they expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use azure_core::credentials::{AccessToken, TokenCredential};
use azure_core::http::Url;
use azure_core_amqp::{
    AmqpClaimsBasedSecurity, AmqpClaimsBasedSecurityApis as _, AmqpConnection,
    AmqpConnectionApis as _, AmqpConnectionOptions, AmqpError, AmqpErrorKind, AmqpMessage,
    AmqpSendOptions, AmqpSendOutcome, AmqpSender, AmqpSenderApis as _, AmqpSession,
    AmqpSessionApis as _, AmqpSessionOptions,
};
use skyport_core::ports::BoxError;
use time::OffsetDateTime;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use super::namespace::Namespace;

/// The scope of the tokens Event Hubs takes (the one the SDK asks for).
const SCOPE: &str = "https://eventhubs.azure.net/.default";
/// How long before a token expires it is replaced (the SDK's margin).
const RENEW_BEFORE: time::Duration = time::Duration::minutes(6);
/// How soon a renewal that failed is tried again.
const RENEW_RETRY: Duration = Duration::from_secs(10);
/// The message format of a batch: each Data section of its body is an encoded event.
const BATCH_FORMAT: u32 = 0x8001_3700;

/// One connection to a hub, shared by its partitions' senders. Once a
/// send or an attach on it fails it is [broken](Self::is_broken): no one
/// sends on it again, and it closes when the last sender lets it go.
pub(crate) struct HubConnection {
    /// The address of the hub (`amqps://NAMESPACE/HUB`); partition links add to it.
    hub: Url,
    broken: AtomicBool,
    // Dropped in this order: the renewal task, the CBS link, the connection.
    _renewal: AbortOnDropHandle<()>,
    authority: Arc<Authority>,
    connection: AmqpConnection,
}

impl std::fmt::Debug for HubConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConnection")
            .field("hub", &self.hub.as_str())
            .field("broken", &self.is_broken())
            .finish_non_exhaustive()
    }
}

impl HubConnection {
    /// Connects to `hub` (through the namespace's custom endpoint, if any)
    /// and attaches a CBS client on a session of its own.
    ///
    /// # Errors
    /// When the connection, a session, the CBS link or the first token fails.
    pub(crate) async fn open(namespace: &Namespace, hub: &str) -> Result<Arc<Self>, BoxError> {
        let address = Url::parse(&format!("amqps://{}/{hub}", namespace.name))?;
        let custom_endpoint = namespace.custom_endpoint().map(Url::parse).transpose()?;
        let connection = AmqpConnection::new();
        connection
            .open(
                "skyport".to_owned(),
                address.clone(),
                Some(AmqpConnectionOptions {
                    custom_endpoint,
                    ..AmqpConnectionOptions::default()
                }),
            )
            .await?;
        let cbs_session = AmqpSession::new();
        cbs_session.begin(&connection, None).await?;
        let cbs = AmqpClaimsBasedSecurity::new(cbs_session)?;
        cbs.attach().await?;
        let credential = namespace.credential();
        let token = credential.get_token(&[SCOPE], None).await?;
        let authority = Arc::new(Authority {
            cbs,
            credential,
            state: tokio::sync::Mutex::new(Authorized {
                token,
                paths: Vec::new(),
            }),
        });
        let span = tracing::info_span!("eventhubs_tokens", hub = %hub);
        let renewal = AbortOnDropHandle::new(tokio::spawn(
            Arc::clone(&authority).renew().instrument(span),
        ));
        Ok(Arc::new(Self {
            hub: address,
            broken: AtomicBool::new(false),
            _renewal: renewal,
            authority,
            connection,
        }))
    }

    /// Whether a send or an attach on this connection has failed.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Takes the connection out of use.
    pub(crate) fn set_broken(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    /// Authorises partition `partition_id` and attaches a sender to it, on a
    /// session of its own as the SDK does, so that the partitions' transfers
    /// do not all pass through one session's task.
    ///
    /// # Errors
    /// When the token is refused or the link cannot be attached.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        partition_id: &str,
    ) -> Result<PartitionSender, AmqpError> {
        let address = format!("{}/Partitions/{partition_id}", self.hub);
        self.authority.authorize(&address).await?;
        let session = AmqpSession::new();
        session
            .begin(
                &self.connection,
                Some(AmqpSessionOptions::with_unbounded_windows()),
            )
            .await?;
        let sender = AmqpSender::new();
        sender
            .attach(
                &session,
                format!("skyport-sender-{partition_id}"),
                address,
                None,
            )
            .await?;
        let max_message_size = sender.max_message_size().await?;
        Ok(PartitionSender {
            sender,
            _session: session,
            max_message_size,
            connection: Arc::clone(self),
        })
    }
}

/// A sender link to one partition, on its own session; it keeps its connection open.
pub(crate) struct PartitionSender {
    // Dropped before the session it is attached on.
    sender: AmqpSender,
    _session: AmqpSession,
    max_message_size: Option<u64>,
    connection: Arc<HubConnection>,
}

impl std::fmt::Debug for PartitionSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionSender")
            .field("max_message_size", &self.max_message_size)
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl PartitionSender {
    /// The largest message the service takes on this link, if it said.
    pub(crate) fn max_message_size(&self) -> Option<u64> {
        self.max_message_size
    }

    pub(crate) fn connection(&self) -> &Arc<HubConnection> {
        &self.connection
    }

    /// Sends `batch` (see [`super::batch`]) and waits for the service's outcome.
    ///
    /// # Errors
    /// When the transfer got no outcome (the link or the connection failed):
    /// the service may or may not have stored it.
    pub(crate) async fn send(&self, batch: &AmqpMessage) -> Result<Outcome, AmqpError> {
        let options = AmqpSendOptions {
            message_format: Some(BATCH_FORMAT),
            ..AmqpSendOptions::default()
        };
        let outcome = self.sender.send_ref(batch, Some(options)).await?;
        Ok(Outcome::of(outcome))
    }
}

/// What the service answered a transfer with.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Accepted: stored.
    Stored,
    /// Released, Modified or Rejected: not stored (and it will not be).
    NotStored(NotStored),
}

impl Outcome {
    fn of(outcome: AmqpSendOutcome) -> Self {
        match outcome {
            AmqpSendOutcome::Accepted => Self::Stored,
            AmqpSendOutcome::Released => Self::NotStored(NotStored::Released),
            AmqpSendOutcome::Modified(modification) => Self::NotStored(NotStored::Modified {
                delivery_failed: modification.delivery_failed.unwrap_or(false),
                undeliverable_here: modification.undeliverable_here.unwrap_or(false),
            }),
            AmqpSendOutcome::Rejected(error) => Self::NotStored(NotStored::Rejected(
                error.map(|error| AmqpError::from(AmqpErrorKind::AmqpDescribedError(error))),
            )),
        }
    }
}

/// An outcome that says the service did not store a transfer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotStored {
    #[error("Event Hubs released the batch: it did not store it")]
    Released,
    #[error(
        "Event Hubs answered the batch with Modified (delivery-failed {delivery_failed}, undeliverable-here {undeliverable_here}): it did not store it"
    )]
    Modified {
        delivery_failed: bool,
        undeliverable_here: bool,
    },
    #[error("Event Hubs rejected the batch")]
    Rejected(#[source] Option<AmqpError>),
}

/// The connection's CBS client and what it has authorised.
struct Authority {
    cbs: AmqpClaimsBasedSecurity,
    credential: Arc<dyn TokenCredential>,
    /// Held while a token is put, so that a renewal covers every address.
    state: tokio::sync::Mutex<Authorized>,
}

struct Authorized {
    token: AccessToken,
    /// The addresses the token has been put for.
    paths: Vec<String>,
}

impl Authority {
    async fn authorize(&self, path: &str) -> Result<(), AmqpError> {
        let mut state = self.state.lock().await;
        self.cbs
            .authorize_path(
                path.to_owned(),
                None,
                &state.token.token,
                state.token.expires_on,
            )
            .await?;
        if !state.paths.iter().any(|known| known == path) {
            state.paths.push(path.to_owned());
        }
        Ok(())
    }

    /// Puts a new token for every address before the current one expires,
    /// for as long as the connection lives.
    async fn renew(self: Arc<Self>) {
        let mut wait = renewal_wait(self.state.lock().await.token.expires_on);
        loop {
            tokio::time::sleep(wait).await;
            wait = match self.renew_once().await {
                Ok(expires_on) => {
                    tracing::debug!(%expires_on, "Renewed the event hub's token.");
                    renewal_wait(expires_on)
                }
                Err(error) => {
                    tracing::warn!(%error, "Cannot renew the event hub's token yet; trying again shortly.");
                    RENEW_RETRY
                }
            };
        }
    }

    async fn renew_once(&self) -> Result<OffsetDateTime, BoxError> {
        let token = self.credential.get_token(&[SCOPE], None).await?;
        let mut state = self.state.lock().await;
        for path in &state.paths {
            self.cbs
                .authorize_path(path.clone(), None, &token.token, token.expires_on)
                .await?;
        }
        let expires_on = token.expires_on;
        state.token = token;
        Ok(expires_on)
    }
}

/// How long to wait before renewing a token that expires at `expires_on`:
/// until [`RENEW_BEFORE`] its expiry, or half its remaining life if that is later.
fn renewal_wait(expires_on: OffsetDateTime) -> Duration {
    let left = expires_on - OffsetDateTime::now_utc();
    let wait = (left - RENEW_BEFORE).max(left / 2);
    Duration::try_from(wait).unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_renewed_six_minutes_before_it_expires_or_halfway_when_it_lives_less() {
        let now = OffsetDateTime::now_utc();
        let hour = renewal_wait(now + time::Duration::hours(1));
        assert!(
            hour <= Duration::from_secs(54 * 60) && hour > Duration::from_secs(53 * 60),
            "{hour:?}"
        );
        let short = renewal_wait(now + time::Duration::minutes(4));
        assert!(
            short <= Duration::from_secs(120) && short > Duration::from_secs(110),
            "{short:?}"
        );
        assert_eq!(
            renewal_wait(now - time::Duration::minutes(1)),
            Duration::ZERO
        );
    }
}
