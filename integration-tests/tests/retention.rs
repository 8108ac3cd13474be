//! Retention against the real PostgreSQL: a pass removes exactly what aged (whole old
//! partitions, old bodies, old terminal intents with their rows) and keeps everything
//! else, above all the body of a payload a non-terminal intent still needs; `--dry-run`
//! changes nothing and counts what the pass then removes; attempts stranded in the
//! default partition are moved into their month when it is created, by the schedule, by
//! `herald migrate` and at start-up, which never fails because of it; and only the owner
//! can do the DDL.

use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Datelike, Months, NaiveDate, Utc};
use integration_tests::http::scrape;
use integration_tests::{pg_connect, wait_for, TestEnv};
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// The clocks of these tests: attempts 6 months, bodies 10 days, intents 30 days; no pass
/// inside `herald run` unless a test asks for one.
const RETENTION: &str = "[retention]
attempt_months = 6
payload_body_days = 10
intent_days = 30
interval_secs = 0
batch_size = 2
";

fn month(offset: i32) -> NaiveDate {
    let today = Utc::now().date_naive();
    let first = NaiveDate::from_ymd_opt(today.year(), today.month(), 1).unwrap();
    if offset >= 0 {
        first + Months::new(offset as u32)
    } else {
        first - Months::new(offset.unsigned_abs())
    }
}

fn partition(m: NaiveDate) -> String {
    format!("notification_attempts_{:04}_{:02}", m.year(), m.month())
}

/// Noon on the 15th of `m`: inside the month in any time zone.
fn mid(m: NaiveDate) -> DateTime<Utc> {
    m.with_day(15).unwrap().and_hms_opt(12, 0, 0).unwrap().and_utc()
}

async fn create_partition(db: &Client, m: NaiveDate) -> Result<()> {
    let next = m + Months::new(1);
    db.batch_execute(&format!(
        "CREATE TABLE {} PARTITION OF notification_attempts FOR VALUES FROM ('{m}') TO ('{next}')",
        partition(m)
    ))
    .await?;
    Ok(())
}

async fn insert_attempt(db: &Client, intent: Uuid, no: i32, started_at: DateTime<Utc>) -> Result<()> {
    db.execute(
        "INSERT INTO notification_attempts (id, intent_id, attempt_no, outcome, worker, started_at)
         VALUES ($1, $2, $3, 'accepted', 'retention-test', $4)",
        &[&Uuid::now_v7(), &intent, &no, &started_at],
    )
    .await?;
    Ok(())
}

async fn insert_payload(db: &Client, digest: &str, created_at: DateTime<Utc>) -> Result<()> {
    db.execute(
        "INSERT INTO notification_payloads
            (digest, channel, destination, locale, consent, template, template_revision, subject, body_text, body_html, created_at)
         VALUES ($1, 'email', 'seller@example.com', 'en', 'granted', 'order_created', '1', 'Subject', 'Body', '<p>Body</p>', $2)",
        &[&digest, &created_at],
    )
    .await?;
    Ok(())
}

/// An intent created at `created` (its id a UUIDv7 of that instant) and last updated at
/// `updated`.
async fn insert_intent(
    db: &Client,
    key: &str,
    state: &str,
    digest: &str,
    created: DateTime<Utc>,
    updated: DateTime<Utc>,
) -> Result<Uuid> {
    let id = uuid::Builder::from_unix_timestamp_millis(created.timestamp_millis() as u64, &rand_bytes())
        .into_uuid();
    insert_intent_with_id(db, id, key, state, digest, created, updated).await
}

fn rand_bytes() -> [u8; 10] {
    let r = Uuid::new_v4();
    r.as_bytes()[..10].try_into().unwrap()
}

async fn insert_intent_with_id(
    db: &Client,
    id: Uuid,
    key: &str,
    state: &str,
    digest: &str,
    created: DateTime<Utc>,
    updated: DateTime<Utc>,
) -> Result<Uuid> {
    let consent = if state == "suppressed" {
        "opted_out"
    } else {
        "granted"
    };
    db.execute(
        "INSERT INTO notification_intents
            (id, marketplace_id, order_id, event_kind, channel, idempotency_key, request_fingerprint, seller_id,
             template, template_revision, payload_digest, consent, state, event_id, occurred_at, source_topic,
             source_partition, source_offset, created_at, updated_at)
         VALUES ($1, 'acme', $2, 'order.created', 'email', $2, 'fp', 'seller-1', 'order_created', '1', $3, $4, $5,
                 $2, $6, 'order-events', 0, 0, $6, $7)",
        &[&id, &key, &digest, &consent, &state, &created, &updated],
    )
    .await
    .with_context(|| format!("intent {key}"))?;
    Ok(id)
}

/// Everything a pass could change, as text: row counts of every table, purged bodies,
/// the partitions and which rows each holds.
async fn snapshot(db: &Client) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (what, sql) in [
        ("intents", "SELECT count(*)::text FROM notification_intents"),
        ("payloads", "SELECT count(*)::text FROM notification_payloads"),
        (
            "bodies purged",
            "SELECT count(*)::text FROM notification_payloads WHERE body_purged_at IS NOT NULL OR body_text IS NULL",
        ),
        ("conflicts", "SELECT count(*)::text FROM intent_conflicts"),
        ("resolutions", "SELECT count(*)::text FROM intent_resolutions"),
        ("outbox", "SELECT count(*)::text FROM outbox"),
        (
            "attempts by partition",
            "SELECT COALESCE(string_agg(p || ':' || n, ',' ORDER BY p), '')
               FROM (SELECT tableoid::regclass::text p, count(*) n FROM notification_attempts GROUP BY 1) s",
        ),
        (
            "partitions",
            "SELECT string_agg(c.relname, ',' ORDER BY c.relname) FROM pg_inherits i
               JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'notification_attempts'::regclass",
        ),
    ] {
        let v: String = db.query_one(sql, &[]).await?.get(0);
        out.push((what.to_owned(), v));
    }
    Ok(out)
}

fn json(out: &str) -> Result<Value> {
    serde_json::from_str(out).with_context(|| format!("not JSON: {out}"))
}

async fn body_of(db: &Client, digest: &str) -> Result<(Option<String>, Option<String>, bool)> {
    let r = db
        .query_one(
            "SELECT body_text, destination, body_purged_at IS NOT NULL FROM notification_payloads WHERE digest = $1",
            &[&digest],
        )
        .await?;
    Ok((r.get(0), r.get(1), r.get(2)))
}

async fn exists(db: &Client, sql: &str, id: &(dyn tokio_postgres::types::ToSql + Sync)) -> Result<bool> {
    Ok(db
        .query_one(&format!("SELECT EXISTS ({sql})"), &[id])
        .await?
        .get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_removes_exactly_what_aged_and_never_a_body_a_live_intent_needs() -> Result<()> {
    let env = TestEnv::new("retention_clocks", RETENTION).await?;
    let db = &env.db;
    let now = Utc::now();
    let days = |n: i64| now - chrono::Duration::days(n);

    // Attempts: partitions 9 and 7 months back end before the 6-month cutoff (dropped);
    // 5 months back does not (kept). A row 12 months back sits in the default partition
    // (no partition for it): deleted, not given a partition.
    for m in [-9, -7, -5] {
        create_partition(db, month(m)).await?;
        insert_attempt(db, Uuid::now_v7(), 1, mid(month(m))).await?;
    }
    insert_attempt(db, Uuid::now_v7(), 1, mid(month(-12))).await?;

    // Payloads and intents (bodies: 10 days, intents: 30 days).
    for (d, age) in [
        ("pa", 60),
        ("pb", 60),
        ("pc", 60),
        ("pd", 5),
        ("pe", 60),
        ("pg", 60),
        ("ph", 5),
        ("pk", 60),
        ("pl", 60),
        ("plf", 60),
    ] {
        insert_payload(db, d, days(age)).await?;
    }
    // A: old, accepted, with a conflict, a resolution and two attempts: all deleted, and
    // its payload, which nothing else references.
    let a = insert_intent(db, "a", "accepted", "pa", days(60), days(60)).await?;
    db.execute(
        "INSERT INTO intent_conflicts (intent_id, existing_fingerprint, offending_fingerprint, offending_event_id,
                                       offending_event, source_topic, source_partition, source_offset)
         VALUES ($1, 'fp', 'fp2', 'evt', '{}', 'order-events', 0, 1)",
        &[&a],
    )
    .await?;
    db.execute(
        "INSERT INTO intent_resolutions (intent_id, resolved_as, reason, operator) VALUES ($1, 'accepted', 'seen', 'op')",
        &[&a],
    )
    .await?;
    insert_attempt(db, a, 1, now).await?;
    insert_attempt(db, a, 2, now).await?;
    // B1 (old, accepted) and B2 (old, unknown: may be resolved as retry, sent again) share
    // payload pb: B1 goes, B2 stays, and so do pb and its body.
    let b1 = insert_intent(db, "b1", "accepted", "pb", days(60), days(60)).await?;
    let b2 = insert_intent(db, "b2", "unknown", "pb", days(60), days(60)).await?;
    // C: recent and accepted, on an old payload: the body goes, the intent stays.
    let c = insert_intent(db, "c", "accepted", "pc", days(5), days(5)).await?;
    // D: recent and pending: nothing happens.
    let d = insert_intent(db, "d", "pending", "pd", days(5), days(5)).await?;
    // E: created long ago, but updated recently: stays; its payload's body goes.
    let e = insert_intent(db, "e", "failed", "pe", days(60), days(5)).await?;
    // G1, G2: old, terminal, sharing pg: both go, then pg; G1 still had an outbox row.
    let g1 = insert_intent(db, "g1", "rejected", "pg", days(60), days(60)).await?;
    let g2 = insert_intent(db, "g2", "suppressed", "pg", days(60), days(60)).await?;
    db.execute("INSERT INTO outbox (intent_id) VALUES ($1)", &[&g1])
        .await?;
    // H: its row says old, but its id was generated now: created within the cutoff by
    // the primary key's measure, never deleted.
    let h = insert_intent_with_id(db, Uuid::now_v7(), "h", "accepted", "ph", days(60), days(60)).await?;
    // K, L: old and terminal, once held for their seller's profile. K's hold expired (its
    // payload is its hold's fallback, pk); L's was released (payload pl, fallback plf).
    // Both go with their holds, and so do pk, pl and plf, which nothing else references.
    let k = insert_intent(db, "k", "suppressed", "pk", days(60), days(60)).await?;
    let l = insert_intent(db, "l", "accepted", "pl", days(60), days(60)).await?;
    for (intent, fallback, decision, version) in
        [(k, "pk", "expired", None), (l, "plf", "released", Some(1i64))]
    {
        db.execute(
            "INSERT INTO intent_holds (intent_id, marketplace_id, seller_id, fallback_digest, held_at, hold_until,
                                       decision, decided_at, profile_version)
             VALUES ($1, 'acme', 'seller-1', $2, $3, $3, $4, $3, $5)",
            &[&intent, &fallback, &days(60), &decision, &version],
        )
        .await?;
    }
    db.batch_execute("ANALYZE").await?;

    // --dry-run changes nothing, and says what the pass then removes.
    let before = snapshot(db).await?;
    let preview = json(&env.herald(&["retention", "run", "--dry-run", "--json"])?)?;
    assert_eq!(snapshot(db).await?, before, "--dry-run changed something");
    let text = env.herald(&["retention", "run", "--dry-run"])?;
    assert!(text.contains("would drop partition"), "{text}");
    assert_eq!(snapshot(db).await?, before);

    let done = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(
        done["removed"], preview["removed"],
        "dry run {preview:#}\npass {done:#}"
    );
    assert_eq!(done["failures"], Value::Array(vec![]));
    let removed = &done["removed"];
    assert_eq!(
        removed["partitions"],
        serde_json::json!([partition(month(-9)), partition(month(-7))])
    );
    assert_eq!(removed["default_attempts"], 1);
    assert_eq!(removed["payload_bodies"], 7, "pa, pc, pe, pg, pk, pl, plf");
    assert_eq!(
        removed["intents"],
        serde_json::json!({"intents": 6, "conflicts": 1, "resolutions": 1, "holds": 2, "outbox": 1, "attempts": 2, "payloads": 5})
    );

    // What is left is exactly what must be.
    let partitions = &snapshot(db).await?[7].1;
    assert!(!partitions.contains(&partition(month(-9))) && !partitions.contains(&partition(month(-7))));
    assert!(partitions.contains(&partition(month(-5))), "{partitions}");
    assert_eq!(
        env.count("SELECT count(*) FROM ONLY notification_attempts_default")
            .await?,
        0
    );
    assert_eq!(env.count("SELECT count(*) FROM intent_holds").await?, 0);
    for gone in [a, b1, g1, g2, k, l] {
        assert!(!exists(db, "SELECT 1 FROM notification_intents WHERE id = $1", &gone).await?);
    }
    for kept in [b2, c, d, e, h] {
        assert!(exists(db, "SELECT 1 FROM notification_intents WHERE id = $1", &kept).await?);
    }
    for gone in ["pa", "pg", "pk", "pl", "plf"] {
        assert!(!exists(db, "SELECT 1 FROM notification_payloads WHERE digest = $1", &gone).await?);
    }
    for purged in ["pc", "pe"] {
        assert_eq!(body_of(db, purged).await?, (None, None, true), "{purged}");
    }
    for whole in ["pb", "pd", "ph"] {
        assert_eq!(
            body_of(db, whole).await?,
            (Some("Body".into()), Some("seller@example.com".into()), false),
            "{whole}"
        );
    }
    // What a purge keeps: the digest, template, revision, locale and consent.
    let kept: (String, String, String, String) = {
        let r = db
            .query_one(
                "SELECT template, template_revision, locale, consent FROM notification_payloads WHERE digest = 'pc'",
                &[],
            )
            .await?;
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!(
        kept,
        ("order_created".into(), "1".into(), "en".into(), "granted".into())
    );

    // The canary: pb is kept by the guard alone. It is a purge candidate by age...
    let candidate = db
        .query_one(
            "SELECT body_purged_at IS NULL AND created_at < now() - interval '10 days'
               FROM notification_payloads WHERE digest = 'pb'",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    assert!(
        candidate,
        "pb must be old enough to purge, or this proves nothing"
    );
    // ...and a second pass keeps it while B2 is unknown...
    let again = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(again["removed"]["payload_bodies"], 0, "{again:#}");
    assert!(!body_of(db, "pb").await?.2);
    // ...and purges it once B2 is settled: nothing else changed.
    db.execute(
        "UPDATE notification_intents SET state = 'accepted', updated_at = now() WHERE id = $1",
        &[&b2],
    )
    .await?;
    let settled = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(settled["removed"]["payload_bodies"], 1, "{settled:#}");
    assert_eq!(body_of(db, "pb").await?, (None, None, true));
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_purged_payload_gets_its_body_back_for_the_new_intent() -> Result<()> {
    // Ingest shares payloads by digest: an order arriving after its payload's body was
    // purged (same content, so same digest) must not be sent with an empty body.
    let env = TestEnv::new("retention_reuse", RETENTION).await?;
    let ingest = env.spawn_ingest("ingest", &[])?;
    let seller = integration_tests::samples::UniqueSeller::new();
    integration_tests::seed_orders(&env, &seller, &["7001"]).await?;
    env.wait_count("intents", "SELECT count(*) FROM notification_intents", 2, WAIT)
        .await?;
    // Settle them, age everything, purge.
    env.db
        .batch_execute(
            "UPDATE notification_intents SET state = CASE WHEN state = 'suppressed' THEN state ELSE 'accepted' END;
             UPDATE notification_payloads SET created_at = now() - interval '60 days';",
        )
        .await?;
    let done = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(done["removed"]["payload_bodies"], 2, "{done:#}");
    let db = &env.db;
    let digests = |sql: &'static str| async move {
        let mut v: Vec<String> = db.query(sql, &[]).await?.iter().map(|r| r.get(0)).collect();
        v.sort();
        anyhow::Ok(v)
    };
    let purged = digests("SELECT digest FROM notification_payloads WHERE body_purged_at IS NOT NULL").await?;
    assert_eq!(purged.len(), 2);
    // The same order again under a new business key (another event kind is not routed;
    // delete the intents instead, as intent retention would).
    env.db
        .batch_execute(
            "DELETE FROM outbox; DELETE FROM notification_attempts; DELETE FROM notification_intents;",
        )
        .await?;
    let p = integration_tests::kafka::producer()?;
    let value = integration_tests::samples::order_event(
        "evt-7001-again",
        "order.created",
        "acme",
        "7001",
        "seller-1",
        "12.00",
    );
    integration_tests::kafka::produce(&p, &env.topic("order-events"), Some(b"7001"), Some(&value), &[])
        .await?;
    env.wait_count(
        "the intents again, each on a payload with its body back",
        "SELECT count(*) FROM notification_intents i JOIN notification_payloads p ON p.digest = i.payload_digest
          WHERE p.body_purged_at IS NULL",
        2,
        WAIT,
    )
    .await?;
    // The very payloads that were purged (same content, same digest), not new ones.
    assert_eq!(
        digests("SELECT payload_digest FROM notification_intents").await?,
        purged
    );
    assert_eq!(env.count("SELECT count(*) FROM notification_payloads").await?, 2);
    assert_eq!(
        env.count(
            "SELECT count(*) FROM notification_payloads p JOIN notification_intents i ON i.payload_digest = p.digest
              WHERE i.state = 'pending' AND p.body_text IS NOT NULL AND p.destination IS NOT NULL"
        )
        .await?,
        env.count("SELECT count(*) FROM notification_intents WHERE state = 'pending'").await?
    );
    drop(ingest);
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_stranded_in_the_default_partition_move_into_their_month() -> Result<()> {
    let env = TestEnv::new("retention_default", RETENTION).await?;
    let db = &env.db;
    // Next month's partition is missing (as if the daemon had run past the months
    // created ahead): its attempts land in the default partition.
    let next = month(1);
    db.batch_execute(&format!("DROP TABLE {}", partition(next)))
        .await?;
    for n in 1..=3 {
        insert_attempt(db, Uuid::now_v7(), n, mid(next)).await?;
    }
    assert_eq!(
        env.count("SELECT count(*) FROM notification_attempts WHERE tableoid = 'notification_attempts_default'::regclass")
            .await?,
        3
    );

    // The gauge says so (a process without start-up migration nor retention pass).
    let herald = env.spawn_roles(
        "relay",
        "gauge",
        &[("HERALD_DATABASE__MIGRATE_ON_START", "false")],
    )?;
    let admin = herald.admin_addr(WAIT).await?;
    wait_for("the default-partition gauge", WAIT, || async {
        let text = scrape(&admin).await?;
        Ok(text
            .lines()
            .any(|l| l == "herald_attempts_default_partition_rows 3")
            .then_some(()))
    })
    .await?;
    drop(herald);

    // So does the dry run, which moves nothing.
    let preview = json(&env.herald(&["retention", "run", "--dry-run", "--json"])?)?;
    assert_eq!(
        preview["partitions_created"],
        serde_json::json!([partition(next)])
    );
    assert_eq!(preview["rows_moved"], 3);
    assert_eq!(
        env.count("SELECT count(*) FROM ONLY notification_attempts_default")
            .await?,
        3
    );

    // `herald migrate` (what start-up runs) creates the partition and moves the rows.
    let out = env.herald(&["migrate"])?;
    assert!(
        out.contains(&format!(
            "moved 3 attempt rows from the default partition into {}",
            partition(next)
        )),
        "{out}"
    );
    let homes: Vec<String> = db
        .query(
            "SELECT DISTINCT tableoid::regclass::text FROM notification_attempts WHERE started_at = $1",
            &[&mid(next)],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(homes, vec![partition(next)]);
    assert_eq!(
        env.count("SELECT count(*) FROM ONLY notification_attempts_default")
            .await?,
        0
    );
    // The default partition is attached again, as the default.
    let attached: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                             WHERE i.inhparent = 'notification_attempts'::regclass
                               AND c.relname = 'notification_attempts_default' AND c.relpartbound IS NOT NULL
                               AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')",
            &[],
        )
        .await?
        .get(0);
    assert!(attached);

    // Start-up with migrate_on_start: stranded rows of another month are moved too...
    let later = month(2);
    insert_attempt(db, Uuid::now_v7(), 1, mid(later)).await?;
    let mut herald = env.spawn_roles("relay", "startup", &[])?;
    herald
        .wait_log("herald started", WAIT, |l| l.contains("herald started"))
        .await?;
    assert_eq!(
        env.count(&format!("SELECT count(*) FROM {}", partition(later)))
            .await?,
        1
    );
    herald.terminate(WAIT).await?;

    // ...and when the upkeep cannot run (its lock is held), start-up goes on without it.
    let holder = pg_connect(&env.db_url).await?;
    holder
        .batch_execute("BEGIN; LOCK TABLE notification_attempts_default IN ACCESS EXCLUSIVE MODE")
        .await?;
    let mut herald = env.spawn_roles("relay", "blocked", &[])?;
    herald
        .wait_log("herald started despite the failed upkeep", WAIT, |l| {
            l.contains("herald started")
        })
        .await?;
    assert!(
        herald
            .log()
            .contains("attempt partition upkeep failed at start-up"),
        "{}",
        herald.log()
    );
    assert!(herald.is_running());
    holder.batch_execute("ROLLBACK").await?;
    herald.terminate(WAIT).await?;
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_runs_the_ddl_and_a_refused_pass_keeps_the_daemon_running() -> Result<()> {
    let env = TestEnv::new("retention_roles", RETENTION).await?;
    let role = format!("herald_rt_{}", &Uuid::new_v4().simple().to_string()[..8]);
    env.db.batch_execute(&format!("CREATE ROLE {role} LOGIN")).await?;
    let out = std::process::Command::new(integration_tests::herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env("HERALD_DATABASE__RUNTIME_ROLE", &role)
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runtime_url = env
        .db_url
        .replacen("postgres://herald@", &format!("postgres://{role}@"), 1);
    // A month whose partition must be created; and one to drop.
    let next = month(1);
    env.db
        .batch_execute(&format!("DROP TABLE {}", partition(next)))
        .await?;
    create_partition(&env.db, month(-9)).await?;

    // As the runtime role alone: refused, and the command says so and fails.
    let as_runtime = |args: &[&str], owner: Option<&str>| -> Result<std::process::Output> {
        let mut cmd = std::process::Command::new(integration_tests::herald_bin());
        cmd.arg("--config")
            .arg(&env.config_path)
            .args(args)
            .env("HERALD_DATABASE__URL", &runtime_url);
        if let Some(o) = owner {
            cmd.env("HERALD_DATABASE__OWNER_URL", o);
        }
        Ok(cmd.output()?)
    };
    let refused = as_runtime(&["retention", "run"], None)?;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("must be owner") || stderr.contains("permission denied"),
        "{stderr}"
    );
    assert!(!env
        .db
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&partition(next)])
        .await?
        .get::<_, bool>(0));

    // The daemon as the runtime role: the pass is refused, logged and counted; it runs on.
    let herald = env.spawn_roles(
        "relay",
        "runtime",
        &[
            ("HERALD_DATABASE__URL", runtime_url.as_str()),
            ("HERALD_DATABASE__MIGRATE_ON_START", "false"),
            ("HERALD_RETENTION__INTERVAL_SECS", "60"),
        ],
    )?;
    let admin = herald.admin_addr(WAIT).await?;
    wait_for("the refused upkeep counted", WAIT, || async {
        let text = scrape(&admin).await?;
        Ok(text
            .lines()
            .any(|l| l == r#"herald_retention_failures_total{step="partition_upkeep"} 1"#)
            .then_some(()))
    })
    .await?;
    herald
        .wait_log("the refusal logged", WAIT, |l| {
            l.contains("retention step failed")
        })
        .await?;
    let mut herald = herald;
    assert!(herald.is_running());
    drop(herald);

    // With the owner configured, the same command does it.
    let ok = as_runtime(&["retention", "run", "--json"], Some(&env.db_url))?;
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let done = json(&String::from_utf8_lossy(&ok.stdout))?;
    assert!(done["partitions_created"]
        .as_array()
        .unwrap()
        .contains(&Value::String(partition(next))));
    assert_eq!(
        done["removed"]["partitions"],
        serde_json::json!([partition(month(-9))])
    );
    env.db.batch_execute(&format!("DROP OWNED BY {role}")).await?;
    env.cleanup().await;
    let admin = pg_connect(integration_tests::PG_ADMIN_URL).await?;
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}

/// An ingest reusing an old payload and a purge of that payload's body, at the same moment:
/// the ingest transaction has converged a new `pending` intent on the payload and not yet
/// committed when the pass runs, so the guard cannot see that intent. The purge takes its
/// candidates `FOR UPDATE SKIP LOCKED`: ingest's payload insert (`DO UPDATE`) locks the row
/// it reuses, and any intent insert takes `FOR KEY SHARE` on its payload through the
/// foreign key (shown by a second payload, referenced by an intent written by hand), so
/// both are passed over and keep their bodies. The canary: once the new intents are final,
/// the same pass purges both, so the zeros before are the locks and the guard at work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_racing_an_ingest_that_reuses_the_payload_keeps_its_body() -> Result<()> {
    use herald_core::{Channel, ConsentDecision, OrderEvent, Payload};
    use herald_store::ingest::SourceRef;
    use herald_store::{Convergence, IngestTx, NewIntent};
    use integration_tests::samples::order_event;

    let env = TestEnv::new("retention_race", RETENTION).await?;
    let db = &env.db;
    let store = env.store(2)?;
    let payload = Payload {
        channel: Channel::Email,
        destination: Some("seller@example.com".into()),
        locale: "en".into(),
        consent: ConsentDecision::Granted,
        template: "order_created".into(),
        template_revision: "1".into(),
        subject: Some("Your shop's weekly digest".into()),
        body_text: "Same content for every order".into(),
        body_html: None,
    };
    let digest = payload.digest();
    let event = |order: &str| {
        OrderEvent::decode(
            &order_event(
                &format!("evt-{order}"),
                "order.created",
                "acme",
                order,
                "seller-1",
                "1.00",
            ),
            65536,
        )
    };
    let source = |offset| SourceRef {
        topic: "order-events".into(),
        partition: 0,
        offset,
    };
    // An old, accepted intent on the payload; the payload 60 days old (bodies: 10 days).
    let old = event("r-1")?;
    {
        let mut conn = store.conn().await?;
        let tx = IngestTx::begin(&mut conn).await?;
        tx.converge(&[NewIntent::new(
            &old,
            Channel::Email,
            payload.clone(),
            None,
            source(1),
        )])
        .await?;
        tx.commit().await?;
    }
    db.execute("UPDATE notification_intents SET state = 'accepted'", &[])
        .await?;
    db.execute(
        "UPDATE notification_payloads SET created_at = now() - interval '60 days' WHERE digest = $1",
        &[&digest],
    )
    .await?;
    // A second payload as old, its intent accepted too.
    insert_payload(db, "by-hand", Utc::now() - chrono::Duration::days(60)).await?;
    insert_intent(db, "by-hand-old", "accepted", "by-hand", Utc::now(), Utc::now()).await?;

    // The ingest, converged and not committed.
    let new = event("r-2")?;
    let mut conn = store.conn().await?;
    let ingest = IngestTx::begin(&mut conn).await?;
    let converged = ingest
        .converge(&[NewIntent::new(
            &new,
            Channel::Email,
            payload.clone(),
            None,
            source(2),
        )])
        .await?;
    assert!(
        matches!(converged[0], Convergence::Created { .. }),
        "{converged:?}"
    );
    // A pending intent on the second payload, written by hand in an open transaction.
    let by_hand = pg_connect(&env.db_url).await?;
    by_hand.batch_execute("BEGIN").await?;
    insert_intent(
        &by_hand,
        "by-hand-new",
        "pending",
        "by-hand",
        Utc::now(),
        Utc::now(),
    )
    .await?;

    let pass = json(&env.herald(&["retention", "run", "--json"])?)?;
    ingest.commit().await?;
    by_hand.batch_execute("COMMIT").await?;
    assert_eq!(pass["removed"]["payload_bodies"], 0, "both locked: {pass:#}");
    // Committed and pending: now the guard keeps them.
    let pass = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(
        pass["removed"]["payload_bodies"], 0,
        "both referenced by pending intents: {pass:#}"
    );
    assert_eq!(
        body_of(db, &digest).await?,
        (
            Some("Same content for every order".into()),
            Some("seller@example.com".into()),
            false
        ),
        "the reused payload keeps its body for the new pending intent"
    );
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM notification_intents WHERE state = 'pending' AND payload_digest = '{digest}'"
        ))
        .await?,
        1
    );
    assert!(!body_of(db, "by-hand").await?.2);
    // The canary: the new intents final, the same pass purges both bodies.
    db.execute("UPDATE notification_intents SET state = 'accepted'", &[])
        .await?;
    let pass = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(pass["removed"]["payload_bodies"], 2, "{pass:#}");
    assert_eq!(body_of(db, &digest).await?, (None, None, true));
    assert_eq!(body_of(db, "by-hand").await?, (None, None, true));
    env.cleanup().await;
    Ok(())
}

/// (text, bool, bool) rows of `sql`.
async fn triples(db: &Client, sql: &str) -> Result<Vec<(String, bool, bool)>> {
    Ok(db
        .query(sql, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// Evidence documents hold personal data (issue 43): the offending event of a conflict, the
/// offending request of a reused key and the body of a refused queue message are purged
/// after their windows while their rows stay; HTTP ingest's expired keys are deleted by the
/// pass even with no listener to sweep them. Canary: the same rows inside their windows are
/// kept whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_documents_are_purged_after_their_windows_and_their_rows_stay() -> Result<()> {
    let env = TestEnv::new(
        "retention_evidence",
        "[retention]\nconflict_document_days = 20\nreject_body_days = 15\ninterval_secs = 0\nbatch_size = 2\n",
    )
    .await?;
    let db = &env.db;
    let now = Utc::now();
    let days = |n: i64| now - chrono::Duration::days(n);
    insert_payload(db, "pz", days(1)).await?;
    let intent = insert_intent(db, "z", "accepted", "pz", days(1), days(1)).await?;
    // An accepted intent whose payload's body goes now (payload_body_days = 90): a
    // complaint about its destination after the purge still suppresses it.
    insert_payload(db, "pold", days(100)).await?;
    let old = insert_intent(db, "old", "accepted", "pold", days(100), days(100)).await?;
    insert_attempt(db, old, 1, days(100)).await?;
    // Conflicts 30 and 10 days old, about seller@personal.example.
    for (offset, age) in [(1i64, 30), (2, 10), (3, 40)] {
        db.execute(
            "INSERT INTO intent_conflicts (intent_id, existing_fingerprint, offending_fingerprint, offending_event_id,
                                           offending_event, source_topic, source_partition, source_offset, detected_at)
             VALUES ($1, 'fp', $2, 'evt', '{\"seller\": \"seller@personal.example\"}', 'order-events', 0, $3, $4)",
            &[&intent, &format!("fp-{offset}"), &offset, &days(age)],
        )
        .await?;
    }
    // HTTP keys: one live with an old and a new mismatch, one expired with its mismatch.
    for (key, expires) in [("live", now + chrono::Duration::days(3)), ("gone", days(1))] {
        db.execute(
            "INSERT INTO http_requests (idempotency_key, request_fingerprint, received_at, expires_at)
             VALUES ($1, 'rf', $2, $3)",
            &[&key, &days(30), &expires],
        )
        .await?;
    }
    for (key, fp, age) in [
        ("live", "m-old", 30),
        ("live", "m-new", 2),
        ("gone", "m-gone", 30),
    ] {
        db.execute(
            "INSERT INTO http_request_mismatches (idempotency_key, stored_fingerprint, offending_fingerprint,
                                                  offending_request, detected_at)
             VALUES ($1, 'rf', $2, '{\"email\": \"seller@personal.example\"}', $3)",
            &[&key, &fp, &days(age)],
        )
        .await?;
    }
    // Refused queue messages 20 and 5 days old.
    for (id, age) in [("old", 20), ("new", 5)] {
        db.execute(
            "INSERT INTO provider_event_rejects (source, message_id, reason, body_prefix, body_size, received_at)
             VALUES ('ses_events', $1, 'not authenticated: a test', '{\"to\": \"seller@personal.example\"}', 40, $2)",
            &[&id, &days(age)],
        )
        .await?;
    }
    let preview = json(&env.herald(&["retention", "run", "--dry-run", "--json"])?)?;
    let done = json(&env.herald(&["retention", "run", "--json"])?)?;
    assert_eq!(
        done["removed"], preview["removed"],
        "dry run {preview:#}\npass {done:#}"
    );
    assert_eq!(done["failures"], Value::Array(vec![]));
    let removed = &done["removed"];
    assert_eq!(
        removed["conflict_documents"], 3,
        "two conflicts and one mismatch: {removed}"
    );
    assert_eq!(removed["reject_bodies"], 1);
    assert_eq!(removed["http_requests"], 1);

    // (which, document still there, purge time set)
    assert_eq!(
        triples(
            db,
            "SELECT offending_fingerprint, offending_event IS NOT NULL, document_purged_at IS NOT NULL
              FROM intent_conflicts ORDER BY offending_fingerprint"
        )
        .await?,
        vec![
            ("fp-1".into(), false, true),
            ("fp-2".into(), true, false),
            ("fp-3".into(), false, true)
        ]
    );
    assert_eq!(
        triples(
            db,
            "SELECT offending_fingerprint, offending_request IS NOT NULL, document_purged_at IS NOT NULL
              FROM http_request_mismatches ORDER BY offending_fingerprint"
        )
        .await?,
        vec![("m-new".into(), true, false), ("m-old".into(), false, true)],
        "m-gone went with its expired key"
    );
    assert_eq!(
        triples(
            db,
            "SELECT message_id, body_prefix IS NOT NULL, body_purged_at IS NOT NULL
              FROM provider_event_rejects ORDER BY message_id"
        )
        .await?,
        vec![("new".into(), true, false), ("old".into(), false, true)]
    );
    assert_eq!(env.count("SELECT count(*) FROM http_requests").await?, 1);
    // What stays of personal data is inside the windows only.
    assert_eq!(
        env.count(
            "SELECT (SELECT count(*) FROM intent_conflicts WHERE offending_event::text LIKE '%personal.example%')
                  + (SELECT count(*) FROM http_request_mismatches WHERE offending_request::text LIKE '%personal.example%')
                  + (SELECT count(*) FROM provider_event_rejects WHERE body_prefix LIKE '%personal.example%')"
        )
        .await?,
        3
    );
    assert_eq!(removed["payload_bodies"], 1, "pold");
    let complaint = |address: &str| herald_store::reconcile::ProviderEvent {
        key: format!("complaint-{address}"),
        channel: herald_core::Channel::Email,
        event_type: "complaint".into(),
        provider_message_id: "0100-late".into(),
        occurred_at: now,
        intent_tag: Some(old.simple().to_string()),
        attempt_tag: Some("1".into()),
        verdict: Some(herald_core::state::Verdict::Accepted),
        bounce_type: None,
        bounce_subtype: None,
        complaint_type: Some("abuse".into()),
        detail: None,
        price_usd: None,
        suppress: Some((
            herald_core::consent::SuppressionReason::Complained,
            vec![address.to_owned()],
        )),
    };
    let store = env.store(2)?;
    let applied = store
        .apply_provider_events(&[complaint("someone@else.example"), complaint("SELLER@example.com")])
        .await?;
    let suppressed: Vec<(u64, u64)> = applied
        .iter()
        .map(|a| match a {
            herald_store::reconcile::Applied::Stored {
                suppressed, refused, ..
            } => (*suppressed, *refused),
            herald_store::reconcile::Applied::Duplicate => (0, 0),
        })
        .collect();
    assert_eq!(
        suppressed,
        vec![(0, 1), (1, 0)],
        "after the purge, only the intent's destination (by its kept digest) is suppressed"
    );
    // A second pass has nothing left to do.
    let again = json(&env.herald(&["retention", "run", "--json"])?)?;
    for what in ["conflict_documents", "reject_bodies", "http_requests"] {
        assert_eq!(again["removed"][what], 0, "{what}");
    }
    // The daemon's gauge of the tables only retention bounds (PostgreSQL's estimate).
    db.batch_execute("ANALYZE intent_conflicts").await?;
    let herald = env.spawn_roles("ingest", "herald", &[])?;
    let admin = herald.admin_addr(WAIT).await?;
    wait_for("the evidence tables sampled", WAIT, || async {
        let text = scrape(&admin).await?;
        Ok(text
            .lines()
            .any(|l| {
                l.starts_with("herald_evidence_table_rows{")
                    && l.contains("table=\"intent_conflicts\"")
                    && l.ends_with(" 3")
            })
            .then_some(()))
    })
    .await?;
    drop(herald);
    env.cleanup().await;
    Ok(())
}
