//! Reading one segment back at start: the whole commits it holds, where the
//! next commit goes, and whether a record that was acknowledged is damaged.
//!
//! Commit `n + 1` is written only after commit `n`'s `fdatasync` returned,
//! so any trace of a later commit on disk proves that every earlier one was
//! whole. A commit that is not whole at the end of the log (a torn tail:
//! the process or the machine stopped during its write) was never
//! acknowledged and is dropped. A frame that does not read back while a
//! later commit does was acknowledged and then damaged: that is reported,
//! never skipped.

use super::frame::{self, ALIGN, Decoded, END_OF_COMMIT};

/// Where one record lies in its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub partition: u32,
    pub offset: u64,
    pub position: u64,
    /// The frame's length on disk, padding included.
    pub len: u32,
    pub commit: u64,
}

/// What [`scan`] found in a segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The records of whole commits, in the order written.
    pub records: Vec<Located>,
    /// Just after the last whole commit: where the next commit goes.
    pub end: usize,
    /// Just after the last byte that is not zero (at least `end`): what lies
    /// in `end..written_to` is a torn commit or stale bytes to clear.
    pub written_to: usize,
    /// The number of the last whole commit (`previous` when there is none).
    pub last_commit: Option<u64>,
    /// Where a frame no longer reads back although a later commit proves it
    /// was durable.
    pub damaged_at: Option<usize>,
}

/// Scans `bytes` (a segment) from `start`, `previous` being the last whole
/// commit of the segments before it. Never panics, whatever the bytes.
pub fn scan(bytes: &[u8], start: usize, previous: Option<u64>) -> Scan {
    let mut records = Vec::new();
    let mut pending = Vec::new();
    let mut last = previous;
    let mut open: Option<u64> = None;
    let mut position = start.min(bytes.len());
    let mut end = position;
    while let Decoded::Frame(record, size) = frame::decode(&bytes[position..]) {
        let follows = match open {
            Some(commit) => record.commit == commit,
            None => last.is_none_or(|last| Some(record.commit) == last.checked_add(1)),
        };
        if !follows {
            break;
        }
        pending.push(Located {
            partition: record.partition,
            offset: record.offset,
            position: position as u64,
            len: u32::try_from(size).unwrap_or(u32::MAX),
            commit: record.commit,
        });
        position += size;
        if record.flags & END_OF_COMMIT == 0 {
            open = Some(record.commit);
        } else {
            records.append(&mut pending);
            last = Some(record.commit);
            open = None;
            end = position;
        }
    }
    let written_to = bytes[end..]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(end, |last_written| end + last_written + 1);
    // The commit that stopped the reading is `open`, or the one after `last`.
    let stopped = open.or_else(|| last.and_then(|l| l.checked_add(1)));
    let damaged_at = later_commit(bytes, position, written_to, stopped).then_some(position);
    Scan {
        records,
        end,
        written_to,
        last_commit: last,
        damaged_at,
    }
}

/// Whether a whole frame of a commit after `stopped` lies in `from..to`
/// (with `stopped` unknown: frames of two different commits).
fn later_commit(bytes: &[u8], from: usize, to: usize, stopped: Option<u64>) -> bool {
    let mut seen: Option<u64> = None;
    let mut position = from.next_multiple_of(ALIGN);
    while position < to {
        if let Decoded::Frame(record, _) = frame::decode(&bytes[position..]) {
            match stopped {
                Some(stopped) if record.commit > stopped => return true,
                Some(_) => {}
                None => match seen {
                    Some(commit) if commit != record.commit => return true,
                    _ => seen = Some(record.commit),
                },
            }
        }
        position += ALIGN;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::frame::{HEADER, encode, set_flags};

    /// A segment holding `commits`, each a list of (partition, offset, payload length).
    fn segment(start: usize, first_commit: u64, commits: &[&[(u32, u64, usize)]]) -> Vec<u8> {
        let mut bytes = vec![0; start];
        for (i, records) in commits.iter().enumerate() {
            let mut last_at = 0;
            for &(partition, offset, len) in *records {
                last_at = bytes.len();
                encode(
                    &mut bytes,
                    partition,
                    0,
                    offset,
                    first_commit + i as u64,
                    &vec![7; len],
                );
            }
            set_flags(&mut bytes[last_at..], END_OF_COMMIT);
        }
        bytes.resize(bytes.len() + 4096, 0);
        bytes
    }

    #[test]
    fn whole_commits_read_back_and_the_end_is_after_the_last() {
        let bytes = segment(64, 5, &[&[(0, 0, 10), (1, 0, 20)], &[(0, 1, 30)]]);
        let scan = scan(&bytes, 64, Some(4));
        assert_eq!(scan.records.len(), 3);
        assert_eq!(scan.last_commit, Some(6));
        assert_eq!(scan.end, scan.written_to);
        assert_eq!(scan.damaged_at, None);
        assert_eq!(
            scan.records[2].position as usize + scan.records[2].len as usize,
            scan.end
        );
    }

    #[test]
    fn a_torn_last_commit_is_dropped_whole() {
        let bytes = segment(0, 1, &[&[(0, 0, 10)], &[(0, 1, 10), (0, 2, 200)]]);
        let whole = scan(&bytes, 0, None).end;
        for cut in 0..whole {
            let mut torn = bytes.clone();
            torn[cut..].fill(0);
            let scan = scan(&torn, 0, None);
            assert_eq!(scan.damaged_at, None, "a cut at {cut} is a torn tail");
            let kept = scan.records.len();
            assert!(kept == 0 || kept == 1, "only whole commits are kept");
            // A cut in a frame's zero padding leaves the frame whole.
            assert!(scan.end <= cut.next_multiple_of(ALIGN));
        }
    }

    #[test]
    fn a_flipped_byte_before_a_later_commit_is_damage() {
        let bytes = segment(0, 1, &[&[(0, 0, 10)], &[(0, 1, 10)], &[(0, 2, 10)]]);
        let second = framed(10);
        for byte in second..second + HEADER + 10 {
            let mut damaged = bytes.clone();
            damaged[byte] ^= 0x40;
            let scan = scan(&damaged, 0, None);
            assert_eq!(
                scan.damaged_at,
                Some(second),
                "a flip at byte {byte} is found"
            );
        }
    }

    #[test]
    fn the_first_commit_of_a_segment_must_follow_the_previous_one() {
        let bytes = segment(0, 9, &[&[(0, 0, 10)]]);
        assert_eq!(scan(&bytes, 0, Some(8)).records.len(), 1);
        assert_eq!(scan(&bytes, 0, Some(3)).damaged_at, Some(0));
    }

    fn framed(len: usize) -> usize {
        crate::log::frame::framed_len(len)
    }
}
