//! Segment files: their names, their header, and how a new one is made.
//!
//! A segment is `<id>.seg` (the id zero-padded to 20 digits, so names sort
//! as ids do), made at its full size ahead of time by a thread of its own
//! (its unwritten bytes read as zeros), written under a temporary name,
//! synced, renamed and the directory synced, so a segment that exists under
//! its name is whole and a commit never waits for one to be made.
//!
//! The size is set, not zero-filled: on this project's disk, writing a
//! segment's zeros while commits run (all at once, or a megabyte at a time
//! with pauses) held the commits' fsyncs back more than the block
//! allocation it saves them (BENCHMARKS.md, "The segment log").

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::faults::Faults;

/// Bytes of the segment header; frames start here.
pub(crate) const DATA_START: usize = 32;
const MAGIC: &[u8; 8] = b"skyplog1";
const SUFFIX: &str = ".seg";
const TEMPORARY: &str = ".tmp";
/// The path of segment `id` in `dir`.
pub(crate) fn path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}{SUFFIX}"))
}

/// The header of segment `id` of a log with `partitions` partitions.
pub(crate) fn header(id: u64, partitions: u32) -> [u8; DATA_START] {
    let mut header = [0; DATA_START];
    header[0..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&partitions.to_le_bytes());
    header[16..24].copy_from_slice(&id.to_le_bytes());
    let crc = crc32c::crc32c(&header[0..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The ids of the segments in `dir`, in order, after removing what a crash
/// left half made.
pub(crate) fn list(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(TEMPORARY) {
            std::fs::remove_file(entry.path())?;
        } else if let Some(id) = name.strip_suffix(SUFFIX).and_then(|id| id.parse().ok()) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Makes segment `id` of `size` bytes and opens it for reading and writing.
pub(crate) fn create(
    dir: &Path,
    id: u64,
    partitions: u32,
    size: u64,
    faults: &Faults,
) -> std::io::Result<File> {
    let temporary = dir.join(format!("{id:020}{SUFFIX}{TEMPORARY}"));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&temporary)?;
    faults.check()?;
    file.write_all(&header(id, partitions))?;
    file.set_len(size)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path(dir, id))?;
    sync_dir(dir)?;
    Ok(file)
}

/// Makes a rename or a removal in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether `bytes` start with the header of segment `id` of a log with `partitions` partitions.
pub(crate) fn header_is(bytes: &[u8], id: u64, partitions: u32) -> bool {
    bytes.get(..DATA_START) == Some(&header(id, partitions)[..])
}
