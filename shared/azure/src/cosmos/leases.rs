//! [`LeaseStore`] on Cosmos DB, in the leases container (partition key
//! `/partitionKey`): a lease is the document `{id: name, partitionKey: group,
//! …fields}`, its `_etag` the version writes are conditional on and its `_ts`
//! the last-modified time expiry is judged by. Listing a group is one
//! single-partition query.
//!
//! [`LeaseCondition::Absent`] is `create_item` (409: someone was first);
//! [`LeaseCondition::Matches`] is `replace_item` on the ETag (412, or 404 for
//! a lease that vanished: it changed); [`LeaseCondition::Any`] is an upsert.

use async_trait::async_trait;
use azure_core::http::Etag;
use azure_data_cosmos::options::{ItemWriteOptions, Precondition, QueryOptions};
use azure_data_cosmos::{FeedScope, Query};
use serde_json::Value;
use skyport_core::ports::{
    ETag, Lease, LeaseCondition, LeaseError, LeaseFields, LeaseStore, LeaseVersion,
};
use skyport_runtime::config::Work;
use time::OffsetDateTime;

use super::charge::Paged;
use super::request_units::Operation;
use super::store::CosmosStore;

const ID: &str = "id";
const GROUP: &str = "partitionKey";

/// The lease a stored document holds: its own fields, without the id, the
/// partition key and the system properties (`_etag`, `_ts`, `_rid`, …).
fn lease(mut document: LeaseFields) -> Option<Lease> {
    let name = document.remove(ID)?.as_str()?.to_owned();
    let etag = document.get("_etag")?.as_str()?.to_owned();
    let modified = document
        .get("_ts")
        .and_then(Value::as_i64)
        .and_then(|ts| OffsetDateTime::from_unix_timestamp(ts).ok())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    document.remove(GROUP);
    document.retain(|key, _| !key.starts_with('_'));
    Some(Lease {
        name,
        version: LeaseVersion {
            etag: ETag(etag),
            modified,
        },
        fields: document,
    })
}

#[async_trait]
impl LeaseStore for CosmosStore {
    async fn list(&self, group: &str, prefix: &str) -> Result<Vec<Lease>, LeaseError> {
        let documents = self
            .requests
            .run(Work::Leases, Operation::Query, u32::MAX, |options| async {
                let options = QueryOptions::default().with_operation_options(options);
                let query = self
                    .leases
                    .query_items::<LeaseFields>(
                        Query::from("SELECT * FROM c"),
                        FeedScope::partition(group.to_owned()),
                        Some(options),
                    )
                    .await?;
                Paged::read_all(query).await
            })
            .await
            .map_err(|e| LeaseError::Unavailable(e.into_box()))?;
        let mut leases: Vec<Lease> = documents
            .items
            .into_iter()
            .filter_map(lease)
            .filter(|lease| lease.name.starts_with(prefix))
            .collect();
        leases.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(leases)
    }

    async fn put(
        &self,
        group: &str,
        name: &str,
        fields: &LeaseFields,
        condition: LeaseCondition,
    ) -> Result<LeaseVersion, LeaseError> {
        let mut document = fields.clone();
        document.insert(ID.into(), name.into());
        document.insert(GROUP.into(), group.into());
        let result = self
            .requests
            .run(Work::Leases, Operation::Write, u32::MAX, |options| async {
                let options = ItemWriteOptions::default().with_operation_options(options);
                match &condition {
                    LeaseCondition::Any => {
                        self.leases
                            .upsert_item(group.to_owned(), name, &document, Some(options))
                            .await
                    }
                    LeaseCondition::Absent => {
                        self.leases
                            .create_item(group.to_owned(), name, &document, Some(options))
                            .await
                    }
                    LeaseCondition::Matches(ETag(etag)) => {
                        let options = options
                            .with_precondition(Precondition::if_match(Etag::from(etag.clone())));
                        self.leases
                            .replace_item(group.to_owned(), name, &document, Some(options))
                            .await
                    }
                }
            })
            .await;
        match result {
            Ok(response) => {
                let etag = response
                    .headers()
                    .etag()
                    .map(ToString::to_string)
                    .ok_or_else(|| LeaseError::Unavailable("the write carried no ETag".into()))?;
                Ok(LeaseVersion {
                    etag: ETag(etag),
                    modified: OffsetDateTime::now_utc(),
                })
            }
            Err(e) if e.lost_race() => Err(LeaseError::Conflict),
            Err(e) => Err(LeaseError::Unavailable(e.into_box())),
        }
    }
}
