//! The AMQP side: one task for the listener, each connection, each session and
//! each link, all on the broker's task tracker and all ending on its shutdown token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::acceptor::sasl_acceptor::SaslServerFrame;
use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, ListenerSessionHandle, SaslAcceptor, SessionAcceptor,
};
use fe2o3_amqp::types::definitions::{self, AmqpError, Role};
use fe2o3_amqp::types::messaging::{Body, Message, Target};
use fe2o3_amqp::types::performatives::Attach;
use fe2o3_amqp::types::primitives::{Array, Symbol, Value};
use fe2o3_amqp::types::sasl::{SaslCode, SaslInit, SaslOutcome, SaslResponse};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::filter::{Cursor, StartPosition};
use super::links::serve_link;
use super::management::Node;
use super::{Partition, Registration, State, lock, not_found};

/// The max-message-size links advertise (the service's, on the standard tier).
const MAX_MESSAGE_SIZE: u64 = 1024 * 1024;
/// Bounds the AMQP handshake of a new connection.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Bounds waiting for the client's answer to a close or detach.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What every task needs.
#[derive(Debug, Clone)]
pub(super) struct Context {
    pub(super) state: Arc<State>,
    pub(super) shutdown: CancellationToken,
    pub(super) tasks: TaskTracker,
}

/// Accepts connections until shutdown.
pub(super) async fn listen(listener: TcpListener, context: Context) {
    let acceptor = Arc::new(
        ConnectionAcceptor::builder()
            .container_id("skyport-eventhubs-test-broker")
            .sasl_acceptor(AnyCredentials)
            .build(),
    );
    let links = Arc::new(AtomicU64::new(0));
    loop {
        let accepted = tokio::select! {
            () = context.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                // Small frames go out at once: Nagle's delay would slow every round trip.
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, "eventhubs broker: TCP_NODELAY not set");
                }
                context.tasks.spawn(serve_connection(
                    stream,
                    Arc::clone(&acceptor),
                    Arc::clone(&links),
                    context.clone(),
                ));
            }
            Err(error) => {
                tracing::warn!(%error, "eventhubs broker: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

type Acceptor = ConnectionAcceptor<(), AnyCredentials>;

async fn serve_connection(
    stream: TcpStream,
    acceptor: Arc<Acceptor>,
    links: Arc<AtomicU64>,
    context: Context,
) {
    let opened = tokio::select! {
        () = context.shutdown.cancelled() => return,
        opened = tokio::time::timeout(OPEN_TIMEOUT, acceptor.accept(stream)) => opened,
    };
    let mut connection = match opened {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            tracing::debug!(%error, "eventhubs broker: connection not opened");
            return;
        }
        Err(_) => {
            tracing::debug!("eventhubs broker: connection not opened in time");
            return;
        }
    };
    let sessions = SessionAcceptor::new();
    loop {
        let incoming = tokio::select! {
            () = context.shutdown.cancelled() => break,
            incoming = connection.next_incoming_session() => incoming,
        };
        let Some(incoming) = incoming else {
            break;
        };
        match sessions
            .accept_incoming_session(incoming, &mut connection)
            .await
        {
            Ok(session) => {
                context
                    .tasks
                    .spawn(serve_session(session, Arc::clone(&links), context.clone()));
            }
            Err(error) => {
                tracing::debug!(%error, "eventhubs broker: session not begun");
                break;
            }
        }
    }
    if let Ok(Err(error)) = tokio::time::timeout(CLOSE_TIMEOUT, connection.close()).await {
        tracing::debug!(%error, "eventhubs broker: connection closed");
    }
}

/// The reply links of a session, by the client address they deliver to.
pub(super) type Replies = Arc<Mutex<HashMap<String, mpsc::Sender<Message<Body<Value>>>>>>;

/// The responses waiting for one reply link.
pub(super) type Outbox = mpsc::Receiver<Message<Body<Value>>>;

async fn serve_session(
    mut session: ListenerSessionHandle,
    links: Arc<AtomicU64>,
    context: Context,
) {
    let replies = Replies::default();
    let acceptor = LinkAcceptor::builder()
        .max_message_size(MAX_MESSAGE_SIZE)
        .build();
    loop {
        let attach = tokio::select! {
            () = context.shutdown.cancelled() => return,
            attach = session.next_incoming_attach() => attach,
        };
        let Some(attach) = attach else {
            return;
        };
        let id = links.fetch_add(1, Ordering::Relaxed);
        let route = Route::of(&attach, &context.state, &replies, id);
        let link = match acceptor.accept_incoming_attach(attach, &mut session).await {
            Ok(link) => link,
            Err(error) => {
                tracing::debug!(%error, "eventhubs broker: link not attached");
                continue;
            }
        };
        let task = serve_link(link, route, Arc::clone(&replies), context.clone());
        context.tasks.spawn(task);
    }
}

/// What a link is for, decided from its attach before accepting it.
#[derive(Debug)]
pub(super) enum Route {
    /// The client sends requests to a node.
    Requests(Node),
    /// The client receives a node's responses at `address`. The address is
    /// registered before the attach is answered, as the client may send a request
    /// as soon as it has the answer.
    Responses { address: String, outbox: Outbox },
    /// The client sends events to a hub, or to one of its partitions.
    Publish {
        hub: usize,
        partition: Option<usize>,
    },
    /// The client receives a partition's events.
    Consume {
        partition: Arc<Partition>,
        registration: Registration,
        cursor: Cursor,
    },
    /// Attach, then close with this error.
    Refuse(definitions::Error),
}

impl Route {
    fn of(attach: &Attach, state: &State, replies: &Replies, id: u64) -> Self {
        match attach.role {
            // The client sends, the broker receives.
            Role::Sender => {
                let address = attach
                    .target
                    .as_ref()
                    .and_then(|target| Target::try_from((**target).clone()).ok())
                    .and_then(|target| target.address)
                    .unwrap_or_default();
                if let Some(node) = Node::of(&address) {
                    return Self::Requests(node);
                }
                match path_segments(&address).as_slice() {
                    [hub] => Self::publish(state, &address, hub, None),
                    [hub, partitions, partition]
                        if partitions.eq_ignore_ascii_case("Partitions") =>
                    {
                        Self::publish(state, &address, hub, Some(partition))
                    }
                    _ => Self::Refuse(not_found(format!("no entity at {address:?}"))),
                }
            }
            // The client receives, the broker sends.
            Role::Receiver => {
                let source = attach.source.as_deref();
                let address = source
                    .and_then(|source| source.address.clone())
                    .unwrap_or_default();
                if Node::of(&address).is_some() {
                    let reply_to = attach
                        .target
                        .as_ref()
                        .and_then(|target| Target::try_from((**target).clone()).ok())
                        .and_then(|target| target.address);
                    return match reply_to {
                        Some(address) => {
                            let (reply_link, outbox) = mpsc::channel(16);
                            lock(replies).insert(address.clone(), reply_link);
                            Self::Responses { address, outbox }
                        }
                        None => Self::Refuse(definitions::Error::new(
                            AmqpError::InvalidField,
                            "a response link needs a target address".to_owned(),
                            None,
                        )),
                    };
                }
                let [hub, groups, group, partitions, partition] = path_segments(&address)[..]
                else {
                    return Self::Refuse(not_found(format!("no entity at {address:?}")));
                };
                if !groups.eq_ignore_ascii_case("ConsumerGroups")
                    || !partitions.eq_ignore_ascii_case("Partitions")
                {
                    return Self::Refuse(not_found(format!("no entity at {address:?}")));
                }
                let Some(partition) = state
                    .hub(hub)
                    .and_then(|found| found.partition(partition))
                    .cloned()
                else {
                    return Self::Refuse(not_found(format!(
                        "no partition {partition:?} in event hub {hub:?}"
                    )));
                };
                let start = match StartPosition::from_filter(
                    source.and_then(|source| source.filter.as_ref()),
                ) {
                    Ok(start) => start,
                    Err(description) => {
                        return Self::Refuse(definitions::Error::new(
                            AmqpError::InvalidField,
                            description,
                            None,
                        ));
                    }
                };
                let owner_level = match owner_level(attach) {
                    Ok(owner_level) => owner_level,
                    Err(description) => {
                        return Self::Refuse(definitions::Error::new(
                            AmqpError::InvalidField,
                            description,
                            None,
                        ));
                    }
                };
                // The log length and the registration are taken now, before the client
                // sees the attach: `@latest` excludes nothing sent after that.
                let cursor = Cursor::new(start, lock(&partition.log).records.len());
                match partition.register(group, owner_level, id) {
                    Ok(registration) => Self::Consume {
                        partition,
                        registration,
                        cursor,
                    },
                    Err(error) => Self::Refuse(error),
                }
            }
        }
    }

    fn publish(state: &State, address: &str, hub: &str, partition: Option<&str>) -> Self {
        let Some((index, found)) = state
            .hubs
            .iter()
            .enumerate()
            .find(|(_, found)| found.name.eq_ignore_ascii_case(hub))
        else {
            return Self::Refuse(not_found(format!("no event hub at {address:?}")));
        };
        let partition = match partition.map(|id| (id, found.partition_index(id))) {
            None => None,
            Some((_, Some(partition))) => Some(partition),
            Some((id, None)) => {
                return Self::Refuse(not_found(format!(
                    "no partition {id:?} in event hub {hub:?}"
                )));
            }
        };
        Self::Publish {
            hub: index,
            partition,
        }
    }
}

/// The path of an address that may be a URL (`amqps://host/a/b`) or a bare path.
fn path_segments(address: &str) -> Vec<&str> {
    let path = match address.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, path)| path),
        None => address,
    };
    path.split('/')
        .filter(|segment| !segment.is_empty())
        .collect()
}

/// The `com.microsoft:epoch` link property.
fn owner_level(attach: &Attach) -> Result<Option<i64>, String> {
    let Some(value) = attach
        .properties
        .as_ref()
        .and_then(|properties| properties.get("com.microsoft:epoch"))
    else {
        return Ok(None);
    };
    match value {
        Value::Long(level) => Ok(Some(*level)),
        Value::Int(level) => Ok(Some(i64::from(*level))),
        other => Err(format!("com.microsoft:epoch is not a long: {other:?}")),
    }
}

/// Accepts SASL ANONYMOUS and PLAIN with any credentials.
#[derive(Debug, Clone)]
pub(super) struct AnyCredentials;

impl SaslAcceptor for AnyCredentials {
    fn mechanisms(&self) -> Array<Symbol> {
        Array::from(vec![Symbol::from("ANONYMOUS"), Symbol::from("PLAIN")])
    }

    fn on_init(&mut self, _init: SaslInit) -> SaslServerFrame {
        SaslServerFrame::Outcome(SaslOutcome {
            code: SaslCode::Ok,
            additional_data: None,
        })
    }

    fn on_response(&mut self, _response: SaslResponse) -> SaslServerFrame {
        SaslServerFrame::Outcome(SaslOutcome {
            code: SaslCode::Ok,
            additional_data: None,
        })
    }
}
