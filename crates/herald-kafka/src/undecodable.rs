//! Record batches librdkafka cannot decode: a compression codec this build lacks (a future
//! one), a batch corrupted on the broker's disk. librdkafka reports such a batch as a
//! consumer error at every fetch and never moves past it, so without this the partition
//! stalls behind it for good. rust-rdkafka hands Herald the error's code only, without the
//! partition and offset librdkafka knew, so they are found here:
//!
//! 1. **Which partition.** After an undecodable error, positions are compared a while
//!    apart ([`StallWatch`]): a partition with messages behind its position (lag) whose
//!    position has not moved is a suspect.
//! 2. **Confirmed**, by a reader of its own (assigned, never in the group) at that
//!    position: it gets the same kind of error there, or it reads a message and the
//!    partition was only slow.
//! 3. **The batch's end.** A fetch from any offset inside a batch returns the whole batch,
//!    and librdkafka's error names the batch's first offset ("... of message at 1234 ...").
//!    So a read inside the batch fails naming the same first offset, and a read after it
//!    reads a message, or fails naming another batch (a second undecodable batch, with good
//!    records maybe between the two). The reader gallops (position + 1, + 2, + 4 ...) until
//!    a read is not the batch's or the high watermark is reached, then bisects between the
//!    last read of the batch and the first that was not: about 2 log2(records in the batch)
//!    reads. One batch at a time: a second one is found at the next stall, so no good
//!    record between two of them is ever skipped.
//!
//! The result is a [`Skip`]: the topic, partition, offsets and librdkafka's reason, for the
//! caller to dead-letter before it moves the consumer past them. The records themselves
//! stay at their offsets in the source topic (until its retention), where a build that can
//! decode them can read them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError as RdKafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::connect::{reader, Plain};
use crate::{KafkaSettings, Result};

/// How long the position of a suspect partition must stand still, with undecodable errors
/// meanwhile, before it is probed.
pub const STALL_AFTER: Duration = Duration::from_secs(2);
/// How long one probe read waits for a message or an error.
const PROBE_WAIT: Duration = Duration::from_secs(5);
/// How long one lookup may hold ingest's loop (which does not consume meanwhile): past it,
/// the reads give no answer and the lookup is made again at the next stall.
const LOOKUP_BUDGET: Duration = Duration::from_secs(30);
/// Most probe reads for one batch: enough for 2^30 records.
const MAX_PROBES: usize = 64;

/// Whether a consumer error with this code means a batch that cannot be decoded here (as
/// opposed to a connection, a rebalance or the broker's state).
pub fn is_undecodable(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        // librdkafka: a codec it was built without, or one it does not know (0x5+), or an
        // unknown message format version.
        C::NotImplemented
            // Decompression failed (a corrupt compressed batch).
            | C::BadCompression
            // A malformed message, or a CRC mismatch when CRCs are checked.
            | C::BadMessage
            | C::InvalidMessage
            | C::UnsupportedCompressionType
    )
}

/// Offsets `first_offset..next_offset` of one partition that were skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub topic: String,
    pub partition: i32,
    pub first_offset: i64,
    /// One past the last offset skipped: where the consumer goes on.
    pub next_offset: i64,
    /// How many probe reads found the run.
    pub reads: usize,
    /// librdkafka's words for it where the consumer kept them ("Decompression (codec 0x4) of
    /// message at 1234 of 567 bytes failed: Local: Not implemented"), else its code and
    /// description.
    pub reason: String,
}

impl Skip {
    pub fn detail(&self) -> String {
        format!(
            "offsets {}..={} of {}/{} could not be decoded by this build of librdkafka ({}): a compression \
             codec it lacks or a corrupt record batch; the records are still at those offsets in the source topic",
            self.first_offset,
            self.next_offset - 1,
            self.topic,
            self.partition,
            self.reason
        )
    }
}

/// A position (or an end) per (topic, partition).
pub type Positions = BTreeMap<(String, i32), i64>;

/// Every assigned partition's position: the offset after the last message handed out, or
/// -1 where none was since the assignment (read from the committed offset when it matters,
/// see [`find_runs`]).
pub fn positions<X: ConsumerContext, C: Consumer<X>>(consumer: &C) -> Positions {
    let Ok(tpl) = consumer.position() else {
        return BTreeMap::new();
    };
    tpl.elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            };
            ((e.topic().to_owned(), e.partition()), o)
        })
        .collect()
}

/// The offsets a list holds, by (topic, partition); logical ones (none, invalid) left out.
fn offsets_of(tpl: &TopicPartitionList) -> Positions {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_owned(), e.partition()), o)),
            _ => None,
        })
        .collect()
}

/// Blocking. The undecodable runs at the start of the partitions that `stood_still`
/// ([`StallWatch::stood_still`]) with messages behind them, each confirmed and measured by a
/// reader of its own (for `group`, never joining it). Three requests to the cluster whatever
/// the number of partitions (committed offsets, log starts, log ends), then the probe
/// reads. `consumer`'s context kept librdkafka's words for the batches it could not
/// decode: they go in each run's reason.
pub fn find_runs<X: ConsumerContext + AsRef<crate::context::Hooks>, C: Consumer<X>>(
    consumer: &C,
    stood_still: Vec<((String, i32), i64)>,
    settings: &KafkaSettings,
    group: &str,
) -> Result<Vec<Skip>> {
    if stood_still.is_empty() {
        return Ok(Vec::new());
    }
    let all: Vec<(String, i32)> = stood_still.iter().map(|(tp, _)| tp.clone()).collect();
    // Where nothing was handed out since the assignment: the committed offset, else the
    // log start (`auto.offset.reset=earliest`).
    let unknown: Vec<(String, i32)> = stood_still
        .iter()
        .filter(|(_, p)| *p < 0)
        .map(|(tp, _)| tp.clone())
        .collect();
    let committed = committed(consumer, &unknown)?;
    let starts = log_offsets(consumer, &unknown, Offset::Beginning)?;
    let ends = log_offsets(consumer, &all, Offset::End)?;
    let mut runs = Vec::new();
    for (tp, position) in stood_still {
        let start = match position {
            p if p >= 0 => Some(p),
            _ => committed.get(&tp).or_else(|| starts.get(&tp)).copied(),
        };
        if let (Some(start), Some(end)) = (start, ends.get(&tp).copied()) {
            if start < end {
                runs.push((tp, start, end));
            }
        }
    }
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let prober = Prober::new(settings, group)?;
    let mut found = Vec::new();
    for ((topic, partition), start, end) in runs {
        if let Some(mut skip) = prober.find(&topic, partition, start, end)? {
            let report = consumer.context().as_ref().as_ref().report();
            if let Some(words) = report.decode_failure_at(start) {
                skip.reason = format!("{}: {words}", skip.reason);
            }
            found.push(skip);
        }
    }
    // Closing a client waits up to a second for its threads: not on the caller's way.
    std::thread::spawn(move || drop(prober));
    Ok(found)
}

/// The group's committed offsets of `partitions`, where it has one.
fn committed<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    partitions: &[(String, i32)],
) -> Result<Positions> {
    if partitions.is_empty() {
        return Ok(Positions::new());
    }
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition(t, *p);
    }
    Ok(offsets_of(
        &consumer.committed_offsets(tpl, Duration::from_secs(10))?,
    ))
}

/// The log start (`Offset::Beginning`) or end (`Offset::End`, the high watermark) of
/// `partitions`, in one request per broker.
fn log_offsets<X: ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    partitions: &[(String, i32)],
    which: Offset,
) -> Result<Positions> {
    if partitions.is_empty() {
        return Ok(Positions::new());
    }
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition_offset(t, *p, which)?;
    }
    Ok(offsets_of(
        &consumer.offsets_for_times(tpl, Duration::from_secs(10))?,
    ))
}

/// Blocking. Moves `consumer` past `skip` (a seek: its next fetch of the partition starts
/// there).
pub fn seek_past<X: ConsumerContext, C: Consumer<X>>(consumer: &C, skip: &Skip) -> Result<()> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&skip.topic, skip.partition, Offset::Offset(skip.next_offset))?;
    let sought = consumer.seek_partitions(tpl, Duration::from_secs(10))?;
    if let Some(e) = sought.elements().first().and_then(|e| e.error().err()) {
        return Err(crate::KafkaError::Client(e));
    }
    Ok(())
}

/// Undecodable errors seen since the last check, and the positions at the first of them.
#[derive(Debug, Default)]
pub struct StallWatch {
    /// When the first undecodable error was seen, its code, and the positions then.
    since: Option<(Instant, RDKafkaErrorCode, Positions)>,
}

impl StallWatch {
    /// Notes a consumer error: one that says a batch cannot be decoded opens a series (if
    /// none is open); `positions` is called only for the first of a series.
    pub fn saw(&mut self, e: &rdkafka::error::KafkaError, positions: impl FnOnce() -> Positions) {
        if let rdkafka::error::KafkaError::MessageConsumption(code) = e {
            if is_undecodable(*code) && self.since.is_none() {
                self.since = Some((Instant::now(), *code, positions()));
            }
        }
    }

    /// Whether a series is open and old enough to look for a stalled partition.
    pub fn due(&self) -> bool {
        self.since
            .as_ref()
            .is_some_and(|(at, ..)| at.elapsed() >= STALL_AFTER)
    }

    /// The partitions whose position is the same `now` as at the series' start (-1: none
    /// handed out since the assignment, then and now); the series is closed.
    pub fn stood_still(&mut self, now: &Positions) -> Vec<((String, i32), i64)> {
        let Some((_, _, then)) = self.since.take() else {
            return Vec::new();
        };
        now.iter()
            .filter(|(tp, pos)| then.get(*tp) == Some(*pos))
            .map(|(tp, pos)| (tp.clone(), *pos))
            .collect()
    }
}

/// What one read at an offset found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// A message, at this offset (at or after the one asked for).
    Message(i64),
    /// An undecodable batch there, and its first offset where librdkafka's reason named it.
    Undecodable(RDKafkaErrorCode, Option<i64>),
    /// Neither within the wait (an unreachable broker, an empty range): no conclusion.
    Nothing,
}

/// The first offset of the batch a librdkafka reason for an undecodable batch names:
/// "Decompression (codec 0x4) of message at 1234 of 567 bytes failed", "MessageSet at offset
/// 1234 (567 bytes) failed CRC32C check", "Unsupported Message(Set) MagicByte 3 at offset
/// 1234".
pub fn batch_start(reason: &str) -> Option<i64> {
    reason.match_indices(" at ").find_map(|(i, at)| {
        let rest = &reason[i + at.len()..];
        let rest = rest.strip_prefix("offset ").unwrap_or(rest);
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// A reader of its own, for the probe reads, within [`LOOKUP_BUDGET`] of its creation.
pub struct Prober {
    consumer: BaseConsumer<Plain>,
    until: Instant,
}

impl Prober {
    pub fn new(settings: &KafkaSettings, group: &str) -> Result<Self> {
        Ok(Self {
            // Each read is a new fetch: answered at once where there are records, and an
            // error there is not waited out (librdkafka's defaults: 500 ms each).
            consumer: reader(
                settings,
                group,
                &[("fetch.wait.max.ms", "50"), ("fetch.error.backoff.ms", "20")],
            )?,
            until: Instant::now() + LOOKUP_BUDGET,
        })
    }

    /// Blocking: reads at `offset` of `topic`/`partition`.
    fn read(&self, topic: &str, partition: i32, offset: i64) -> Result<Read> {
        let started = Instant::now();
        let read = self.read_once(topic, partition, offset)?;
        tracing::debug!(
            topic,
            partition,
            offset,
            ?read,
            took_ms = started.elapsed().as_millis() as u64,
            "probe read"
        );
        Ok(read)
    }

    fn read_once(&self, topic: &str, partition: i32, offset: i64) -> Result<Read> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        self.consumer.assign(&tpl)?;
        let deadline = (Instant::now() + PROBE_WAIT).min(self.until);
        while Instant::now() < deadline {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) if m.partition() == partition && m.offset() >= offset => {
                    return Ok(Read::Message(m.offset()))
                }
                Some(Ok(_)) | None => {}
                Some(Err(RdKafkaError::MessageConsumption(code))) if is_undecodable(code) => {
                    // The poll handed librdkafka's words to the context just before.
                    let words = self.consumer.context().hooks.report().last_decode_failure();
                    return Ok(Read::Undecodable(code, words.as_deref().and_then(batch_start)));
                }
                Some(Err(_)) => {}
            }
        }
        Ok(Read::Nothing)
    }

    /// Blocking: whether `position` of `topic`/`partition` starts an undecodable run, and
    /// where the run ends (before `end`, the high watermark). `None`: the partition reads
    /// fine there, or the reads gave no answer (tried again at the next stall).
    pub fn find(&self, topic: &str, partition: i32, position: i64, end: i64) -> Result<Option<Skip>> {
        let (code, batch) = match self.read(topic, partition, position)? {
            Read::Undecodable(code, batch) => (code, batch),
            Read::Message(_) | Read::Nothing => return Ok(None),
        };
        let mut reads = 1;
        let mut probe = |offset: i64| {
            reads += 1;
            self.read(topic, partition, offset)
        };
        let next_offset = match batch {
            Some(first) => match run_end(position, end, first, &mut probe)? {
                Some(next) => next,
                None => return Ok(None),
            },
            // librdkafka's words did not name the batch: one offset at a time, so that no
            // good record is ever taken for part of it.
            None => position + 1,
        };
        Ok(Some(Skip {
            topic: topic.to_owned(),
            partition,
            first_offset: position,
            next_offset,
            reads,
            reason: code.to_string(),
        }))
    }
}

/// The first offset after the undecodable batch whose first offset is `batch` and that
/// `start` is in, before `end` (the high watermark, read as its end when reached): gallop,
/// then bisect, on "the read fails naming this batch". `None` when a read gave no answer or
/// the reads ran out.
fn run_end(
    start: i64,
    end: i64,
    batch: i64,
    read: &mut impl FnMut(i64) -> Result<Read>,
) -> Result<Option<i64>> {
    // Whether the read at an offset is of this batch; `None`: no answer.
    let mut of_batch = |at: i64| -> Result<Option<bool>> {
        Ok(match read(at)? {
            Read::Undecodable(_, Some(first)) => Some(first == batch),
            // Undecodable without a name: not provably this batch (a bound, conservatively).
            Read::Undecodable(_, None) | Read::Message(_) => Some(false),
            Read::Nothing => None,
        })
    };
    let (mut inside, mut step, mut probes) = (start, 1i64, 0usize);
    let mut after = loop {
        let at = inside.saturating_add(step).min(end);
        if at >= end {
            break end;
        }
        probes += 1;
        match of_batch(at)? {
            Some(true) => {
                inside = at;
                step = step.saturating_mul(2);
            }
            Some(false) => break at,
            None => return Ok(None),
        }
        if probes >= MAX_PROBES {
            return Ok(None);
        }
    };
    while after - inside > 1 {
        probes += 1;
        if probes > MAX_PROBES {
            return Ok(None);
        }
        let mid = inside + (after - inside) / 2;
        match of_batch(mid)? {
            Some(true) => inside = mid,
            Some(false) => after = mid,
            None => return Ok(None),
        }
    }
    Ok(Some(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition of batches (first offset, last offset, decodable): what a read at an
    /// offset finds, as librdkafka reports it (an undecodable batch named by its first offset).
    fn log(batches: &[(i64, i64, bool)]) -> impl FnMut(i64) -> Result<Read> + '_ {
        move |at| {
            // The batch holding `at`, else (a gap) the first after it.
            let batch = batches
                .iter()
                .find(|(first, last, _)| (*first..=*last).contains(&at))
                .or_else(|| batches.iter().find(|(first, _, _)| *first > at));
            Ok(match batch {
                Some((first, _, true)) => Read::Message(at.max(*first)),
                Some((first, _, false)) => Read::Undecodable(RDKafkaErrorCode::NotImplemented, Some(*first)),
                None => Read::Nothing,
            })
        }
    }

    #[test]
    fn the_run_ends_where_its_batch_ends() {
        // One bad batch of 10 in the middle, a good one after it.
        let batches = [(0, 9, true), (10, 19, false), (20, 29, true)];
        assert_eq!(run_end(10, 30, 10, &mut log(&batches)).unwrap(), Some(20));
        // The bad batch is the last: the run ends at the high watermark.
        assert_eq!(run_end(10, 20, 10, &mut log(&batches[..2])).unwrap(), Some(20));
        // A batch of one record.
        let one = [(5, 5, false), (6, 6, true)];
        assert_eq!(run_end(5, 7, 5, &mut log(&one)).unwrap(), Some(6));
        // Two bad batches in a row: one at a time.
        let two = [(0, 99, false), (100, 499, false), (500, 520, true)];
        assert_eq!(run_end(0, 521, 0, &mut log(&two)).unwrap(), Some(100));
        assert_eq!(run_end(100, 521, 100, &mut log(&two)).unwrap(), Some(500));
        // A gap (a transaction marker, compaction) after the bad batch: the read at the
        // gap finds the next message, so the run ends at the gap.
        let gap = [(10, 19, false), (21, 30, true)];
        assert_eq!(run_end(10, 31, 10, &mut log(&gap)).unwrap(), Some(20));
    }

    /// Two undecodable batches with good records between them: the gallop from the first
    /// lands in the second (1, 2, 4, 8), which must not carry the run over the good ones.
    #[test]
    fn good_records_between_two_bad_batches_are_never_skipped() {
        let batches = [(1, 6, false), (7, 7, true), (8, 10, false), (11, 11, true)];
        assert_eq!(run_end(1, 12, 1, &mut log(&batches)).unwrap(), Some(7));
        assert_eq!(run_end(8, 12, 8, &mut log(&batches)).unwrap(), Some(11));
        let wide = [(0, 9, false), (10, 12, true), (13, 40, false), (41, 50, true)];
        assert_eq!(run_end(0, 51, 0, &mut log(&wide)).unwrap(), Some(10));
    }

    #[test]
    fn a_read_without_an_answer_gives_no_run() {
        let mut silent = |_| Ok(Read::Nothing);
        assert_eq!(run_end(10, 30, 10, &mut silent).unwrap(), None);
    }

    #[test]
    fn the_reads_are_logarithmic_in_the_batch() {
        let batches = [(0, 99_999, false), (100_000, 100_010, true)];
        let mut reads = 0;
        let mut inner = log(&batches);
        let mut counting = |at| {
            reads += 1;
            inner(at)
        };
        assert_eq!(run_end(0, 100_011, 0, &mut counting).unwrap(), Some(100_000));
        assert!(reads <= 2 * 17 + 2, "{reads} reads");
    }

    #[test]
    fn librdkafka_s_reasons_name_the_batch() {
        assert_eq!(
            batch_start(
                "Decompression (codec 0x4) of message at 1234 of 567 bytes failed: Local: Not implemented"
            ),
            Some(1234)
        );
        assert_eq!(
            batch_start(
                "MessageSet at offset 77 (100 bytes) failed CRC32C check (original 0x1 != calculated 0x2)"
            ),
            Some(77)
        );
        assert_eq!(
            batch_start("Unsupported Message(Set) MagicByte 3 at offset 5"),
            Some(5)
        );
        assert_eq!(batch_start("Local: Broker transport failure"), None);
    }

    #[test]
    fn a_suspect_is_a_partition_whose_position_stood_still() {
        let at = |v: &[(&str, i32, i64)]| {
            v.iter()
                .map(|(t, p, o)| (((*t).to_owned(), *p), *o))
                .collect::<BTreeMap<_, _>>()
        };
        let mut watch = StallWatch::default();
        assert!(!watch.due());
        let consuming = rdkafka::error::KafkaError::MessageConsumption;
        watch.saw(&consuming(RDKafkaErrorCode::NotImplemented), || {
            at(&[("orders", 0, 10), ("orders", 1, 5), ("orders", 2, 7)])
        });
        // A second error does not move the series' start.
        watch.saw(&consuming(RDKafkaErrorCode::BadCompression), || {
            panic!("positions are read once")
        });
        let now = at(&[("orders", 0, 10), ("orders", 1, 9), ("orders", 2, 7)]);
        // 1 moved.
        assert_eq!(
            watch.stood_still(&now),
            vec![(("orders".to_owned(), 0), 10), (("orders".to_owned(), 2), 7)]
        );
        assert!(!watch.due(), "the series is closed");
    }

    #[test]
    fn only_decoding_failures_are_undecodable() {
        assert!(is_undecodable(RDKafkaErrorCode::NotImplemented));
        assert!(is_undecodable(RDKafkaErrorCode::BadCompression));
        assert!(!is_undecodable(RDKafkaErrorCode::BrokerTransportFailure));
        assert!(!is_undecodable(RDKafkaErrorCode::AllBrokersDown));
        assert!(!is_undecodable(RDKafkaErrorCode::SaslAuthenticationFailed));
    }
}
