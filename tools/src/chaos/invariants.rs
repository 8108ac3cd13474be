//! The checks after a scenario, read from what a user would look at: the intents and
//! attempts in PostgreSQL, what the provider fake received, the committed offsets and the
//! dead-letter topic.
//!
//! (a) intents = distinct routed business keys, none lost, none extra;
//! (b) every intent terminal, `unknown`, or `retry_scheduled` with a due time;
//! (c) provider sends = `accepted` attempts + sends after `unknown`: per intent, no
//!     accepted attempt without a send, no send without an accepted or `unknown` attempt,
//!     and no second send unless an `unknown` attempt explains it;
//! (d) every attempt has a final outcome;
//! (e) committed offsets cover everything produced (lag 0); nothing valid dead-lettered, and
//!     every input the scenario made invalid dead-lettered once per source offset with
//!     its reason (whole, or past the dead-letter topic's limit as a prefix or headers
//!     only, with the original's size and digest);
//! (f) conflicts recorded = conflicting re-emissions produced;
//! (g) under a channel's `retry` policy, no intent rests in `unknown` while it has
//!     attempts left;
//! (h) the `unknown` attempts never decrease during the run ([`super::watch`]);
//! (i) where the scenario injects no fault that can lose an answer (a slow, rate-limited
//!     provider), no attempt is `unknown` at all: provider sends = accepted attempts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use super::plan::Plan;
use integration_tests::kafka::{committed_lag, read_all, Record};
use integration_tests::{moto, pg_connect, wait_for, TestEnv};

/// What a scenario's configuration promises beyond (a)-(f).
#[derive(Debug, Clone)]
pub struct Expect {
    /// `on_unknown` of each channel: `hold` or `retry`.
    pub on_unknown: Vec<(&'static str, &'static str)>,
    /// `max_attempts` of both channels.
    pub max_attempts: i64,
    /// No fault that can lose an answer: every attempt's outcome is observed (i).
    pub quiet_provider: bool,
    /// Inputs the scenario made invalid on purpose: each must be dead-lettered (e).
    pub refused: Vec<RefusedInput>,
}

/// An input produced to be refused, and what its dead letter must say.
#[derive(Debug, Clone)]
pub struct RefusedInput {
    /// Where it was produced (prefixed topic).
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// What was done to it (e.g. `nul:order.currency`), for the violation message.
    pub kind: String,
    /// The `herald-dlq-reason` its dead letter must carry.
    pub reason: &'static str,
    /// Its value's size and blake3 digest (hex).
    pub size: usize,
    pub blake3: String,
    /// Larger than the dead-letter topic takes: its dead letter must be a prefix or
    /// headers only.
    pub beyond_dead_letter_limit: bool,
}

impl Expect {
    pub fn policy(&self, channel: &str) -> &'static str {
        self.on_unknown
            .iter()
            .find(|(c, _)| *c == channel)
            .map_or("hold", |(_, p)| p)
    }
}

/// One scenario's figures and what it found wrong; printed as one line each.
pub struct Report {
    pub name: String,
    figures: Vec<(String, String)>,
    pub violations: Vec<String>,
}

impl Report {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            figures: Vec::new(),
            violations: Vec::new(),
        }
    }

    pub fn fig(&mut self, key: &str, value: impl Display) {
        self.figures.push((key.to_owned(), value.to_string()));
    }

    pub fn violation(&mut self, what: impl Into<String>) {
        self.violations.push(what.into());
    }

    pub fn line(&self) -> String {
        let figures: Vec<String> = self.figures.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}: {}", self.name, figures.join(" "))
    }
}

/// Waits (up to `timeout`) until the run is at rest: every expected intent exists, none is
/// pending, sending or waiting for a retry, the outbox is empty, no attempt is open, and
/// both consumer groups have committed everything. Returns whether it got there; the
/// invariants are checked either way and say what did not settle.
pub async fn settle(env: &TestEnv, plan: &Plan, timeout: Duration) -> Result<bool> {
    let expected = plan.expected_intents() as i64;
    let settled = wait_for("the run to settle", timeout, || async {
        let db = pg_connect(&env.db_url).await?;
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM notification_intents),
                        (SELECT count(*) FROM notification_intents
                          WHERE state IN ('pending', 'sending', 'retry_scheduled'))
                      + (SELECT count(*) FROM outbox)
                      + (SELECT count(*) FROM notification_attempts WHERE outcome = 'started')",
                &[],
            )
            .await?;
        let (intents, open): (i64, i64) = (row.get(0), row.get(1));
        Ok((intents >= expected && open == 0 && lag(env)? == 0).then_some(()))
    })
    .await;
    Ok(settled.is_ok())
}

/// What a run that did not settle left behind, for its violation line (CI keeps only the
/// printed output): the outbox rows still waiting, and each process's warnings and errors
/// by message, the most frequent first.
pub async fn unsettled(env: &TestEnv) -> Result<String> {
    let db = pg_connect(&env.db_url).await?;
    let outbox: i64 = db.query_one("SELECT count(*) FROM outbox", &[]).await?.get(0);
    let mut clues = vec![format!("outbox rows {outbox}")];
    let mut logs: Vec<_> = std::fs::read_dir(&env.dir)?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for path in logs {
        let mut by_message: BTreeMap<String, usize> = BTreeMap::new();
        // Line by line: a process that logged in a loop may have left gigabytes.
        for line in BufReader::new(std::fs::File::open(&path)?).lines() {
            let Ok(v) = serde_json::from_str::<Value>(&line?) else {
                continue;
            };
            let level = v["level"].as_str().unwrap_or_default();
            if level == "WARN" || level == "ERROR" {
                let message: String = v["message"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(120)
                    .collect();
                *by_message.entry(format!("{level} {message}")).or_default() += 1;
            }
        }
        let mut top: Vec<(String, usize)> = by_message.into_iter().collect();
        top.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let shown: Vec<String> = top.iter().take(4).map(|(m, n)| format!("{n}x {m}")).collect();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if !shown.is_empty() {
            clues.push(format!("{name}: {}", shown.join("; ")));
        }
    }
    Ok(clues.join(" | "))
}

/// Committed lag of the ingest group (order events, seller profiles) plus the delivery
/// group (deliveries).
fn lag(env: &TestEnv) -> Result<i64> {
    let ingest = committed_lag(
        &env.group("herald-ingest"),
        &[&env.topic("order-events"), &env.topic("seller-profiles")],
    )?;
    let delivery = committed_lag(&env.group("herald-delivery"), &[&env.topic("herald.deliveries")])?;
    Ok(ingest + delivery)
}

struct Intent {
    id: String,
    order: String,
    channel: String,
    state: String,
    due: bool,
    accepted: i64,
    unknown: i64,
    open: i64,
    after_unknown: i64,
    lease_expired: i64,
    attempts: i64,
    /// Attempts that could have reached the provider (not `not_sent`).
    tries: i64,
}

impl Intent {
    /// Terminal, `unknown` (an operator's to resolve), or waiting for a retry that is due.
    fn at_rest(&self) -> bool {
        match self.state.as_str() {
            "accepted" | "rejected" | "failed" | "suppressed" | "unknown" => true,
            "retry_scheduled" => self.due,
            _ => false,
        }
    }

    fn name(&self) -> String {
        format!("{} ({}/{}, {})", self.id, self.order, self.channel, self.state)
    }
}

/// Checks (a)–(g) and (i) and adds their figures and violations to `report`.
pub async fn check(env: &TestEnv, plan: &Plan, expect: &Expect, report: &mut Report) -> Result<()> {
    let db = pg_connect(&env.db_url).await?;
    let intents: Vec<Intent> = db
        .query(
            "SELECT i.id::text, i.order_id, i.channel, i.state, i.next_attempt_at IS NOT NULL,
                    count(a.id) FILTER (WHERE a.outcome = 'accepted'),
                    count(a.id) FILTER (WHERE a.outcome = 'unknown'),
                    count(a.id) FILTER (WHERE a.outcome = 'started' OR a.finished_at IS NULL),
                    count(a.id) FILTER (WHERE a.after_unknown),
                    count(a.id) FILTER (WHERE a.error_category = 'lease_expired'),
                    count(a.id),
                    count(a.id) FILTER (WHERE a.outcome <> 'not_sent')
               FROM notification_intents i LEFT JOIN notification_attempts a ON a.intent_id = i.id
              GROUP BY i.id, i.order_id, i.channel, i.state, i.next_attempt_at",
            &[],
        )
        .await?
        .iter()
        .map(|r| Intent {
            id: r.get(0),
            order: r.get(1),
            channel: r.get(2),
            state: r.get(3),
            due: r.get(4),
            accepted: r.get(5),
            unknown: r.get(6),
            open: r.get(7),
            after_unknown: r.get(8),
            lease_expired: r.get(9),
            attempts: r.get(10),
            tries: r.get(11),
        })
        .collect();

    // (a) One intent per routed business key.
    let by_key: BTreeMap<(&str, &str), &Intent> = intents
        .iter()
        .map(|i| ((i.order.as_str(), i.channel.as_str()), i))
        .collect();
    let lost: Vec<String> = plan
        .orders
        .iter()
        .flat_map(|o| super::plan::CHANNELS.iter().map(move |c| (o.as_str(), *c)))
        .filter(|k| !by_key.contains_key(k))
        .map(|(o, c)| format!("{o}/{c}"))
        .collect();
    let produced: BTreeSet<&str> = plan.orders.iter().map(String::as_str).collect();
    let extra: Vec<String> = intents
        .iter()
        .filter(|i| !produced.contains(i.order.as_str()))
        .map(Intent::name)
        .collect();
    report.fig(
        "intents",
        format!("{}/{}", intents.len() - extra.len(), plan.expected_intents()),
    );
    report.fig("lost", lost.len());
    flag(report, "(a) business keys without an intent (lost)", &lost);
    flag(report, "(a) intents of no produced order", &extra);

    // (b) Every intent at rest.
    let restless: Vec<String> = intents
        .iter()
        .filter(|i| !i.at_rest())
        .map(Intent::name)
        .collect();
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for i in &intents {
        *states.entry(i.state.as_str()).or_default() += 1;
    }
    let states: Vec<String> = states.iter().map(|(s, n)| format!("{s}:{n}")).collect();
    report.fig("states", states.join(","));
    flag(
        report,
        "(b) intents not terminal, unknown or due for a retry",
        &restless,
    );

    // (c) What the provider received, per business key.
    let sends = provider_sends(plan).await?;
    let (mut totals, mut unexplained, mut unbacked, mut unseen) =
        (SendCheck::default(), Vec::new(), Vec::new(), Vec::new());
    let mut total = 0;
    for ((order, channel), n) in &sends {
        total += n;
        if !by_key.contains_key(&(order.as_str(), channel.as_str())) {
            totals.unbacked += n;
            unbacked.push(format!("{order}/{channel}: {n} send(s) and no intent"));
        }
    }
    for i in &intents {
        let n = sends
            .get(&(i.order.clone(), i.channel.clone()))
            .copied()
            .unwrap_or(0);
        let c = SendCheck::of(n, i.accepted, i.unknown);
        let detail = format!(
            "{}: {n} send(s), attempts={} accepted={} unknown={} after_unknown={}",
            i.name(),
            i.attempts,
            i.accepted,
            i.unknown,
            i.after_unknown
        );
        for (count, list) in [
            (c.unexplained_duplicates, &mut unexplained),
            (c.unbacked, &mut unbacked),
            (c.unseen, &mut unseen),
        ] {
            if count > 0 {
                list.push(detail.clone());
            }
        }
        totals.add(&c);
    }
    let accepted: i64 = intents.iter().map(|i| i.accepted).sum();
    let unknown: i64 = intents.iter().map(|i| i.unknown).sum();
    report.fig("sends", total);
    report.fig("accepted", accepted);
    report.fig("unknown_attempts", unknown);
    report.fig(
        "lease_expired",
        intents.iter().map(|i| i.lease_expired).sum::<i64>(),
    );
    report.fig("unexplained_duplicate_sends", totals.unexplained_duplicates);
    report.fig("unbacked_sends", totals.unbacked);
    report.fig("accepted_unseen", totals.unseen);
    flag(
        report,
        "(c) duplicate sends no unknown attempt explains",
        &unexplained,
    );
    flag(
        report,
        "(c) sends without an accepted or unknown attempt",
        &unbacked,
    );
    flag(
        report,
        "(c) accepted attempts the provider never received",
        &unseen,
    );

    let outcomes: Vec<String> = db
        .query(
            "SELECT outcome || coalesce('/' || error_category, ''), count(*) FROM notification_attempts
              GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| format!("{}:{}", r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect();
    report.fig("attempts", outcomes.join(","));

    // (g) Under `retry`, `unknown` is only where the attempts ran out.
    let held: Vec<String> = intents
        .iter()
        .filter(|i| {
            i.state == "unknown" && expect.policy(&i.channel) == "retry" && i.tries < expect.max_attempts
        })
        .map(|i| format!("{}: {} of {} tries", i.name(), i.tries, expect.max_attempts))
        .collect();
    flag(
        report,
        "(g) intents left unknown under the retry policy with attempts left",
        &held,
    );

    // (i) Nothing lost an answer: every send is an accepted attempt.
    if expect.quiet_provider {
        let unobserved: Vec<String> = intents
            .iter()
            .filter(|i| i.unknown > 0 || i.lease_expired > 0)
            .map(Intent::name)
            .collect();
        flag(
            report,
            "(i) unknown attempts although no fault could lose an answer",
            &unobserved,
        );
        if total != accepted {
            report.violation(format!(
                "(i) {total} sends at the provider for {accepted} accepted attempts"
            ));
        }
    }
    let late = db
        .query_one(
            "SELECT count(*) FROM notification_attempts WHERE late_outcome IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, i64>(0);
    report.fig("late_outcomes", late);

    // (d) Every attempt finished.
    let open: Vec<String> = intents.iter().filter(|i| i.open > 0).map(Intent::name).collect();
    report.fig("open_attempts", intents.iter().map(|i| i.open).sum::<i64>());
    flag(report, "(d) intents with an attempt that never finished", &open);

    // (e) Lag 0, and nothing valid dead-lettered.
    let lag = lag(env)?;
    report.fig("lag", lag);
    if lag != 0 {
        report.violation(format!(
            "(e) committed offsets are {lag} behind what was produced"
        ));
    }
    let letters = read_all(&env.topic("herald.dead-letter"))?;
    let d = DeadLetterCheck::of(&letters, &expect.refused);
    report.fig("dead_letters", letters.len());
    if !expect.refused.is_empty() {
        report.fig(
            "refused_dead_lettered",
            format!(
                "{}/{}",
                expect.refused.len() - d.missing.len(),
                expect.refused.len()
            ),
        );
        let reasons: Vec<String> = d.by_reason.iter().map(|(r, n)| format!("{r}:{n}")).collect();
        report.fig("dlq_reasons", reasons.join(","));
        report.fig("dlq_cut", d.cut);
    }
    flag(report, "(e) valid input dead-lettered", &d.unexpected);
    flag(report, "(e) invalid input never dead-lettered", &d.missing);
    flag(report, "(e) dead letters with another reason", &d.wrong_reason);
    flag(
        report,
        "(e) dead letters that misstate the original value",
        &d.bad_payload,
    );

    // (f) Every conflicting re-emission recorded once, against its order's intents.
    let recorded: BTreeMap<String, i64> = db
        .query(
            "SELECT i.order_id, count(DISTINCT (c.source_partition, c.source_offset))
               FROM intent_conflicts c JOIN notification_intents i ON i.id = c.intent_id
              GROUP BY i.order_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut injected: BTreeMap<String, i64> = BTreeMap::new();
    for m in &plan.conflicts {
        *injected.entry(plan.orders[m.order].clone()).or_default() += 1;
    }
    let orders: BTreeSet<&String> = injected.keys().chain(recorded.keys()).collect();
    let mismatched: Vec<String> = orders
        .into_iter()
        .filter(|o| injected.get(*o) != recorded.get(*o))
        .map(|o| {
            format!(
                "{o}: injected {} recorded {}",
                injected.get(o).unwrap_or(&0),
                recorded.get(o).unwrap_or(&0)
            )
        })
        .collect();
    report.fig(
        "conflicts",
        format!("{}/{}", recorded.values().sum::<i64>(), plan.conflicts.len()),
    );
    flag(
        report,
        "(f) conflicts recorded differ from those injected",
        &mismatched,
    );
    Ok(())
}

/// The dead-letter topic against the inputs refused on purpose (invariant e), by source
/// (topic, partition, offset). A source dead-lettered twice (a batch replayed after its
/// dead letters were sent) counts once.
#[derive(Debug, Default)]
struct DeadLetterCheck {
    /// Dead letters of a source that was not refused on purpose: valid input.
    unexpected: Vec<String>,
    /// Refused inputs with no dead letter.
    missing: Vec<String>,
    wrong_reason: Vec<String>,
    /// Whole copies that differ from the original, or a prefix / headers-only letter whose
    /// size or digest headers do not match it, or a whole copy of a value the dead-letter
    /// topic cannot take.
    bad_payload: Vec<String>,
    by_reason: BTreeMap<String, usize>,
    /// Dead letters carrying a prefix or headers only.
    cut: usize,
}

impl DeadLetterCheck {
    fn of(letters: &[Record], refused: &[RefusedInput]) -> Self {
        use herald_kafka::headers::*;
        let mut c = Self::default();
        let mut by_source: BTreeMap<(String, i32, i64), &Record> = BTreeMap::new();
        for l in letters {
            let h = |n: &str| l.headers.get(n).cloned().unwrap_or_default();
            let source = (
                h(DLQ_SOURCE_TOPIC),
                h(DLQ_SOURCE_PARTITION).parse().unwrap_or(-1),
                h(DLQ_SOURCE_OFFSET).parse().unwrap_or(-1),
            );
            by_source.entry(source).or_insert(l);
        }
        let mut expected = BTreeSet::new();
        for r in refused {
            let source = (r.topic.clone(), r.partition, r.offset);
            let name = format!("{} at {}[{}]@{}", r.kind, r.topic, r.partition, r.offset);
            expected.insert(source.clone());
            let Some(l) = by_source.get(&source) else {
                c.missing.push(name);
                continue;
            };
            let h = |n: &str| l.headers.get(n).map(String::as_str);
            let reason = h(DLQ_REASON).unwrap_or("");
            *c.by_reason.entry(reason.to_owned()).or_default() += 1;
            if reason != r.reason {
                c.wrong_reason.push(format!(
                    "{name}: {reason:?} (detail {:?}), expected {}",
                    h(DLQ_DETAIL).unwrap_or(""),
                    r.reason
                ));
            }
            let value = l.value.as_deref().unwrap_or_default();
            let payload = match h(DLQ_PAYLOAD) {
                None if r.beyond_dead_letter_limit => Err(format!(
                    "a whole copy of {} bytes, more than the dead-letter topic takes",
                    r.size
                )),
                None if blake3::hash(value).to_hex().as_str() != r.blake3 => Err(format!(
                    "a whole copy that differs from the original ({} of {} bytes)",
                    value.len(),
                    r.size
                )),
                None => Ok(()),
                Some(kind) => {
                    c.cut += 1;
                    let size = r.size.to_string();
                    if h(DLQ_ORIGINAL_SIZE) != Some(size.as_str())
                        || h(DLQ_ORIGINAL_BLAKE3) != Some(r.blake3.as_str())
                    {
                        Err(format!(
                            "{kind}: size {:?} digest {:?}, the original has {size} bytes, {}",
                            h(DLQ_ORIGINAL_SIZE),
                            h(DLQ_ORIGINAL_BLAKE3),
                            r.blake3
                        ))
                    } else if !((kind == "prefix" && !value.is_empty() && value.len() < r.size)
                        || (kind == "omitted" && value.is_empty()))
                    {
                        Err(format!("{kind} with {} of {} bytes", value.len(), r.size))
                    } else {
                        Ok(())
                    }
                }
            };
            if let Err(e) = payload {
                c.bad_payload.push(format!("{name}: {e}"));
            }
        }
        for ((topic, partition, offset), l) in &by_source {
            if !expected.contains(&(topic.clone(), *partition, *offset)) {
                c.unexpected.push(format!(
                    "{topic}[{partition}]@{offset}: {:?}",
                    l.headers.get(DLQ_REASON)
                ));
            }
        }
        c
    }
}

/// How one business key's sends at the provider square with its attempts (invariant c).
#[derive(Debug, Default, PartialEq, Eq)]
struct SendCheck {
    /// Sends beyond the first that no `unknown` attempt explains (an `unknown` attempt may
    /// have reached the provider, so each explains at most one), or accepted twice.
    unexplained_duplicates: i64,
    /// Sends backed by neither an `accepted` nor an `unknown` attempt: a send recorded as
    /// retryable or rejected, or one with no attempt at all.
    unbacked: i64,
    /// `accepted` attempts the provider has no message for.
    unseen: i64,
}

impl SendCheck {
    fn of(sends: i64, accepted: i64, unknown: i64) -> Self {
        Self {
            unexplained_duplicates: (sends - 1 - unknown).max(accepted - 1).max(0),
            unbacked: (sends - accepted - unknown).max(0),
            unseen: (accepted - sends).max(0),
        }
    }

    fn add(&mut self, other: &Self) {
        self.unexplained_duplicates += other.unexplained_duplicates;
        self.unbacked += other.unbacked;
        self.unseen += other.unseen;
    }
}

/// Sends the provider fake received for this run, by (order, channel): e-mails by the
/// order id in their subject, SMS by the order id in their text.
async fn provider_sends(plan: &Plan) -> Result<BTreeMap<(String, String), i64>> {
    let (emails, sms) = moto::received().await?;
    let mut out = BTreeMap::new();
    for (channel, messages, field) in [("email", emails, "subject"), ("sms", sms, "message")] {
        for m in messages {
            if let Some(order) = m
                .get(field)
                .and_then(Value::as_str)
                .and_then(|t| order_in(t, &plan.tag))
            {
                *out.entry((order, channel.to_owned())).or_default() += 1;
            }
        }
    }
    Ok(out)
}

/// The order id (`TAG-N`) in a rendered text, if the text is one of this run's.
fn order_in(text: &str, tag: &str) -> Option<String> {
    let start = text.find(tag)?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

/// Adds a violation naming (up to 20 of) the intents involved.
fn flag(report: &mut Report, what: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    let shown: Vec<&str> = items.iter().take(20).map(String::as_str).collect();
    let more = items.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    report.violation(format!("{what}: {}: {}{tail}", items.len(), shown.join("; ")));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{order_in, DeadLetterCheck, RefusedInput, SendCheck};
    use integration_tests::kafka::Record;

    fn refused(offset: i64, value: &[u8], beyond: bool) -> RefusedInput {
        RefusedInput {
            topic: "t".into(),
            partition: 0,
            offset,
            kind: format!("case-{offset}"),
            reason: "invalid_value",
            size: value.len(),
            blake3: blake3::hash(value).to_hex().to_string(),
            beyond_dead_letter_limit: beyond,
        }
    }

    fn letter(offset: i64, reason: &str, value: &[u8], cut: Option<(&str, &[u8])>) -> Record {
        let mut headers: BTreeMap<String, String> = [
            ("herald-dlq-reason", reason.to_owned()),
            ("herald-dlq-source-topic", "t".to_owned()),
            ("herald-dlq-source-partition", "0".to_owned()),
            ("herald-dlq-source-offset", offset.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let Some((kind, original)) = cut {
            headers.insert("herald-dlq-payload".into(), kind.into());
            headers.insert("herald-dlq-original-size".into(), original.len().to_string());
            headers.insert(
                "herald-dlq-original-blake3".into(),
                blake3::hash(original).to_hex().to_string(),
            );
        }
        Record {
            partition: 0,
            offset: 0,
            key: None,
            value: Some(value.to_vec()),
            headers,
        }
    }

    #[test]
    fn every_refused_input_needs_its_own_dead_letter_with_its_reason_and_a_true_payload() {
        let big = vec![b'x'; 100];
        let expected = [refused(1, b"bad", false), refused(2, &big, true)];
        let good = [
            letter(1, "invalid_value", b"bad", None),
            letter(1, "invalid_value", b"bad", None),
            letter(2, "invalid_value", &big[..10], Some(("prefix", &big))),
        ];
        let c = DeadLetterCheck::of(&good, &expected);
        assert!(
            c.missing.is_empty()
                && c.unexpected.is_empty()
                && c.wrong_reason.is_empty()
                && c.bad_payload.is_empty(),
            "{c:?}"
        );
        assert_eq!(c.cut, 1);
        let omitted = [
            letter(1, "invalid_value", b"bad", None),
            letter(2, "invalid_value", b"", Some(("omitted", &big))),
        ];
        assert!(DeadLetterCheck::of(&omitted, &expected).bad_payload.is_empty());

        let c = DeadLetterCheck::of(&good[..1], &expected);
        assert_eq!(
            c.missing,
            ["case-2 at t[0]@2"],
            "a refused input not dead-lettered"
        );
        let c = DeadLetterCheck::of(
            &[good[0].clone(), good[2].clone(), letter(3, "not_json", b"", None)],
            &expected,
        );
        assert_eq!(c.unexpected.len(), 1, "a valid input dead-lettered: {c:?}");
        let c = DeadLetterCheck::of(
            &[letter(1, "store_rejected", b"bad", None), good[2].clone()],
            &expected,
        );
        assert_eq!(c.wrong_reason.len(), 1, "another reason: {c:?}");
        for wrong in [
            letter(1, "invalid_value", b"bat", None),
            letter(2, "invalid_value", &big, None),
            letter(2, "invalid_value", &big[..10], Some(("prefix", &big[..99]))),
            letter(2, "invalid_value", &big, Some(("prefix", &big))),
            letter(2, "invalid_value", b"x", Some(("omitted", &big))),
        ] {
            let other = if wrong.headers["herald-dlq-source-offset"] == "1" {
                2
            } else {
                0
            };
            let c = DeadLetterCheck::of(&[wrong.clone(), good[other].clone()], &expected);
            assert_eq!(c.bad_payload.len(), 1, "{wrong:?}: {c:?}");
        }
    }

    fn check(sends: i64, accepted: i64, unknown: i64) -> (i64, i64, i64) {
        let c = SendCheck::of(sends, accepted, unknown);
        (c.unexplained_duplicates, c.unbacked, c.unseen)
    }

    #[test]
    fn sends_square_with_attempts_only_when_unknown_attempts_explain_the_extra_ones() {
        assert_eq!(check(1, 1, 0), (0, 0, 0), "sent once, accepted");
        assert_eq!(check(0, 0, 1), (0, 0, 0), "unknown that never arrived");
        assert_eq!(check(2, 1, 1), (0, 0, 0), "a resend after an unknown");
        assert_eq!(check(3, 1, 2), (0, 0, 0), "two unknowns, both arrived");
        assert_eq!(check(2, 1, 0), (1, 1, 0), "a second send no attempt explains");
        assert_eq!(check(3, 1, 1), (1, 1, 0), "one more than the unknowns explain");
        assert_eq!(check(2, 2, 0), (1, 0, 0), "accepted twice is a duplicate");
        assert_eq!(
            check(1, 0, 0),
            (0, 1, 0),
            "a send recorded as retryable or rejected"
        );
        assert_eq!(
            check(0, 1, 0),
            (0, 0, 1),
            "accepted, and the provider has nothing"
        );
    }

    #[test]
    fn an_order_id_is_found_in_the_rendered_subject_and_sms_text() {
        assert_eq!(
            order_in("New order cab12-17 on acme", "cab12").as_deref(),
            Some("cab12-17")
        );
        assert_eq!(
            order_in("New order cab12-3: 3 item(s)", "cab12").as_deref(),
            Some("cab12-3")
        );
        assert_eq!(order_in("New order 8042 on acme", "cab12"), None);
    }
}
