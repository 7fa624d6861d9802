//! The committer's vocabulary: the writes it takes ([`Op`], [`OpKind`]), what
//! each expects to replace, and what it answers once the write is durable.

use std::sync::Arc;

use skyport_core::ports::{ChangeDeadLetter, DeadLetter};
use tokio::sync::oneshot;

use crate::listing::Listed;
use crate::sweep::{Cutoffs, Swept};

/// A commit that did not happen; every operation in it failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the embedded store could not commit")]
pub(crate) struct CommitFailed(#[source] pub(crate) Arc<redb::Error>);

pub(crate) type Reply = oneshot::Sender<Result<Applied, CommitFailed>>;

/// A write, with where to send its result once it is durable.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) reply: Reply,
}

#[derive(Debug)]
pub(crate) enum OpKind {
    /// Write a status document if its stored version is `expected` (`None`:
    /// absent), listed as `listed`; `settled_ms`: when its retention window
    /// starts (Unix ms; `None` while it is not settled); `due`: when its
    /// steps run (Unix ms), its revision and whether it is expedited, while
    /// it is Waiting.
    PutStatus {
        id: String,
        expected: Option<u64>,
        body: Vec<u8>,
        listed: Listed,
        settled_ms: Option<i64>,
        due: Option<(i64, u32, bool)>,
    },
    DeadLetter(DeadLetter),
    /// Forget the dead-lettered event at this position.
    RemoveDeadLetter {
        partition: u32,
        offset: u64,
    },
    ChangeDeadLetter(ChangeDeadLetter),
    /// Write a lease (an ownership claim or a checkpoint of the Event Hubs
    /// processor) if its stored version is as expected.
    PutLease {
        group: String,
        name: String,
        expected: Expected,
        body: Vec<u8>,
    },
    /// Remove what the retention windows have expired, up to a batch of each kind.
    Sweep(Cutoffs),
}

/// The version a conditional write expects to replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expected {
    Any,
    Absent,
    Version(u64),
}

/// The durable result of one operation.
#[derive(Debug)]
pub(crate) enum Applied {
    Written(u64),
    /// A lease's new version, and the commit's time in Unix milliseconds.
    Leased {
        version: u64,
        modified_ms: i64,
    },
    PreconditionFailed,
    Done,
    Swept(Swept),
}
