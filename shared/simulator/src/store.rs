//! Sharded resource store of one simulated service: an id is created at most once, and every
//! later PUT of it is either a replay of the stored response or a conflict, never an overwrite.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// Enough shards that a few thousand concurrent requests rarely contend on one lock.
const SHARDS: usize = 16;

pub(super) struct Store {
    shards: [Mutex<HashMap<String, Record>>; SHARDS],
}

struct Record {
    idempotency_key: Option<String>,
    request: Value,
    /// Serialized once at creation so replays cost a reference-count bump, not a re-encode.
    response: Bytes,
}

pub(super) enum PutOutcome {
    Created(Bytes),
    Replayed(Bytes),
    Conflict,
}

impl Record {
    /// The idempotency rule: same key, or same body whatever the keys, is the same request.
    fn is_retry_of(&self, idempotency_key: Option<&str>, request: &Value) -> bool {
        let same_key = matches!(
            (self.idempotency_key.as_deref(), idempotency_key),
            (Some(stored), Some(given)) if stored == given
        );
        same_key || self.request == *request
    }
}

impl Store {
    pub(super) fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    /// Creates `id` with the response built by `create` unless it exists; `create` runs under
    /// the shard lock, so it is called at most once per id.
    pub(super) fn put(
        &self,
        id: String,
        idempotency_key: Option<String>,
        request: Value,
        create: impl FnOnce() -> Value,
    ) -> PutOutcome {
        let mut shard = self.shard(&id);
        match shard.entry(id) {
            Entry::Occupied(entry) => {
                let record = entry.get();
                if record.is_retry_of(idempotency_key.as_deref(), &request) {
                    PutOutcome::Replayed(record.response.clone())
                } else {
                    PutOutcome::Conflict
                }
            }
            Entry::Vacant(entry) => {
                let response = Bytes::from(create().to_string());
                entry.insert(Record {
                    idempotency_key,
                    request,
                    response: response.clone(),
                });
                PutOutcome::Created(response)
            }
        }
    }

    /// Removes `id`; returns whether it existed.
    pub(super) fn remove(&self, id: &str) -> bool {
        self.shard(id).remove(id).is_some()
    }

    fn shard(&self, id: &str) -> MutexGuard<'_, HashMap<String, Record>> {
        let index = (xxh3_64(id.as_bytes()) % SHARDS as u64) as usize;
        // Nothing panics while a shard is locked, and a map is never left half-updated anyway.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
