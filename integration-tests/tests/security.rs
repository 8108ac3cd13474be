//! Security against the real stack: the runtime database role cannot change the schema,
//! and secrets given through the environment never show up in what Herald prints or serves.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use integration_tests::http::{exchange, request_text};
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::{produce_order, produce_seller, seed_orders, wait_for, TestEnv};

const WAIT: Duration = Duration::from_secs(60);

/// The error of `sql` run as `client`, which must be a refusal for lack of privilege.
async fn refused(client: &tokio_postgres::Client, sql: &str) -> Result<String> {
    match client.batch_execute(sql).await {
        Ok(()) => anyhow::bail!("the runtime role could run {sql:?}"),
        Err(e) => {
            let code = e.code().map(|c| c.code().to_owned());
            assert_eq!(
                code.as_deref(),
                Some("42501"),
                "{sql}: expected insufficient_privilege, got {e:?}"
            );
            Ok(e.to_string())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_role_writes_rows_but_cannot_change_the_schema() -> Result<()> {
    let env = TestEnv::new("roles", "").await?;
    let role = format!("herald_rt_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    env.db.batch_execute(&format!("CREATE ROLE {role} LOGIN")).await?;
    // Migrations as the owner (the configured url: the stack's admin role), with the grants.
    let out = std::process::Command::new(integration_tests::herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env("HERALD_DATABASE__RUNTIME_ROLE", &role)
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("granted {role}")));

    // herald run as the runtime role: orders become intents, relayed and sent.
    let runtime_url = env
        .db_url
        .replacen("postgres://herald@", &format!("postgres://{role}@"), 1);
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "runtime",
        &[
            ("HERALD_DATABASE__URL", runtime_url.as_str()),
            ("HERALD_DATABASE__MIGRATE_ON_START", "false"),
            ("HERALD_HTTP_INGEST__LISTEN", "127.0.0.1:0"),
            ("HERALD_HTTP_INGEST__TOKEN", "rt-ingest-token"),
            ("HERALD_HTTP_INGEST__MAX_IN_FLIGHT", "2"),
        ],
    )?;
    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["9101"]).await?;
    // An order held for a profile that comes later (holds written, then released), and
    // one through HTTP ingest (its key stored, then answered).
    let p = producer()?;
    produce_order(&env, &p, "evt-9102", "9102", "seller-2", "12.00").await?;
    env.wait_count("order 9102 held", "SELECT count(*) FROM intent_holds", 2, WAIT)
        .await?;
    produce_seller(&env, &p, &seller.profile("seller-2")).await?;
    let ingest = herald.http_ingest_addr(WAIT).await?;
    let answer = exchange(
        &ingest,
        "POST",
        "/v1/order-events",
        &[
            ("Authorization", "Bearer rt-ingest-token"),
            ("Idempotency-Key", "rt-9103"),
            ("Content-Type", "application/json"),
        ],
        &order_event("evt-9103", "order.created", "acme", "9103", "seller-1", "12.00"),
    )
    .await?;
    assert_eq!(answer.status, 201, "{answer:?}");
    env.wait_count(
        "six intents accepted, written by the runtime role",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        6,
        WAIT,
    )
    .await?;
    assert!(herald.terminate(WAIT).await?.success());

    // The same role, by hand: rows yes, schema no.
    let runtime = integration_tests::pg_connect(&runtime_url).await?;
    let rows: i64 = runtime
        .query_one("SELECT count(*) FROM notification_attempts", &[])
        .await?
        .get(0);
    assert_eq!(rows, 6);
    runtime.query_one("SELECT count(*) FROM templates", &[]).await?;
    // What the database gauges read (the default-partition alert's input).
    runtime
        .query_one("SELECT count(*) FROM ONLY notification_attempts_default", &[])
        .await?;
    for ddl in [
        "CREATE TABLE herald_intruder (x int)",
        "ALTER TABLE intent_contents ADD COLUMN intruder int",
        "DROP TABLE outbox",
        "TRUNCATE notification_attempts",
        "CREATE INDEX intruder_idx ON intent_contents (order_id)",
        "DROP TRIGGER outbox_notify_after_insert ON outbox",
        "INSERT INTO herald_schema_history (version, name, applied_on, checksum) VALUES (999, 'x', 'now', '0')",
        // Table by table, only what herald run does: the ledger is never deleted from by
        // the runtime role (retention runs as the owner), templates are only read.
        "DELETE FROM notification_intents",
        "DELETE FROM intent_contents",
        "DELETE FROM intent_states",
        "DELETE FROM notification_payloads",
        "DELETE FROM notification_attempts",
        "DELETE FROM intent_conflicts",
        "DELETE FROM intent_resolutions",
        "DELETE FROM intent_holds",
        "DELETE FROM provider_events",
        "DELETE FROM suppressions",
        "UPDATE intent_conflicts SET offending_event_id = 'x'",
        "UPDATE intent_resolutions SET reason = 'x'",
        "UPDATE templates SET active = false",
        "DELETE FROM templates",
        "INSERT INTO templates SELECT * FROM templates LIMIT 1",
        "DELETE FROM http_request_mismatches",
    ] {
        refused(&runtime, ddl).await?;
    }
    drop(runtime);

    // A table nobody decided the runtime role's privileges for stops the grant (and the
    // migration command) instead of being left out silently.
    env.db.batch_execute("CREATE TABLE it_unlisted (x int)").await?;
    let out = std::process::Command::new(integration_tests::herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env("HERALD_DATABASE__RUNTIME_ROLE", &role)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("it_unlisted"), "{err}");
    env.db.batch_execute("DROP TABLE it_unlisted").await?;
    env.db.batch_execute(&format!("DROP OWNED BY {role}")).await?;
    env.cleanup().await;
    let admin = integration_tests::pg_connect(integration_tests::PG_ADMIN_URL).await?;
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_from_the_environment_never_reach_the_log_the_metrics_or_the_api() -> Result<()> {
    const SENTINEL: &str = "sentinel-7c1e9a55d2";
    let env = TestEnv::new("secrets", "").await?;
    let db_url = env.db_url.replacen(
        "postgres://herald@",
        &format!("postgres://herald:{SENTINEL}-db@"),
        1,
    );
    // Tokens of at least 32 bytes, as Herald requires.
    let token = format!("{SENTINEL}-admin-0123456789ab");
    let read_token = format!("{SENTINEL}-read-0123456789abcd");
    let ingest_token = format!("{SENTINEL}-ingest");
    let aws_secret = format!("{SENTINEL}-aws");
    let suppression_key = format!("{SENTINEL}-suppression-key-0123456789");
    // Kafka through the SASL_SSL listener, as a user of the test's own whose password is
    // a sentinel too.
    let kafka_user = format!(
        "herald-secrets-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let kafka_password = format!("{SENTINEL}-kafka");
    integration_tests::secure_kafka::add_scram_user(&kafka_user, &kafka_password)?;
    let kafka = integration_tests::secure_kafka::scram_env_as(&kafka_user, &kafka_password);
    let mut vars = vec![
        ("HERALD_DATABASE__URL", db_url.as_str()),
        ("HERALD_DATABASE__OWNER_URL", db_url.as_str()),
        ("HERALD_ADMIN__TOKEN", token.as_str()),
        ("HERALD_ADMIN__READ_TOKEN", read_token.as_str()),
        ("HERALD_HTTP_INGEST__LISTEN", "127.0.0.1:0"),
        ("HERALD_HTTP_INGEST__TOKEN", ingest_token.as_str()),
        ("HERALD_HTTP_INGEST__MAX_IN_FLIGHT", "2"),
        ("HERALD_AWS__SECRET_ACCESS_KEY", aws_secret.as_str()),
        ("HERALD_SUPPRESSION__KEY", suppression_key.as_str()),
        ("HERALD_LOG__LEVEL", "debug"),
    ];
    vars.extend(kafka.iter().map(|(k, v)| (*k, v.as_str())));
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", &vars)?;
    // Work through every role, a poison message, and refused admin calls.
    seed_orders(&env, &UniqueSeller::new(), &["9201"]).await?;
    produce(
        &producer()?,
        &env.topic("order-events"),
        Some(b"9202"),
        Some(b"{not json"),
        &[],
    )
    .await?;
    env.wait_count(
        "both intents accepted",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    let admin = herald.admin_addr(WAIT).await?;
    let wrong = format!("Bearer {SENTINEL}-wrong");
    let read_auth = format!("Bearer {read_token}");
    let mut served = String::new();
    for (method, path, auth) in [
        ("GET", "/metrics", None),
        ("GET", "/readyz", None),
        ("GET", "/openapi.json", None),
        ("GET", "/v1/dead-letters", None),
        ("GET", "/v1/dead-letters", Some(wrong.as_str())),
        ("GET", "/v1/dead-letters", Some(read_auth.as_str())),
        ("POST", "/v1/dead-letters/replay", Some(wrong.as_str())),
        ("POST", "/v1/dead-letters/replay", Some(read_auth.as_str())),
    ] {
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", *a)).collect();
        let body = (method == "POST").then(|| serde_json::json!({"all": true, "dry_run": true}));
        let (_, text) = request_text(&admin, method, path, &headers, body.as_ref()).await?;
        served.push_str(&text);
    }
    // HTTP ingest: one order accepted with its token, one refused with a wrong one.
    let ingest = herald.http_ingest_addr(WAIT).await?;
    let order = order_event("evt-9203", "order.created", "acme", "9203", "seller-1", "12.00");
    for auth in [format!("Bearer {ingest_token}"), wrong.clone()] {
        let answer = exchange(
            &ingest,
            "POST",
            "/v1/order-events",
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "secrets-9203"),
                ("Content-Type", "application/json"),
            ],
            &order,
        )
        .await?;
        served.push_str(&answer.body);
    }
    ensure!(
        env.count("SELECT count(*) FROM http_requests").await? == 1,
        "the order with the right token was accepted: {served}"
    );
    wait_for("the poison message dead-lettered", WAIT, || async {
        let (_, text) = request_text(
            &admin,
            "GET",
            "/v1/dead-letters",
            &[("Authorization", &read_auth)],
            None,
        )
        .await?;
        Ok(text.contains("not_json").then_some(()))
    })
    .await?;

    ensure!(
        herald.log().contains("Kafka answered"),
        "herald reached Kafka as the sentinel user"
    );
    // Commands that fail on the secret-bearing URL: the error names the problem, not the password.
    let out = std::process::Command::new(integration_tests::herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env(
            "HERALD_DATABASE__OWNER_URL",
            format!("postgres://herald:{SENTINEL}-db@127.0.0.1:1/nowhere"),
        )
        .output()
        .context("herald migrate")?;
    assert!(!out.status.success(), "no database on port 1");
    let failed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(failed.contains("herald migrate"), "{failed}");
    // A Kafka password the broker refuses: the error names the broker and the cause, not it.
    let mut ensure_cmd = std::process::Command::new(integration_tests::herald_bin());
    ensure_cmd
        .arg("--config")
        .arg(&env.config_path)
        .args(["topics", "ensure"]);
    for (k, v) in integration_tests::secure_kafka::scram_env_as(&kafka_user, &format!("{SENTINEL}-wrong")) {
        ensure_cmd.env(k, v);
    }
    let out = ensure_cmd.output().context("herald topics ensure")?;
    assert!(!out.status.success(), "a refused password stops topics ensure");
    let refused = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(refused.contains("refused Herald's credentials"), "{refused}");
    let failed = format!("{failed}{refused}");

    let log = herald.log();
    assert!(log.lines().count() > 10, "the debug log has content");
    for (what, text) in [("log", &log), ("admin API", &served), ("failed command", &failed)] {
        assert!(!text.contains(SENTINEL), "a secret reached the {what}");
    }
    drop(herald);
    env.cleanup().await;
    Ok(())
}

/// `herald migrate` with the URL's `sslmode` and `database.tls_ca_file` in its environment.
fn migrate_with(env: &TestEnv, url: &str, ca_file: Option<&str>) -> Result<std::process::Output> {
    let mut cmd = std::process::Command::new(integration_tests::herald_bin());
    cmd.arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env("HERALD_DATABASE__URL", url);
    if let Some(ca) = ca_file {
        cmd.env("HERALD_DATABASE__TLS_CA_FILE", ca);
    }
    Ok(cmd.output()?)
}

/// The command failed, and its error says the server's certificate is why.
fn refused_for_its_certificate(out: &std::process::Output, what: &str) {
    assert!(!out.status.success(), "connected despite {what}");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("certificate"),
        "{what}: the error names the certificate: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_is_used_when_asked_and_the_server_certificate_is_verified() -> Result<()> {
    let env = TestEnv::new("pgtls", "").await?;
    // The local cluster offers TLS with a certificate from its own CA (deploy/local/postgres.sh).
    let ca = integration_tests::workspace_root().join(".local/postgres/tls/ca.crt");
    let ca = ca.to_str().context("CA path")?;
    let sep = if env.db_url.contains('?') { '&' } else { '?' };
    let require = format!("{}{sep}sslmode=require", env.db_url);

    let ok = migrate_with(&env, &require, Some(ca))?;
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));

    // Not trusted without the CA: refused at the handshake, and the message says why.
    refused_for_its_certificate(&migrate_with(&env, &require, None)?, "an untrusted CA");

    // The name is checked too: the same server reached as a name its certificate does not
    // carry (hostaddr: the address to connect to, host: the name to verify).
    let other_name = format!(
        "{}&hostaddr=127.0.0.1",
        require.replacen("@127.0.0.1:", "@db.herald.invalid:", 1)
    );
    refused_for_its_certificate(
        &migrate_with(&env, &other_name, Some(ca))?,
        "a name not in the certificate",
    );

    // herald run with sslmode=require: its connections are encrypted (pg_stat_ssl).
    let _herald = env.spawn_roles(
        "ingest,relay,deliver",
        "tls",
        &[
            ("HERALD_DATABASE__URL", require.as_str()),
            ("HERALD_DATABASE__TLS_CA_FILE", ca),
        ],
    )?;
    seed_orders(&env, &UniqueSeller::new(), &["9301"]).await?;
    env.wait_count(
        "both intents accepted over TLS",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        2,
        WAIT,
    )
    .await?;
    let (tls, plain): (i64, i64) = {
        let row = env
            .db
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                   FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                  WHERE a.datname = current_database() AND a.application_name = 'herald'",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    assert!(tls >= 2, "herald's pool and its LISTEN connection use TLS: {tls}");
    assert_eq!(plain, 0, "no herald connection without TLS");
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_password_comes_from_a_file_and_is_never_shown() -> Result<()> {
    let env = TestEnv::new("pwfile", "").await?;
    let role = format!("herald_pw_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let password = format!("sentinel-pw-{}", uuid::Uuid::new_v4().simple());
    // Members of herald_password_auth must authenticate (deploy/local/postgres.sh's pg_hba).
    env.db
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE herald_password_auth"
        ))
        .await?;
    let granted = std::process::Command::new(integration_tests::herald_bin())
        .arg("--config")
        .arg(&env.config_path)
        .arg("migrate")
        .env("HERALD_DATABASE__RUNTIME_ROLE", &role)
        .output()?;
    assert!(
        granted.status.success(),
        "{}",
        String::from_utf8_lossy(&granted.stderr)
    );
    let url = env
        .db_url
        .replacen("postgres://herald@", &format!("postgres://{role}@"), 1);
    let list = |password_file: Option<&std::path::Path>| -> Result<std::process::Output> {
        let mut cmd = std::process::Command::new(integration_tests::herald_bin());
        cmd.arg("--config")
            .arg(&env.config_path)
            .args(["intent", "list", "acme", "9999"])
            .env("HERALD_DATABASE__URL", &url);
        if let Some(f) = password_file {
            cmd.env("HERALD_DATABASE__PASSWORD_FILE", f);
        }
        Ok(cmd.output()?)
    };

    let without = list(None)?;
    assert!(!without.status.success(), "the role needs its password");

    let file = env.dir.join("db-password");
    std::fs::write(&file, format!("{password}\n"))?;
    let with = list(Some(&file))?;
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));

    let wrong_secret = format!("sentinel-wrong-{}", uuid::Uuid::new_v4().simple());
    let wrong = env.dir.join("wrong-password");
    std::fs::write(&wrong, &wrong_secret)?;
    let refused = list(Some(&wrong))?;
    assert!(!refused.status.success(), "a wrong password is refused");
    for out in [&without, &with, &refused] {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(&password) && !text.contains(&wrong_secret),
            "a password was printed: {text}"
        );
    }
    env.cleanup().await;
    Ok(())
}
