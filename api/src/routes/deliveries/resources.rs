//! The resources the delivery routes answer with: the 202 of an accepted
//! request or cancellation, and the status resource with its links. Their
//! own module, so that the JSON routes and the browser's status page both
//! read them and neither imports the other.

use serde::{Deserialize, Serialize};
use skyport_core::status::{DeliveryState, StatusDocument};
use utoipa::ToSchema;

/// The path every delivery request is posted to.
pub const DELIVERY_REQUESTS: &str = "/api/deliveryrequests";
/// The answer to an accepted request (or cancellation).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({
    "deliveryId": "d-2026-11-21-0001",
    "status": "Accepted",
    "statusUrl": "https://skyport.example.com/api/deliveryrequests/d-2026-11-21-0001/status?receipt=1wAAAZsF2_EAAIy_bJDbHRLuSrnLVqt0028",
    "receipt": "1wAAAZsF2_EAAIy_bJDbHRLuSrnLVqt0028"
}))]
pub struct Accepted {
    pub delivery_id: String,
    /// Where the delivery is now: Accepted for a new request; a retried or
    /// cancelled one may be further along.
    pub status: DeliveryState,
    /// Poll this URL (also in `Location`) for the outcome.
    #[schema(format = "uri")]
    pub status_url: String,
    /// The signed receipt in the status URL: with the credentials of the
    /// principal it was signed for (none with authentication off), the
    /// capability to read, cancel or reschedule this delivery.
    pub receipt: String,
    /// The delivery's status once it is over, as its status URL answers it:
    /// present only on the 200 of a POST made with `Prefer: wait=N` whose
    /// delivery reached its outcome within N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub outcome: Option<Box<DeliveryStatus>>,
}

/// The status resource: the delivery's document, whether it is over, and where to go next.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryStatus {
    #[serde(flatten)]
    pub document: StatusDocument,
    /// Whether the state is final (Scheduled, Failed or Cancelled): stop polling.
    pub terminal: bool,
    /// The state as an Azure long-running operation's status, for the
    /// pollers that read it (Azure SDKs, Logic Apps).
    pub status: OperationStatus,
    pub links: Links,
}

/// A delivery's state as the status of an Azure long-running operation
/// (Microsoft REST API guidelines): NotStarted while Accepted or Waiting,
/// Running while Processing, and Succeeded, Failed or Canceled once it is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum OperationStatus {
    NotStarted,
    Running,
    Succeeded,
    Failed,
    Canceled,
}

impl From<DeliveryState> for OperationStatus {
    fn from(state: DeliveryState) -> Self {
        match state {
            DeliveryState::Accepted | DeliveryState::Waiting => Self::NotStarted,
            DeliveryState::Processing => Self::Running,
            DeliveryState::Scheduled => Self::Succeeded,
            DeliveryState::Failed => Self::Failed,
            DeliveryState::Cancelled => Self::Canceled,
        }
    }
}

/// One delivery in a listing: its status document, whether it is over and,
/// for an authenticated caller, its links.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListedDelivery {
    #[serde(flatten)]
    pub document: StatusDocument,
    pub terminal: bool,
    /// Absent when the gateway does not authenticate (a listing then hands
    /// out no receipt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub links: Option<Links>,
}

/// A page of a listing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryList {
    pub items: Vec<ListedDelivery>,
    /// The cursor of the next page (the `cursor` parameter); absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

/// Where a client goes from a status.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Links {
    /// This status resource.
    #[serde(rename = "self")]
    #[schema(format = "uri")]
    pub status: String,
    /// `DELETE` here cancels the delivery; absent once it cannot be cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = "uri", nullable = false)]
    pub cancel: Option<String>,
}

impl Links {
    pub(crate) fn new(base: &str, id: &str, receipt: &str, state: DeliveryState) -> Self {
        let cancellable = matches!(
            state,
            DeliveryState::Accepted
                | DeliveryState::Waiting
                | DeliveryState::Processing
                | DeliveryState::Scheduled
        );
        Self {
            status: Self::status_url(base, id, receipt),
            cancel: cancellable
                .then(|| [base, DELIVERY_REQUESTS, "/", id, "?receipt=", receipt].concat()),
        }
    }

    /// The status URL of delivery `id` under `base`, with its receipt.
    pub(crate) fn status_url(base: &str, id: &str, receipt: &str) -> String {
        [
            base,
            DELIVERY_REQUESTS,
            "/",
            id,
            "/status?receipt=",
            receipt,
        ]
        .concat()
    }
}
