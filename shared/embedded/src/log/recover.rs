//! Reading the segments back at start: every partition's index, the last
//! commit, the reservations not yet copied into the database, and a torn
//! tail cut (only the last commit can be torn).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::checkpoints::Checkpoints;
use super::frame::{self, Decoded};
use super::index::{Index, Location};
use super::segment::{self, DATA_START};
use super::{LogError, reservation_slot, reservations, scan};
use crate::faults::Faults;

/// What reading the segments back at start found.
pub(super) struct Recovered {
    pub(super) indexes: Vec<Index>,
    pub(super) segments: BTreeMap<u64, Arc<File>>,
    /// The segment to write to and where.
    pub(super) active: (u64, u64),
    pub(super) next_commit: u64,
    /// Reservation records not yet copied into the database.
    pub(super) unfolded: Vec<(u64, reservations::Record)>,
}

/// Reads every segment in `dir` back (see the module documentation).
pub(super) fn recover(
    dir: &Path,
    partitions: u32,
    segment_size: u64,
    checkpoints: &Checkpoints,
    faults: &Faults,
) -> Result<Recovered, LogError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LogError::Io { path, source }
    };
    let ids = segment::list(dir).map_err(io(dir))?;
    let mut indexes: Vec<Index> = (0..=reservation_slot(partitions))
        .map(|_| Index::default())
        .collect();
    let mut segments = BTreeMap::new();
    let mut last_commit = None;
    let mut unfolded = Vec::new();
    // (id, end, written_to) of each segment, to check once the last one with data is known.
    let mut extents = Vec::new();
    for &id in &ids {
        let path = segment::path(dir, id);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        if !segment::header_is(&bytes, id, partitions) {
            return Err(LogError::Foreign { path });
        }
        let found = scan::scan(&bytes, DATA_START, last_commit);
        if let Some(position) = found.damaged_at {
            return Err(LogError::Damaged {
                path,
                position: position as u64,
            });
        }
        last_commit = found.last_commit;
        for record in &found.records {
            let damaged = || LogError::Damaged {
                path: path.clone(),
                position: record.position,
            };
            let slot = if record.partition == reservations::STREAM {
                reservation_slot(partitions)
            } else if record.partition <= partitions {
                record.partition as usize
            } else {
                return Err(damaged());
            };
            let index = &mut indexes[slot];
            if !index.locations.is_empty() && record.offset != index.next() {
                return Err(damaged());
            }
            index.push(
                record.offset,
                Location {
                    segment: id,
                    position: u32::try_from(record.position).map_err(|_| damaged())?,
                    len: record.len,
                },
            );
            if record.partition == reservations::STREAM
                && checkpoints.reservations.is_none_or(|f| record.offset > f)
            {
                let at = usize::try_from(record.position).unwrap_or(usize::MAX);
                let Decoded::Frame(frame, _) = frame::decode(&bytes[at..]) else {
                    return Err(damaged());
                };
                let decoded = reservations::Record::decode(frame.payload).ok_or_else(damaged)?;
                unfolded.push((record.offset, decoded));
            }
        }
        extents.push((id, found.end, found.written_to));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        segments.insert(id, Arc::new(file));
    }
    let last_with_data = extents
        .iter()
        .rposition(|&(_, _, written_to)| written_to > DATA_START);
    for (i, &(id, end, written_to)) in extents.iter().enumerate() {
        if written_to <= end {
            continue;
        }
        let path = segment::path(dir, id);
        if Some(i) != last_with_data {
            // Only the last commit can be torn; anything after a sealed segment's end is damage.
            return Err(LogError::Damaged {
                path,
                position: end as u64,
            });
        }
        tracing::warn!(path = %path.display(), from = end, to = written_to, "Cut the torn tail of the stream (a commit that was never acknowledged).");
        let file = &segments[&id];
        let zeros = vec![0; written_to - end];
        file.write_all_at(&zeros, end as u64)
            .and_then(|()| file.sync_data())
            .map_err(io(&path))?;
    }
    let active = match last_with_data.or(if extents.is_empty() { None } else { Some(0) }) {
        Some(i) => (extents[i].0, extents[i].1 as u64),
        None => {
            let file =
                segment::create(dir, 1, partitions, segment_size, faults).map_err(io(dir))?;
            segments.insert(1, Arc::new(file));
            (1, DATA_START as u64)
        }
    };
    // Empty segments after the active one were made ahead of time; the writer makes its own.
    let spares: Vec<u64> = segments.range(active.0 + 1..).map(|(id, _)| *id).collect();
    for id in spares {
        segments.remove(&id);
        let path = segment::path(dir, id);
        std::fs::remove_file(&path).map_err(io(&path))?;
    }
    Ok(Recovered {
        indexes,
        segments,
        active,
        next_commit: last_commit.map_or(1, |c| c + 1),
        unfolded,
    })
}
