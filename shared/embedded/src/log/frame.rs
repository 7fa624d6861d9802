//! One record of the segment log, as it lies on disk.
//!
//! ```text
//! 0      4        8           12      16       24       32
//! | len  | crc32c | partition | flags | offset | commit | payload (len bytes) | zeros to a multiple of 8 |
//! ```
//!
//! All integers are little-endian. The CRC-32C covers `len` and everything
//! after the checksum up to the end of the payload, so a torn or flipped
//! header is caught as surely as a flipped payload byte. `commit` numbers the
//! group commit the record was written by, and the last record of every
//! commit carries [`END_OF_COMMIT`]: recovery keeps only whole commits and
//! can tell a torn last commit from a damaged earlier one (see
//! [`super::scan`]). A region of zeros is where nothing was written.

/// Bytes before the payload.
pub const HEADER: usize = 32;
/// Every frame starts at a multiple of this within its segment.
pub const ALIGN: usize = 8;
/// Set on the last record of a group commit.
pub const END_OF_COMMIT: u32 = 1;
/// The largest payload a frame may carry (a sanity bound on `len` when reading).
pub const MAX_PAYLOAD: usize = 64 << 20;

/// A record read back from a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    pub partition: u32,
    pub flags: u32,
    pub offset: u64,
    pub commit: u64,
    pub payload: &'a [u8],
}

/// What lies at a position of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole frame whose checksum holds, and the bytes it takes (padding included).
    Frame(Frame<'a>, usize),
    /// Zeros, or too little room left for a header: nothing was written here.
    Empty,
    /// Bytes that are not a frame: torn, damaged or stale.
    Invalid,
}

/// The bytes a frame with a payload of `len` bytes takes on disk.
pub const fn framed_len(len: usize) -> usize {
    (HEADER + len).div_ceil(ALIGN) * ALIGN
}

/// Appends the frame of one record to `out`.
pub fn encode(
    out: &mut Vec<u8>,
    partition: u32,
    flags: u32,
    offset: u64,
    commit: u64,
    payload: &[u8],
) {
    let start = out.len();
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&partition.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&commit.to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(start + framed_len(payload.len()), 0);
    seal(&mut out[start..]);
}

/// Sets `flags` on the frame at the start of `frame` and writes its checksum again.
pub fn set_flags(frame: &mut [u8], flags: u32) {
    frame[12..16].copy_from_slice(&flags.to_le_bytes());
    seal(frame);
}

fn seal(frame: &mut [u8]) {
    let len = read_u32(frame, 0) as usize;
    let crc = checksum(&frame[..HEADER + len]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(frame: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&frame[0..4]), &frame[8..])
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Reads the frame at the start of `bytes`; never panics, whatever the bytes.
pub fn decode(bytes: &[u8]) -> Decoded<'_> {
    if bytes.len() < HEADER || bytes[..HEADER].iter().all(|&b| b == 0) {
        return Decoded::Empty;
    }
    let len = read_u32(bytes, 0) as usize;
    if len == 0 || len > MAX_PAYLOAD || framed_len(len) > bytes.len() {
        return Decoded::Invalid;
    }
    if checksum(&bytes[..HEADER + len]) != read_u32(bytes, 4) {
        return Decoded::Invalid;
    }
    Decoded::Frame(
        Frame {
            partition: read_u32(bytes, 8),
            flags: read_u32(bytes, 12),
            offset: read_u64(bytes, 16),
            commit: read_u64(bytes, 24),
            payload: &bytes[HEADER..HEADER + len],
        },
        framed_len(len),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_as_written_and_any_flipped_bit_is_caught() {
        let mut out = Vec::new();
        encode(&mut out, 3, END_OF_COMMIT, 42, 7, b"hello");
        assert_eq!(out.len(), framed_len(5));
        assert_eq!(out.len() % ALIGN, 0);
        let Decoded::Frame(frame, size) = decode(&out) else {
            panic!("the frame decodes");
        };
        assert_eq!(size, out.len());
        assert_eq!(
            frame,
            Frame {
                partition: 3,
                flags: END_OF_COMMIT,
                offset: 42,
                commit: 7,
                payload: b"hello",
            }
        );
        for byte in 0..HEADER + 5 {
            for bit in 0..8 {
                let mut damaged = out.clone();
                damaged[byte] ^= 1 << bit;
                assert!(
                    !matches!(decode(&damaged), Decoded::Frame(..)),
                    "a flip of bit {bit} of byte {byte} is caught"
                );
            }
        }
    }

    #[test]
    fn zeros_and_short_buffers_are_empty_and_a_cut_frame_is_invalid() {
        assert_eq!(decode(&[0; 64]), Decoded::Empty);
        assert_eq!(decode(&[1; 8]), Decoded::Empty);
        let mut out = Vec::new();
        encode(&mut out, 0, 0, 0, 1, &[9; 100]);
        assert_eq!(decode(&out[..HEADER + 10]), Decoded::Invalid);
        let mut flagged = out.clone();
        set_flags(&mut flagged, END_OF_COMMIT);
        assert!(matches!(decode(&flagged), Decoded::Frame(f, _) if f.flags == END_OF_COMMIT));
    }
}
