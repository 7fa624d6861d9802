//! The timers of Waiting deliveries: an index of when each one's steps run,
//! kept by the status store beside the document (the document is the truth,
//! the index a hint that a timer reads), in shards that the workers share
//! out through leases, one reader per shard.

use async_trait::async_trait;
use time::OffsetDateTime;

use super::ETag;
use super::status::StatusStoreError;
use crate::lane::Lane;

/// A Waiting delivery whose time has come, as the index holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub delivery_id: String,
    /// The document's revision when its timer was set.
    pub revision: u32,
    pub runs_at: OffsetDateTime,
    /// The lane its events travel in.
    pub lane: Lane,
    /// The version of the index entry, where the store removes fired entries
    /// itself ([`Timers::fired`]): an entry that moved since is kept.
    pub version: Option<ETag>,
}

/// When Waiting deliveries run, as the status store keeps it: every write
/// of a Waiting document sets or moves its timer, in the same transaction
/// (the embedded store) or right after it (Cosmos DB, whose lost timers
/// [`Timers::overdue`] finds from the documents).
#[async_trait]
pub trait Timers: std::fmt::Debug + Send + Sync + 'static {
    /// How many shards the timers are kept in: the leases the workers share.
    fn shards(&self) -> u32;

    /// The Waiting deliveries of `shard` due at or before `up_to`, earliest
    /// first (by when, then by id), after `after` when given, at most
    /// `limit` of them.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the index cannot be read.
    async fn due(
        &self,
        shard: u32,
        after: Option<&Due>,
        up_to: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError>;

    /// `fired` are durable in the stream now. A store that keeps its index
    /// apart from the documents removes their entries (each unless it moved
    /// since); one that keeps it with them leaves that to the document's
    /// next write.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the index cannot be written;
    /// the entries fire again.
    async fn fired(&self, shard: u32, fired: &[Due]) -> Result<(), StatusStoreError>;

    /// Waiting deliveries whose `runsAt` is before `before`, read from the
    /// documents: the timers an index kept apart from them lost (a process
    /// that stopped between the two writes). Empty where the index is
    /// written with the document.
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the documents cannot be read.
    async fn overdue(
        &self,
        before: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<Due>, StatusStoreError>;

    /// How many timers `shard` holds: one per Waiting delivery (where the
    /// index is kept apart, also those whose delivery was cancelled and
    /// whose entry is not yet due).
    ///
    /// # Errors
    /// [`StatusStoreError::Unavailable`] when the index cannot be read.
    async fn waiting(&self, shard: u32) -> Result<u64, StatusStoreError>;
}

/// The shard of the `shards` that keeps `delivery_id`'s timer: FNV-1a of the
/// id, so that every process places it alike.
pub fn shard_of(delivery_id: &str, shards: u32) -> u32 {
    let hash = delivery_id
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    u32::try_from(hash % u64::from(shards.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::shard_of;

    #[test]
    fn a_delivery_has_one_shard_spread_over_all() {
        assert_eq!(shard_of("d-1", 16), shard_of("d-1", 16));
        assert_eq!(shard_of("d-1", 1), 0);
        assert_eq!(shard_of("d-1", 0), 0);
        let mut seen = [0_u32; 16];
        for i in 0..1_600 {
            seen[shard_of(&format!("delivery-{i}"), 16) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
    }
}
