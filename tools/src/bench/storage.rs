//! Storage per intent: what PostgreSQL keeps for each intent once it is ingested and sent,
//! as table + indexes + TOAST (`pg_total_relation_size`; `notification_attempts` summed over
//! its partitions with `pg_partition_tree`) divided by the table's rows.
//!
//! One run: order events with 30% duplicates and 2% conflicting re-emissions, each with a
//! `traceparent` header, consumed by `herald run --roles ingest,relay,deliver` and sent to
//! the provider stand-in, one attempt each. Sizes are read twice: after `VACUUM (ANALYZE)`
//! ("settled": the files as the run left them, with the space the updates' dead row
//! versions freed, which later rows reuse) and after `VACUUM (FULL, ANALYZE)` ("compact":
//! live rows only). Then the real retention pass (`herald retention run`, bodies of terminal
//! intents purged at `payload_body_days = 0`) and the compact sizes again; where the binary
//! has no such command, the after-figures are absent, never emulated. Last, the same
//! attempt rows copied into the attempt's shape before V7 (with its intent's trace context,
//! as claims wrote it) and into today's shape, measured side by side.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use tokio_postgres::Client;

use super::delivery::UNTHROTTLED;
use super::ingest::{self, Workload};
use integration_tests::kafka::committed_lag;
use integration_tests::{herald_bin, wait_for, workspace_root, EnvOptions, TestEnv};

/// The tables Herald writes per intent, by what one row of each is. An intent is two rows
/// since V13: its frozen contents and its state.
pub const TABLES: [(&str, &str); 5] = [
    ("intent", "intent_contents"),
    ("intent state", "intent_states"),
    ("payload", "notification_payloads"),
    ("attempt", "notification_attempts"),
    ("conflict", "intent_conflicts"),
];

/// The design's month: intents, attempts per intent, and the naive design's copies of the
/// rendered payload (one per attempt, up to 4) of 6 KB.
pub const MONTH_INTENTS: f64 = 8_000_000.0;
pub const ATTEMPTS_PER_INTENT: f64 = 1.15;
pub const NAIVE_BYTES: f64 = 6_000.0 * 4.0 * MONTH_INTENTS;
/// The goal for one attempt row with its share of the indexes.
pub const ATTEMPT_GOAL: f64 = 300.0;

/// What one measurement run renders.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub name: &'static str,
    /// Line items per order event; > 0 publishes the bench's e-mail revision, whose
    /// rendered payload (subject, text and HTML) is about 6 KB with 6 items.
    pub items: usize,
}

pub const SAMPLE: Variant = Variant {
    name: "sample templates",
    items: 0,
};
pub const EMAIL_6KB: Variant = Variant {
    name: "6 KB e-mail",
    items: 6,
};

/// One table's bytes on disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableBytes {
    pub rows: i64,
    /// Heap, free space map and visibility map (`pg_table_size` less the TOAST).
    pub heap: i64,
    pub indexes: i64,
    /// TOAST table and its index.
    pub toast: i64,
}

impl TableBytes {
    pub fn total(&self) -> i64 {
        self.heap + self.indexes + self.toast
    }

    fn per(&self, bytes: i64) -> f64 {
        if self.rows == 0 {
            f64::NAN
        } else {
            bytes as f64 / self.rows as f64
        }
    }

    pub fn per_row(&self) -> f64 {
        self.per(self.total())
    }

    pub fn to_json(&self) -> Value {
        json!({"rows": self.rows, "heap": self.heap, "indexes": self.indexes, "toast": self.toast,
               "total": self.total(), "per_row": self.per_row(), "heap_per_row": self.per(self.heap),
               "indexes_per_row": self.per(self.indexes), "toast_per_row": self.per(self.toast)})
    }

    fn cells(&self) -> String {
        format!(
            "{} | {:.0} | {:.0} | {:.0} | **{:.0}**",
            self.rows,
            self.per(self.heap),
            self.per(self.indexes),
            self.per(self.toast),
            self.per_row()
        )
    }
}

/// How the sizes are settled before they are read.
#[derive(Debug, Clone, Copy)]
pub enum Vacuum {
    /// `VACUUM (ANALYZE)`: dead row versions become free space; files keep their size.
    Analyze,
    /// `VACUUM (FULL, ANALYZE)`: tables and indexes rewritten with the live rows only.
    Full,
}

/// Bytes of `table`: a plain table, or every relation of a partitioned one's tree
/// (`pg_partition_tree` lists nothing for a plain table, hence the union).
pub async fn table_bytes(db: &Client, table: &str) -> Result<TableBytes> {
    let sql = format!(
        "SELECT (SELECT count(*) FROM {table}),
                coalesce(sum(pg_table_size(c.oid) - coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)), 0)::int8,
                coalesce(sum(pg_indexes_size(c.oid)), 0)::int8,
                coalesce(sum(pg_total_relation_size(nullif(c.reltoastrelid, 0))), 0)::int8
           FROM (SELECT '{table}'::regclass AS relid UNION SELECT relid FROM pg_partition_tree('{table}'::regclass)) t
           JOIN pg_class c ON c.oid = t.relid"
    );
    let r = db
        .query_one(&sql, &[])
        .await
        .with_context(|| format!("sizing {table}"))?;
    Ok(TableBytes {
        rows: r.get(0),
        heap: r.get(1),
        indexes: r.get(2),
        toast: r.get(3),
    })
}

/// Vacuums and sizes each of `tables`.
pub async fn measure(db: &Client, tables: &[&str], vacuum: Vacuum) -> Result<BTreeMap<String, TableBytes>> {
    let mut out = BTreeMap::new();
    for t in tables {
        let v = match vacuum {
            Vacuum::Analyze => "VACUUM (ANALYZE)",
            Vacuum::Full => "VACUUM (FULL, ANALYZE)",
        };
        db.batch_execute(&format!("{v} {t}"))
            .await
            .with_context(|| format!("{v} {t}"))?;
        out.insert((*t).to_owned(), table_bytes(db, t).await?);
    }
    Ok(out)
}

/// The payloads of one channel: rows, rendered bytes (subject + text + HTML) and bytes
/// as stored (`pg_column_size` of the row, after compression).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelPayloads {
    pub rows: i64,
    pub rendered_mean: f64,
    pub stored_sum: i64,
}

/// The payloads per channel.
async fn channel_payloads(db: &Client) -> Result<BTreeMap<String, ChannelPayloads>> {
    let rows = db
        .query(
            "SELECT channel, count(*),
                    coalesce(avg(coalesce(octet_length(subject), 0) + coalesce(octet_length(body_text), 0)
                                 + coalesce(octet_length(body_html), 0)), 0)::float8,
                    sum(pg_column_size(p.*))::int8
               FROM notification_payloads p GROUP BY channel",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                ChannelPayloads {
                    rows: r.get(1),
                    rendered_mean: r.get(2),
                    stored_sum: r.get(3),
                },
            )
        })
        .collect())
}

/// Bytes per e-mail payload row: the heap and TOAST apportioned by each channel's stored
/// row bytes, the index (one digest per row) evenly.
pub fn email_payload_row(t: &TableBytes, by_channel: &BTreeMap<String, ChannelPayloads>) -> f64 {
    let all: i64 = by_channel.values().map(|c| c.stored_sum).sum();
    let Some(email) = by_channel.get("email").filter(|c| c.rows > 0 && all > 0) else {
        return f64::NAN;
    };
    let share = email.stored_sum as f64 / all as f64;
    (t.heap + t.toast) as f64 * share / email.rows as f64 + t.indexes as f64 / t.rows as f64
}

/// What `herald retention run` did, or why it did not run.
#[derive(Debug, Clone)]
pub enum Retention {
    /// This binary has no `retention` command (it is on another branch).
    Absent(String),
    /// Its `--json` output (or its text, when that is not JSON).
    Ran(Value),
}

/// `herald retention run --json` with `payload_body_days` 0 on the env's database: every
/// terminal intent's payload body is due.
pub fn run_retention(env: &TestEnv) -> Result<Retention> {
    let out = Command::new(herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .args(["retention", "run", "--json"])
        .env("HERALD_RETENTION__PAYLOAD_BODY_DAYS", "0")
        .env("HERALD_LOG__LEVEL", "warn")
        .output()
        .context("running herald retention run")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("unrecognized subcommand") {
            return Ok(Retention::Absent(format!(
                "`herald retention run` is not in this binary ({}): the after-retention figures are absent \
                 until the retention branch is merged",
                stderr.lines().next().unwrap_or_default().trim()
            )));
        }
        bail!("herald retention run failed ({}):\n{stdout}{stderr}", out.status);
    }
    Ok(Retention::Ran(
        serde_json::from_str(stdout.trim()).unwrap_or_else(|_| Value::String(stdout.into_owned())),
    ))
}

/// The attempt rows copied, in the order they were started, into the shape before V7
/// (the claim copied the intent's `trace_context` into each attempt) and into today's.
async fn attempt_shapes(db: &Client) -> Result<(TableBytes, TableBytes)> {
    let still_there = db
        .query_opt(
            "SELECT 1 FROM information_schema.columns
              WHERE table_name = 'notification_attempts' AND column_name = 'trace_context'",
            &[],
        )
        .await?
        .is_some();
    ensure!(
        !still_there,
        "notification_attempts still has trace_context: V7 not applied"
    );
    db.batch_execute(
        "CREATE TABLE bench_attempts_before_v7 (LIKE notification_attempts INCLUDING ALL);
         ALTER TABLE bench_attempts_before_v7 ADD COLUMN trace_context text;
         CREATE TABLE bench_attempts_after_v7 (LIKE notification_attempts INCLUDING ALL);
         INSERT INTO bench_attempts_before_v7
              SELECT a.*, i.trace_context FROM notification_attempts a
                JOIN notification_intents i ON i.id = a.intent_id ORDER BY a.started_at, a.id;
         INSERT INTO bench_attempts_after_v7
              SELECT * FROM notification_attempts ORDER BY started_at, id;",
    )
    .await
    .context("copying the attempts into their two shapes")?;
    let m = measure(
        db,
        &["bench_attempts_before_v7", "bench_attempts_after_v7"],
        Vacuum::Analyze,
    )
    .await?;
    Ok((m["bench_attempts_before_v7"], m["bench_attempts_after_v7"]))
}

/// Mean stored bytes of the attempt row's variable columns (`pg_column_size`).
async fn attempt_columns(db: &Client) -> Result<Value> {
    let r = db
        .query_one(
            "SELECT avg(pg_column_size(a.*))::float8, avg(pg_column_size(a.worker))::float8,
                    avg(coalesce(pg_column_size(a.provider_message_id), 0))::float8,
                    avg(pg_column_size(a.outcome))::float8,
                    (SELECT avg(coalesce(pg_column_size(trace_context), 0))::float8 FROM notification_intents)
               FROM notification_attempts a",
            &[],
        )
        .await?;
    Ok(json!({"row": r.get::<_, f64>(0), "worker": r.get::<_, f64>(1),
              "provider_message_id": r.get::<_, f64>(2), "outcome": r.get::<_, f64>(3),
              "intent_trace_context": r.get::<_, f64>(4)}))
}

/// Everything one run measured.
pub struct Report {
    pub variant: Variant,
    pub workload: Workload,
    pub settled: BTreeMap<String, TableBytes>,
    pub compact: BTreeMap<String, TableBytes>,
    pub channels: BTreeMap<String, ChannelPayloads>,
    /// Distinct digests the intents reference, and payload rows no intent references.
    pub referenced_digests: i64,
    pub unreferenced_payloads: i64,
    pub attempt_columns: Value,
    pub before_v7: TableBytes,
    pub after_v7: TableBytes,
    pub retention: Retention,
    pub after_retention: Option<(BTreeMap<String, TableBytes>, BTreeMap<String, ChannelPayloads>)>,
    pub purged: i64,
}

/// Publishes the bench's e-mail revision (order items table) as `order_created` email/en
/// revision `bench-6kb`, active.
fn publish_email_revision(env: &TestEnv) -> Result<()> {
    let dir = workspace_root().join("bench/templates");
    let (text, html) = (
        dir.join("order_created.email.en.txt"),
        dir.join("order_created.email.en.html"),
    );
    env.herald(&[
        "template",
        "publish",
        "--template",
        "order_created",
        "--channel",
        "email",
        "--locale",
        "en",
        "--revision",
        "bench-6kb",
        "--subject",
        "New order {{ order_id }} on {{ marketplace_id }}: {{ order.item_count }} items, {{ order.total }} {{ order.currency }}",
        "--body-file",
        text.to_str().context("path")?,
        "--html-file",
        html.to_str().context("path")?,
        "--activate",
    ])?;
    Ok(())
}

/// One measurement run of `events` order events, sent through the stand-in at `endpoint`.
pub async fn run(endpoint: &str, events: usize, variant: Variant) -> Result<Report> {
    let env = TestEnv::with_options(
        "bench_storage",
        "",
        EnvOptions {
            aws_endpoint: Some(endpoint.to_owned()),
            ..EnvOptions::default()
        },
    )
    .await?;
    let report = measure_run(&env, events, variant).await;
    env.cleanup().await;
    report
}

async fn measure_run(env: &TestEnv, events: usize, variant: Variant) -> Result<Report> {
    if variant.items > 0 {
        publish_email_revision(env)?;
    }
    let w = Workload::new(events).with_items(variant.items).traced();
    let mut vars = UNTHROTTLED.to_vec();
    vars.push(("HERALD_DELIVERY__MAX_IN_FLIGHT", "256"));
    let mut herald = env.spawn_roles("ingest,relay,deliver", "storage", &vars)?;
    // The sellers first, applied before any order arrives: ingest reads both topics at
    // once, and an order read before its seller's profile is suppressed (no profile).
    ingest::fill_sellers(env).await?;
    env.wait_count(
        "storage: seller profiles applied",
        "SELECT count(*) FROM sellers",
        ingest::SELLERS as i64,
        Duration::from_secs(300),
    )
    .await?;
    ingest::fill_events(env, &w).await?;
    let group = env.group("herald-ingest");
    let topics = [env.topic("order-events"), env.topic("seller-profiles")];
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    wait_for("storage: ingest lag 0", Duration::from_secs(900), || async {
        Ok((committed_lag(&group, &refs)? == 0).then_some(()))
    })
    .await?;
    let suppressed = env
        .count("SELECT count(*) FROM notification_intents WHERE state = 'suppressed'")
        .await?;
    ensure!(
        suppressed == 0,
        "storage: {suppressed} intents suppressed (every seller is opted in)"
    );
    env.wait_count(
        "storage: every intent accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        w.intents(),
        Duration::from_secs(900),
    )
    .await?;
    herald.terminate(Duration::from_secs(60)).await?;

    let db = &env.db;
    ensure!(
        env.count("SELECT count(*) FROM notification_intents").await? == w.intents(),
        "storage: expected {} intents",
        w.intents()
    );
    let conflicts = env.count("SELECT count(*) FROM intent_conflicts").await?;
    ensure!(
        conflicts > 0,
        "storage: the workload's conflicting re-emissions recorded no conflict"
    );
    let payloads = env.count("SELECT count(*) FROM notification_payloads").await?;
    let referenced_digests = env
        .count("SELECT count(DISTINCT payload_digest) FROM notification_intents")
        .await?;
    let unreferenced_payloads = env
        .count(
            "SELECT count(*) FROM notification_payloads p
              WHERE NOT EXISTS (SELECT 1 FROM notification_intents i WHERE i.payload_digest = p.digest)",
        )
        .await?;
    // Stored once per distinct content: every payload row is a digest an intent references,
    // or the content of a conflicting re-emission (rendered before the conflict was known).
    ensure!(
        payloads == referenced_digests + unreferenced_payloads && unreferenced_payloads <= conflicts,
        "storage: {payloads} payload rows, {referenced_digests} distinct digests referenced, \
         {unreferenced_payloads} unreferenced, {conflicts} conflicts"
    );
    let channels = channel_payloads(db).await?;
    if variant.items > 0 {
        let mean = channels.get("email").map_or(0.0, |c| c.rendered_mean);
        ensure!(
            (5_000.0..=7_000.0).contains(&mean),
            "storage: the e-mail payload renders to {mean:.0} bytes, not about 6 KB"
        );
    }
    let tables: Vec<&str> = TABLES.iter().map(|(_, t)| *t).collect();
    let settled = measure(db, &tables, Vacuum::Analyze).await?;
    let compact = measure(db, &tables, Vacuum::Full).await?;
    let attempt_columns = attempt_columns(db).await?;
    let (before_v7, after_v7) = attempt_shapes(db).await?;

    let retention = run_retention(env)?;
    let (after_retention, purged) = match &retention {
        Retention::Absent(_) => (None, 0),
        Retention::Ran(_) => {
            let purged = env
                .count("SELECT count(*) FROM notification_payloads WHERE body_purged_at IS NOT NULL")
                .await?;
            let m = measure(db, &tables, Vacuum::Full).await?;
            (Some((m, channel_payloads(db).await?)), purged)
        }
    };
    Ok(Report {
        variant,
        workload: w,
        settled,
        compact,
        channels,
        referenced_digests,
        unreferenced_payloads,
        attempt_columns,
        before_v7,
        after_v7,
        retention,
        after_retention,
        purged,
    })
}

/// Bytes per intent of a month: an intent, its payloads, its attempts and its share of the
/// conflicts, with the bytes per row of each.
#[derive(Debug, Clone, Copy)]
pub struct Projection {
    pub intent: f64,
    pub payloads_per_intent: f64,
    pub payload: f64,
    pub attempts_per_intent: f64,
    pub attempt: f64,
    pub conflicts_per_intent: f64,
    pub conflict: f64,
}

impl Projection {
    pub fn per_intent(&self) -> f64 {
        self.intent
            + self.payloads_per_intent * self.payload
            + self.attempts_per_intent * self.attempt
            + self.conflicts_per_intent * self.conflict
    }

    pub fn month_bytes(&self) -> f64 {
        self.per_intent() * MONTH_INTENTS
    }

    pub fn to_json(&self) -> Value {
        json!({"intent": self.intent, "payloads_per_intent": self.payloads_per_intent, "payload": self.payload,
               "attempts_per_intent": self.attempts_per_intent, "attempt": self.attempt,
               "conflicts_per_intent": self.conflicts_per_intent, "conflict": self.conflict,
               "per_intent": self.per_intent(), "month_bytes": self.month_bytes()})
    }
}

impl Report {
    fn intents(&self) -> f64 {
        self.workload.intents() as f64
    }

    /// The month projected from `sizes` (one of this run's measurements), every intent
    /// carrying an e-mail payload as this run rendered it.
    pub fn projection(
        &self,
        sizes: &BTreeMap<String, TableBytes>,
        channels: &BTreeMap<String, ChannelPayloads>,
    ) -> Projection {
        let t = |name: &str| sizes[name];
        let payloads = t("notification_payloads");
        Projection {
            intent: t("intent_contents").per_row() + t("intent_states").per_row(),
            payloads_per_intent: payloads.rows as f64 / self.intents(),
            payload: email_payload_row(&payloads, channels),
            attempts_per_intent: ATTEMPTS_PER_INTENT,
            attempt: t("notification_attempts").per_row(),
            conflicts_per_intent: t("intent_conflicts").rows as f64 / self.intents(),
            conflict: t("intent_conflicts").per_row(),
        }
    }

    pub fn projections(&self) -> (Projection, Projection, Option<Projection>) {
        (
            self.projection(&self.settled, &self.channels),
            self.projection(&self.compact, &self.channels),
            self.after_retention
                .as_ref()
                .map(|(sizes, channels)| self.projection(sizes, channels)),
        )
    }

    pub fn to_json(&self) -> Value {
        let sizes = |m: &BTreeMap<String, TableBytes>| -> Value {
            m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()
        };
        let (settled, compact, after) = self.projections();
        let proj = Projection::to_json;
        let channels = |m: &BTreeMap<String, ChannelPayloads>| -> Value {
            m.iter()
                .map(|(k, c)| {
                    (
                        k.clone(),
                        json!({"rows": c.rows, "rendered_mean": c.rendered_mean, "stored_sum": c.stored_sum}),
                    )
                })
                .collect()
        };
        json!({
            "variant": self.variant.name,
            "events": self.workload.events, "intents": self.workload.intents(),
            "duplicates": self.workload.duplicates, "conflicting_reemissions": self.workload.conflicts,
            "items_per_order": self.variant.items,
            "settled_vacuum_analyze": sizes(&self.settled),
            "compact_vacuum_full": sizes(&self.compact),
            "payloads_by_channel": channels(&self.channels),
            "payload_rows": self.compact["notification_payloads"].rows,
            "distinct_digests_referenced": self.referenced_digests,
            "unreferenced_payloads": self.unreferenced_payloads,
            "payloads_per_intent": self.compact["notification_payloads"].rows as f64 / self.intents(),
            "attempt_columns_mean_bytes": self.attempt_columns,
            "attempt_before_v7": self.before_v7.to_json(),
            "attempt_after_v7": self.after_v7.to_json(),
            "retention": match &self.retention {
                Retention::Absent(note) => json!({"ran": false, "note": note}),
                Retention::Ran(out) => json!({"ran": true, "output": out, "payloads_purged": self.purged}),
            },
            "after_retention_vacuum_full": self.after_retention.as_ref().map(|(m, c)| json!({"sizes": sizes(m), "payloads_by_channel": channels(c)})),
            "projection": {
                "month_intents": MONTH_INTENTS, "attempts_per_intent": ATTEMPTS_PER_INTENT,
                "naive_bytes": NAIVE_BYTES,
                "settled": proj(&settled), "compact": proj(&compact),
                "after_retention_compact": after.as_ref().map(proj),
            },
        })
    }

    /// The Markdown section of the bench's report.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "### Storage per intent: {} ({} events, {} intents, {} conflict rows; e-mail payload {:.0} bytes rendered)\n\n\
             | table | rows | heap B/row | index B/row | TOAST B/row | total B/row, after VACUUM (ANALYZE) | after VACUUM (FULL, ANALYZE) |\n\
             |---|---|---|---|---|---|---|\n",
            self.variant.name,
            self.workload.events,
            self.workload.intents(),
            self.compact["intent_conflicts"].rows,
            self.channels.get("email").map_or(0.0, |c| c.rendered_mean),
        );
        for (what, table) in TABLES {
            md += &format!(
                "| {what} (`{table}`) | {} | {:.0} |\n",
                self.settled[table].cells(),
                self.compact[table].per_row()
            );
        }
        md += &format!(
            "\nPayload rows {} for {} distinct digests referenced ({} unreferenced, from conflicting re-emissions); \
             {:.3} payloads per intent.\n",
            self.compact["notification_payloads"].rows,
            self.referenced_digests,
            self.unreferenced_payloads,
            self.compact["notification_payloads"].rows as f64 / self.intents()
        );
        md += &format!(
            "\nAttempt row before V7 (with the intent's trace context) {:.0} B (heap {:.0}, indexes {:.0}), after V7 {:.0} B \
             (heap {:.0}, indexes {:.0}): goal {ATTEMPT_GOAL:.0} B {}.\n",
            self.before_v7.per_row(),
            self.before_v7.per(self.before_v7.heap),
            self.before_v7.per(self.before_v7.indexes),
            self.after_v7.per_row(),
            self.after_v7.per(self.after_v7.heap),
            self.after_v7.per(self.after_v7.indexes),
            if self.after_v7.per_row() < ATTEMPT_GOAL { "met" } else { "**not met**" }
        );
        let (settled, compact, after) = self.projections();
        let gb = |p: &Projection| p.month_bytes() / 1e9;
        md += &format!(
            "\nA month of {MONTH_INTENTS:.0} intents at {ATTEMPTS_PER_INTENT} attempts: {:.1} GB settled, {:.1} GB compact \
             ({:.0} and {:.0} B per intent); naive {:.0} GB.",
            gb(&settled),
            gb(&compact),
            settled.per_intent(),
            compact.per_intent(),
            NAIVE_BYTES / 1e9
        );
        md += &match (&self.retention, after) {
            (Retention::Ran(_), Some(a)) => format!(
                " After the retention pass ({} payload bodies purged): {:.1} GB compact ({:.0} B per intent).\n",
                self.purged,
                gb(&a),
                a.per_intent()
            ),
            (Retention::Absent(note), _) => format!(" After the retention pass: absent. {note}.\n"),
            _ => "\n".into(),
        };
        md
    }
}
