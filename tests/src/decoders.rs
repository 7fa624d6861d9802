//! Everything Skyport decodes from bytes it did not write in this process —
//! from the network or from disk — as one table the fuzzers run: the
//! property-based run in the tests (`tests/tests/system/fuzz.rs`) and the
//! coverage-guided one under `tests/fuzz/` (which compiles this file alone, so it
//! uses nothing else of the harness). A decoder joins both with one line in
//! [`DECODERS`].
//!
//! Each check decodes arbitrary bytes and asserts what must hold for any
//! input: no panic, and, for what decodes, the invariants of the format
//! (an envelope re-encodes to itself, a receipt verifies only for what it was
//! signed for, a request that passes validation passes it again).

use skyport_core::event::{DeliveryRequested, Event};
use skyport_core::ports::Lane;
use skyport_core::status::StatusDocument;
use skyport_embedded::log::frame::{self, Decoded, END_OF_COMMIT};
use skyport_embedded::log::scan::scan;
use skyport_gateway::extract::parse_delivery_request;
use skyport_gateway::receipt::{Binding, Receipts};
use skyport_runtime::config::Settings;
use time::OffsetDateTime;

/// One decoder under fuzzing.
#[derive(Debug, Clone, Copy)]
pub struct Decoder {
    pub name: &'static str,
    /// Decodes `bytes`, panicking only when an invariant is broken; whether
    /// they decoded.
    pub check: fn(&[u8]) -> bool,
    /// Valid inputs the mutations start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// The decoders, each a line.
pub const DECODERS: &[Decoder] = &[
    Decoder {
        name: "event_envelope",
        check: event_envelope,
        seeds: envelope_seeds,
    },
    Decoder {
        name: "delivery_request",
        check: delivery_request,
        seeds: request_seeds,
    },
    Decoder {
        name: "receipt",
        check: receipt,
        seeds: receipt_seeds,
    },
    Decoder {
        name: "configuration",
        check: configuration,
        seeds: configuration_seeds,
    },
    Decoder {
        name: "status_document",
        check: status_document,
        seeds: status_seeds,
    },
    Decoder {
        name: "stream_segment",
        check: stream_segment,
        seeds: segment_seeds,
    },
];

/// Runs the decoder the first byte picks on the rest: how one byte string
/// reaches every decoder (the coverage-guided fuzzer's entry point).
pub fn check_any(bytes: &[u8]) -> bool {
    bytes
        .split_first()
        .is_some_and(|(&pick, rest)| (DECODERS[usize::from(pick) % DECODERS.len()].check)(rest))
}

/// The receipt key of the receipt check: a secret nothing else knows.
const RECEIPT_KEY: &[u8] = b"the fuzzers' receipt key, 32 bytes+";
/// Whom the fuzzed receipts are verified for.
const PRINCIPAL: &str = "alice";

fn event_envelope(bytes: &[u8]) -> bool {
    let Ok(event) = Event::decode(bytes) else {
        return false;
    };
    let again = Event::decode(&event.encode()).expect("an encoded event decodes");
    assert_eq!(
        again.delivery_id(),
        event.delivery_id(),
        "an event keeps its key"
    );
    true
}

fn delivery_request(bytes: &[u8]) -> bool {
    let Ok(request) = parse_delivery_request(bytes) else {
        return false;
    };
    let encoded = serde_json::to_vec(&request).expect("a request serializes");
    parse_delivery_request(&encoded).expect("a valid request stays valid once re-encoded");
    true
}

/// `id`, a zero byte, then the receipt offered for it.
fn receipt(bytes: &[u8]) -> bool {
    let (id, offered) = match bytes.iter().position(|b| *b == 0) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let id = String::from_utf8_lossy(id);
    let offered = String::from_utf8_lossy(offered);
    let receipts = Receipts::new(&[RECEIPT_KEY]);
    let Some(verified) = receipts.verify(&id, &offered, Some(PRINCIPAL)) else {
        return false;
    };
    // Only what this key signed verifies: the offer is that signature (the
    // key signs no receipt of the older, unbound formats).
    assert_eq!(
        verified.binding,
        Binding::Principal,
        "an unbound receipt verified that the key did not sign"
    );
    assert_eq!(
        receipts.sign(&id, verified.accepted_at, verified.lane, Some(PRINCIPAL)),
        offered,
        "a receipt verified that the key did not sign"
    );
    true
}

fn configuration(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let Ok(settings) = Settings::from_toml(text) else {
        return false;
    };
    assert!(settings.gateway.max_in_flight >= 1, "validation ran");
    true
}

fn status_document(bytes: &[u8]) -> bool {
    let Ok(document) = serde_json::from_slice::<StatusDocument>(bytes) else {
        return false;
    };
    let encoded = serde_json::to_vec(&document).expect("a status document serializes");
    serde_json::from_slice::<StatusDocument>(&encoded).expect("it decodes again");
    true
}

/// A segment of the embedded stream, read back as at start: every record
/// it keeps reads back where the scan says, within the bytes, and only
/// whole commits are kept.
fn stream_segment(bytes: &[u8]) -> bool {
    let found = scan(bytes, 0, None);
    assert!(found.end <= found.written_to && found.written_to <= bytes.len());
    for record in &found.records {
        let at = usize::try_from(record.position).expect("a position fits");
        let Decoded::Frame(frame, len) = frame::decode(&bytes[at..]) else {
            panic!("a kept record at {at} does not read back");
        };
        assert_eq!(
            (frame.partition, frame.offset),
            (record.partition, record.offset)
        );
        assert_eq!(len, record.len as usize);
        assert!(at + len <= found.end, "a kept record lies before the end");
    }
    if let Some(last) = found.records.last() {
        let at = usize::try_from(last.position).expect("a position fits");
        assert!(
            matches!(frame::decode(&bytes[at..]), Decoded::Frame(f, _) if f.flags & END_OF_COMMIT != 0),
            "the last kept record ends its commit"
        );
    }
    !found.records.is_empty()
}

/// A valid delivery request.
const SAMPLE_REQUEST: &str = r#"{"deliveryId":"delivery-7","ownerId":"owner-7","pickupLocation":"47.0007,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","expedited":false,"confirmationRequired":"Picture","packageInfo":{"packageId":"package-7","size":"Small","weight":2.5,"tag":"test"}}"#;

fn envelope_seeds() -> Vec<Vec<u8>> {
    let request =
        parse_delivery_request(SAMPLE_REQUEST.as_bytes()).expect("the sample request is valid");
    let event = Event::DeliveryRequested(Box::new(DeliveryRequested {
        delivery_id: request.delivery_id.clone().unwrap_or_default(),
        accepted_at: OffsetDateTime::UNIX_EPOCH,
        traceparent: None,
        idempotency_key: None,
        principal: None,
        epoch: 0,
        redrive: None,
        request,
    }));
    vec![event.encode(), b"{\"schemaVersion\":1}".to_vec()]
}

fn request_seeds() -> Vec<Vec<u8>> {
    vec![SAMPLE_REQUEST.as_bytes().to_vec(), b"{}".to_vec()]
}

fn receipt_seeds() -> Vec<Vec<u8>> {
    let receipts = Receipts::new(&[RECEIPT_KEY]);
    let signed = receipts.sign(
        "delivery-7",
        OffsetDateTime::UNIX_EPOCH,
        Lane::Normal,
        Some(PRINCIPAL),
    );
    vec![format!("delivery-7\0{signed}").into_bytes()]
}

fn configuration_seeds() -> Vec<Vec<u8>> {
    vec![
        b"profile = \"embedded\"\n[gateway]\nmax_in_flight = 64\n[gateway.http]\nmax_header_bytes = 16384\n[worker]\nrate_limit_per_s = 100\n".to_vec(),
        b"[gateway.auth.api_keys.portal]\nkey = \"0123456789abcdef0123456789abcdef\"\n".to_vec(),
    ]
}

fn segment_seeds() -> Vec<Vec<u8>> {
    let mut segment = Vec::new();
    for (commit, records) in [(1, 1), (2, 3), (3, 2)] {
        let mut last = 0;
        for offset in 0..records {
            last = segment.len();
            frame::encode(
                &mut segment,
                offset as u32 % 2,
                0,
                offset,
                commit,
                SAMPLE_REQUEST.as_bytes(),
            );
        }
        frame::set_flags(&mut segment[last..], END_OF_COMMIT);
    }
    let mut torn = segment.clone();
    torn.truncate(segment.len() - 17);
    vec![segment, torn]
}

fn status_seeds() -> Vec<Vec<u8>> {
    let document = StatusDocument::accepted("delivery-7", OffsetDateTime::UNIX_EPOCH);
    vec![serde_json::to_vec(&document).expect("a status document serializes")]
}
