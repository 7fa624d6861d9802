//! Delivery ids: the ones the gateway makes for requests that name none, and
//! the shapes a client may therefore not choose, so that no POST can take
//! an id the gateway gave (or will give) another delivery.
//!
//! The gateway makes `sp-` and a time-ordered UUID (version 7: the
//! millisecond, then 74 random bits) for an unnamed request, so that
//! deliveries accepted together are stored together (a status write then
//! lands on pages the store has just written, not on a random one); and
//! `k-` and 32 hex digits for one named by its `Idempotency-Key` (derived
//! from the client and the key: [`crate::idempotency`]). A client-chosen
//! `deliveryId` of either shape is refused.

/// What every id the gateway makes for an unnamed request starts with.
pub const GENERATED_PREFIX: &str = "sp-";
/// What an id derived from an `Idempotency-Key` starts with.
pub const DERIVED_PREFIX: &str = "k-";
/// The hex digits after [`DERIVED_PREFIX`].
pub const DERIVED_HEX: usize = 32;

/// A new id for a request that names no delivery.
pub fn generated() -> String {
    format!("{GENERATED_PREFIX}{}", uuid::Uuid::now_v7())
}

/// The last segment of the batch route, which no delivery may be named.
const BATCH: &str = "batch";

/// Why a client may not choose `id`, if it may not: the gateway's own shapes.
pub fn refusal(id: &str) -> Option<String> {
    if id == BATCH {
        return Some(format!(
            "must not be {BATCH:?}: /api/deliveryrequests/{BATCH} is the route of batches"
        ));
    }
    if id.starts_with(GENERATED_PREFIX) {
        return Some(format!(
            "must not start with {GENERATED_PREFIX:?}: the gateway names the deliveries of \
             requests that name none so"
        ));
    }
    let derived = id
        .strip_prefix(DERIVED_PREFIX)
        .is_some_and(|hex| hex.len() == DERIVED_HEX && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    derived.then(|| {
        format!(
            "must not be {DERIVED_PREFIX:?} and {DERIVED_HEX} hex digits: the gateway names the \
             deliveries of requests with an Idempotency-Key so"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_sort_in_the_order_they_were_made() {
        let made: Vec<String> = (0..1_000).map(|_| generated()).collect();
        let mut sorted = made.clone();
        sorted.sort();
        assert_eq!(made, sorted);
        sorted.dedup();
        assert_eq!(sorted.len(), made.len(), "each one new");
    }

    #[test]
    fn the_gateways_own_shapes_are_refused_and_the_rest_taken() {
        let generated = generated();
        assert!(skyport_core::request::is_valid_id(&generated));
        assert!(refusal(&generated).is_some());
        assert!(refusal("sp-mine").is_some());
        assert!(refusal("k-0123456789abcdef0123456789ABCDEF").is_some());
        for taken in [
            "d-2026-11-21-0001",
            "order-42",
            "k-42",
            "k-0123456789abcdef0123456789abcdeg",
            "2ea05e51-0c5f-4f6e-9b8c-3d1e2f4a5b6c",
            "spx-1",
        ] {
            assert_eq!(refusal(taken), None, "{taken}");
        }
    }
}
