//! The OAUTHBEARER token of `kafka.auth = "entra"`, kept fresh ahead of
//! need: [`BearerToken::start`] fetches the first one from a
//! [`TokenSource`] before any client exists, and a task of its own fetches
//! the next before the one held expires (at 80 % of its lifetime or 5
//! minutes before its end, whichever is sooner), retrying with backoff.
//! librdkafka asks for the token in a callback on its own thread, which
//! must not wait on the network or on the async runtime: the callback only
//! reads the token held, and there is always one.

use std::error::Error;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;
use secrecy::{ExposeSecret, SecretString};
use skyport_runtime::backoff::Backoff;
use skyport_runtime::config::{ConfigError, KafkaAuth, KafkaSettings};
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::KafkaOpenError;

/// How long before its end a token is replaced, at most.
const MARGIN: Duration = Duration::from_secs(5 * 60);
/// The shortest wait before a refresh, so that a token of a very short
/// lifetime cannot make the task spin.
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// The waits between failed refreshes: full jitter, doubling from 1 s to 60 s.
const RETRY: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Why a token could not be had.
pub type TokenError = Box<dyn Error + Send + Sync>;

/// An access token and when it expires.
#[derive(Debug, Clone)]
pub struct AccessToken {
    pub secret: SecretString,
    pub expires_at: SystemTime,
}

/// Where tokens come from: Entra ID in Skyport. A fetch may take a network
/// round trip; only the refresh task waits for it.
#[async_trait]
pub trait TokenSource: Send + Sync + fmt::Debug {
    /// A new token.
    ///
    /// # Errors
    /// When none can be had now; the task tries again after a backoff.
    async fn token(&self) -> Result<AccessToken, TokenError>;
}

/// The token the Kafka clients present, never empty once started; the
/// refresh task stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct BearerToken {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    held: Arc<RwLock<AccessToken>>,
    /// librdkafka's principal name for the token (it only logs it).
    principal: String,
    _refresh: AbortOnDropHandle<()>,
}

impl BearerToken {
    /// Fetches the first token from `source`, then starts the task that
    /// replaces it before it expires. `principal` is the name librdkafka
    /// gives the token in its logs.
    ///
    /// # Errors
    /// [`KafkaOpenError::Token`] when the first token cannot be had.
    pub async fn start(
        source: Arc<dyn TokenSource>,
        principal: &str,
    ) -> Result<Self, KafkaOpenError> {
        let first = fetch(source.as_ref())
            .await
            .map_err(KafkaOpenError::Token)?;
        let held = Arc::new(RwLock::new(first));
        let task = tokio::spawn(
            refresh(source, Arc::clone(&held))
                .instrument(tracing::info_span!("kafka_token_refresh")),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                held,
                principal: principal.to_owned(),
                _refresh: AbortOnDropHandle::new(task),
            }),
        })
    }

    /// The token held now.
    pub fn current(&self) -> AccessToken {
        self.inner
            .held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// librdkafka's token: the one held, with its expiry in milliseconds
    /// since the Unix epoch.
    ///
    /// # Errors
    /// When the token held has expired (every refresh since has failed).
    pub fn oauth_token(&self) -> Result<OAuthToken, Box<dyn Error>> {
        let token = self.current();
        if token.expires_at <= SystemTime::now() {
            return Err("the Entra ID token for Kafka has expired and cannot be refreshed".into());
        }
        let lifetime_ms = token
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
            });
        Ok(OAuthToken {
            token: token.secret.expose_secret().to_owned(),
            principal_name: self.inner.principal.clone(),
            lifetime_ms,
        })
    }
}

/// A token from `source`, refused when it has already expired.
async fn fetch(source: &dyn TokenSource) -> Result<AccessToken, TokenError> {
    let token = source.token().await?;
    if token.expires_at <= SystemTime::now() {
        return Err("the token source gave a token that has already expired".into());
    }
    Ok(token)
}

/// How long after its fetch a token of `lifetime` is replaced: at 80 % of
/// it or [`MARGIN`] before its end, whichever is sooner, but not before half
/// of it (a short-lived token) nor within [`MIN_REFRESH`].
fn refresh_after(lifetime: Duration) -> Duration {
    let sooner = lifetime.mul_f64(0.8).min(lifetime.saturating_sub(MARGIN));
    sooner.max(lifetime / 2).max(MIN_REFRESH)
}

/// Replaces the token in `held` before it expires, for as long as the
/// [`BearerToken`] lives; after a failure, tries again with backoff and
/// keeps the old token meanwhile.
async fn refresh(source: Arc<dyn TokenSource>, held: Arc<RwLock<AccessToken>>) {
    let backoff = Backoff::new(RETRY.0, RETRY.1);
    let lifetime = |token: &AccessToken| {
        token
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    };
    let mut wait = refresh_after(lifetime(
        &held.read().unwrap_or_else(PoisonError::into_inner),
    ));
    let mut failures = 0u32;
    loop {
        tokio::time::sleep(wait).await;
        match fetch(source.as_ref()).await {
            Ok(token) => {
                let remaining = lifetime(&token);
                *held.write().unwrap_or_else(PoisonError::into_inner) = token;
                tracing::debug!(
                    expires_in_s = remaining.as_secs(),
                    "Refreshed the Kafka OAUTHBEARER token."
                );
                wait = refresh_after(remaining);
                failures = 0;
            }
            Err(error) => {
                wait = backoff.delay(failures);
                failures = failures.saturating_add(1);
                let expired = held
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .expires_at
                    <= SystemTime::now();
                if expired {
                    tracing::error!(%error, failures, retry_in_ms = wait.as_millis(), "The Kafka OAUTHBEARER token has expired and cannot be refreshed; the brokers refuse new connections until it is.");
                } else {
                    tracing::warn!(%error, failures, retry_in_ms = wait.as_millis(), "Cannot refresh the Kafka OAUTHBEARER token; the one held is still valid.");
                }
            }
        }
    }
}

/// What a client answers librdkafka's OAUTHBEARER token refresh with: the
/// bearer token with `kafka.auth = "entra"`, else nothing (librdkafka then
/// never asks). The context of a client that needs no other callback.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    token: Option<BearerToken>,
}

impl Login {
    /// The login of a client of `settings`, with `token` when it is entra.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `kafka.auth` when it is entra and no token is given.
    pub(crate) fn new(
        settings: &KafkaSettings,
        token: Option<BearerToken>,
    ) -> Result<Self, KafkaOpenError> {
        if settings.auth == KafkaAuth::Entra && token.is_none() {
            return Err(KafkaOpenError::Config(ConfigError::new(
                "kafka.auth",
                "\"entra\" needs an Entra ID token source, and this Kafka client was opened without one",
            )));
        }
        Ok(Self { token })
    }

    pub(crate) fn oauth_token(&self) -> Result<OAuthToken, Box<dyn Error>> {
        match &self.token {
            Some(token) => token.oauth_token(),
            None => Err("no OAUTHBEARER token: kafka.auth is not \"entra\"".into()),
        }
    }
}

impl ClientContext for Login {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.oauth_token()
    }
}

impl ProducerContext for Login {
    type DeliveryOpaque = ();

    fn delivery(&self, _result: &DeliveryResult<'_>, _opaque: Self::DeliveryOpaque) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Tokens `token-1`, `token-2`, … of `lifetime` each; the fetches whose
    /// numbers (from 1) are in `failing` fail instead.
    #[derive(Debug)]
    struct Scripted {
        lifetime: Duration,
        failing: Vec<usize>,
        fetches: AtomicUsize,
        at: Mutex<Vec<tokio::time::Instant>>,
    }

    impl Scripted {
        fn new(lifetime: Duration, failing: &[usize]) -> Arc<Self> {
            Arc::new(Self {
                lifetime,
                failing: failing.to_vec(),
                fetches: AtomicUsize::new(0),
                at: Mutex::default(),
            })
        }

        fn fetches(&self) -> usize {
            self.fetches.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl TokenSource for Scripted {
        async fn token(&self) -> Result<AccessToken, TokenError> {
            let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
            self.at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(tokio::time::Instant::now());
            if self.failing.contains(&n) {
                return Err(format!("fetch {n} fails").into());
            }
            Ok(AccessToken {
                secret: format!("token-{n}").into(),
                expires_at: SystemTime::now() + self.lifetime,
            })
        }
    }

    fn secret(token: &BearerToken) -> String {
        token.current().secret.expose_secret().to_owned()
    }

    /// Lets the paused clock run `by`, the refresh task with it.
    async fn advance(by: Duration) {
        tokio::time::sleep(by).await;
    }

    #[test]
    fn a_token_is_replaced_at_80_percent_or_5_minutes_before_its_end_whichever_is_sooner() {
        let minutes = |m: u64| Duration::from_secs(m * 60);
        assert_eq!(refresh_after(minutes(60)), minutes(48));
        assert_eq!(refresh_after(minutes(24 * 60)), minutes(24 * 48));
        assert_eq!(refresh_after(minutes(20)), minutes(15));
        assert_eq!(refresh_after(minutes(6)), minutes(3));
        assert_eq!(
            refresh_after(Duration::from_secs(4)),
            Duration::from_secs(2)
        );
        assert_eq!(refresh_after(Duration::ZERO), MIN_REFRESH);
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_is_refreshed_before_it_expires() {
        let source = Scripted::new(Duration::from_secs(3600), &[]);
        let token = BearerToken::start(source.clone(), "skyport").await.unwrap();
        assert_eq!(secret(&token), "token-1");
        advance(Duration::from_secs(47 * 60)).await;
        assert_eq!((source.fetches(), secret(&token).as_str()), (1, "token-1"));
        advance(Duration::from_secs(2 * 60)).await;
        assert_eq!((source.fetches(), secret(&token).as_str()), (2, "token-2"));
        let at = source.at.lock().unwrap().clone();
        let first_refresh = Duration::from_secs(48 * 60 - 1)..=Duration::from_secs(48 * 60);
        assert!(first_refresh.contains(&(at[1] - at[0])), "{at:?}");
        advance(Duration::from_secs(48 * 60)).await;
        assert_eq!(secret(&token), "token-3");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_refresh_keeps_the_token_and_is_retried_with_backoff() {
        let source = Scripted::new(Duration::from_secs(3600), &[2, 3]);
        let token = BearerToken::start(source.clone(), "skyport").await.unwrap();
        advance(Duration::from_secs(48 * 60) + Duration::from_millis(1)).await;
        assert!(source.fetches() >= 2);
        assert_eq!(secret(&token), "token-1", "the token held stays");
        // Two failures wait at most 1 s and 2 s before the third retry.
        advance(Duration::from_secs(4)).await;
        assert_eq!((source.fetches(), secret(&token).as_str()), (4, "token-4"));
        let at = source.at.lock().unwrap().clone();
        assert!(at[2] - at[1] <= RETRY.0, "{at:?}");
        assert!(at[3] - at[2] <= RETRY.0 * 2, "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_that_cannot_be_had_at_start_is_an_error() {
        let source = Scripted::new(Duration::from_secs(3600), &[1]);
        let error = BearerToken::start(source, "skyport").await.unwrap_err();
        assert!(matches!(error, KafkaOpenError::Token(_)), "{error:?}");
        let expired = Scripted::new(Duration::ZERO, &[]);
        let error = BearerToken::start(expired, "skyport").await.unwrap_err();
        assert!(error.source().unwrap().to_string().contains("expired"));
    }

    #[tokio::test(start_paused = true)]
    async fn librdkafka_gets_the_token_its_expiry_in_epoch_milliseconds_and_the_principal() {
        let source = Scripted::new(Duration::from_secs(3600), &[]);
        let token = BearerToken::start(source, "skyport-worker").await.unwrap();
        let login = Login {
            token: Some(token.clone()),
        };
        let answer = login.generate_oauth_token(None).unwrap();
        assert_eq!(answer.token, "token-1");
        assert_eq!(answer.principal_name, "skyport-worker");
        let expires_at = token
            .current()
            .expires_at
            .duration_since(UNIX_EPOCH)
            .unwrap();
        assert_eq!(
            answer.lifetime_ms,
            i64::try_from(expires_at.as_millis()).unwrap()
        );
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let ahead = u128::try_from(answer.lifetime_ms).unwrap() - now_ms;
        assert!((3_599_000..=3_600_000).contains(&ahead), "{ahead} ms ahead");
        let none = Login { token: None };
        assert!(none.generate_oauth_token(None).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_refresh_task_stops_with_the_last_clone() {
        let source = Scripted::new(Duration::from_secs(3600), &[]);
        let token = BearerToken::start(source.clone(), "skyport").await.unwrap();
        let clone = token.clone();
        drop(token);
        advance(Duration::from_millis(1)).await;
        assert_eq!(Arc::strong_count(&source), 2, "the task holds the source");
        drop(clone);
        advance(Duration::from_millis(1)).await;
        assert_eq!(Arc::strong_count(&source), 1, "the task has ended");
    }

    #[test]
    fn entra_without_a_token_is_refused_naming_kafka_auth() {
        let settings = KafkaSettings {
            auth: KafkaAuth::Entra,
            ..KafkaSettings::default()
        };
        match Login::new(&settings, None) {
            Err(KafkaOpenError::Config(error)) => assert_eq!(error.key, "kafka.auth"),
            other => panic!("{other:?}"),
        }
        assert!(Login::new(&KafkaSettings::default(), None).is_ok());
    }
}
