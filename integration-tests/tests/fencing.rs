//! Delivery fencing, against the real schema: a record moves an intent only while its
//! attempt holds the lease, an `unknown` attempt stays `unknown` whatever arrives later,
//! a late outcome settles the intent only when no newer attempt was claimed, claims and
//! records retried after a lost reply change nothing twice, and `not_sent` attempts do not
//! use up the intent's attempts; the intent's two rows keep their invariants, and its payload
//! and outbox rows their references. Then, end to end: a worker whose turn comes after its
//! lease deadline sends nothing, and SIGTERM releases the attempts waiting for their turn.

use std::time::Duration;

use anyhow::{bail, Result};
use herald_core::retry::{NextState, RetryPolicy, UnknownPolicy};
use herald_core::{AttemptOutcome, Channel};
use herald_store::delivery::{
    AttemptRecord, ChannelPolicies, ClaimOutcome, ClaimRequest, ClaimTry, Claimed, Recorded,
};
use herald_store::Store;
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::UniqueSeller;
use integration_tests::{seed_orders, wait_for, TestEnv};
use tokio_postgres::error::SqlState;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(90);

/// Intents of `orders` (e-mail and SMS each), with no outbox rows and no relay: the test
/// claims and records them itself through the store.
async fn intents(name: &str, orders: &[&str]) -> Result<(TestEnv, Store)> {
    let env = TestEnv::new(name, "").await?;
    let mut ingest = env.spawn_roles("ingest", "ingest", &[])?;
    seed_orders(&env, &UniqueSeller::new(), orders).await?;
    env.wait_count(
        "intents created",
        "SELECT count(*) FROM notification_intents",
        orders.len() as i64 * 2,
        WAIT,
    )
    .await?;
    ingest.terminate(WAIT).await?;
    env.db.batch_execute("DELETE FROM outbox").await?;
    let store = env.store(2)?;
    Ok((env, store))
}

fn policies(on_unknown: UnknownPolicy) -> ChannelPolicies {
    let policy = RetryPolicy {
        max_attempts: 3,
        base_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
        on_unknown,
        evidence_window: None,
    };
    Channel::ALL.iter().map(|c| (*c, policy)).collect()
}

async fn intent_id(env: &TestEnv, order: &str, channel: &str) -> Result<Uuid> {
    Ok(env
        .db
        .query_one(
            "SELECT id FROM notification_intents WHERE order_id = $1 AND channel = $2",
            &[&order, &channel],
        )
        .await?
        .get(0))
}

async fn claim_one(
    store: &Store,
    request: ClaimRequest,
    lease: Duration,
    p: &ChannelPolicies,
) -> Result<Claimed> {
    claim_try(store, request, lease, p, ClaimTry::First).await
}

async fn claim_try(
    store: &Store,
    request: ClaimRequest,
    lease: Duration,
    p: &ChannelPolicies,
    attempt: ClaimTry,
) -> Result<Claimed> {
    match store
        .claim("fencing-test", lease, &[request], p, attempt)
        .await?
        .pop()
    {
        Some(ClaimOutcome::Claimed(c)) => Ok(*c),
        other => bail!("intent {} not claimed: {other:?}", request.intent_id),
    }
}

fn record(c: &Claimed, outcome: AttemptOutcome, next: NextState) -> AttemptRecord {
    let provider_id = (outcome == AttemptOutcome::Accepted).then(|| format!("msg-{}", c.attempt_no));
    c.record(outcome, provider_id, None, None, next)
}

/// The intent's (state, attempt_count, unsent_attempts, had_unknown, lease token).
async fn intent_row(env: &TestEnv, id: Uuid) -> Result<(String, i32, i32, bool, Option<Uuid>)> {
    let r = env
        .db
        .query_one(
            "SELECT state, attempt_count, unsent_attempts, had_unknown, lease_attempt_id
               FROM notification_intents WHERE id = $1",
            &[&id],
        )
        .await?;
    Ok((r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

/// Each attempt of the intent: (attempt_no, outcome, error_category, late_outcome,
/// late_provider_message_id).
async fn attempts_of(
    env: &TestEnv,
    id: Uuid,
) -> Result<Vec<(i32, String, Option<String>, Option<String>, Option<String>)>> {
    Ok(env
        .db
        .query(
            "SELECT attempt_no, outcome, error_category, late_outcome, late_provider_message_id
               FROM notification_attempts WHERE intent_id = $1 ORDER BY attempt_no",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect())
}

/// Sweeps until the lease of `id` has expired and its attempt was recorded `unknown`.
async fn expire(env: &TestEnv, store: &Store, p: &ChannelPolicies, id: Uuid) -> Result<()> {
    wait_for("the lease to expire and be swept", WAIT, || async {
        store.expire_leases(p, 100).await?;
        Ok((intent_row(env, id).await?.0 != "sending").then_some(()))
    })
    .await
}

/// The constraint `sql` breaks, if PostgreSQL refuses it as a check violation (the deferred
/// checks run at the statement's implicit commit).
async fn refused_by(env: &TestEnv, sql: &str) -> Result<String> {
    refused_with(env, sql, &SqlState::CHECK_VIOLATION).await
}

/// The constraint named by the error `sql` fails with, which must be `code`.
async fn refused_with(env: &TestEnv, sql: &str, code: &SqlState) -> Result<String> {
    match env.db.batch_execute(sql).await {
        Ok(()) => bail!("the database took {sql:?}"),
        Err(e) => match e.as_db_error() {
            Some(db) if db.code() == code => Ok(db.constraint().unwrap_or_default().to_owned()),
            _ => bail!("{sql}: expected {code:?}, got {e:?}"),
        },
    }
}

/// SQL: a copy of intent `id` for order `order`, with `consent` and `state`, inserted
/// through the `notification_intents` view.
fn copy_through_view(id: Uuid, order: &str, consent: &str, state: &str) -> String {
    copy_of(
        id,
        order,
        "payload_digest",
        &format!("'{consent}'"),
        &format!("'{state}'"),
    )
}

/// SQL: a copy of intent `id` for order `order`, inserted through the `notification_intents`
/// view, with `digest`, `consent` and `state` (SQL expressions over the copied row); a copy
/// without a digest (held) has no revision either.
fn copy_of(id: Uuid, order: &str, digest: &str, consent: &str, state: &str) -> String {
    format!(
        "INSERT INTO notification_intents (id, marketplace_id, order_id, event_kind, channel, idempotency_key,
                request_fingerprint, seller_id, template, template_revision, payload_digest, consent, state,
                event_id, occurred_at, source_topic, source_partition, source_offset)
         SELECT gen_random_uuid(), marketplace_id, '{order}', event_kind, channel, idempotency_key,
                request_fingerprint, seller_id, template, CASE WHEN {digest} IS NOT NULL THEN template_revision END,
                {digest}, {consent}, {state},
                event_id, occurred_at, source_topic, source_partition, source_offset
           FROM notification_intents WHERE id = '{id}'"
    )
}

/// The intent is two rows since V13, its frozen contents and its state: the invariants
/// that tied them as one row's CHECKs hold across the two tables, and the frozen contents
/// never change. Each write below would break one; the database refuses each, and writes
/// through the `notification_intents` view that keep them pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intent_keeps_its_invariants_across_its_two_tables() -> Result<()> {
    let (env, _store) = intents("fencing_schema", &["20"]).await?;
    let id = intent_id(&env, "20", "email").await?;
    let other = intent_id(&env, "20", "sms").await?;
    let cases = [
        (
            format!("UPDATE intent_states SET state = 'suppressed' WHERE intent_id = '{id}'"),
            "notification_intents_suppressed_iff_no_consent",
        ),
        (
            format!("UPDATE notification_intents SET state = 'awaiting_profile' WHERE id = '{id}'"),
            "notification_intents_frozen_unless_held",
        ),
        (
            format!("UPDATE intent_contents SET consent = 'opted_out' WHERE id = '{id}'"),
            "intent_contents_frozen",
        ),
        (
            format!("UPDATE intent_contents SET order_id = '21' WHERE id = '{id}'"),
            "intent_contents_frozen",
        ),
        (
            format!("DELETE FROM intent_states WHERE intent_id = '{id}'"),
            "notification_intents_both_rows",
        ),
        (
            format!("DELETE FROM intent_contents WHERE id = '{other}'"),
            "notification_intents_both_rows",
        ),
        (
            format!("UPDATE intent_states SET intent_id = gen_random_uuid() WHERE intent_id = '{id}'"),
            "notification_intents_both_rows",
        ),
        (
            format!("UPDATE notification_intents SET id = gen_random_uuid() WHERE id = '{id}'"),
            "intent_contents_frozen",
        ),
        (
            format!(
                "INSERT INTO intent_contents (id, marketplace_id, order_id, event_kind, channel, idempotency_key,
                        request_fingerprint, seller_id, template, template_revision, payload_digest, consent,
                        event_id, occurred_at, source_topic, source_partition, source_offset)
                 SELECT gen_random_uuid(), marketplace_id, '22', event_kind, channel, idempotency_key,
                        request_fingerprint, seller_id, template, template_revision, payload_digest, consent,
                        event_id, occurred_at, source_topic, source_partition, source_offset
                   FROM intent_contents WHERE id = '{id}'"
            ),
            "notification_intents_both_rows",
        ),
        (
            copy_through_view(id, "23", "opted_out", "pending"),
            "notification_intents_suppressed_iff_no_consent",
        ),
    ];
    for (sql, constraint) in &cases {
        assert_eq!(refused_by(&env, sql).await?, *constraint, "{sql}");
    }
    assert_eq!(intent_row(&env, id).await?.0, "pending", "nothing was written");

    // What keeps them passes, through the view too: a delivering intent's moves, an
    // operator's correction of the state, a new intent with both rows.
    env.db
        .batch_execute(&format!(
            "UPDATE intent_states SET state = 'sending' WHERE intent_id = '{id}';
             UPDATE notification_intents SET state = 'accepted', attempt_count = 1 WHERE id = '{id}';
             {}",
            copy_through_view(other, "24", "opted_out", "suppressed")
        ))
        .await?;
    assert_eq!(intent_row(&env, id).await?.0, "accepted");
    let suppressed: i64 = env
        .db
        .query_one(
            "SELECT count(*) FROM notification_intents WHERE order_id = '24' AND state = 'suppressed'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(suppressed, 1);
    env.db
        .batch_execute("DELETE FROM notification_intents WHERE order_id = '24'")
        .await?;
    let states: i64 = env
        .db
        .query_one("SELECT count(*) FROM intent_states", &[])
        .await?
        .get(0);
    assert_eq!(states, 2, "the deleted intent's state row went with it");
    Ok(())
}

/// An intent's payload and its outbox rows refer to rows that exist (the foreign keys
/// notification_intents_payload_digest_fkey and outbox_intent_id_fkey, which V13 kept
/// when the intent became two tables): each write below would leave one dangling, and the
/// database refuses it; the writes that keep them pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_s_payload_and_outbox_rows_refer_to_rows_that_exist() -> Result<()> {
    let (env, _store) = intents("fencing_references", &["30"]).await?;
    let id = intent_id(&env, "30", "email").await?;
    let digest: String = env
        .db
        .query_one("SELECT payload_digest FROM intent_contents WHERE id = $1", &[&id])
        .await?
        .get(0);
    const PAYLOAD: &str = "notification_intents_payload_digest_fkey";
    const OUTBOX: &str = "outbox_intent_id_fkey";
    let cases = [
        (
            copy_of(id, "31", "'no-such-payload'", "consent", "'pending'"),
            PAYLOAD,
        ),
        // A held intent frozen with a payload that is not stored.
        (
            format!(
                "{};
                 UPDATE intent_states SET state = 'pending'
                  WHERE intent_id = (SELECT id FROM intent_contents WHERE order_id = '32');
                 UPDATE intent_contents SET payload_digest = 'no-such-payload', template_revision = template,
                        consent = 'granted'
                  WHERE order_id = '32'",
                copy_of(id, "32", "NULL", "NULL", "'awaiting_profile'")
            ),
            PAYLOAD,
        ),
        (
            format!("DELETE FROM notification_payloads WHERE digest = '{digest}'"),
            PAYLOAD,
        ),
        (
            format!("UPDATE notification_payloads SET digest = 'moved' WHERE digest = '{digest}'"),
            PAYLOAD,
        ),
        (
            "INSERT INTO outbox (intent_id, channel) VALUES (gen_random_uuid(), 'email')".to_owned(),
            OUTBOX,
        ),
        (
            format!(
                "INSERT INTO outbox (intent_id, channel) VALUES ('{id}', 'email');
                 WITH s AS (DELETE FROM intent_states WHERE intent_id = '{id}')
                 DELETE FROM intent_contents WHERE id = '{id}'"
            ),
            OUTBOX,
        ),
    ];
    for (sql, constraint) in &cases {
        let sql = format!("BEGIN; {sql}; COMMIT");
        let refused = refused_with(&env, &sql, &SqlState::FOREIGN_KEY_VIOLATION).await;
        // A refused statement inside BEGIN leaves the transaction aborted.
        env.db.batch_execute("ROLLBACK").await?;
        assert_eq!(refused?, *constraint, "{sql}");
    }
    let count = |sql: &'static str| {
        let db = &env.db;
        async move { Ok::<i64, anyhow::Error>(db.query_one(sql, &[]).await?.get(0)) }
    };
    assert_eq!(
        count("SELECT count(*) FROM intent_contents").await?,
        2,
        "nothing was written"
    );
    assert_eq!(
        count("SELECT count(*) FROM outbox").await?,
        0,
        "nothing was queued"
    );
    assert_eq!(
        count("SELECT count(*) FROM notification_payloads").await?,
        2,
        "one payload per intent (the digest covers the channel), none deleted"
    );

    // What keeps them passes: an outbox row for an intent that exists, an intent deleted
    // with its outbox row gone first, a payload no intent references deleted.
    env.db
        .batch_execute(&format!(
            "INSERT INTO outbox (intent_id, channel) VALUES ('{id}', 'email');
             DELETE FROM outbox WHERE intent_id = '{id}';
             WITH s AS (DELETE FROM intent_states WHERE intent_id = '{id}')
             DELETE FROM intent_contents WHERE id = '{id}';
             INSERT INTO notification_payloads (digest, channel, destination, locale, consent, template,
                    template_revision, subject, body_text, body_html)
             SELECT 'unreferenced', channel, destination, locale, consent, template, template_revision, subject,
                    body_text, body_html
               FROM notification_payloads WHERE digest = '{digest}';
             DELETE FROM notification_payloads WHERE digest IN ('unreferenced', '{digest}')"
        ))
        .await?;
    assert_eq!(count("SELECT count(*) FROM intent_contents").await?, 1);
    assert_eq!(
        count("SELECT count(*) FROM notification_payloads").await?,
        1,
        "the deleted intent's payload and the unreferenced one are gone, the other intent's stays"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_outcome_is_stored_beside_the_unknown_and_settles_only_what_no_newer_attempt_claimed(
) -> Result<()> {
    let (env, store) = intents("late", &["9101", "9102"]).await?;
    let short = Duration::from_millis(300);

    // Held: the worker stalled past its lease; the sweeper recorded `unknown`; then the
    // worker's `accepted` arrives. The attempt stays `unknown`, the acceptance is stored
    // beside it, and the intent (nobody claimed it since) is accepted.
    let hold = policies(UnknownPolicy::Hold);
    let held = intent_id(&env, "9101", "email").await?;
    let first = claim_one(&store, ClaimRequest::new(held), short, &hold).await?;
    expire(&env, &store, &hold, held).await?;
    assert_eq!(intent_row(&env, held).await?.0, "unknown");
    let late = store
        .record(&[record(&first, AttemptOutcome::Accepted, NextState::Accepted)])
        .await?;
    assert_eq!(late, [Recorded::Late { settled: true }]);
    assert_eq!(
        attempts_of(&env, held).await?,
        [(
            1,
            "unknown".into(),
            Some("lease_expired".into()),
            Some("accepted".into()),
            Some("msg-1".into())
        )],
        "the unknown stays, the late acceptance beside it"
    );
    let (state, _, _, had_unknown, token) = intent_row(&env, held).await?;
    assert_eq!((state.as_str(), had_unknown, token), ("accepted", true, None));

    // Retry: the sweeper's retry was claimed (attempt 2) before attempt 1's acceptance
    // arrived. Both facts stay on record; the intent belongs to attempt 2.
    let retry = policies(UnknownPolicy::Retry);
    let raced = intent_id(&env, "9102", "email").await?;
    let one = claim_one(&store, ClaimRequest::new(raced), short, &retry).await?;
    expire(&env, &store, &retry, raced).await?;
    assert_eq!(intent_row(&env, raced).await?.0, "retry_scheduled");
    let two = claim_one(&store, ClaimRequest::new(raced), Duration::from_secs(60), &retry).await?;
    assert!(two.after_unknown, "the retry is flagged as following an unknown");
    let late = store
        .record(&[record(&one, AttemptOutcome::Accepted, NextState::Accepted)])
        .await?;
    assert_eq!(late, [Recorded::Late { settled: false }]);
    let (state, count, _, _, token) = intent_row(&env, raced).await?;
    assert_eq!(
        (state.as_str(), count, token),
        ("sending", 2, Some(two.attempt_id)),
        "a late record of attempt 1 does not touch the intent attempt 2 holds"
    );
    let on_time = store
        .record(&[record(&two, AttemptOutcome::Accepted, NextState::Accepted)])
        .await?;
    assert_eq!(on_time, [Recorded::OnTime { moved: true }]);
    let ledger = attempts_of(&env, raced).await?;
    assert_eq!(
        (ledger[0].1.as_str(), ledger[0].3.as_deref(), ledger[1].1.as_str()),
        ("unknown", Some("accepted"), "accepted"),
        "{ledger:?}"
    );

    // A late `unknown` tells nothing new: stored, the intent left alone.
    let quiet = intent_id(&env, "9101", "sms").await?;
    let c = claim_one(&store, ClaimRequest::new(quiet), short, &hold).await?;
    expire(&env, &store, &hold, quiet).await?;
    let late = store
        .record(&[record(&c, AttemptOutcome::Unknown, NextState::HoldUnknown)])
        .await?;
    assert_eq!(late, [Recorded::Late { settled: false }]);
    assert_eq!(intent_row(&env, quiet).await?.0, "unknown");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_lost_its_lease_changes_no_intent_and_retried_claims_and_records_change_nothing_twice(
) -> Result<()> {
    let (env, store) = intents("fence", &["9201"]).await?;
    let p = policies(UnknownPolicy::Hold);
    let lease = Duration::from_secs(60);

    // A claim retried after its commit's reply was lost: the same attempt, found again.
    let id = intent_id(&env, "9201", "email").await?;
    let request = ClaimRequest::new(id);
    let first = claim_one(&store, request, lease, &p).await?;
    let again = claim_try(&store, request, lease, &p, ClaimTry::Again).await?;
    assert!(!first.reclaimed && again.reclaimed);
    assert_eq!(again.attempt_id, first.attempt_id);
    assert_eq!(attempts_of(&env, id).await?.len(), 1, "no orphan started attempt");
    // Another request for the same intent is refused while the lease is held.
    let other = store
        .claim(
            "fencing-test",
            lease,
            &[ClaimRequest::new(id)],
            &p,
            ClaimTry::First,
        )
        .await?;
    assert!(matches!(other[..], [ClaimOutcome::Skipped(_)]), "{other:?}");

    // The lease is taken over behind this attempt's back (as if swept and claimed again):
    // its record is kept, the intent is not moved.
    let usurper = Uuid::now_v7();
    env.db
        .execute(
            "UPDATE notification_intents SET lease_attempt_id = $2 WHERE id = $1",
            &[&id, &usurper],
        )
        .await?;
    let fenced = store
        .record(&[record(&first, AttemptOutcome::Rejected, NextState::Rejected)])
        .await?;
    assert_eq!(fenced, [Recorded::OnTime { moved: false }]);
    let (state, _, _, _, token) = intent_row(&env, id).await?;
    assert_eq!((state.as_str(), token), ("sending", Some(usurper)));

    // A record retried after a lost reply finds its own outcome.
    let sms = intent_id(&env, "9201", "sms").await?;
    let c = claim_one(&store, ClaimRequest::new(sms), lease, &p).await?;
    let r = record(&c, AttemptOutcome::Accepted, NextState::Accepted);
    assert_eq!(
        store.record(std::slice::from_ref(&r)).await?,
        [Recorded::OnTime { moved: true }]
    );
    assert_eq!(store.record(&[r]).await?, [Recorded::AlreadyRecorded]);
    assert_eq!(intent_row(&env, sms).await?.0, "accepted");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_never_turns_its_own_attempt_unknown_nor_reuses_its_id() -> Result<()> {
    let (env, store) = intents("lostreply", &["9251", "9252"]).await?;
    let hold = policies(UnknownPolicy::Hold);
    let short = Duration::from_millis(300);

    // The worker's own `unknown`, recorded on time, retried after a lost reply: already
    // recorded, not a late outcome.
    let id = intent_id(&env, "9251", "email").await?;
    let c = claim_one(&store, ClaimRequest::new(id), Duration::from_secs(60), &hold).await?;
    let r = record(&c, AttemptOutcome::Unknown, NextState::HoldUnknown);
    assert_eq!(
        store.record(std::slice::from_ref(&r)).await?,
        [Recorded::OnTime { moved: true }]
    );
    assert_eq!(store.record(&[r]).await?, [Recorded::AlreadyRecorded]);
    assert_eq!(
        attempts_of(&env, id).await?,
        [(1, "unknown".into(), None, None, None)],
        "no late outcome invented"
    );

    // The claim committed, its reply was lost, and the lease ran out before the retry got
    // through: nothing was sent, so the retry finds its own attempt (not swept `unknown`).
    let id = intent_id(&env, "9251", "sms").await?;
    let request = ClaimRequest::new(id);
    let first = claim_one(&store, request, short, &hold).await?;
    env.wait_count(
        "the lease to run out",
        &format!("SELECT count(*) FROM notification_intents WHERE id = '{id}' AND lease_until < now()"),
        1,
        WAIT,
    )
    .await?;
    let again = claim_try(&store, request, short, &hold, ClaimTry::Again).await?;
    assert!(again.reclaimed && again.attempt_id == first.attempt_id);
    assert_eq!(attempts_of(&env, id).await?[0].1, "started");

    // Swept meanwhile by another worker, and due again: the retry does not claim it a
    // second time under the same attempt id.
    let retry = policies(UnknownPolicy::Retry);
    let id = intent_id(&env, "9252", "email").await?;
    let request = ClaimRequest::new(id);
    claim_one(&store, request, short, &retry).await?;
    expire(&env, &store, &retry, id).await?;
    let refused = store
        .claim("fencing-test", short, &[request], &retry, ClaimTry::Again)
        .await?;
    assert!(matches!(refused[..], [ClaimOutcome::Skipped(_)]), "{refused:?}");
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM notification_attempts WHERE id = '{}'",
            request.attempt_id
        ))
        .await?,
        1,
        "one attempt row per attempt id"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_sent_attempts_do_not_use_up_the_intent_and_stranded_intents_are_queued_again() -> Result<()> {
    let (env, store) = intents("unsent", &["9301"]).await?;
    let p = policies(UnknownPolicy::Hold);
    let lease = Duration::from_secs(60);
    let id = intent_id(&env, "9301", "email").await?;
    // max_attempts is 3: five `not_sent` attempts in a row, and the intent is still due.
    for n in 1..=5 {
        let c = claim_one(&store, ClaimRequest::new(id), lease, &p).await?;
        assert_eq!(
            (c.attempt_no, c.tries),
            (n, 1),
            "attempt {n} is still the first try"
        );
        let next = p[&Channel::Email].next(AttemptOutcome::NotSent, c.tries, 0.0);
        let done = store
            .record(&[AttemptRecord {
                error_category: Some("lease_deadline"),
                ..record(&c, AttemptOutcome::NotSent, next)
            }])
            .await?;
        assert_eq!(done, [Recorded::OnTime { moved: true }]);
        let (state, count, unsent, _, _) = intent_row(&env, id).await?;
        assert_eq!((state.as_str(), count, unsent), ("retry_scheduled", n, n));
        env.wait_count(
            "the retry to be due",
            &format!(
                "SELECT count(*) FROM notification_intents WHERE id = '{id}' AND next_attempt_at <= now()"
            ),
            1,
            WAIT,
        )
        .await?;
    }
    assert_eq!(
        env.count("SELECT count(*) FROM outbox").await?,
        5,
        "each not_sent queued the intent again"
    );

    // Due, and nothing would bring it to a worker: the outbox row was lost.
    env.db.batch_execute("DELETE FROM outbox").await?;
    let sms = intent_id(&env, "9301", "sms").await?;
    assert!(
        store
            .requeue_stranded(Duration::from_secs(3600), 100)
            .await?
            .is_empty(),
        "not while they are due for less than the grace"
    );
    let requeued = store.requeue_stranded(Duration::ZERO, 100).await?;
    let mut expected = vec![id, sms];
    expected.sort();
    let mut got = requeued.clone();
    got.sort();
    assert_eq!(got, expected, "the due e-mail retry and the pending SMS");
    assert!(
        store.requeue_stranded(Duration::ZERO, 100).await?.is_empty(),
        "an intent with an outbox row is not stranded"
    );
    assert_eq!(env.count("SELECT count(*) FROM outbox").await?, 2);
    env.cleanup().await;
    Ok(())
}

/// (outcome, error_category) of every attempt of the order's intents.
async fn outcomes(env: &TestEnv) -> Result<Vec<(String, Option<String>)>> {
    Ok(env
        .db
        .query(
            "SELECT outcome, error_category FROM notification_attempts ORDER BY started_at",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_turn_comes_after_its_lease_deadline_sends_nothing() -> Result<()> {
    // The test's lease is 10 s with 2 s attempts and a 3 s margin: a send must start
    // within 5 s of its claim. The first attempt to get its turn stalls 6 s first.
    let env = TestEnv::new("deadline", "").await?;
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[("FAILPOINTS", "deliver-before-send=1*return(6000)")],
    )?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["9401"]).await?;
    env.wait_count(
        "both intents accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    let all = outcomes(&env).await?;
    let unsent: Vec<_> = all.iter().filter(|(o, _)| o == "not_sent").collect();
    assert_eq!(
        unsent,
        [&("not_sent".to_owned(), Some("lease_deadline".to_owned()))],
        "{all:?}"
    );
    assert_eq!(all.iter().filter(|(o, _)| o == "accepted").count(), 2, "{all:?}");
    assert!(
        !all.iter().any(|(o, _)| o == "unknown" || o == "started"),
        "nothing left to expire into unknown: {all:?}"
    );
    assert_eq!(emails_to(&seller.email).await?.len(), 1, "one e-mail");
    assert_eq!(sms_to(&seller.phone).await?.len(), 1, "one SMS");
    assert!(herald.terminate(WAIT).await?.success());
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_attempts_waiting_for_their_turn_as_not_sent() -> Result<()> {
    // E-mail at 1/s: of twelve orders, a few e-mails are claimed and waiting for the rate
    // when SIGTERM arrives.
    let env = TestEnv::new("release", "").await?;
    let slow_email = [("HERALD_CHANNELS__EMAIL__RATE_PER_SECOND", "1")];
    let mut herald = env.spawn_roles("ingest,relay,deliver", "herald", &slow_email)?;
    let seller = UniqueSeller::new();
    let orders: Vec<String> = (0..12).map(|n| format!("95{n:02}")).collect();
    let refs: Vec<&str> = orders.iter().map(String::as_str).collect();
    seed_orders(&env, &seller, &refs).await?;
    env.wait_count(
        "the first e-mails accepted",
        "SELECT least(count(*), 2) FROM notification_attempts a JOIN notification_intents i ON i.id = a.intent_id
          WHERE i.channel = 'email' AND a.outcome = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    assert!(
        herald.terminate(WAIT).await?.success(),
        "SIGTERM drains and exits 0"
    );
    let all = outcomes(&env).await?;
    let released = all
        .iter()
        .filter(|(o, c)| o == "not_sent" && c.as_deref() == Some("shutdown"))
        .count();
    assert!(
        released > 0,
        "attempts waiting for the rate were released: {all:?}"
    );
    assert!(
        !all.iter().any(|(o, _)| o == "started" || o == "unknown"),
        "only requests in flight may end unknown, and none was: {all:?}"
    );

    // Started again, every order is delivered once.
    let _herald = env.spawn_roles("ingest,relay,deliver", "herald-again", &slow_email)?;
    env.wait_count(
        "every intent accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        24,
        WAIT,
    )
    .await?;
    assert_eq!(emails_to(&seller.email).await?.len(), 12, "one e-mail per order");
    assert_eq!(sms_to(&seller.phone).await?.len(), 12, "one SMS per order");
    env.cleanup().await;
    Ok(())
}
