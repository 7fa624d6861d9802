//! Stable key → partition mapping.
//!
//! The hash is XXH3-64 (seed 0) of the key's UTF-8 bytes. It is fixed by its
//! specification, so a key lands on the same hub and partition in every
//! process, build and restart.
//!
//! - One stream of `p` partitions: partition = `h mod p`.
//! - `n` hubs (shards) of `p` partitions each: hub = `h mod n`, partition in
//!   the hub = `(h div n) mod p`. Dividing first keeps the two choices
//!   independent: with `h mod 2` and `h mod 4`, hub 0 would only ever see even
//!   partitions. With one hub this is the single-stream mapping.

use xxhash_rust::xxh3::xxh3_64;

/// The partition (0-based) of `key` among `partitions`.
///
/// # Panics
/// When `partitions` is zero; configuration validation rules that out.
pub fn partition_for(key: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "partition count must be positive");
    u32::try_from(xxh3_64(key.as_bytes()) % u64::from(partitions))
        .unwrap_or_else(|_| unreachable!("a value below a u32 fits a u32"))
}

/// Where `key` goes among `hubs` hubs: the hub (0-based) and its partition
/// among that hub's `partitions_of(hub)` partitions.
///
/// # Panics
/// When `hubs` or a partition count is zero; validation and the hubs' own
/// properties rule that out.
pub fn shard_for(key: &str, hubs: u32, partitions_of: impl Fn(u32) -> u32) -> (u32, u32) {
    assert!(hubs > 0, "hub count must be positive");
    let hash = xxh3_64(key.as_bytes());
    let hub = u32::try_from(hash % u64::from(hubs))
        .unwrap_or_else(|_| unreachable!("a value below a u32 fits a u32"));
    let partitions = partitions_of(hub);
    assert!(partitions > 0, "partition count must be positive");
    let partition = u32::try_from((hash / u64::from(hubs)) % u64::from(partitions))
        .unwrap_or_else(|_| unreachable!("a value below a u32 fits a u32"));
    (hub, partition)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_fixed_by_the_hash_specification() {
        assert_eq!(xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(partition_for("d-1", 8), partition_for("d-1", 8));
    }

    #[test]
    fn one_hub_maps_like_one_stream() {
        for i in 0..1_000 {
            let key = format!("delivery-{i}");
            assert_eq!(shard_for(&key, 1, |_| 8), (0, partition_for(&key, 8)));
        }
    }

    #[test]
    fn keys_spread_evenly_over_hubs_and_their_partitions() {
        let mut counts = [[0u32; 4]; 2];
        for i in 0..80_000 {
            let (hub, partition) = shard_for(&format!("delivery-{i}"), 2, |_| 4);
            counts[hub as usize][partition as usize] += 1;
        }
        for count in counts.iter().flatten() {
            assert!((9_000..=11_000).contains(count), "{counts:?}");
        }
    }

    #[test]
    fn keys_spread_evenly() {
        let mut counts = [0u32; 8];
        for i in 0..80_000 {
            counts[partition_for(&format!("delivery-{i}"), 8) as usize] += 1;
        }
        for count in counts {
            assert!((9_000..=11_000).contains(&count), "{counts:?}");
        }
    }
}
