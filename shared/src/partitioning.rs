//! Stable key → partition mapping.
//!
//! The hash is XXH3-64 (seed 0) of the key's UTF-8 bytes, reduced modulo the
//! partition count. It is fixed by its specification, so a key lands on the
//! same partition in every process, build and restart.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_is_fixed_by_the_hash_specification() {
        assert_eq!(xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(partition_for("d-1", 8), partition_for("d-1", 8));
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
