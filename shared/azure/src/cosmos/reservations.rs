//! Idempotency reservations in their own container (partition key `/id` =
//! the delivery id), each item with a `ttl` so that Cosmos DB deletes it when
//! its retention is over.
//!
//! Taking a name is a point read of its status (a name stays taken while its
//! delivery is recorded), then `create_item` (409: it is held); an expired
//! item that the service has not deleted yet is replaced on its ETag, so two
//! gateways racing for it cannot both win. The read comes first so that a
//! taken name costs no write. It cannot miss a status written after it: the
//! worker writes one only for a request published under a reservation, and
//! that reservation outlives the request's time in the stream (the config
//! holds `idempotency_retention_s` above `worker.allow_backlog_to_ms`).

use azure_core::http::{Etag, StatusCode};
use azure_data_cosmos::options::{ItemWriteOptions, Precondition as CosmosPrecondition};
use serde::{Deserialize, Serialize};
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use async_trait::async_trait;
use skyport_core::ports::{IdempotencyStore, Reservation, Reserved, StatusStore, StatusStoreError};

use super::request_units::Operation;
use super::store::CosmosStore;
use super::throttle::Failure;

/// A reservation waits out the service's 429s (its throughput control
/// group, if any, refuses it at once instead).
const PATIENCE: u32 = u32::MAX;

/// How many times a reservation is retried when the item changes under it.
const RACES: usize = 3;

#[derive(Debug, Serialize, Deserialize)]
struct Item {
    id: String,
    #[serde(flatten)]
    reservation: Reservation,
    /// Seconds Cosmos DB keeps the item after its last write.
    ttl: i64,
}

impl Item {
    fn new(reservation: &Reservation) -> Self {
        let left = (reservation.expires_at - OffsetDateTime::now_utc()).whole_seconds();
        Self {
            id: reservation.delivery_id.clone(),
            reservation: reservation.clone(),
            ttl: left.max(1) + 1,
        }
    }
}

fn unavailable(e: Failure) -> StatusStoreError {
    StatusStoreError::Unavailable(e.into_box())
}

impl CosmosStore {
    /// Reads the stored reservation of `id` and its ETag.
    async fn read_reservation(
        &self,
        id: &str,
    ) -> Result<Option<(Reservation, Etag)>, StatusStoreError> {
        let read: Option<(Item, Etag)> = self
            .read_versioned(&self.reservations, id, Work::Reservations, PATIENCE)
            .await?;
        Ok(read.map(|(item, etag)| (item.reservation, etag)))
    }

    async fn reserve_item(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError> {
        let id = &reservation.delivery_id;
        let item = Item::new(reservation);
        for _ in 0..RACES {
            let created = self
                .requests
                .run(Work::Reservations, Operation::Write, PATIENCE, |options| {
                    let options = ItemWriteOptions::default().with_operation_options(options);
                    self.reservations
                        .create_item(id.clone(), id, &item, Some(options))
                })
                .await;
            match created {
                Ok(_) => return Ok(Reserved::New),
                Err(e) if e.status_code() == StatusCode::Conflict => {}
                Err(e) => return Err(unavailable(e)),
            }
            let Some((held, etag)) = self.read_reservation(id).await? else {
                continue;
            };
            if held.expires_at > OffsetDateTime::now_utc() {
                return Ok(Reserved::Existing(held));
            }
            let replaced = self
                .requests
                .run(Work::Reservations, Operation::Write, PATIENCE, |options| {
                    let options = ItemWriteOptions::default()
                        .with_operation_options(options)
                        .with_precondition(CosmosPrecondition::if_match(etag.clone()));
                    self.reservations
                        .replace_item(id.clone(), id, &item, Some(options))
                })
                .await;
            match replaced {
                Ok(_) => return Ok(Reserved::New),
                Err(e)
                    if matches!(
                        e.status_code(),
                        StatusCode::PreconditionFailed | StatusCode::NotFound
                    ) => {}
                Err(e) => return Err(unavailable(e)),
            }
        }
        Err(StatusStoreError::Unavailable(
            format!("the reservation of {id} kept changing while it was taken").into(),
        ))
    }

    async fn release_item(&self, reservation: &Reservation) -> Result<(), StatusStoreError> {
        let id = &reservation.delivery_id;
        let Some((held, etag)) = self.read_reservation(id).await? else {
            return Ok(());
        };
        if held != *reservation {
            return Ok(());
        }
        let deleted = self
            .requests
            .run(Work::Reservations, Operation::Delete, PATIENCE, |options| {
                let options = ItemWriteOptions::default()
                    .with_operation_options(options)
                    .with_precondition(CosmosPrecondition::if_match(etag.clone()));
                self.reservations.delete_item(id.clone(), id, Some(options))
            })
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.status_code(),
                    StatusCode::PreconditionFailed | StatusCode::NotFound
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable(e)),
        }
    }
}

#[async_trait]
impl IdempotencyStore for CosmosStore {
    async fn reserve(&self, reservation: &Reservation) -> Result<Reserved, StatusStoreError> {
        if let Some(status) = self.get(&reservation.delivery_id).await? {
            return Ok(Reserved::Recorded(Box::new(status)));
        }
        self.reserve_item(reservation).await
    }

    async fn release(&self, reservation: &Reservation) -> Result<(), StatusStoreError> {
        self.release_item(reservation).await
    }
}
