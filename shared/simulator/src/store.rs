//! Sharded resource store of one simulated service: an id is created at most once, and every
//! later PUT of it is either a replay of the stored response or a conflict, never an overwrite.
//!
//! A real service keeps its resources; a simulated one only needs to remember them as long as
//! a client may retry, so each shard keeps two generations of at most half its share of
//! `max_resources` each: when the newer fills, the older is forgotten. A resource is held
//! by its id, the digest of its request and its response, never the request itself.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

/// Enough shards that a few thousand concurrent requests rarely contend on one lock.
const SHARDS: usize = 16;

pub(super) struct Store {
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Default)]
struct Shard {
    /// At most this many records in `newer`; `older` holds the generation before.
    generation: usize,
    newer: HashMap<String, Record>,
    older: HashMap<String, Record>,
}

struct Record {
    idempotency_key: Option<String>,
    /// The digest of the request's canonical JSON (object keys sorted).
    request: u128,
    /// Serialized once at creation (and at each update) so replays cost a
    /// reference-count bump, not a re-encode.
    response: Bytes,
    /// The idempotency keys of the updates applied, so that a retried
    /// update is applied once.
    updates: Vec<String>,
}

pub(super) enum PutOutcome {
    Created(Bytes),
    Replayed(Bytes),
    Conflict,
}

pub(super) enum UpdateOutcome {
    Updated(Bytes),
    /// The update under this key was applied before: the resource as it is.
    Replayed(Bytes),
    Missing,
}

impl Record {
    /// The idempotency rule: same key, or same body whatever the keys, is the same request.
    fn is_retry_of(&self, idempotency_key: Option<&str>, request: u128) -> bool {
        let same_key = matches!(
            (self.idempotency_key.as_deref(), idempotency_key),
            (Some(stored), Some(given)) if stored == given
        );
        same_key || self.request == request
    }
}

impl Shard {
    fn get(&self, id: &str) -> Option<&Record> {
        self.newer.get(id).or_else(|| self.older.get(id))
    }

    fn get_mut(&mut self, id: &str) -> Option<&mut Record> {
        match self.newer.get_mut(id) {
            Some(record) => Some(record),
            None => self.older.get_mut(id),
        }
    }

    fn insert(&mut self, id: String, record: Record) {
        if self.newer.len() >= self.generation {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(id, record);
    }
}

/// The digest `Record::request` holds: equal for equal JSON values, whatever their key order.
fn digest(request: &Value) -> u128 {
    xxh3_128(request.to_string().as_bytes())
}

impl Store {
    /// A store that remembers at least `max_resources / 2` and at most about
    /// `max_resources` of the most recently created resources.
    pub(super) fn new(max_resources: usize) -> Self {
        let generation = (max_resources / SHARDS / 2).max(1);
        Self {
            shards: std::array::from_fn(|_| {
                Mutex::new(Shard {
                    generation,
                    ..Shard::default()
                })
            }),
        }
    }

    /// Creates `id` with the response built by `create` unless it exists; `create` runs under
    /// the shard lock, so it is called at most once per remembered id.
    pub(super) fn put(
        &self,
        id: String,
        idempotency_key: Option<String>,
        request: &Value,
        create: impl FnOnce() -> Value,
    ) -> PutOutcome {
        let request = digest(request);
        let mut shard = self.shard(&id);
        if let Some(record) = shard.get(&id) {
            return if record.is_retry_of(idempotency_key.as_deref(), request) {
                PutOutcome::Replayed(record.response.clone())
            } else {
                PutOutcome::Conflict
            };
        }
        let response = Bytes::from(create().to_string());
        shard.insert(
            id,
            Record {
                idempotency_key,
                request,
                response: response.clone(),
                updates: Vec::new(),
            },
        );
        PutOutcome::Created(response)
    }

    /// Sets `fields` on resource `id`, once per `idempotency_key`.
    pub(super) fn update(
        &self,
        id: &str,
        idempotency_key: Option<String>,
        fields: &serde_json::Map<String, Value>,
    ) -> UpdateOutcome {
        let mut shard = self.shard(id);
        let Some(record) = shard.get_mut(id) else {
            return UpdateOutcome::Missing;
        };
        if let Some(key) = &idempotency_key
            && record.updates.contains(key)
        {
            return UpdateOutcome::Replayed(record.response.clone());
        }
        let mut resource: serde_json::Map<String, Value> =
            serde_json::from_slice(&record.response).unwrap_or_default();
        for (name, value) in fields {
            resource.insert(name.clone(), value.clone());
        }
        record.response = Bytes::from(Value::Object(resource).to_string());
        record.updates.extend(idempotency_key);
        UpdateOutcome::Updated(record.response.clone())
    }

    /// Removes `id`; returns whether it existed.
    pub(super) fn remove(&self, id: &str) -> bool {
        let mut shard = self.shard(id);
        let newer = shard.newer.remove(id).is_some();
        newer | shard.older.remove(id).is_some()
    }

    fn shard(&self, id: &str) -> MutexGuard<'_, Shard> {
        let index = (xxh3_64(id.as_bytes()) % SHARDS as u64) as usize;
        // Nothing panics while a shard is locked, and a map is never left half-updated anyway.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn put(store: &Store, id: usize) -> PutOutcome {
        store.put(
            format!("r{id}"),
            None,
            &json!({ "n": id }),
            || json!({ "id": id }),
        )
    }

    #[test]
    fn the_most_recent_resources_are_remembered_and_the_oldest_forgotten() {
        let store = Store::new(SHARDS * 2 * 10);
        for id in 0..10_000 {
            assert!(matches!(put(&store, id), PutOutcome::Created(_)));
        }
        let remembered = |range: std::ops::Range<usize>| {
            range
                .filter(|id| matches!(put(&store, *id), PutOutcome::Replayed(_)))
                .count()
        };
        // Every shard holds its newest generation whole, so the last
        // `max_resources / 2` (spread over the shards by hash) are all there.
        let newest = remembered(10_000 - 100..10_000);
        assert!(newest >= 95, "{newest} of the newest 100 were remembered");
        let oldest = remembered(0..1_000);
        assert_eq!(oldest, 0, "the oldest were kept");
        let held: usize = store
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                s.newer.len() + s.older.len()
            })
            .sum();
        assert!(held <= SHARDS * 2 * 10 + 1_100, "{held} records held");
    }

    #[test]
    fn equal_requests_are_equal_whatever_their_key_order() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"c":2,"d":3}}"#).unwrap_or_default();
        let b: Value = serde_json::from_str(r#"{"b":{"d":3,"c":2},"a":1}"#).unwrap_or_default();
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&json!({ "a": 2 })));
    }
}
