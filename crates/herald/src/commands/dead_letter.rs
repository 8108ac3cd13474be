//! `herald dead-letter list|replay`: read the dead-letter topic, and produce chosen records
//! back to their source topic once the cause is fixed (a template published, a producer
//! bug corrected). Replay writes only to the topics Herald's ingest consumes; a record
//! naming another source, or holding only a prefix of its value, is refused and listed. Replays keep key, value and headers; ingest converges them like any
//! duplicate, so replaying twice is harmless.

use std::time::Duration;

use crate::config::Config;
use anyhow::Context;
use clap::Subcommand;
use herald_kafka::inspect::{
    self, DeadLetterRecord, ReadBound, RecordRef, ReplaySelection, DEAD_LETTER_LIMIT, DEAD_LETTER_MAX_BYTES,
};

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Subcommand)]
pub enum DeadLetterCommand {
    /// List the dead-letter records (reason, detail, source); payloads are not shown.
    List {
        /// Only records with this reason (e.g. template_missing).
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Produce records back to their source topic: give `--record P:O` (repeatable),
    /// `--reason R`, or `--all`.
    Replay {
        /// Dead-letter partition and offset, as `P:O`.
        #[arg(long = "record", value_parser = parse_record)]
        records: Vec<(i32, i64)>,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        all: bool,
        /// Show what would be replayed; produce nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn parse_record(s: &str) -> Result<(i32, i64), String> {
    let (p, o) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected PARTITION:OFFSET"))?;
    Ok((
        p.parse().map_err(|_| format!("{p:?} is not a partition"))?,
        o.parse().map_err(|_| format!("{o:?} is not an offset"))?,
    ))
}

async fn read(config: &Config) -> anyhow::Result<(String, Vec<DeadLetterRecord>)> {
    let topic = config.topic(&config.kafka.topics.dead_letter);
    let (settings, t) = (config.kafka_settings(), topic.clone());
    let records = tokio::task::spawn_blocking(move || {
        inspect::read_dead_letters(&settings, &t, ReadBound::ALL, TIMEOUT)
    })
    .await?
    .with_context(|| format!("reading {topic}"))?;
    if records.1 {
        tracing::warn!(
            records = records.0.len(),
            "{topic} holds more than one read takes ({DEAD_LETTER_LIMIT} records, {} MiB): these are the first",
            DEAD_LETTER_MAX_BYTES >> 20
        );
    }
    let records = records.0;
    Ok((topic, records))
}

pub async fn run(config: &Config, command: DeadLetterCommand) -> anyhow::Result<()> {
    match command {
        DeadLetterCommand::List { reason, json } => {
            let (topic, mut records) = read(config).await?;
            if let Some(r) = &reason {
                records.retain(|x| &x.reason == r);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&records)?);
            } else {
                print_table(&topic, &records);
            }
            Ok(())
        }
        DeadLetterCommand::Replay {
            records,
            reason,
            all,
            dry_run,
        } => {
            let sel = ReplaySelection {
                records: records
                    .into_iter()
                    .map(|(partition, offset)| RecordRef { partition, offset })
                    .collect(),
                reason,
                all,
            };
            sel.validate()?;
            let (topic, all_records) = read(config).await?;
            let chosen: Vec<DeadLetterRecord> = all_records.into_iter().filter(|r| sel.picks(r)).collect();
            print_table(&topic, &chosen);
            if dry_run {
                println!("dry run: {} record(s) would be replayed", chosen.len());
                return Ok(());
            }
            let ingest_topics = config.ingest_topics();
            let ingest_topics: Vec<&str> = ingest_topics.iter().map(String::as_str).collect();
            let report = inspect::replay(&config.kafka_settings(), &topic, &ingest_topics, &chosen).await?;
            for r in &report.refused {
                println!("refused {}:{}: {}", r.partition, r.offset, r.refusal);
            }
            println!(
                "replayed {} record(s) to their source topics; refused {} (replay writes only to {})",
                report.replayed,
                report.refused.len(),
                ingest_topics.join(", ")
            );
            anyhow::ensure!(
                report.refused.is_empty(),
                "{} record(s) not replayed (listed above)",
                report.refused.len()
            );
            Ok(())
        }
    }
}

fn print_table(topic: &str, records: &[DeadLetterRecord]) {
    println!("{topic}: {} record(s)", records.len());
    println!(
        "{:>4}:{:<8}  {:<20}  {:<34}  {:<24}  DETAIL",
        "PART", "OFFSET", "REASON", "SOURCE", "KEY"
    );
    for r in records {
        let source = match (&r.source_topic, r.source_partition, r.source_offset) {
            (Some(t), Some(p), Some(o)) => format!("{t}/{p}@{o}"),
            _ => "-".into(),
        };
        let mut detail = r.detail.replace(['\n', '\r'], " ");
        if detail.len() > 100 {
            let mut cut = 100;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
            detail.push('…');
        }
        println!(
            "{:>4}:{:<8}  {:<20}  {:<34}  {:<24}  {}",
            r.partition,
            r.offset,
            r.reason,
            source,
            r.key.as_deref().unwrap_or("-"),
            detail
        );
    }
}
