//! An Event Hubs batch as it goes on the wire: one AMQP message (message
//! format `0x80013700`) whose body's Data sections each hold an encoded
//! event, and whose other sections are the first event's. Its size is
//! counted as events are added, so that it never exceeds what the link takes.

use azure_core::Uuid;
use azure_core_amqp::{AmqpError, AmqpMessage};

/// Events for one transfer, and an upper bound of its encoded size.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The first event without its body: the batch's own sections.
    envelope: Option<AmqpMessage>,
    events: Vec<Vec<u8>>,
    size: u64,
    max_size: u64,
}

impl Batch {
    pub(crate) fn new(max_size: u64) -> Self {
        Self {
            envelope: None,
            events: Vec::new(),
            size: 0,
            max_size,
        }
    }

    /// Adds `event` unless the batch would then be larger than its maximum
    /// size. An event without a message id gets one (as the SDK gives it).
    ///
    /// # Errors
    /// When the event cannot be encoded.
    pub(crate) fn try_add(&mut self, mut event: AmqpMessage) -> Result<bool, AmqpError> {
        if event
            .properties
            .as_ref()
            .is_none_or(|properties| properties.message_id.is_none())
        {
            event.set_message_id(Uuid::new_v4());
        }
        let encoded = AmqpMessage::serialize(&event)?;
        // The envelope is the first event with another body, so the first
        // event's encoded size bounds it.
        let envelope = if self.envelope.is_none() {
            len(&encoded)
        } else {
            0
        };
        let size = self.size + envelope + data_section_size(&encoded);
        if size > self.max_size {
            return Ok(false);
        }
        if self.envelope.is_none() {
            self.envelope = Some(event);
        }
        self.size = size;
        self.events.push(encoded);
        Ok(true)
    }

    /// An upper bound of the batch's encoded size.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// The message to send; `None` for an empty batch.
    pub(crate) fn into_message(self) -> Option<AmqpMessage> {
        let mut envelope = self.envelope?;
        envelope.set_message_body(self.events);
        Some(envelope)
    }
}

fn len(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

/// The encoded size of a Data section holding `bytes`: its descriptor (3
/// bytes), then a binary's constructor and length (2 bytes up to 255 bytes,
/// 5 beyond) and the bytes.
fn data_section_size(bytes: &[u8]) -> u64 {
    len(bytes) + if bytes.len() < 256 { 5 } else { 8 }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use azure_core_amqp::message::AmqpMessageBody;

    fn event(body: &[u8]) -> AmqpMessage {
        AmqpMessage::builder()
            .with_body(AmqpMessageBody::Binary(vec![body.to_vec()]))
            .add_application_property("kind".to_owned(), "test")
            .build()
    }

    #[test]
    fn a_batch_bounds_its_encoded_size_and_keeps_the_first_events_sections() {
        let mut batch = Batch::new(4_096);
        for body in [&b"short"[..], &[7u8; 300][..], b"third"] {
            assert!(batch.try_add(event(body)).unwrap());
        }
        assert_eq!(batch.len(), 3);
        let bound = batch.size();
        let message = batch.into_message().unwrap();
        let encoded = AmqpMessage::serialize(&message).unwrap();
        assert!(
            len(&encoded) <= bound,
            "{} bytes against a bound of {bound}",
            encoded.len()
        );
        assert!(message.properties.unwrap().message_id.is_some());
        assert!(
            message
                .application_properties
                .unwrap()
                .0
                .contains_key("kind")
        );
        match message.body {
            AmqpMessageBody::Binary(sections) => assert_eq!(sections.len(), 3),
            other => panic!("a batch's body is Data sections, not {other:?}"),
        }
    }

    #[test]
    fn an_event_that_does_not_fit_is_left_out_and_an_empty_batch_has_no_message() {
        let mut batch = Batch::new(200);
        assert!(!batch.try_add(event(&[1u8; 300])).unwrap());
        assert_eq!(batch.len(), 0);
        assert!(batch.try_add(event(b"fits")).unwrap());
        let size = batch.size();
        assert!(!batch.try_add(event(&[2u8; 150])).unwrap());
        assert_eq!((batch.len(), batch.size()), (1, size));
        assert!(Batch::new(200).into_message().is_none());
    }
}
