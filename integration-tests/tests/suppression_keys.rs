//! The suppression list's keyed digests (issue 43): an entry made before they were keyed
//! (V17) still suppresses its address, retention re-keys it from the sellers' profiles, an
//! operator lifts it by address, and Herald refuses to start with another key than the one
//! live entries were made with.
//!
//! The keyed path itself (a bounce puts a keyed entry on the list, ingest suppresses the
//! next order, the CLI lifts it by address) is `reconcile.rs`'s bounce test.

use std::time::Duration;

use anyhow::Result;
use herald_store::destination::DestinationKey;
use integration_tests::samples::UniqueSeller;
use integration_tests::{destination_key, seed_orders, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

/// Inserts an entry as V8 wrote them: the unkeyed digest, computed by PostgreSQL.
async fn unkeyed_entry(env: &TestEnv, channel: &str, address: &str, reason: &str) -> Result<i64> {
    Ok(env
        .db
        .query_one(
            "INSERT INTO suppressions (channel, destination_digest, reason, digest_version)
             VALUES ($1, herald_destination_digest($1, $2), $3, 1) RETURNING id",
            &[&channel, &address, &reason],
        )
        .await?
        .get(0))
}

async fn keyed_entry(env: &TestEnv, key: &DestinationKey, channel: &str, address: &str) -> Result<i64> {
    Ok(env
        .db
        .query_one(
            "INSERT INTO suppressions (channel, destination_digest, reason, digest_version, digest_key)
             VALUES ($1, $2, 'bounced', 2, $3) RETURNING id",
            &[&channel, &key.digest(channel, address), &key.id()],
        )
        .await?
        .get(0))
}

/// (digest_version, destination_digest, lifted_by) of an entry.
async fn entry(env: &TestEnv, id: i64) -> Result<(i16, String, Option<String>)> {
    let r = env
        .db
        .query_one(
            "SELECT digest_version, destination_digest, lifted_by FROM suppressions WHERE id = $1",
            &[&id],
        )
        .await?;
    Ok((r.get(0), r.get(1), r.get(2)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_made_before_the_key_still_suppress_and_retention_rekeys_them() -> Result<()> {
    let env = TestEnv::new("supkeys", "").await?;
    let key = destination_key();
    let seller = UniqueSeller::new();
    let stranger = "nobody-on-file@seller.example";
    // The seller's address in other letter case, an address no profile holds, and the
    // seller's phone, whose keyed entry is live too (a bounce after the upgrade).
    let email = unkeyed_entry(&env, "email", &seller.email.to_uppercase(), "bounced").await?;
    let orphan = unkeyed_entry(&env, "email", stranger, "complained").await?;
    let phone = unkeyed_entry(&env, "sms", &seller.phone, "bounced").await?;
    let phone_keyed = keyed_entry(&env, &key, "sms", &seller.phone).await?;

    let _herald = env.spawn_roles("ingest", "herald", &[])?;
    seed_orders(&env, &seller, &["9501"]).await?;
    env.wait_count(
        "order 9501 suppressed on both channels by entries made before the key",
        "SELECT count(*) FROM notification_intents WHERE order_id = '9501' AND state = 'suppressed'
           AND consent = 'bounced'",
        2,
        WAIT,
    )
    .await?;

    let text = env.herald(&["retention", "run"])?;
    assert!(text.contains("suppression-list entries re-keyed: 2"), "{text}");
    let (version, digest, lifted) = entry(&env, email).await?;
    assert_eq!(
        (version, digest.as_str(), lifted),
        (2, key.digest("email", &seller.email).as_str(), None),
        "the e-mail entry carries its keyed digest"
    );
    let (version, _, lifted) = entry(&env, phone).await?;
    assert_eq!(
        (version, lifted.as_deref()),
        (1, Some("herald retention")),
        "the phone's unkeyed entry lifted beside its keyed twin"
    );
    assert_eq!(entry(&env, phone_keyed).await?.2, None);
    let (version, _, lifted) = entry(&env, orphan).await?;
    assert_eq!(
        (version, lifted),
        (1, None),
        "no profile names it: left as it was"
    );
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM suppressions WHERE digest_version = 2 AND digest_key = '{}' AND lifted_at IS NULL",
            key.id()
        ))
        .await?,
        2
    );
    // A dictionary of addresses and the public function find none of the keyed entries.
    assert_eq!(
        env.count(&format!(
            "SELECT count(*) FROM suppressions s
               JOIN (VALUES ('email', '{}'), ('sms', '{}')) AS d(channel, address)
                 ON s.channel = d.channel AND s.destination_digest = herald_destination_digest(d.channel, d.address)
              WHERE s.digest_version = 2",
            seller.email, seller.phone
        ))
        .await?,
        0
    );

    // The keyed entries go on suppressing.
    seed_orders(&env, &seller, &["9502"]).await?;
    env.wait_count(
        "order 9502 suppressed on both channels by keyed entries",
        "SELECT count(*) FROM notification_intents WHERE order_id = '9502' AND state = 'suppressed'
           AND consent = 'bounced'",
        2,
        WAIT,
    )
    .await?;
    // An operator lifts the entry no profile names by its address.
    env.herald(&[
        "suppression",
        "remove",
        "--channel",
        "email",
        "--address",
        stranger,
        "--reason",
        "the address was never ours",
        "--operator",
        "on-call",
    ])?;
    assert_eq!(entry(&env, orphan).await?.2.as_deref(), Some("on-call"));
    assert_eq!(
        env.count("SELECT count(*) FROM suppressions WHERE digest_version = 1 AND lifted_at IS NULL")
            .await?,
        0
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_refuses_to_start_with_another_key_than_the_live_entries() -> Result<()> {
    let env = TestEnv::new("supkeys_other", "").await?;
    let before = DestinationKey::new(b"the key this list was made with, before")?;
    let id = keyed_entry(&env, &before, "email", "someone@seller.example").await?;
    let mut herald = env.spawn_roles("ingest", "refused", &[])?;
    let deadline = std::time::Instant::now() + WAIT;
    while herald.is_running() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "herald did not exit: {}",
            herald.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = herald.log();
    assert!(
        log.contains("is not the key of live suppression-list entries") && log.contains(before.id()),
        "{log}"
    );
    // Canary: the entry lifted, the same configuration starts.
    env.db
        .execute(
            "UPDATE suppressions SET lifted_at = now(), lifted_by = 'test', lift_reason = 'test' WHERE id = $1",
            &[&id],
        )
        .await?;
    let started = env.spawn_roles("ingest", "started", &[])?;
    started
        .wait_log("herald started", WAIT, |l| l.contains("herald started"))
        .await?;
    env.cleanup().await;
    Ok(())
}
