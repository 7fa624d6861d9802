//! How the `documents` table keeps a status document: its JSON compressed
//! by zstd against a dictionary of typical documents, so that a delivery's
//! 1.4 KB document is kept in about 150 bytes, and a B-tree leaf holds many
//! of them rather than two. Every write is compressed, a running document's
//! too: the all-in-one's CPU per workflow could not tell the cost from its
//! noise, while keeping those plain (they are rewritten at every step) let
//! their large values split leaves and grew the file to 1,704 bytes a
//! delivery where this keeps 1,003.
//!
//! A compact body is one format byte ([`COMPACT_V1`]), one byte of flags
//! (whether the document names its owner, its principal and a callback URL,
//! which the committer and the change feed need without decompressing),
//! then one zstd frame made against `codec/status-v1.dict`. A plain body
//! starts with `{`, as every body of earlier versions did: [`decode`] reads
//! both, and [`crate::compact`] rewrites the old ones once.
//!
//! The dictionary is part of the format: a body made against it can be read
//! only with it, so it never changes. A better one would be a new format
//! byte beside this one.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::LazyLock;

use skyport_core::status::StatusDocument;
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

/// The format byte of a body compressed against `status-v1.dict`.
pub(crate) const COMPACT_V1: u8 = 1;
const HEADER: usize = 2;
const NAMES_OWNER: u8 = 1;
const NAMES_PRINCIPAL: u8 = 2;
const NAMES_CALLBACK: u8 = 4;
/// The field a compact body's flags answer for without decompressing.
const CALLBACK_FIELD: &str = "callbackUrl";
/// zstd's default level. On a 1.4 KB document (2 cores, release build):
/// 5.5 µs to serialize and compress against 1.9 µs to serialize alone, 5.2 µs
/// to decompress and parse against 3.5 µs to parse; level 1 is no faster
/// and keeps 140 bytes where this keeps 133.
const LEVEL: i32 = 3;
/// The most a body may expand to: a frame that claims more is corrupt.
const MAX_DOCUMENT: u64 = 16 * 1024 * 1024;

static DICTIONARY: &[u8] = include_bytes!("codec/status-v1.dict");
static ENCODER: LazyLock<EncoderDictionary<'static>> =
    LazyLock::new(|| EncoderDictionary::copy(DICTIONARY, LEVEL));
static DECODER: LazyLock<DecoderDictionary<'static>> =
    LazyLock::new(|| DecoderDictionary::copy(DICTIONARY));

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Why a stored body could not be read back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("the stored body has an unknown format (byte {0})")]
    Format(u8),
    #[error("the stored body is empty or cut short")]
    Short,
    #[error("the stored body's frame does not decompress")]
    Frame(#[source] std::io::Error),
    #[error("the stored document is not valid JSON")]
    Json(#[from] serde_json::Error),
}

/// The compact body of `document`.
pub(crate) fn encode(document: &StatusDocument) -> Vec<u8> {
    let json = serde_json::to_vec(document)
        .unwrap_or_else(|e| unreachable!("a status document always serializes: {e}"));
    let mut flags = 0;
    if document.owner_id.is_some() {
        flags |= NAMES_OWNER;
    }
    if document.principal.is_some() {
        flags |= NAMES_PRINCIPAL;
    }
    if document.callback_url.is_some() {
        flags |= NAMES_CALLBACK;
    }
    let frame = COMPRESSOR.with_borrow_mut(|compressor| {
        let compressor = match compressor {
            Some(compressor) => compressor,
            None => compressor.insert(
                Compressor::with_prepared_dictionary(&ENCODER)
                    .unwrap_or_else(|e| unreachable!("zstd makes a context: {e}")),
            ),
        };
        compressor
            .compress(&json)
            .unwrap_or_else(|e| unreachable!("zstd compresses into a buffer of its bound: {e}"))
    });
    let mut body = Vec::with_capacity(HEADER + frame.len());
    body.extend_from_slice(&[COMPACT_V1, flags]);
    body.extend_from_slice(&frame);
    body
}

/// The document stored as `body`, compact or plain JSON.
pub(crate) fn decode(body: &[u8]) -> Result<StatusDocument, DecodeError> {
    Ok(serde_json::from_slice(&json(body)?)?)
}

/// The JSON of the document stored as `body`, compact or plain.
pub(crate) fn json(body: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
    match body.first() {
        Some(b'{') => Ok(Cow::Borrowed(body)),
        Some(&COMPACT_V1) => {
            let frame = body.get(HEADER..).ok_or(DecodeError::Short)?;
            Ok(Cow::Owned(decompress(frame)?))
        }
        Some(&other) => Err(DecodeError::Format(other)),
        None => Err(DecodeError::Short),
    }
}

fn decompress(frame: &[u8]) -> Result<Vec<u8>, DecodeError> {
    let size = zstd::zstd_safe::get_frame_content_size(frame)
        .ok()
        .flatten()
        .filter(|size| *size <= MAX_DOCUMENT)
        .ok_or(DecodeError::Short)?;
    DECOMPRESSOR.with_borrow_mut(|decompressor| {
        let decompressor = match decompressor {
            Some(decompressor) => decompressor,
            None => decompressor.insert(
                Decompressor::with_prepared_dictionary(&DECODER).map_err(DecodeError::Frame)?,
            ),
        };
        // The size was checked against MAX_DOCUMENT, which fits a usize.
        let capacity = usize::try_from(size).unwrap_or(usize::MAX);
        decompressor
            .decompress(frame, capacity)
            .map_err(DecodeError::Frame)
    })
}

/// Whether the document stored as `body` has `field` set, when a compact
/// body's flags say (`None`: its JSON must be searched).
pub(crate) fn holds(body: &[u8], field: &str) -> Option<bool> {
    (body.first() == Some(&COMPACT_V1) && field == CALLBACK_FIELD)
        .then(|| body.get(1).is_some_and(|flags| flags & NAMES_CALLBACK != 0))
}

/// Whether the document stored as `body` names its owner and its
/// principal, read from a compact body's flags (a plain one is searched).
pub(crate) fn names(body: &[u8]) -> (bool, bool) {
    match body.first() {
        Some(&COMPACT_V1) => {
            let flags = body.get(1).copied().unwrap_or(0);
            (flags & NAMES_OWNER != 0, flags & NAMES_PRINCIPAL != 0)
        }
        _ => {
            let has = |field: &[u8]| body.windows(field.len()).any(|window| window == field);
            (has(b"\"ownerId\":"), has(b"\"principal\":"))
        }
    }
}

#[cfg(test)]
mod tests;
