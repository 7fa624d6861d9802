//! What a change-feed lease holds, and the writes that keep it: a lease per
//! feed range in the lease store's group named after the processor, its name
//! `range.{min}-{max}`. Every write is conditional on the version last read
//! (the store's ETag), so two instances never both believe they own a lease:
//! the one whose write fails has lost it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skyport_core::ports::{
    ETag, FeedRange, Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore,
};
use time::OffsetDateTime;

/// The prefix of every range lease's name.
pub(crate) const PREFIX: &str = "range.";

/// A lease's fields, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseDoc {
    pub(crate) min: String,
    pub(crate) max: String,
    /// The instance that holds it; `None` once released.
    #[serde(default)]
    pub(crate) owner: Option<String>,
    /// Where the range is read from next: the last checkpoint.
    #[serde(default)]
    pub(crate) continuation: Option<String>,
    /// A range that split: its children carry on from its continuation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) retired: bool,
    /// The lease this one was split from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<String>,
}

impl LeaseDoc {
    pub(crate) fn new(range: &FeedRange) -> Self {
        Self {
            min: range.min.clone(),
            max: range.max.clone(),
            owner: None,
            continuation: None,
            retired: false,
            parent: None,
        }
    }

    pub(crate) fn range(&self) -> FeedRange {
        FeedRange {
            min: self.min.clone(),
            max: self.max.clone(),
        }
    }

    pub(crate) fn name(&self) -> String {
        name(&self.range())
    }

    pub(crate) fn fields(&self) -> LeaseFields {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(fields)) => fields,
            other => unreachable!("a lease serializes to an object, not {other:?}"),
        }
    }
}

pub(crate) fn name(range: &FeedRange) -> String {
    format!("{PREFIX}{}", range.name())
}

/// A lease as read: its fields, version and last write.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) name: String,
    pub(crate) doc: LeaseDoc,
    pub(crate) etag: ETag,
    pub(crate) modified: OffsetDateTime,
}

impl Stored {
    /// The lease of a stored one, unless its fields are not a range lease's.
    pub(crate) fn from_lease(lease: Lease) -> Option<Self> {
        let doc = serde_json::from_value(serde_json::Value::Object(lease.fields)).ok()?;
        Some(Self {
            name: lease.name,
            doc,
            etag: lease.version.etag,
            modified: lease.version.modified,
        })
    }

    /// The owner, if it renewed within `expiry` of `now`.
    pub(crate) fn live_owner(&self, now: OffsetDateTime, expiry: time::Duration) -> Option<&str> {
        self.doc
            .owner
            .as_deref()
            .filter(|_| self.modified + expiry > now)
    }
}

/// The processor's leases in the store.
#[derive(Debug, Clone)]
pub(crate) struct Leases {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) group: String,
}

impl Leases {
    /// Every range lease, retired ones included.
    pub(crate) async fn list(&self) -> Result<Vec<Stored>, LeaseError> {
        Ok(self
            .store
            .list(&self.group, PREFIX)
            .await?
            .into_iter()
            .filter_map(Stored::from_lease)
            .collect())
    }

    /// The lease `name`, if it exists.
    pub(crate) async fn get(&self, name: &str) -> Result<Option<Stored>, LeaseError> {
        Ok(self
            .store
            .list(&self.group, name)
            .await?
            .into_iter()
            .filter(|lease| lease.name == name)
            .find_map(Stored::from_lease))
    }

    /// Creates the lease of `doc`'s range unless it exists (another instance
    /// creating it at the same time is as good).
    pub(crate) async fn create(&self, doc: &LeaseDoc) -> Result<(), LeaseError> {
        match self
            .store
            .put(
                &self.group,
                &doc.name(),
                &doc.fields(),
                LeaseCondition::Absent,
            )
            .await
        {
            Ok(_) | Err(LeaseError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes `doc` over the version `etag`; the new version, or `Conflict`.
    pub(crate) async fn replace(&self, doc: &LeaseDoc, etag: &ETag) -> Result<Stored, LeaseError> {
        let version = self
            .store
            .put(
                &self.group,
                &doc.name(),
                &doc.fields(),
                LeaseCondition::Matches(etag.clone()),
            )
            .await?;
        Ok(Stored {
            name: doc.name(),
            doc: doc.clone(),
            etag: version.etag,
            modified: version.modified,
        })
    }
}
