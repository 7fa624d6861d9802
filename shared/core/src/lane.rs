//! The lanes of the stream: a delivery's events all go to its lane, and the
//! expedited lane's partitions are read apart from the normal ones.

/// The partitions an event goes to: every event of a delivery goes to its
/// delivery's lane, so that they keep their order.
///
/// The expedited lane has partitions of its own (the embedded log's extra
/// partition, `kafka.expedited_topic`, `eventhubs.expedited_hubs`), each
/// with a window of its own in the worker, so an expedited delivery never
/// waits behind a backlog of normal ones. A stream without the lane
/// configured carries expedited events in the normal lane.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    #[default]
    Normal,
    Expedited,
}

impl Lane {
    /// The lane of a delivery requested with `expedited`.
    pub fn of(expedited: bool) -> Self {
        if expedited {
            Self::Expedited
        } else {
            Self::Normal
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Expedited => "expedited",
        }
    }

    pub fn is_normal(&self) -> bool {
        *self == Self::Normal
    }
}
