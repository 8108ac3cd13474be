//! The suppression list's keyed digests (issue 43): an entry made before they were keyed
//! (V17) still suppresses its address, retention re-keys it from the sellers' profiles (as
//! the keyed normalization tells addresses apart), an operator lifts it by address, and
//! neither `herald run` nor retention works with another key than the one recorded.
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

/// The key recorded in the database (`suppression_key`).
async fn recorded_key(env: &TestEnv) -> Result<Option<String>> {
    Ok(env
        .db
        .query_opt("SELECT key_id FROM suppression_key", &[])
        .await?
        .map(|r| r.get(0)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_and_retention_refuse_another_key_than_the_lists() -> Result<()> {
    let env = TestEnv::new("supkeys_other", "").await?;
    let key = destination_key();
    // The list as a deployment with another key left it: the key recorded, no keyed entry
    // yet (only unkeyed ones), so nothing but the record tells the keys apart.
    let before = DestinationKey::new(b"the key this list was made with, before")?;
    env.db
        .execute(
            "INSERT INTO suppression_key (key_id) VALUES ($1)",
            &[&before.id()],
        )
        .await?;
    let seller = UniqueSeller::new();
    let unkeyed = unkeyed_entry(&env, "email", &seller.email, "bounced").await?;
    // The seller's profile, so that a retention pass could re-key the entry.
    env.db
        .execute(
            "INSERT INTO sellers (marketplace_id, seller_id, email, locale, email_opt_in, version)
             VALUES ('acme', 'seller-0', $1, 'en', true, 1)",
            &[&seller.email],
        )
        .await?;
    let mut refused = env.spawn_roles("ingest", "refused", &[])?;
    let deadline = std::time::Instant::now() + WAIT;
    while refused.is_running() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "herald did not exit: {}",
            refused.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = refused.log();
    assert!(
        log.contains("is not the key the suppression list is keyed with") && log.contains(before.id()),
        "{log}"
    );
    // Retention with this key would key the entry so that the other deployment misses it.
    let out = env.herald_output(&["retention", "run"])?;
    assert!(!out.status.success(), "retention ran with another key");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not the key the suppression list is keyed with")
            || String::from_utf8_lossy(&out.stdout)
                .contains("is not the key the suppression list is keyed with"),
        "{out:?}"
    );
    assert_eq!(entry(&env, unkeyed).await?.0, 1, "left unkeyed");
    // Nor does losing the record let another key in while keyed entries remain: the key
    // they carry is recorded again.
    env.db.execute("DELETE FROM suppression_key", &[]).await?;
    keyed_entry(&env, &before, "sms", "+15550009999").await?;
    let out = env.herald_output(&["retention", "run"])?;
    assert!(
        !out.status.success(),
        "retention ran with another key than the entries'"
    );
    assert_eq!(recorded_key(&env).await?.as_deref(), Some(before.id()));
    env.db
        .execute(
            "UPDATE suppressions SET lifted_at = now(), lifted_by = 'test', lift_reason = 'test'
              WHERE digest_key = $1",
            &[&before.id()],
        )
        .await?;

    // Canary: with no key recorded, the same configuration starts and records its own,
    // and retention then re-keys the entry.
    env.db.execute("DELETE FROM suppression_key", &[]).await?;
    let started = env.spawn_roles("ingest", "started", &[])?;
    started
        .wait_log("herald started", WAIT, |l| l.contains("herald started"))
        .await?;
    assert_eq!(recorded_key(&env).await?.as_deref(), Some(key.id()));
    seed_orders(&env, &seller, &["9511"]).await?;
    env.wait_count(
        "order 9511's e-mail suppressed",
        "SELECT count(*) FROM notification_intents WHERE order_id = '9511' AND channel = 'email'
           AND state = 'suppressed' AND consent = 'bounced'",
        1,
        WAIT,
    )
    .await?;
    env.herald(&["retention", "run"])?;
    assert_eq!(entry(&env, unkeyed).await?.0, 2, "re-keyed");
    env.cleanup().await;
    Ok(())
}

/// Addresses PostgreSQL's `lower` and the keyed digests' normalization (Rust's Unicode
/// lowercasing) tell apart differently: two unkeyed entries that key alike (a final sigma:
/// `lower` gives σασ, Rust σας) make one keyed entry, the other is lifted (both in one
/// batch would break the unique index on every pass); one unkeyed entry whose profiles'
/// addresses key differently (İ: `lower` gives i, Rust i̇) becomes one keyed entry per
/// address. Ingest computes exactly these keyed digests from the profiles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekeying_follows_the_keyed_normalization() -> Result<()> {
    let env = TestEnv::new("supkeys_unicode", "").await?;
    let key = destination_key();
    let n = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (sigma_upper, sigma_lower) = (
        format!("ΣΑΣ@{n}.seller.example"),
        format!("σας@{n}.seller.example"),
    );
    let (dotted, plain) = (format!("İ{n}@seller.example"), format!("i{n}@seller.example"));
    for (seller, email) in [
        ("s1", &sigma_upper),
        ("s2", &sigma_lower),
        ("s3", &dotted),
        ("s4", &plain),
    ] {
        env.db
            .execute(
                "INSERT INTO sellers (marketplace_id, seller_id, email, locale, email_opt_in, version)
                 VALUES ('acme', $1, $2, 'en', true, 1)",
                &[&seller, email],
            )
            .await?;
    }
    // The premises, in this database's locale (glibc's C.UTF-8, deploy/local/postgres.sh):
    // `lower` tells the sigmas apart and makes İ an i.
    let premises: bool = env
        .db
        .query_one(
            "SELECT herald_destination_digest('email', $1) <> herald_destination_digest('email', $2)
                AND herald_destination_digest('email', $3) = herald_destination_digest('email', $4)",
            &[&sigma_upper, &sigma_lower, &dotted, &plain],
        )
        .await?
        .get(0);
    anyhow::ensure!(
        premises,
        "this database's lower() does not behave as the test assumes"
    );
    let a = unkeyed_entry(&env, "email", &sigma_upper, "bounced").await?;
    let b = unkeyed_entry(&env, "email", &sigma_lower, "bounced").await?;
    let c = unkeyed_entry(&env, "email", &plain, "complained").await?;
    assert_eq!(
        key.digest("email", &sigma_upper),
        key.digest("email", &sigma_lower)
    );
    assert_ne!(key.digest("email", &dotted), key.digest("email", &plain));

    let text = env.herald(&["retention", "run"])?;
    assert!(text.contains("suppression-list entries re-keyed: 4"), "{text}");
    let (ea, eb) = (entry(&env, a).await?, entry(&env, b).await?);
    assert_eq!(
        [ea.0, eb.0].iter().filter(|v| **v == 2).count(),
        1,
        "one of the sigma entries keyed: {ea:?} {eb:?}"
    );
    assert_eq!(
        [&ea.2, &eb.2]
            .iter()
            .filter(|l| l.as_deref() == Some("herald retention"))
            .count(),
        1,
        "the other lifted: {ea:?} {eb:?}"
    );
    assert_eq!(entry(&env, c).await?.0, 2);
    for address in [&sigma_lower, &dotted, &plain] {
        assert_eq!(
            env.count(&format!(
                "SELECT count(*) FROM suppressions WHERE lifted_at IS NULL AND digest_version = 2
                   AND destination_digest = '{}'",
                key.digest("email", address)
            ))
            .await?,
            1,
            "{address} keyed"
        );
    }
    assert_eq!(
        env.count("SELECT count(*) FROM suppressions WHERE lifted_at IS NULL AND digest_version = 1")
            .await?,
        0
    );
    let again = env.herald(&["retention", "run"])?;
    assert!(again.contains("suppression-list entries re-keyed: 0"), "{again}");
    env.cleanup().await;
    Ok(())
}
