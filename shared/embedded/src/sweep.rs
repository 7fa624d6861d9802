//! One sweep, inside the committer's transaction: what the retention
//! windows expired, oldest first, at most a batch of each kind, never past
//! the slowest change-feed lease; and the one-time indexing of a data
//! directory written before the retention and listing indexes.
//! ([`crate::retention`] has the windows and the sweeper that asks for one.)

use redb::{ReadableTable, WriteTransaction};
use skyport_core::ports::{LEASE_CONTINUATION, LEASE_RETIRED, RANGE_LEASE_PREFIX};
use time::OffsetDateTime;

use crate::codec;
use crate::listing::Listed;
use crate::tables::{META, Tables, unix_ms, unix_ms_of};

/// The key in `meta` that says the retention and listing indexes cover
/// every entry (a data directory written before them is indexed once, at open).
const INDEXED: &str = "indexed";

/// What one sweep removes: entries written before these times, at most
/// `batch` of each kind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cutoffs {
    pub(crate) status_before_ms: i64,
    pub(crate) dead_letters_before_ms: i64,
    pub(crate) batch: usize,
}

/// What one sweep removed, and what it left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Status documents removed, each with its change record.
    pub statuses: usize,
    pub dead_letters: usize,
    pub change_dead_letters: usize,
    /// The sweep stopped at a document whose change record a change-feed
    /// lease has not checkpointed past.
    pub held_by_lease: bool,
    /// When the oldest entry left of each kind was written (Unix ms).
    pub oldest_status_ms: Option<i64>,
    pub oldest_dead_letter_ms: Option<i64>,
    pub oldest_change_dead_letter_ms: Option<i64>,
}

impl Swept {
    /// Whether a kind removed a whole batch, so that more may be due now.
    pub(crate) fn more(&self, batch: usize) -> bool {
        !self.held_by_lease
            && [self.statuses, self.dead_letters, self.change_dead_letters]
                .iter()
                .any(|&removed| removed >= batch)
    }
}

/// Removes what `cutoffs` expire, in the committer's transaction.
pub(crate) fn sweep(tables: &mut Tables<'_>, cutoffs: &Cutoffs) -> Result<Swept, redb::Error> {
    let mut swept = Swept::default();
    let floor = change_floor(tables)?;
    let due: Vec<(i64, String)> = tables
        .status_expiry
        .range(..(cutoffs.status_before_ms, ""))?
        .take(cutoffs.batch)
        .map(|entry| entry.map(|(key, _)| (key.value().0, key.value().1.to_owned())))
        .collect::<Result<_, _>>()?;
    for (at, id) in due {
        let stored = tables.status.get(id.as_str())?.map(|stored| {
            let (_, change, _, body) = stored.value();
            (change, body.to_vec())
        });
        let change = stored.as_ref().and_then(|(change, _)| *change);
        if let (Some(change), Some(floor)) = (change, floor)
            && change > floor
        {
            swept.held_by_lease = true;
            break;
        }
        if let Some(change) = change {
            tables.changes.remove(change)?;
        }
        if let Some((_, body)) = stored {
            tables.unlist(&id, &body)?;
            tables.status.remove(id.as_str())?;
        }
        tables.status_expiry.remove((at, id.as_str()))?;
        swept.statuses += 1;
    }
    let due: Vec<(i64, u32, u64)> = tables
        .dead_letter_expiry
        .range(..(cutoffs.dead_letters_before_ms, 0, 0))?
        .take(cutoffs.batch)
        .map(|entry| entry.map(|(key, _)| key.value()))
        .collect::<Result<_, _>>()?;
    for (at, partition, offset) in due {
        tables.dead_letters.remove((partition, offset))?;
        tables.dead_letter_expiry.remove((at, partition, offset))?;
        swept.dead_letters += 1;
    }
    let due: Vec<(i64, String, String)> = tables
        .change_dead_letter_expiry
        .range(..(cutoffs.dead_letters_before_ms, "", ""))?
        .take(cutoffs.batch)
        .map(|entry| {
            entry.map(|(key, _)| {
                let (at, processor, name) = key.value();
                (at, processor.to_owned(), name.to_owned())
            })
        })
        .collect::<Result<_, _>>()?;
    for (at, processor, name) in due {
        tables
            .change_dead_letters
            .remove((processor.as_str(), name.as_str()))?;
        tables
            .change_dead_letter_expiry
            .remove((at, processor.as_str(), name.as_str()))?;
        swept.change_dead_letters += 1;
    }
    swept.oldest_status_ms = tables.status_expiry.first()?.map(|(key, _)| key.value().0);
    swept.oldest_dead_letter_ms = tables
        .dead_letter_expiry
        .first()?
        .map(|(key, _)| key.value().0);
    swept.oldest_change_dead_letter_ms = tables
        .change_dead_letter_expiry
        .first()?
        .map(|(key, _)| key.value().0);
    Ok(swept)
}

/// The change every live change-feed lease has checkpointed past (the
/// slowest one's), `None` when there is no lease; a lease that has not
/// checkpointed yet holds everything.
fn change_floor(tables: &Tables<'_>) -> Result<Option<u64>, redb::Error> {
    let mut floor: Option<u64> = None;
    for entry in tables.leases.iter()? {
        let (key, value) = entry?;
        if !key.value().1.starts_with(RANGE_LEASE_PREFIX) {
            continue;
        }
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(value.value().2).unwrap_or_default();
        if fields
            .get(LEASE_RETIRED)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
        {
            continue;
        }
        let checkpoint = fields
            .get(LEASE_CONTINUATION)
            .and_then(serde_json::Value::as_str)
            .and_then(|text| text.parse::<u64>().ok())
            .unwrap_or(0);
        floor = Some(floor.map_or(checkpoint, |floor| floor.min(checkpoint)));
    }
    Ok(floor)
}

/// Indexes what a data directory written before the retention and listing
/// indexes holds, once: settled documents from now, dead letters from when
/// they were dead-lettered, every document for listing. Answers how many
/// documents it indexed.
pub(crate) fn index_existing(txn: &WriteTransaction) -> Result<Option<u64>, redb::Error> {
    {
        let meta = txn.open_table(META)?;
        if meta.get(INDEXED)?.is_some() {
            return Ok(None);
        }
    }
    let now = OffsetDateTime::now_utc();
    let indexed = {
        let mut tables = Tables::open(txn)?;
        let mut documents = Vec::new();
        for entry in tables.status.iter()? {
            let (id, value) = entry?;
            let (version, change, settled, body) = value.value();
            if let Ok(document) = codec::decode(body) {
                let settles = document.settled_at(now).map(unix_ms);
                // The row is rewritten only when its retention window moves.
                let row = (settled != settles).then(|| (version, change, body.to_vec()));
                documents.push((id.value().to_owned(), document, settled, settles, row));
            }
        }
        for (id, document, settled, settles, row) in &documents {
            tables.list(id, &Listed::of(document))?;
            tables.settle(id, *settled, *settles)?;
            if let Some((version, change, body)) = row {
                tables
                    .status
                    .insert(id.as_str(), (*version, *change, *settles, body.as_slice()))?;
            }
        }
        let mut letters = Vec::new();
        for entry in tables.dead_letters.iter()? {
            let (key, value) = entry?;
            letters.push((unix_ms_of(value.value().1), key.value()));
        }
        for (at, (partition, offset)) in letters {
            tables
                .dead_letter_expiry
                .insert((at, partition, offset), ())?;
        }
        let mut letters = Vec::new();
        for entry in tables.change_dead_letters.iter()? {
            let (key, value) = entry?;
            let (processor, name) = key.value();
            letters.push((
                unix_ms_of(value.value().1),
                processor.to_owned(),
                name.to_owned(),
            ));
        }
        for (at, processor, name) in letters {
            tables
                .change_dead_letter_expiry
                .insert((at, processor.as_str(), name.as_str()), ())?;
        }
        u64::try_from(documents.len()).unwrap_or(u64::MAX)
    };
    txn.open_table(META)?.insert(INDEXED, [1u8].as_slice())?;
    Ok(Some(indexed))
}
