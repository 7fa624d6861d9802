//! A delivery request never takes a delivery another principal made: the
//! worker reads its status before the first step, and a request whose id
//! names someone else's delivery (an event from before the gateway reserved
//! every id, or one written to the stream by hand) runs no step — the steps
//! would call the services under the owner's idempotency keys — and is
//! dead-lettered with the reason. The status writes hold to the same rule,
//! so that not even a race past that read overwrites who made a delivery.

use skyport_core::event::DeliveryRequested;
use skyport_core::status::StatusDocument;
use tokio_util::sync::CancellationToken;

use super::engine::Workflow;
use super::retry::Interrupted;

impl Workflow {
    /// Why `request` may not run, if the status of its delivery says it is
    /// another principal's.
    ///
    /// # Errors
    /// [`Interrupted`] when the status cannot be read before `abandon` fires
    /// or the event is to be read again.
    pub(super) async fn foreign(
        &self,
        request: &DeliveryRequested,
        abandon: &CancellationToken,
    ) -> Result<Option<String>, Interrupted> {
        let current = self.status.current(&request.delivery_id, abandon).await?;
        Ok(current.and_then(|current| conflict(&current.document, request)))
    }
}

/// Why `request` may not write `document`, if they are different
/// principals' (no principal: made with auth off). A document that records
/// no owner yet was made by a cancellation read before its request: the
/// request is what tells it its owner.
pub(super) fn conflict(document: &StatusDocument, request: &DeliveryRequested) -> Option<String> {
    let owner = document.owner_id.as_ref()?;
    (document.principal != request.principal).then(|| {
        let name = |principal: Option<&str>| {
            principal.map_or_else(|| "nobody (auth off)".to_owned(), |p| format!("{p:?}"))
        };
        format!(
            "delivery {} was made by {} for owner {owner:?}; this request, by {}, names its id \
             and was not run",
            document.id,
            name(document.principal.as_deref()),
            name(request.principal.as_deref()),
        )
    })
}

#[cfg(test)]
mod tests {
    use skyport_core::request::DeliveryRequest;
    use time::OffsetDateTime;

    use super::*;

    fn request(principal: Option<&str>) -> DeliveryRequested {
        let body = serde_json::json!({
            "deliveryId": "d-1",
            "ownerId": "owner-b",
            "pickupLocation": "a",
            "pickupTime": "2030-01-01T10:00:00Z",
            "deadline": "2030-01-01T12:00:00Z",
            "dropoffLocation": "b",
            "packageInfo": {"packageId": "p-1", "size": "Small", "weight": 1.0},
        });
        DeliveryRequested {
            delivery_id: "d-1".into(),
            accepted_at: OffsetDateTime::UNIX_EPOCH,
            traceparent: None,
            idempotency_key: None,
            principal: principal.map(str::to_owned),
            epoch: 0,
            redrive: None,
            request: serde_json::from_value::<DeliveryRequest>(body).expect("a request"),
        }
    }

    fn made_by(principal: Option<&str>) -> StatusDocument {
        StatusDocument {
            owner_id: Some("owner-a".into()),
            principal: principal.map(str::to_owned),
            ..StatusDocument::accepted("d-1", OffsetDateTime::UNIX_EPOCH)
        }
    }

    #[test]
    fn only_the_principal_that_made_a_delivery_writes_it() {
        assert_eq!(
            conflict(&made_by(Some("alice")), &request(Some("alice"))),
            None
        );
        assert_eq!(conflict(&made_by(None), &request(None)), None);
        for (made, by) in [
            (Some("alice"), Some("bob")),
            (Some("alice"), None),
            (None, Some("bob")),
        ] {
            let reason = conflict(&made_by(made), &request(by)).expect("a conflict");
            assert!(
                reason.contains("d-1") && reason.contains("owner-a"),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_document_a_cancellation_made_first_takes_its_request() {
        let cancelled = StatusDocument::accepted("d-1", OffsetDateTime::UNIX_EPOCH);
        assert_eq!(conflict(&cancelled, &request(Some("bob"))), None);
    }
}
