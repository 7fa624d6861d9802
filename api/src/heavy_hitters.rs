//! The quotas' busiest clients, for the dashboard: a Space-Saving summary
//! (Metwally, Agrawal and El Abbadi, "Efficient Computation of Frequent and
//! Top-k Elements in Data Streams", 2005) of a fixed number of entries, so
//! that its memory never grows with the number of clients.
//!
//! A client the summary does not hold takes the place of the entry of least
//! weight and inherits that weight, so every client that made more than
//! 1/capacity of the requests counted is held. What an entry shows, the
//! requests let through and refused, is counted from its entry and exact.

use std::collections::HashMap;

use skyport_runtime::dashboard::ClientCount;

/// Clients the quotas' summary holds: about 9 KB (its table, 128 slots of
/// 56 bytes, and a name of up to 24 characters in 32 bytes each).
pub const CAPACITY: usize = 64;

/// The busiest clients among those counted, at most `capacity` of them.
#[derive(Debug)]
pub struct HeavyHitters {
    capacity: usize,
    entries: HashMap<String, Entry>,
    /// Entries made so far, which numbers the next one.
    entered: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    number: u64,
    accepted: u64,
    refused: u64,
    /// What ranks the entry: its requests and the weight it inherited.
    weight: u64,
}

impl Entry {
    fn add(&mut self, accepted: bool) {
        if accepted {
            self.accepted += 1;
        } else {
            self.refused += 1;
        }
        self.weight += 1;
    }
}

impl HeavyHitters {
    /// An empty summary of at most `capacity` clients (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            entries: HashMap::with_capacity(capacity),
            entered: 0,
        }
    }

    /// Counts one request of `client`, let through when `accepted`, else refused.
    pub fn count(&mut self, client: &str, accepted: bool) {
        if let Some(entry) = self.entries.get_mut(client) {
            entry.add(accepted);
            return;
        }
        self.enter(client).add(accepted);
    }

    /// A new entry for `client`, in the place of the least one when full.
    fn enter(&mut self, client: &str) -> &mut Entry {
        let number = self.entered;
        self.entered += 1;
        let least = (self.entries.len() >= self.capacity)
            .then(|| {
                self.entries
                    .values()
                    .min_by_key(|entry| (entry.weight, entry.number))
                    .map(|entry| entry.number)
            })
            .flatten();
        // The forgotten client's name keeps its allocation for the new one.
        let (name, weight) = match least.and_then(|least| {
            self.entries
                .extract_if(|_, entry| entry.number == least)
                .next()
        }) {
            Some((mut name, forgotten)) => {
                name.clear();
                name.push_str(client);
                (name, forgotten.weight)
            }
            None => (client.to_owned(), 0),
        };
        self.entries.entry(name).or_insert(Entry {
            number,
            accepted: 0,
            refused: 0,
            weight,
        })
    }

    /// Every client held, busiest first.
    pub fn clients(&self) -> Vec<ClientCount> {
        let mut entries: Vec<_> = self.entries.iter().collect();
        entries.sort_by(|(a_name, a), (b_name, b)| {
            b.weight.cmp(&a.weight).then_with(|| a_name.cmp(b_name))
        });
        entries
            .into_iter()
            .map(|(name, entry)| ClientCount {
                name: name.clone(),
                entry: entry.number,
                accepted: entry.accepted,
                refused: entry.refused,
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn held<'a>(clients: &'a [ClientCount], name: &str) -> Option<&'a ClientCount> {
        clients.iter().find(|client| client.name == name)
    }

    #[test]
    fn within_its_capacity_every_client_is_counted_exactly_busiest_first() {
        let mut summary = HeavyHitters::new(4);
        for (client, accepted, refused) in [("alice", 3, 2), ("bob", 2, 0), ("carol", 1, 0)] {
            for _ in 0..accepted {
                summary.count(client, true);
            }
            for _ in 0..refused {
                summary.count(client, false);
            }
        }
        let clients = summary.clients();
        let counts: Vec<_> = clients
            .iter()
            .map(|c| (c.name.as_str(), c.accepted, c.refused))
            .collect();
        assert_eq!(counts, [("alice", 3, 2), ("bob", 2, 0), ("carol", 1, 0)]);
        let entries: Vec<_> = clients.iter().map(|c| c.entry).collect();
        assert_eq!(entries, [0, 1, 2]);
    }

    #[test]
    fn heavy_hitters_are_found_among_many_light_clients_in_bounded_memory() {
        let mut summary = HeavyHitters::new(8);
        let allocated = summary.entries.capacity();
        let mut light = 0;
        // 100,000 requests: "big" makes a quarter, "medium" a fifth, and the
        // rest come from clients seen once each.
        for n in 0..100_000 {
            if n % 4 == 0 {
                summary.count("big", n % 8 != 0);
            } else if n % 5 == 0 {
                summary.count("medium", true);
            } else {
                light += 1;
                summary.count(&format!("light-{light}"), true);
            }
        }
        assert!(light > 50_000, "{light} clients seen once");
        assert_eq!(summary.entries.len(), 8);
        assert_eq!(summary.entries.capacity(), allocated, "the map never grew");
        let clients = summary.clients();
        assert_eq!(clients[0].name, "big");
        assert_eq!(clients[1].name, "medium");
        // Held since their first request, so counted exactly.
        let big = held(&clients, "big").unwrap();
        assert_eq!((big.accepted, big.refused), (12_500, 12_500));
        assert_eq!(held(&clients, "medium").unwrap().accepted, 15_000);
        assert_eq!((big.entry, held(&clients, "medium").unwrap().entry), (0, 4));
    }

    #[test]
    fn a_forgotten_client_comes_back_with_a_new_entry_counted_from_there() {
        let mut summary = HeavyHitters::new(2);
        for _ in 0..3 {
            summary.count("a", true);
        }
        summary.count("b", true);
        // "c" takes the least entry, "b"'s, and its weight (1 + 1 = 2).
        summary.count("c", false);
        assert!(held(&summary.clients(), "b").is_none());
        // "b" comes back in "c"'s place (2 < 3): a new entry, counted afresh.
        summary.count("b", true);
        let clients = summary.clients();
        let names: Vec<_> = clients.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "a and b weigh 3 each; by name");
        let b = held(&clients, "b").unwrap();
        assert_eq!((b.entry, b.accepted, b.refused), (3, 1, 0));
        assert_eq!(held(&clients, "a").unwrap().entry, 0);
    }
}
