//! The lease store contract: what every `LeaseStore` adapter must do, as one
//! suite run against each (the embedded store and Cosmos DB) — first the
//! leases themselves (conditions, versions, listing by group and prefix),
//! then the Event Hubs processor's ownership and checkpoint store written
//! over them.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use azure_messaging_eventhubs::CheckpointStore;
use azure_messaging_eventhubs::models::{Checkpoint, Ownership};
use serde_json::json;
use skyport_azure::eventhubs::LeaseCheckpointStore;
use skyport_core::ports::{ETag, LeaseCondition, LeaseError, LeaseFields, LeaseStore};
use time::OffsetDateTime;

/// A store as the processors hold it.
pub type Leases = Arc<dyn CheckpointStore + Send + Sync>;

/// Runs the whole contract on `store`, which must be empty.
pub async fn lease_store_contract(store: Arc<dyn LeaseStore>) {
    leases_are_written_on_their_condition(store.as_ref()).await;
    let leases: Leases = Arc::new(LeaseCheckpointStore::new(Arc::clone(&store)));
    racing_claims_expire_and_move(&leases).await;
    checkpoints_list_back_exactly(&leases).await;
    each_instance_keeps_its_share_across_hubs(Arc::clone(&store)).await;
    hubs_renewing_together_hand_back_the_excess_once(store).await;
}

/// Over two hubs of 4 partitions and three owners, an instance that holds the
/// extra partition of both hubs (4, 2, 2) keeps 3 at its next renewal and
/// hands the fourth back; it cannot claim it again, and another instance can.
/// Then (3, 3, 2) a steal by the instance with 2 is refused, since it would
/// move a partition without evening the load; one by a new instance is not.
async fn each_instance_keeps_its_share_across_hubs(store: Arc<dyn LeaseStore>) {
    let hubs = ["shares-0", "shares-1"];
    let plain = LeaseCheckpointStore::new(Arc::clone(&store));
    let leases = LeaseCheckpointStore::across_hubs(
        store,
        hubs.iter().map(|h| (*h).to_owned()).collect(),
        Duration::from_secs(60),
    );
    let claim = |hub: &str, partition: usize, owner: &str, etag| Ownership {
        event_hub_name: hub.into(),
        ..ownership(partition, owner, etag)
    };
    // Claimed as the SDK balances each hub alone: a 0 and 1, b 2, c 3 in each.
    let mut held = Vec::new();
    for hub in hubs {
        for (partition, owner) in [(0, "a"), (1, "a"), (2, "b"), (3, "c")] {
            let won = plain
                .claim_ownership(&[claim(hub, partition, owner, None)])
                .await
                .unwrap();
            assert_eq!(won.len(), 1);
            held.push(won[0].clone());
        }
    }
    let renewal: Vec<Ownership> = held
        .iter()
        .filter(|o| o.event_hub_name == hubs[1] && o.owner_id.as_deref() == Some("a"))
        .cloned()
        .collect();
    let renewed = leases.claim_ownership(&renewal).await.unwrap();
    assert_eq!(
        renewed.len(),
        1,
        "a keeps 3 of the 8 partitions: {renewed:?}"
    );
    let listed = leases
        .list_ownerships(NAMESPACE, hubs[1], GROUP)
        .await
        .unwrap();
    let handed_back: Vec<&Ownership> = listed.iter().filter(|o| o.owner_id.is_none()).collect();
    assert_eq!(handed_back.len(), 1, "{listed:?}");
    let partition: usize = handed_back[0].partition_id.parse().unwrap();
    let again = claim(hubs[1], partition, "a", handed_back[0].etag.clone());
    assert!(leases.claim_ownership(&[again]).await.unwrap().is_empty());
    let by_b = claim(hubs[1], partition, "b", handed_back[0].etag.clone());
    assert_eq!(leases.claim_ownership(&[by_b]).await.unwrap().len(), 1);
    let listed = leases
        .list_ownerships(NAMESPACE, hubs[0], GROUP)
        .await
        .unwrap();
    let of_a = listed
        .iter()
        .find(|o| o.owner_id.as_deref() == Some("a"))
        .unwrap();
    let partition: usize = of_a.partition_id.parse().unwrap();
    let by_c = claim(hubs[0], partition, "c", of_a.etag.clone());
    assert!(
        leases.claim_ownership(&[by_c]).await.unwrap().is_empty(),
        "c (2 partitions) must not steal from a (3)"
    );
    let by_d = claim(hubs[0], partition, "d", of_a.etag.clone());
    assert_eq!(leases.claim_ownership(&[by_d]).await.unwrap().len(), 1);
}

/// An instance holding 6 of 8 partitions over two hubs with one other owner
/// (share 4) renews both hubs at once: it keeps 4 and hands 2 back, never
/// both hubs cutting for the same excess.
async fn hubs_renewing_together_hand_back_the_excess_once(store: Arc<dyn LeaseStore>) {
    let hubs = ["together-0", "together-1"];
    let plain = LeaseCheckpointStore::new(Arc::clone(&store));
    let leases = LeaseCheckpointStore::across_hubs(
        store,
        hubs.iter().map(|h| (*h).to_owned()).collect(),
        Duration::from_secs(60),
    );
    let mut renewals = [Vec::new(), Vec::new()];
    for (hub, renewal) in hubs.iter().zip(&mut renewals) {
        for (partition, owner) in [(0, "a"), (1, "a"), (2, "a"), (3, "b")] {
            let won = plain
                .claim_ownership(&[Ownership {
                    event_hub_name: (*hub).into(),
                    ..ownership(partition, owner, None)
                }])
                .await
                .unwrap();
            if owner == "a" {
                renewal.extend(won);
            }
        }
    }
    let (first, second) = tokio::join!(
        leases.claim_ownership(&renewals[0]),
        leases.claim_ownership(&renewals[1])
    );
    let kept = first.unwrap().len() + second.unwrap().len();
    assert_eq!(kept, 4, "a keeps its share of 4, handing back 2 of its 6");
}

fn fields(value: serde_json::Value) -> LeaseFields {
    match value {
        serde_json::Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

async fn leases_are_written_on_their_condition(store: &dyn LeaseStore) {
    let (group, other_group) = ("contract/a", "contract/b");
    let owner = |who: &str| fields(json!({ "owner": who, "n": 1 }));
    let first = store
        .put(group, "lease-1", &owner("a"), LeaseCondition::Absent)
        .await
        .unwrap();
    let age = OffsetDateTime::now_utc() - first.modified;
    assert!(age.abs() < time::Duration::seconds(5), "modified {age} ago");
    assert!(matches!(
        store
            .put(group, "lease-1", &owner("b"), LeaseCondition::Absent)
            .await,
        Err(LeaseError::Conflict)
    ));
    let second = store
        .put(
            group,
            "lease-1",
            &owner("b"),
            LeaseCondition::Matches(first.etag.clone()),
        )
        .await
        .unwrap();
    assert_ne!(second.etag, first.etag);
    for stale in [first.etag.clone(), ETag("not-a-version".into())] {
        assert!(matches!(
            store
                .put(
                    group,
                    "lease-1",
                    &owner("c"),
                    LeaseCondition::Matches(stale)
                )
                .await,
            Err(LeaseError::Conflict)
        ));
    }
    store
        .put(group, "other-1", &owner("x"), LeaseCondition::Any)
        .await
        .unwrap();
    store
        .put(group, "lease-0", &owner("z"), LeaseCondition::Any)
        .await
        .unwrap();
    store
        .put(other_group, "lease-9", &owner("y"), LeaseCondition::Absent)
        .await
        .unwrap();
    let listed = store.list(group, "lease-").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["lease-0", "lease-1"]);
    assert_eq!(
        listed[1].fields,
        owner("b"),
        "the fields come back as written"
    );
    assert_eq!(listed[1].version.etag, second.etag);
    assert_eq!(store.list(other_group, "").await.unwrap().len(), 1);
    assert!(store.list("contract/none", "").await.unwrap().is_empty());
}

const NAMESPACE: &str = "skyport.servicebus.windows.net";
const HUB: &str = "deliveries-0";
const GROUP: &str = "$Default";
const PARTITIONS: usize = 32;

fn ownership(partition: usize, owner: &str, etag: Option<azure_core::http::Etag>) -> Ownership {
    Ownership {
        fully_qualified_namespace: NAMESPACE.into(),
        event_hub_name: HUB.into(),
        consumer_group: GROUP.into(),
        partition_id: partition.to_string(),
        owner_id: Some(owner.into()),
        etag,
        last_modified_time: None,
    }
}

/// Who owns what, by partition, as the store lists it.
async fn owners(store: &(dyn CheckpointStore + Send + Sync)) -> BTreeMap<String, Ownership> {
    let listed = store.list_ownerships(NAMESPACE, HUB, GROUP).await.unwrap();
    listed
        .into_iter()
        .map(|o| (o.partition_id.clone(), o))
        .collect()
}

/// Three processors racing for every partition each win distinct ones; an
/// idle owner's claims expire and go to another; a stale claim loses.
async fn racing_claims_expire_and_move(leases: &Leases) {
    // Three processors claim every partition at once: each partition goes to exactly one.
    let mut racers = tokio::task::JoinSet::new();
    for owner in ["a", "b", "c"] {
        let leases = Arc::clone(leases);
        racers.spawn(async move {
            let claims: Vec<_> = (0..PARTITIONS).map(|p| ownership(p, owner, None)).collect();
            (owner, leases.claim_ownership(&claims).await.unwrap())
        });
    }
    let won: Vec<(&str, Vec<Ownership>)> = racers.join_all().await;
    let claimed: usize = won.iter().map(|(_, w)| w.len()).sum();
    assert_eq!(
        claimed, PARTITIONS,
        "the claims won add up to the partitions, none twice"
    );
    let listed = owners(leases.as_ref()).await;
    assert_eq!(listed.len(), PARTITIONS);
    for (owner, claims) in &won {
        for claim in claims {
            assert_eq!(
                listed[&claim.partition_id].owner_id.as_deref(),
                Some(*owner)
            );
            assert!(claim.etag.is_some() && claim.last_modified_time.is_some());
        }
    }

    // "a" stops renewing; "b" and "c" renew theirs. After the expiry, "b" takes "a"'s.
    let expiry = Duration::from_secs(2);
    tokio::time::sleep(expiry + Duration::from_millis(1_100)).await;
    for (owner, claims) in &won {
        if *owner != "a" {
            let renewals: Vec<_> = claims
                .iter()
                .map(|c| {
                    ownership(
                        c.partition_id.parse().unwrap(),
                        owner,
                        listed[&c.partition_id].etag.clone(),
                    )
                })
                .collect();
            assert_eq!(
                leases.claim_ownership(&renewals).await.unwrap().len(),
                renewals.len()
            );
        }
    }
    let now = OffsetDateTime::now_utc();
    let listed = owners(leases.as_ref()).await;
    let expired: Vec<&Ownership> = listed
        .values()
        .filter(|o| o.last_modified_time.is_some_and(|t| t + expiry < now))
        .collect();
    let idle: HashSet<String> = won
        .iter()
        .filter(|(owner, _)| *owner == "a")
        .flat_map(|(_, claims)| claims.iter().map(|c| c.partition_id.clone()))
        .collect();
    assert_eq!(
        expired
            .iter()
            .map(|o| o.partition_id.clone())
            .collect::<HashSet<_>>(),
        idle,
        "exactly the idle owner's partitions expired"
    );
    let takeovers: Vec<_> = expired
        .iter()
        .map(|o| ownership(o.partition_id.parse().unwrap(), "b", o.etag.clone()))
        .collect();
    assert_eq!(
        leases.claim_ownership(&takeovers).await.unwrap().len(),
        takeovers.len()
    );
    // "a" wakes up and tries to renew with what it knew: it lost them.
    let stale: Vec<_> = expired
        .iter()
        .map(|o| ownership(o.partition_id.parse().unwrap(), "a", o.etag.clone()))
        .collect();
    assert!(leases.claim_ownership(&stale).await.unwrap().is_empty());
    let listed = owners(leases.as_ref()).await;
    assert!(listed.values().all(|o| o.owner_id.as_deref() != Some("a")));
    assert_eq!(listed.len(), PARTITIONS);

    // An owner gives its partitions up (a graceful stop): they are unowned,
    // and a new processor "d" claims them at once.
    let leaving = listed.values().next().and_then(|o| o.owner_id.clone());
    let released: Vec<_> = listed
        .values()
        .filter(|o| o.owner_id == leaving)
        .map(|o| Ownership {
            owner_id: None,
            ..o.clone()
        })
        .collect();
    assert!(!released.is_empty());
    assert_eq!(
        leases.claim_ownership(&released).await.unwrap().len(),
        released.len()
    );
    let listed = owners(leases.as_ref()).await;
    let unowned: Vec<_> = listed.values().filter(|o| o.owner_id.is_none()).collect();
    assert_eq!(unowned.len(), released.len());
    let claims: Vec<_> = unowned
        .iter()
        .map(|o| ownership(o.partition_id.parse().unwrap(), "d", o.etag.clone()))
        .collect();
    assert_eq!(
        leases.claim_ownership(&claims).await.unwrap().len(),
        claims.len()
    );
    let listed = owners(leases.as_ref()).await;
    for claim in &claims {
        assert_eq!(listed[&claim.partition_id].owner_id.as_deref(), Some("d"));
    }
    assert!(
        listed
            .values()
            .all(|o| o.owner_id.is_some() && o.owner_id != leaving)
    );
}

/// Checkpoints list back exactly, per hub, the latest of each partition.
async fn checkpoints_list_back_exactly(leases: &Leases) {
    let written: Vec<Checkpoint> = (0..PARTITIONS)
        .map(|p| Checkpoint {
            fully_qualified_namespace: NAMESPACE.into(),
            event_hub_name: HUB.into(),
            consumer_group: GROUP.into(),
            partition_id: p.to_string(),
            offset: Some(format!("{}", p * 1_000)),
            sequence_number: Some(p as i64 * 10),
        })
        .collect();
    for checkpoint in &written {
        leases.update_checkpoint(checkpoint.clone()).await.unwrap();
    }
    // A later checkpoint of one partition replaces its earlier one.
    let mut moved = written[3].clone();
    moved.sequence_number = Some(999);
    leases.update_checkpoint(moved.clone()).await.unwrap();
    let key = |c: &Checkpoint| (c.partition_id.clone(), c.offset.clone(), c.sequence_number);
    let mut expected: Vec<_> = written.iter().map(key).collect();
    expected[3] = key(&moved);
    expected.sort();
    let mut listed: Vec<_> = leases
        .list_checkpoints(NAMESPACE, HUB, GROUP)
        .await
        .unwrap()
        .iter()
        .map(key)
        .collect();
    listed.sort();
    assert_eq!(listed, expected);
    assert!(
        leases
            .list_checkpoints(NAMESPACE, "another-hub", GROUP)
            .await
            .unwrap()
            .is_empty()
    );
}
