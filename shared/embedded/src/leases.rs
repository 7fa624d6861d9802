//! [`LeaseStore`] on the embedded store: what a single machine running
//! against a partition-balancing stream (Event Hubs) keeps its ownership
//! claims and checkpoints in.
//!
//! A lease is keyed by (group, name), so one range scan lists a group. Its
//! version is the [`ETag`]: a write with [`LeaseCondition::Absent`] creates
//! the lease, one with [`LeaseCondition::Matches`] replaces it only at that
//! version, and the time of the commit is the lease's last-modified time, the
//! one expiry is judged by.

use std::sync::Arc;

use async_trait::async_trait;
use redb::ReadableDatabase;
use skyport_core::ports::{
    ETag, Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore, LeaseVersion,
};
use time::OffsetDateTime;

use crate::ops::{Applied, Expected, OpKind};
use crate::store::EmbeddedStore;
use crate::tables::LEASES;

fn version(version: u64, modified_ms: i64) -> LeaseVersion {
    LeaseVersion {
        etag: ETag(version.to_string()),
        modified: OffsetDateTime::from_unix_timestamp_nanos(i128::from(modified_ms) * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
    }
}

#[async_trait]
impl LeaseStore for EmbeddedStore {
    async fn list(&self, group: &str, prefix: &str) -> Result<Vec<Lease>, LeaseError> {
        let db = Arc::clone(&self.db);
        let (group, prefix) = (group.to_owned(), prefix.to_owned());
        let stored = self
            .blocking(move || {
                let txn = db.begin_read()?;
                let table = txn.open_table(LEASES)?;
                let mut stored = Vec::new();
                for entry in table.range((group.as_str(), prefix.as_str())..)? {
                    let (key, value) = entry?;
                    let (in_group, name) = key.value();
                    if in_group != group || !name.starts_with(&prefix) {
                        break;
                    }
                    let (version, modified_ms, body) = value.value();
                    stored.push((name.to_owned(), version, modified_ms, body.to_vec()));
                }
                Ok(stored)
            })
            .await
            .map_err(|e| LeaseError::Unavailable(Box::new(e)))?;
        stored
            .into_iter()
            .map(|(name, v, modified_ms, body)| {
                let fields = serde_json::from_slice(&body)
                    .map_err(|e| LeaseError::Unavailable(Box::new(e)))?;
                Ok(Lease {
                    name,
                    version: version(v, modified_ms),
                    fields,
                })
            })
            .collect()
    }

    async fn put(
        &self,
        group: &str,
        name: &str,
        fields: &LeaseFields,
        condition: LeaseCondition,
    ) -> Result<LeaseVersion, LeaseError> {
        let expected = match condition {
            LeaseCondition::Any => Expected::Any,
            LeaseCondition::Absent => Expected::Absent,
            LeaseCondition::Matches(ETag(tag)) => match tag.parse() {
                Ok(version) => Expected::Version(version),
                // A tag this store never issued cannot match.
                Err(_) => return Err(LeaseError::Conflict),
            },
        };
        let body = serde_json::to_vec(fields)
            .unwrap_or_else(|e| unreachable!("a JSON object always serializes: {e}"));
        let kind = OpKind::PutLease {
            group: group.to_owned(),
            name: name.to_owned(),
            expected,
            body,
        };
        match self.submit(kind).await {
            Ok(Applied::Leased {
                version: v,
                modified_ms,
            }) => Ok(version(v, modified_ms)),
            Ok(Applied::PreconditionFailed) => Err(LeaseError::Conflict),
            Ok(other) => unreachable!("a lease write is answered with its version, not {other:?}"),
            Err(e) => Err(LeaseError::Unavailable(Box::new(e))),
        }
    }
}
