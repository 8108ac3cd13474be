//! The local broker's log segments, read and altered on disk: each record batch's offsets
//! and compression codec (what a producer really sent), and the corruption a test needs to
//! put in front of a consumer a batch it cannot decode. The broker reads fetched batches
//! from these files as they are (it validates batches when they are produced, not when
//! they are fetched), so a batch altered here reaches the consumer altered.
//!
//! Layout of a record batch (magic 2), from Kafka's protocol documentation: baseOffset
//! int64 at 0, batchLength int32 at 8 (the bytes after it), partitionLeaderEpoch int32 at
//! 12, magic int8 at 16, crc at 17, attributes int16 at 21 (its low 3 bits the codec),
//! lastOffsetDelta int32 at 23, ... records at 61.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::local_dir;

/// Where the records of a batch start.
const RECORDS_AT: u64 = 61;
const ATTRIBUTES_AT: u64 = 21;

/// A compression codec, as a batch's attributes name it.
pub fn codec_name(codec: u8) -> &'static str {
    match codec {
        0 => "none",
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown",
    }
}

/// One record batch in a segment file.
#[derive(Debug, Clone)]
pub struct Batch {
    pub file: PathBuf,
    /// Where the batch starts in the file.
    pub position: u64,
    pub base_offset: i64,
    pub last_offset: i64,
    pub codec: u8,
    pub length: u64,
}

/// The data directory of `topic`'s `partition` on the single local broker.
fn partition_dir(topic: &str, partition: i32) -> PathBuf {
    local_dir()
        .join("kafka/data")
        .join(format!("{topic}-{partition}"))
}

/// Every batch of `topic`/`partition`, in offset order.
pub fn batches(topic: &str, partition: i32) -> Result<Vec<Batch>> {
    let dir = partition_dir(topic, partition);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {} (the local broker's data)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let bytes = std::fs::read(&file)?;
        let mut at = 0usize;
        while at + RECORDS_AT as usize <= bytes.len() {
            let i64_at = |o: usize| i64::from_be_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
            let i32_at = |o: usize| i32::from_be_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
            let length = i32_at(at + 8);
            if length <= 0 {
                break; // preallocated space past the last batch
            }
            let base_offset = i64_at(at);
            out.push(Batch {
                file: file.clone(),
                position: at as u64,
                base_offset,
                last_offset: base_offset + i64::from(i32_at(at + 23)),
                codec: bytes[at + ATTRIBUTES_AT as usize + 1] & 0x07,
                length: 12 + length as u64,
            });
            at += 12 + length as usize;
        }
    }
    Ok(out)
}

/// The batch that holds `offset`.
pub fn batch_of(topic: &str, partition: i32, offset: i64) -> Result<Batch> {
    batches(topic, partition)?
        .into_iter()
        .find(|b| (b.base_offset..=b.last_offset).contains(&offset))
        .with_context(|| format!("no batch of {topic}/{partition} holds offset {offset}"))
}

fn write_at(file: &PathBuf, position: u64, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new().read(true).write(true).open(file)?;
    f.seek(SeekFrom::Start(position))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Overwrites the first bytes of a compressed batch's records (the compressed stream's own
/// header: gzip's magic, zstd's frame magic), so decompressing it fails.
pub fn corrupt_compressed_records(batch: &Batch) -> Result<()> {
    if batch.codec == 0 {
        bail!(
            "batch at {} is not compressed: nothing to corrupt that decompression checks",
            batch.base_offset
        );
    }
    write_at(&batch.file, batch.position + RECORDS_AT, &[0u8; 4])
}

/// Sets the batch's codec bits to `codec` (5 to 7: codecs no Kafka version defines, what a
/// codec added after this build looks like to it).
pub fn set_codec(batch: &Batch, codec: u8) -> Result<()> {
    let mut f = OpenOptions::new().read(true).open(&batch.file)?;
    f.seek(SeekFrom::Start(batch.position + ATTRIBUTES_AT))?;
    let mut attributes = [0u8; 2];
    f.read_exact(&mut attributes)?;
    attributes[1] = (attributes[1] & !0x07) | (codec & 0x07);
    write_at(&batch.file, batch.position + ATTRIBUTES_AT, &attributes)
}
