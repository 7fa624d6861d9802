//! Equal distribution of leases over the live instances (the change-feed
//! processor's feed ranges, the worker's timer shards), as the Cosmos DB
//! SDKs' `EqualPartitionsBalancingStrategy` does it: each instance aims at
//! `ceil(leases / instances)`; it takes leases nobody holds (no owner, or an
//! owner that stopped renewing) up to that, and when none is free it steals
//! one lease per cycle from the instance that holds the most, so a joining
//! instance gets its share over a few cycles without a stampede.

use std::collections::BTreeMap;

/// A lease as the balancer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<'a> {
    pub name: &'a str,
    /// The owner, when it renewed within the expiry.
    pub live_owner: Option<&'a str>,
}

/// The leases `me` should try to acquire this cycle.
pub fn choose<'a>(leases: &[Held<'a>], me: &str) -> Vec<&'a str> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for lease in leases {
        if let Some(owner) = lease.live_owner {
            *counts.entry(owner).or_default() += 1;
        }
    }
    let workers = counts.len() + usize::from(!counts.contains_key(me));
    let total = leases.len();
    let target = if total <= workers {
        1
    } else {
        total.div_ceil(workers)
    };
    let mine = counts.get(me).copied().unwrap_or(0);
    let Some(need) = target.checked_sub(mine).filter(|&need| need > 0) else {
        return Vec::new();
    };
    let mut free: Vec<&str> = leases
        .iter()
        .filter(|lease| lease.live_owner.is_none())
        .map(|lease| lease.name)
        .collect();
    if !free.is_empty() {
        // Instances starting together take different leases first.
        fastrand::shuffle(&mut free);
        free.truncate(need);
        return free;
    }
    let busiest = counts
        .iter()
        .filter(|(owner, _)| **owner != me)
        .max_by_key(|(_, count)| **count);
    match busiest {
        Some((owner, &count)) if count > target - usize::from(need > 1) => leases
            .iter()
            .find(|lease| lease.live_owner == Some(*owner))
            .map(|lease| vec![lease.name])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{Held, choose};

    fn leases<'a>(owners: &[Option<&'a str>], names: &'a [String]) -> Vec<Held<'a>> {
        owners
            .iter()
            .zip(names)
            .map(|(owner, name)| Held {
                name,
                live_owner: *owner,
            })
            .collect()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("l{i}")).collect()
    }

    #[test]
    fn an_only_instance_takes_every_free_lease() {
        let names = names(4);
        let taken = choose(&leases(&[None; 4], &names), "a");
        assert_eq!(taken.len(), 4);
    }

    #[test]
    fn a_second_instance_takes_half_of_the_free_leases() {
        let names = names(4);
        let held = leases(&[Some("b"), Some("b"), None, None], &names);
        let mut taken = choose(&held, "a");
        taken.sort_unstable();
        assert_eq!(taken, ["l2", "l3"]);
    }

    #[test]
    fn with_nothing_free_one_lease_is_stolen_from_the_busiest() {
        let names = names(4);
        let held = leases(&[Some("b"), Some("b"), Some("b"), Some("c")], &names);
        assert_eq!(choose(&held, "a"), ["l0"]);
    }

    #[test]
    fn an_even_split_steals_nothing() {
        let names = names(4);
        let held = leases(&[Some("a"), Some("a"), Some("b"), Some("b")], &names);
        assert!(choose(&held, "a").is_empty());
        assert!(choose(&held, "b").is_empty());
    }

    #[test]
    fn a_third_instance_steals_one_per_cycle_until_it_has_its_share() {
        let names = names(4);
        let held = leases(&[Some("a"), Some("a"), Some("b"), Some("b")], &names);
        assert_eq!(choose(&held, "c").len(), 1);
        let held = leases(&[Some("c"), Some("a"), Some("b"), Some("b")], &names);
        // Holding 1 of a target of 2, c steals no more: the others hold 2 and 1,
        // and taking one from b would leave b short in turn.
        assert!(choose(&held, "c").is_empty());
    }

    #[test]
    fn a_lone_lease_for_two_instances_is_not_stolen_back_and_forth() {
        let names = names(1);
        let held = leases(&[Some("b")], &names);
        assert!(choose(&held, "a").is_empty());
    }

    #[test]
    fn an_instance_at_its_share_takes_no_free_lease() {
        let names = names(4);
        let held = leases(&[Some("a"), Some("a"), Some("b"), None], &names);
        assert!(choose(&held, "a").is_empty());
        assert_eq!(choose(&held, "b"), ["l3"]);
    }

    #[test]
    fn free_leases_are_taken_before_any_is_stolen() {
        let names = names(3);
        let held = leases(&[Some("b"), Some("b"), None], &names);
        assert_eq!(choose(&held, "a"), ["l2"]);
    }

    #[test]
    fn the_stolen_lease_is_one_of_the_busiest_owners() {
        let names = names(6);
        let held = leases(
            &[
                Some("b"),
                Some("c"),
                Some("c"),
                Some("c"),
                Some("c"),
                Some("b"),
            ],
            &names,
        );
        assert_eq!(choose(&held, "a"), ["l1"]);
    }
}
