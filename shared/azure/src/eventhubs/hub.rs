//! One hub as this instance reads it: [`HubContext`], shared by the
//! consumer that opens the hubs, the readers of their partitions and the
//! task that reads the partitions' ends.

use skyport_core::ports::Lane;

/// Where one hub's partitions are and who this instance is in its ownership records.
#[derive(Debug, Clone)]
pub(crate) struct HubContext {
    pub(crate) namespace: String,
    pub(crate) hub: String,
    pub(crate) consumer_group: String,
    pub(crate) owner: String,
    /// The worker's number of this hub's first partition.
    pub(crate) first: u32,
    /// The partition ids, in the order the worker numbers them.
    pub(crate) partition_ids: Vec<String>,
    pub(crate) lane: Lane,
}
