//! Reservations: how a retried POST finds the delivery it made.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::status::{StatusStoreError, Versioned};

/// What the gateway remembers of a request that named its delivery: by a
/// client-chosen `deliveryId`, or by an `Idempotency-Key` the id is derived from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub delivery_id: String,
    /// A digest of what was asked (the body, the key and the client), so that a
    /// retry can be told from another request under the same name.
    pub fingerprint: String,
    #[serde(with = "time::serde::rfc3339")]
    pub accepted_at: OffsetDateTime,
    /// When the name may be taken again.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// The answer to [`IdempotencyStore::reserve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Reserved {
    /// The name was free (or its reservation had expired) and is now this one's.
    New,
    /// The name is held by this earlier reservation.
    Existing(Reservation),
    /// The name's reservation has expired, but the status store still
    /// records a delivery by that id (this is its status): the name stays
    /// taken, and nothing was stored.
    Recorded(Box<Versioned>),
}

/// Reservations by delivery id: how a retried POST finds the delivery it made.
#[async_trait]
pub trait IdempotencyStore: std::fmt::Debug + Send + Sync + 'static {
    /// Stores `reservation` unless an unexpired one holds its delivery id,
    /// or the status store records a delivery by that id. An adapter that
    /// keeps both in one database looks at both in one read.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the store cannot be used.
    async fn reserve(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError>;

    /// Forgets `reservation` if it is still the one stored (its request was
    /// never made durable, so the name is free again).
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the store cannot be used.
    async fn release(&self, reservation: &Reservation) -> Result<(), StatusStoreError>;
}
