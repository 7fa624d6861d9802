#![allow(clippy::unwrap_used)]

use skyport_core::status::{DeliveryState, StatusDocument};
use time::OffsetDateTime;

use super::{COMPACT_V1, DICTIONARY, DecodeError, decode, encode, holds, names};

/// A delivery as the sizing run leaves it: Scheduled after five steps, its
/// callback delivered, auth on, its request kept for redrives.
const SCHEDULED: &str = r#"{"id":"sp-b0ed0323-3cb2-4996-a694-a39ecd3eecc4","state":"Scheduled","steps":[{"step":"Account","result":"Succeeded","at":"2026-11-28T18:56:54.515727462Z","calls":1},{"step":"Package","result":"Succeeded","at":"2026-11-28T18:56:54.554317605Z","calls":1},{"step":"Delivery","result":"Succeeded","at":"2026-11-28T18:56:54.59056265Z","calls":1},{"step":"ThirdParty","result":"Succeeded","at":"2026-11-28T18:56:54.615897348Z","calls":1},{"step":"Drone","result":"Succeeded","at":"2026-11-28T18:56:54.632624272Z","calls":1,"detail":"drone-19961"}],"droneId":"drone-19961","thirdPartyRequired":false,"packageId":"pkg-19976","createdAt":"2026-11-28T18:56:52.032747927Z","updatedAt":"2026-11-28T18:56:54.63263013Z","attempt":1,"callbackUrl":"http://127.0.0.1:36531/hook","callback":{"state":"Delivered","announced":"Scheduled","attempts":1,"deliveredAt":"2026-11-28T18:57:19.923645159Z"},"ownerId":"owner-91","principal":"sizing","epoch":0,"request":{"deliveryId":"sp-b0ed0323-3cb2-4996-a694-a39ecd3eecc4","ownerId":"owner-91","pickupLocation":"47.6423,-122.1368","pickupTime":"2030-01-01T10:00:00Z","deadline":"2030-01-01T12:00:00Z","dropoffLocation":"47.6101,-122.2015","expedited":false,"confirmationRequired":"Picture","packageInfo":{"packageId":"pkg-19976","size":"Small","weight":2.5,"tag":"fragile"},"callbackUrl":"http://127.0.0.1:36531/hook"},"revision":0,"lane":"normal"}"#;

fn scheduled() -> StatusDocument {
    serde_json::from_str(SCHEDULED).unwrap()
}

#[test]
fn documents_of_every_shape_come_back_as_they_went_in() {
    let mut failed = scheduled();
    failed.state = DeliveryState::Failed;
    failed.owner_id = None;
    failed.principal = None;
    failed.failure = Some(skyport_core::status::Failure {
        step: skyport_core::status::Step::Drone,
        code: "Suspended".into(),
        message: "the account is suspended ✈ ünïcödé".into(),
    });
    let documents = [
        scheduled(),
        failed,
        StatusDocument::accepted("d-1", OffsetDateTime::UNIX_EPOCH),
        StatusDocument::accepted("x".repeat(64), OffsetDateTime::now_utc()),
    ];
    for document in documents {
        let body = encode(&document);
        assert_eq!(body[0], COMPACT_V1);
        assert_eq!(decode(&body).unwrap(), document);
    }
}

#[test]
fn a_typical_document_is_kept_in_a_fifth_of_its_json() {
    let document = scheduled();
    let json = serde_json::to_vec(&document).unwrap().len();
    let body = encode(&document).len();
    println!("{json} bytes of JSON kept in {body}");
    assert!(json > 1_300, "{json}");
    assert!(body * 5 <= json, "{body} of {json}");
}

#[test]
fn a_body_kept_as_plain_json_by_an_earlier_version_still_reads() {
    let plain = SCHEDULED.as_bytes();
    assert_eq!(encode(&scheduled())[0], COMPACT_V1);
    assert_eq!(decode(plain).unwrap(), scheduled());
}

#[test]
fn the_owner_principal_and_callback_flags_match_the_document_in_either_form() {
    let mut document = scheduled();
    assert_eq!(names(&encode(&document)), (true, true));
    assert_eq!(holds(&encode(&document), "callbackUrl"), Some(true));
    assert_eq!(holds(&encode(&document), "principal"), None);
    assert_eq!(holds(SCHEDULED.as_bytes(), "callbackUrl"), None);
    assert_eq!(names(SCHEDULED.as_bytes()), (true, true));
    document.principal = None;
    assert_eq!(names(&encode(&document)), (true, false));
    document.owner_id = None;
    document.callback_url = None;
    assert_eq!(names(&encode(&document)), (false, false));
    assert_eq!(holds(&encode(&document), "callbackUrl"), Some(false));
    // A plain body is searched, and its request names the owner too.
    document.request = None;
    let plain = serde_json::to_vec(&document).unwrap();
    assert_eq!(names(&plain), (false, false));
}

#[test]
fn a_damaged_body_is_an_error_never_a_panic() {
    let body = encode(&scheduled());
    assert!(matches!(decode(&[]), Err(DecodeError::Short)));
    assert!(matches!(decode(&[7, 0, 1]), Err(DecodeError::Format(7))));
    assert!(decode(&body[..2]).is_err());
    assert!(decode(&body[..body.len() / 2]).is_err());
    let mut flipped = body.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    flipped[10] ^= 0xff;
    assert!(decode(&flipped).is_err() || decode(&flipped).unwrap() != scheduled());
    assert!(matches!(decode(b"{not json"), Err(DecodeError::Json(_))));
}

/// Every body ever written with format 1 needs these exact bytes to be read.
#[test]
fn the_dictionary_of_format_1_never_changes() {
    assert_eq!(
        crc32c::crc32c(DICTIONARY),
        0xb9f7_70ea,
        "codec/status-v1.dict changed: bodies already stored need the old one; add a format 2"
    );
}
