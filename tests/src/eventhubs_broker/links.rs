//! One task per link: request/response nodes, publishers and consumers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fe2o3_amqp::acceptor::LinkEndpoint;
use fe2o3_amqp::link::{DetachError, RecvError};
use fe2o3_amqp::types::definitions::{self, AmqpError, LinkError};
use fe2o3_amqp::types::messaging::message::__private::Deserializable;
use fe2o3_amqp::types::messaging::{Body, Message, Modified};
use fe2o3_amqp::types::primitives::Value;
use fe2o3_amqp::{Delivery, Receiver, Sendable, Sender};
use tokio::sync::mpsc;

use super::filter::Cursor;
use super::management::{self, Node};
use super::server::{CLOSE_TIMEOUT, Context, Outbox, Replies, Route};
use super::{Partition, Refusal, Registration, lock, stolen};

/// The message format of an `EventDataBatch` transfer.
const BATCH_FORMAT: u32 = 0x8001_3700;
/// How many records a receiver link takes from the log at a time.
const DELIVERY_CHUNK: usize = 64;
/// The least time the broker takes to answer what the client sent (settle a
/// transfer, answer a detach): a stand-in for the network round trip that always
/// lies between the SDK and the service, and that fe2o3-amqp 0.14.1's client relies
/// on (see "What the SDK does that shapes this" in the module docs).
const ROUND_TRIP: Duration = Duration::from_millis(10);

pub(super) async fn serve_link(
    link: LinkEndpoint,
    route: Route,
    replies: Replies,
    context: Context,
) {
    match (route, link) {
        (Route::Refuse(error), link) => {
            tracing::debug!(%error, "eventhubs broker: refusing a link");
            let closed = match link {
                LinkEndpoint::Sender(sender) => {
                    tokio::time::timeout(CLOSE_TIMEOUT, sender.close_with_error(error)).await
                }
                LinkEndpoint::Receiver(receiver) => {
                    tokio::time::timeout(CLOSE_TIMEOUT, receiver.close_with_error(error)).await
                }
            };
            if let Ok(Err(error)) = closed {
                tracing::debug!(%error, "eventhubs broker: refused link closed");
            }
        }
        (Route::Requests(node), LinkEndpoint::Receiver(receiver)) => {
            serve_requests(receiver, node, replies, context).await;
        }
        (Route::Responses { address, outbox }, LinkEndpoint::Sender(sender)) => {
            serve_responses(sender, address, outbox, replies, context).await;
        }
        (Route::Publish { hub, partition }, LinkEndpoint::Receiver(receiver)) => {
            serve_publisher(receiver, hub, partition, context).await;
        }
        (
            Route::Consume {
                partition,
                registration,
                cursor,
            },
            LinkEndpoint::Sender(sender),
        ) => {
            serve_consumer(sender, partition, registration, cursor, context).await;
        }
        // `Route::of` routes by the attach's role, so the endpoint always fits.
        (route, _) => {
            tracing::warn!(
                ?route,
                "eventhubs broker: a link whose role does not fit its route"
            );
        }
    }
}

/// Receives requests for `node` and hands each response to the session's reply
/// link for its `reply-to` address. A request is settled a [`ROUND_TRIP`] after it
/// arrived, and the next frame is read a [`ROUND_TRIP`] after the response was
/// handed over: the SDK drops a CBS client, its links and its session as soon as it
/// has its response, and the detach of this link, answered at once, would overtake
/// the end of the session.
async fn serve_requests(mut receiver: Receiver, node: Node, replies: Replies, context: Context) {
    loop {
        let delivery: Delivery<Body<Value>> = tokio::select! {
            () = context.shutdown.cancelled() => return,
            delivery = receiver.recv() => match delivery {
                Ok(delivery) => delivery,
                Err(error) => return link_ended(receiver, error).await,
            },
        };
        if !round_trip(&context).await {
            return;
        }
        if let Err(error) = receiver.accept(&delivery).await {
            tracing::debug!(%error, "eventhubs broker: request not accepted");
            return;
        }
        if !respond(node, delivery.message(), &replies, &context).await
            || !round_trip(&context).await
        {
            return;
        }
    }
}

/// Hands the response to `request` to the reply link for its `reply-to` address;
/// false if the broker shuts down meanwhile.
async fn respond(
    node: Node,
    request: &Message<Body<Value>>,
    replies: &Replies,
    context: &Context,
) -> bool {
    let response = management::respond(node, &context.state, request);
    let reply_to = request
        .properties
        .as_ref()
        .and_then(|properties| properties.reply_to.clone())
        .unwrap_or_default();
    let reply_link = lock(replies).get(&reply_to).cloned();
    let Some(reply_link) = reply_link else {
        tracing::warn!(reply_to, ?node, "eventhubs broker: no link to reply to");
        return true;
    };
    tokio::select! {
        () = context.shutdown.cancelled() => false,
        sent = reply_link.send(response) => {
            if sent.is_err() {
                tracing::debug!(reply_to, "eventhubs broker: the reply link has gone");
            }
            true
        }
    }
}

/// Delivers the responses addressed to `address`.
async fn serve_responses(
    mut sender: Sender,
    address: String,
    mut outbox: Outbox,
    replies: Replies,
    context: Context,
) {
    loop {
        let response = tokio::select! {
            () = context.shutdown.cancelled() => break,
            detach = sender.on_detach() => {
                unregister(&replies, &address, outbox);
                return answer_detach(sender, detach, &context).await;
            }
            response = outbox.recv() => response,
        };
        let Some(response) = response else {
            break;
        };
        let sendable = Sendable::builder().message(response).settled(true).build();
        let sent = tokio::select! {
            () = context.shutdown.cancelled() => break,
            sent = sender.send(sendable) => sent,
        };
        if let Err(error) = sent {
            tracing::debug!(%error, address, "eventhubs broker: response not sent");
            break;
        }
    }
    unregister(&replies, &address, outbox);
}

/// Takes `address` out of the session's reply links, unless a newer link has it.
fn unregister(replies: &Replies, address: &str, mut outbox: Outbox) {
    outbox.close();
    let mut replies = lock(replies);
    if replies.get(address).is_some_and(mpsc::Sender::is_closed) {
        replies.remove(address);
    }
}

/// Stores what the client sends to hub `hub` (or one of its partitions).
async fn serve_publisher(
    mut receiver: Receiver,
    hub: usize,
    partition: Option<usize>,
    context: Context,
) {
    let Some(hub) = context.state.hubs.get(hub) else {
        return;
    };
    let mut detach = context.state.detach_publishers.subscribe();
    loop {
        let delivery: Delivery<Body<Value>> = tokio::select! {
            () = context.shutdown.cancelled() => return,
            Ok(()) = detach.changed() => return force_detach(receiver).await,
            delivery = receiver.recv() => match delivery {
                Ok(delivery) => delivery,
                Err(error) => return link_ended(receiver, error).await,
            },
        };
        // A refused transfer is not stored; `Ok` holds what storing it came to.
        let answer = match context.state.refusal() {
            Some(refusal) => Err(refusal),
            None => Ok(events_of(&delivery)
                .and_then(|events| hub.publish(&context.state, partition, events))),
        };
        if matches!(answer, Ok(Ok(()))) && context.state.withhold.load(Ordering::SeqCst) {
            continue;
        }
        if !round_trip(&context).await {
            return;
        }
        let disposed = match answer {
            Ok(Ok(())) => receiver.accept(&delivery).await,
            Ok(Err(error)) => {
                tracing::debug!(%error, hub = hub.name, "eventhubs broker: transfer rejected");
                receiver.reject(&delivery, error).await
            }
            Err(Refusal::Rejected) => {
                let error = definitions::Error::new(
                    AmqpError::InternalError,
                    "the test broker refuses sends".to_owned(),
                    None,
                );
                receiver.reject(&delivery, error).await
            }
            Err(Refusal::Released) => receiver.release(&delivery).await,
            Err(Refusal::Modified) => {
                let modified = Modified {
                    delivery_failed: Some(true),
                    undeliverable_here: Some(true),
                    message_annotations: None,
                };
                receiver.modify(&delivery, modified).await
            }
        };
        if let Err(error) = disposed {
            tracing::debug!(%error, "eventhubs broker: transfer not settled");
            return;
        }
    }
}

/// The events of a transfer: the message itself, or for a batch each message
/// encoded in its Data sections.
fn events_of(
    delivery: &Delivery<Body<Value>>,
) -> Result<Vec<Message<Body<Value>>>, definitions::Error> {
    let message = delivery.message();
    if *delivery.message_format() != Some(BATCH_FORMAT) {
        return Ok(vec![message.clone()]);
    }
    let decode_error =
        |description: String| definitions::Error::new(AmqpError::DecodeError, description, None);
    let Body::Data(sections) = &message.body else {
        return Err(decode_error("a batch must carry Data sections".to_owned()));
    };
    sections
        .iter()
        .map(|data| {
            serde_amqp::from_slice::<Deserializable<Message<Body<Value>>>>(&data.0)
                .map(|event| event.0)
                .map_err(|error| decode_error(format!("a batched event does not decode: {error}")))
        })
        .collect()
}

/// Delivers a partition's events from `cursor` on, as link credit allows, until
/// the client detaches, another receiver steals the partition, or shutdown.
async fn serve_consumer(
    mut sender: Sender,
    partition: Arc<Partition>,
    mut registration: Registration,
    mut cursor: Cursor,
    context: Context,
) {
    let mut appended = partition.appended.subscribe();
    loop {
        let batch: Vec<Message<Body<Value>>> = {
            let log = lock(&partition.log);
            cursor
                .take(&log.records, DELIVERY_CHUNK)
                .iter()
                .map(|record| record.message.clone())
                .collect()
        };
        if batch.is_empty() {
            tokio::select! {
                () = context.shutdown.cancelled() => return,
                Ok(level) = &mut registration.stolen => return close_stolen(sender, level).await,
                detach = sender.on_detach() => return answer_detach(sender, detach, &context).await,
                changed = appended.changed() => if changed.is_err() {
                    return;
                },
            }
            continue;
        }
        for message in batch {
            let sendable = Sendable::builder().message(message).settled(true).build();
            tokio::select! {
                biased;
                () = context.shutdown.cancelled() => return,
                Ok(level) = &mut registration.stolen => return close_stolen(sender, level).await,
                sent = sender.send(sendable) => if let Err(error) = sent {
                    tracing::debug!(%error, "eventhubs broker: event not delivered");
                    return;
                },
            }
        }
    }
}

/// Waits [`ROUND_TRIP`]; false if the broker shuts down meanwhile.
async fn round_trip(context: &Context) -> bool {
    tokio::select! {
        () = context.shutdown.cancelled() => false,
        () = tokio::time::sleep(ROUND_TRIP) => true,
    }
}

/// Answers, after [`ROUND_TRIP`], the detach the client started on a link the
/// broker sends on, in kind (closing or not). If the client ends the session
/// meanwhile, the end detaches the link and no answer goes out.
async fn answer_detach(sender: Sender, detach: DetachError, context: &Context) {
    let closing = match detach {
        DetachError::ClosedByRemote | DetachError::RemoteClosedWithError(_) => true,
        DetachError::DetachedByRemote | DetachError::RemoteDetachedWithError(_) => false,
        error => {
            tracing::debug!(%error, "eventhubs broker: link gone without a detach to answer");
            return;
        }
    };
    if !round_trip(context).await {
        return;
    }
    let answered = if closing {
        tokio::time::timeout(CLOSE_TIMEOUT, sender.close()).await
    } else {
        tokio::time::timeout(CLOSE_TIMEOUT, async {
            sender.detach().await.map(drop).map_err(|(_, error)| error)
        })
        .await
    };
    match answered {
        Ok(Ok(())) => {}
        // The session ended while the broker waited, which detached the link.
        Ok(Err(DetachError::IllegalSessionState)) => {}
        Ok(Err(error)) => tracing::debug!(%error, "eventhubs broker: detach not answered"),
        Err(_) => tracing::debug!("eventhubs broker: detach not answered in time"),
    }
}

async fn close_stolen(sender: Sender, level: i64) {
    let error = stolen(format!(
        "a receiver with owner level {level} took over the partition, \
         so this receiver is being disconnected"
    ));
    if let Ok(Err(error)) =
        tokio::time::timeout(CLOSE_TIMEOUT, sender.close_with_error(error)).await
    {
        tracing::debug!(%error, "eventhubs broker: stolen link closed");
    }
}

/// Closes a publisher's link as the service closes an idle one.
async fn force_detach(receiver: Receiver) {
    let error = definitions::Error::new(
        LinkError::DetachForced,
        "the test broker detaches the publishers' links".to_owned(),
        None,
    );
    if let Ok(Err(error)) =
        tokio::time::timeout(CLOSE_TIMEOUT, receiver.close_with_error(error)).await
    {
        tracing::debug!(%error, "eventhubs broker: publisher link closed");
    }
}

/// A receiving link's `recv` failed: the client detached, or sent what does not decode.
async fn link_ended(receiver: Receiver, error: RecvError) {
    if let RecvError::MessageDecode(_) = error {
        let error = definitions::Error::new(AmqpError::DecodeError, error.to_string(), None);
        if let Ok(Err(error)) =
            tokio::time::timeout(CLOSE_TIMEOUT, receiver.close_with_error(error)).await
        {
            tracing::debug!(%error, "eventhubs broker: link closed after a decode error");
        }
    } else {
        tracing::debug!(%error, "eventhubs broker: link ended");
    }
}
