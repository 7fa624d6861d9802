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
pub(crate) use skyport_core::ports::RANGE_LEASE_PREFIX as PREFIX;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;
    use skyport_core::ports::{FeedRange, LeaseCondition, LeaseError};
    use skyport_runtime::balance::{Held, choose};
    use time::OffsetDateTime;

    use super::{LeaseDoc, Stored};
    use crate::change_feed::fixture::{Fixture, PROCESSOR};

    fn half(min: &str, max: &str) -> FeedRange {
        FeedRange {
            min: min.into(),
            max: max.into(),
        }
    }

    #[test]
    fn a_lease_names_its_checkpoint_as_stores_that_sweep_old_changes_read_it() {
        let mut doc = LeaseDoc::new(&FeedRange::full());
        doc.continuation = Some("42".into());
        doc.retired = true;
        let fields = doc.fields();
        assert_eq!(fields[skyport_core::ports::LEASE_CONTINUATION], json!("42"));
        assert_eq!(fields[skyport_core::ports::LEASE_RETIRED], json!(true));
        assert!(
            doc.name()
                .starts_with(skyport_core::ports::RANGE_LEASE_PREFIX)
        );
    }

    #[tokio::test]
    async fn a_lease_is_created_once_and_a_second_create_finds_it_made() {
        let fixture = Fixture::open();
        let leases = fixture.leases();
        let first = fixture.acquired("a").await;
        leases
            .create(&LeaseDoc::new(&FeedRange::full()))
            .await
            .unwrap();
        let listed = leases.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].name, "range.-FF");
        assert_eq!(listed[0].doc.owner.as_deref(), Some("a"));
        assert_eq!(listed[0].etag, first.etag);
    }

    #[tokio::test]
    async fn only_the_writer_at_the_version_it_read_acquires_a_lease() {
        let fixture = Fixture::open();
        let leases = fixture.leases();
        leases
            .create(&LeaseDoc::new(&FeedRange::full()))
            .await
            .unwrap();
        let read = fixture.lease().await;
        let mut mine = read.doc.clone();
        mine.owner = Some("a".into());
        let mut theirs = read.doc.clone();
        theirs.owner = Some("b".into());
        leases.replace(&mine, &read.etag).await.unwrap();
        let late = leases.replace(&theirs, &read.etag).await;
        assert!(matches!(late, Err(LeaseError::Conflict)));
        assert_eq!(fixture.lease().await.doc.owner.as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn a_renewal_gives_the_lease_a_new_version_and_a_later_time() {
        let fixture = Fixture::open();
        let acquired = fixture.acquired("a").await;
        let renewed = fixture
            .leases()
            .replace(&acquired.doc, &acquired.etag)
            .await
            .unwrap();
        assert_ne!(renewed.etag, acquired.etag);
        assert!(renewed.modified >= acquired.modified);
        assert_eq!(renewed.doc, acquired.doc);
        let stored = fixture.lease().await;
        assert_eq!(stored.etag, renewed.etag);
        assert_eq!(stored.modified, renewed.modified);
    }

    #[tokio::test]
    async fn an_owner_is_live_until_the_expiry_after_its_last_write() {
        let fixture = Fixture::open();
        let acquired = fixture.acquired("a").await;
        let expiry = time::Duration::seconds(60);
        let written = acquired.modified;
        assert_eq!(acquired.live_owner(written, expiry), Some("a"));
        assert_eq!(
            acquired.live_owner(written + expiry - time::Duration::MILLISECOND, expiry),
            Some("a")
        );
        assert_eq!(acquired.live_owner(written + expiry, expiry), None);
        let released = Stored {
            doc: LeaseDoc {
                owner: None,
                ..acquired.doc.clone()
            },
            ..acquired
        };
        assert_eq!(released.live_owner(written, expiry), None);
    }

    #[tokio::test]
    async fn a_checkpoint_is_kept_with_the_owner_and_read_back() {
        let fixture = Fixture::open();
        let acquired = fixture.acquired("a").await;
        let mut doc = acquired.doc.clone();
        doc.continuation = Some("42".into());
        fixture
            .leases()
            .replace(&doc, &acquired.etag)
            .await
            .unwrap();
        let stored = fixture.lease().await;
        assert_eq!(stored.doc.continuation.as_deref(), Some("42"));
        assert_eq!(stored.doc.owner.as_deref(), Some("a"));
        assert!(!stored.doc.retired);
    }

    #[tokio::test]
    async fn only_this_processors_range_leases_are_listed() {
        let fixture = Fixture::open();
        let leases = fixture.leases();
        leases
            .create(&LeaseDoc::new(&half("", "7F")))
            .await
            .unwrap();
        leases
            .create(&LeaseDoc::new(&half("7F", "FF")))
            .await
            .unwrap();
        let other = LeaseDoc::new(&FeedRange::full());
        let store = fixture.lease_store();
        store
            .put(
                "another-processor",
                &other.name(),
                &other.fields(),
                LeaseCondition::Absent,
            )
            .await
            .unwrap();
        let not_a_range = json!({"owner": "a"}).as_object().unwrap().clone();
        store
            .put(
                PROCESSOR,
                "range.broken",
                &not_a_range,
                LeaseCondition::Absent,
            )
            .await
            .unwrap();
        store
            .put(
                PROCESSOR,
                "ownership.0",
                &other.fields(),
                LeaseCondition::Absent,
            )
            .await
            .unwrap();
        let names: Vec<String> = leases
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, ["range.-7F", "range.7F-FF"]);
        assert!(leases.get("range.broken").await.unwrap().is_none());
        assert!(leases.get("range.-7F").await.unwrap().is_some());
    }

    #[test]
    fn a_lease_is_named_after_its_range() {
        assert_eq!(LeaseDoc::new(&half("3F", "7F")).name(), "range.3F-7F");
        assert_eq!(LeaseDoc::new(&half("3F", "7F")).range(), half("3F", "7F"));
    }

    #[tokio::test]
    async fn leases_in_the_store_whose_owner_stopped_renewing_are_free_to_take() {
        let fixture = Fixture::open();
        let leases = fixture.leases();
        for (min, max) in [("", "7F"), ("7F", "FF")] {
            let range = FeedRange {
                min: min.into(),
                max: max.into(),
            };
            leases
                .create(&LeaseDoc {
                    owner: Some("gone".into()),
                    ..LeaseDoc::new(&range)
                })
                .await
                .unwrap();
        }
        let stored = leases.list().await.unwrap();
        let decide = |now: OffsetDateTime| {
            let held: Vec<Held<'_>> = stored
                .iter()
                .map(|lease| Held {
                    name: &lease.name,
                    live_owner: lease.live_owner(now, time::Duration::seconds(60)),
                })
                .collect();
            let mut taken: Vec<String> =
                choose(&held, "a").into_iter().map(str::to_owned).collect();
            taken.sort();
            taken
        };
        let written = stored.iter().map(|lease| lease.modified).max().unwrap();
        assert_eq!(decide(written), ["range.-7F"]);
        assert_eq!(
            decide(written + time::Duration::seconds(61)),
            ["range.-7F", "range.7F-FF"]
        );
    }
}
