//! PostgreSQL as production runs it: a primary that stops taking writes while Herald's
//! connections stay on it, a primary that crashes and a standby promoted in its place, and
//! PgBouncer in transaction mode. The same `herald run` process goes on through each: the
//! orders are all delivered, once, and the ledger on the node that is primary at the end
//! has every intent and attempt Herald acknowledged.
//!
//! The HA pair and PgBouncer are deploy/local/postgres-ha.sh and deploy/local/pgbouncer.sh,
//! started (and reset) here; the tests that use the pair take turns.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use integration_tests::kafka::{committed_lag, producer};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::UniqueSeller;
use integration_tests::{
    ha_url, pg_connect, produce_order, publish_sellers, wait_for, workspace_root, Database, EnvOptions,
    HeraldProcess, TestEnv, HA_PORTS, PG_ADMIN_URL,
};
use tokio_postgres::Client;

const WAIT: Duration = Duration::from_secs(120);

/// One HA pair and one PgBouncer for every test of this file: they take turns (the tests
/// reset the pair and restart PgBouncer).
static SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `deploy/local/{component}.sh args` with `vars` set.
fn script(component: &str, args: &[&str], vars: &[(&str, &str)]) -> Result<()> {
    let path = workspace_root().join(format!("deploy/local/{component}.sh"));
    let out = Command::new(&path)
        .args(args)
        .envs(vars.iter().copied())
        .output()?;
    ensure!(
        out.status.success(),
        "{} {args:?}: {}{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn env_on(name: &str, database: Database) -> Result<TestEnv> {
    TestEnv::with_options(
        name,
        "",
        EnvOptions {
            database,
            ..EnvOptions::default()
        },
    )
    .await
}

/// A connection to whichever node takes writes now.
async fn primary(env: &TestEnv) -> Result<Client> {
    pg_connect(&env.db_url).await
}

async fn count(db: &Client, sql: &str) -> Result<i64> {
    Ok(db.query_one(sql, &[]).await?.get(0))
}

/// Produces orders `from..to` of `seller-1`.
async fn produce_orders(env: &TestEnv, from: usize, to: usize) -> Result<()> {
    let p = producer()?;
    for i in from..to {
        let order = format!("o-{i}");
        produce_order(env, &p, &format!("evt-{order}"), &order, "seller-1", "12.00").await?;
    }
    Ok(())
}

/// Waits until the node that is primary now has `n` accepted intents (an e-mail and an SMS
/// per order), reconnecting as the primary moves.
async fn wait_accepted(env: &TestEnv, n: i64) -> Result<()> {
    wait_for(&format!("{n} intents accepted on the primary"), WAIT, || async {
        let db = primary(env).await?;
        let accepted = count(
            &db,
            "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        )
        .await?;
        Ok((accepted == n).then_some(()))
    })
    .await
}

/// What the provider received against the ledger of the node that is primary now: one
/// e-mail and one SMS per order, each the send of an accepted attempt on record, and every
/// intent accepted once.
async fn check_ledger(env: &TestEnv, seller: &UniqueSeller, orders: usize) -> Result<()> {
    let db = primary(env).await?;
    let intents = count(&db, "SELECT count(*) FROM notification_intents").await?;
    ensure!(
        intents == 2 * orders as i64,
        "{intents} intents for {orders} orders"
    );
    let twice = count(
        &db,
        "SELECT count(*) FROM (SELECT intent_id FROM notification_attempts WHERE outcome = 'accepted'
                                GROUP BY intent_id HAVING count(*) > 1) t",
    )
    .await?;
    ensure!(twice == 0, "{twice} intents with more than one accepted attempt");
    let emails = emails_to(&seller.email).await?;
    let sms = sms_to(&seller.phone).await?;
    ensure!(
        emails.len() == orders && sms.len() == orders,
        "the provider received {} e-mails and {} SMS for {orders} orders",
        emails.len(),
        sms.len()
    );
    let recorded: Vec<String> = db
        .query(
            "SELECT provider_message_id FROM notification_attempts
             WHERE outcome = 'accepted' AND provider_message_id IS NOT NULL",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for m in emails.iter().chain(&sms) {
        // SES messages carry `id`, SMS `message_id` (see integration_tests::moto).
        let id = m
            .get("id")
            .or_else(|| m.get("message_id"))
            .and_then(|v| v.as_str())
            .context("a provider message without an id")?;
        ensure!(
            recorded.iter().any(|r| r == id),
            "the provider's message {id} is the send of no accepted attempt on the primary"
        );
    }
    Ok(())
}

/// Herald's sessions on the HA node at `port` (application_name herald).
async fn herald_sessions_on(port: u16) -> Result<i64> {
    let db = pg_connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await?;
    count(
        &db,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'herald' AND backend_type = 'client backend'",
    )
    .await
}

/// A namespace behind the stack's PgBouncer (started if it is not) and Herald on it.
async fn behind_pgbouncer(
    name: &str,
    pooler: &'static str,
    session: bool,
) -> Result<(TestEnv, UniqueSeller, HeraldProcess)> {
    script("pgbouncer", &["start"], &[])?;
    let env = env_on(name, Database::PgBouncer { pooler, session }).await?;
    let seller = UniqueSeller::new();
    let herald = start(&env, &seller).await?;
    Ok((env, seller, herald))
}

/// A store on `url(database)`, a database of its own made through `admin`, its schema
/// migrated, its connections closed past `max_age`.
async fn store_on(
    admin: &str,
    url: impl Fn(&str) -> String,
    database: &str,
    max_age: Duration,
    idle_check_after: Duration,
) -> Result<herald_store::Store> {
    pg_connect(admin)
        .await?
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await?;
    let store = herald_store::Store::new(&herald_store::StoreConfig {
        url: url(database),
        pool_size: 2,
        connect_timeout: Duration::from_secs(5),
        tls_ca_file: None,
        password_file: None,
        pooler: herald_store::Pooler::None,
        session_url: None,
        max_connection_age: max_age,
        query_timeout: Duration::from_secs(30),
        idle_check_after,
        destination_key: Some(integration_tests::destination_key()),
    })?;
    store.migrate(1, chrono::Utc::now().date_naive(), None).await?;
    Ok(store)
}

/// A store on the HA pair's two-host URL, whose connections are asked whether their node
/// takes writes when last taken more than `idle_check_after` ago.
async fn ha_store(database: &str, idle_check_after: Duration) -> Result<herald_store::Store> {
    store_on(
        &ha_url("herald"),
        ha_url,
        database,
        Duration::from_secs(1800),
        idle_check_after,
    )
    .await
}

/// The backend pids of the sessions named herald on `database` of the stack's cluster.
async fn herald_backends(admin: &Client, database: &str) -> Result<Vec<i32>> {
    Ok(admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'herald' AND datname = $1",
            &[&database],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

async fn start(env: &TestEnv, seller: &UniqueSeller) -> Result<HeraldProcess> {
    start_with(env, seller, &[]).await
}

async fn start_with(env: &TestEnv, seller: &UniqueSeller, vars: &[(&str, &str)]) -> Result<HeraldProcess> {
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", vars)?;
    herald.wait_partitions_assigned(WAIT).await?;
    publish_sellers(env, &[seller.profile("seller-1")]).await?;
    Ok(herald)
}

/// The pool's side of a switchover, statement by statement: the first write on a
/// connection left on the fenced old primary fails as `not_primary` (transient), and the
/// next one, on a new connection that skipped the read-only node, succeeds on the promoted
/// one; no connection of the store is left on the old node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_leaves_a_fenced_primary_after_one_refused_write() -> Result<()> {
    let _servers = SERVERS.lock().await;
    script("postgres-ha", &["reset"], &[])?;
    // No idle check: the write is what finds the node read-only.
    let store = ha_store("herald_pool_switch", Duration::from_secs(3600)).await?;
    // A write through a hot (prepared) statement, and one planned per call.
    store.outbox_published(&[1]).await?;
    store.outbox_due_now(&[1]).await?;
    ensure!(
        herald_sessions_on(HA_PORTS[0]).await? > 0,
        "the pool is on node a"
    );
    script("postgres-ha", &["fence", "a"], &[])?;
    script("postgres-ha", &["promote", "b"], &[])?;
    let refused = store
        .outbox_published(&[1])
        .await
        .expect_err("a write on the fenced node");
    ensure!(
        refused.class() == herald_core::ErrorClass::Transient("not_primary"),
        "{refused:?} is {:?}",
        refused.class()
    );
    on_b_alone(&store).await?;
    script("postgres-ha", &["reset"], &[])?;
    Ok(())
}

/// Writes through the store (a hot statement and one planned per call) succeed, on node b,
/// and no connection of the pool is left on node a.
async fn on_b_alone(store: &herald_store::Store) -> Result<()> {
    store.outbox_published(&[1]).await?;
    store.outbox_due_now(&[1]).await?;
    ensure!(
        herald_sessions_on(HA_PORTS[1]).await? > 0,
        "the pool is on node b"
    );
    wait_for("no session of the pool left on node a", WAIT, || async {
        Ok((herald_sessions_on(HA_PORTS[0]).await? == 0).then_some(()))
    })
    .await
}

/// Pooled connections are replaced past `database.max_connection_age_s`: none stays longer
/// on a node that a DNS name or an endpoint stopped naming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_past_its_maximum_age_is_replaced() -> Result<()> {
    let database = format!(
        "herald_maxage_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let direct = |db: &str| format!("postgres://herald@127.0.0.1:15432/{db}");
    let store = store_on(
        PG_ADMIN_URL,
        direct,
        &database,
        Duration::from_secs(1),
        herald_store::primary::IDLE_CHECK_AFTER,
    )
    .await?;
    let admin = pg_connect(PG_ADMIN_URL).await?;
    store.outbox_due_now(&[1]).await?;
    let first = herald_backends(&admin, &database).await?;
    ensure!(!first.is_empty(), "no pooled session seen");
    wait_for("the pool's connections replaced", WAIT, || async {
        store.outbox_due_now(&[1]).await?;
        let now = herald_backends(&admin, &database).await?;
        Ok((!now.is_empty() && now.iter().all(|p| !first.contains(p))).then_some(()))
    })
    .await?;
    drop(store);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .await?;
    Ok(())
}

/// The idle check's side of a switchover: a connection that sat in the pool while its node
/// was fenced and the standby promoted is asked before use, and the write goes to the
/// promoted node without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_on_a_fenced_primary_is_replaced_before_use() -> Result<()> {
    let _servers = SERVERS.lock().await;
    script("postgres-ha", &["reset"], &[])?;
    // Every connection is asked when taken (the threshold of none).
    let store = ha_store("herald_pool_idle", Duration::ZERO).await?;
    store.outbox_published(&[1]).await?;
    ensure!(
        herald_sessions_on(HA_PORTS[0]).await? > 0,
        "the pool is on node a"
    );
    script("postgres-ha", &["fence", "a"], &[])?;
    script("postgres-ha", &["promote", "b"], &[])?;
    on_b_alone(&store).await?;
    script("postgres-ha", &["reset"], &[])?;
    Ok(())
}

/// A switchover: the old primary fenced read-only (a reload; Herald's pooled connections
/// stay, and their writes fail with 25006), the standby promoted, and the old node still
/// first in Herald's URL. The same process delivers every order after it, and holds no
/// connection to the old node: it dropped every pooled connection made before the first
/// 25006, and new ones skip the read-only node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_with_connections_left_on_the_fenced_old_primary_costs_a_retry() -> Result<()> {
    let _servers = SERVERS.lock().await;
    script("postgres-ha", &["reset"], &[])?;
    let env = env_on("switchover", Database::HighlyAvailable).await?;
    let seller = UniqueSeller::new();
    let mut herald = start(&env, &seller).await?;
    produce_orders(&env, 0, 10).await?;
    wait_accepted(&env, 20).await?;
    ensure!(
        herald_sessions_on(HA_PORTS[0]).await? > 0,
        "Herald's pool is on node a"
    );

    script("postgres-ha", &["fence", "a"], &[])?;
    script("postgres-ha", &["promote", "b"], &[])?;
    produce_orders(&env, 10, 20).await?;
    wait_accepted(&env, 40).await?;
    ensure!(herald.is_running(), "herald exited during the switchover");
    wait_for("no Herald session left on the fenced node", WAIT, || async {
        Ok((herald_sessions_on(HA_PORTS[0]).await? == 0).then_some(()))
    })
    .await?;
    check_ledger(&env, &seller, 20).await?;
    let [not_primary] = herald.count_in_log(["takes no writes"])?;
    ensure!(not_primary > 0, "the pool never noticed the read-only node");
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}

/// A failover: the primary crashes (SIGKILL, no shutdown) under load and the synchronous
/// standby is promoted. Before the crash the standby's WAL receiver is stopped while orders
/// arrive, so that the primary holds commits the standby has not confirmed (as a lagging
/// standby would): none of them was acknowledged to Herald. Every order whose offset Herald
/// committed is an intent on the promoted node, every attempt recorded there matches what
/// the provider received, and nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_loses_no_acknowledged_work_with_synchronous_replication() -> Result<()> {
    let _servers = SERVERS.lock().await;
    script("postgres-ha", &["reset"], &[])?;
    let env = env_on("failover", Database::HighlyAvailable).await?;
    let seller = UniqueSeller::new();
    let mut herald = start(&env, &seller).await?;
    produce_orders(&env, 0, 30).await?;
    wait_for("some intents accepted", WAIT, || async {
        let db = primary(&env).await?;
        Ok((count(
            &db,
            "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        )
        .await?
            >= 10)
            .then_some(()))
    })
    .await?;
    script("postgres-ha", &["crash", "a"], &[])?;
    script("postgres-ha", &["promote", "b"], &[])?;
    produce_orders(&env, 30, 40).await?;
    wait_accepted(&env, 80).await?;
    ensure!(herald.is_running(), "herald exited during the failover");
    check_ledger(&env, &seller, 40).await?;
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}

/// With synchronous replication and the standby gone, every commit on the primary waits
/// for it, and would wait forever: Herald gives up on each after `database.query_timeout_ms`,
/// closes its connection and retries, and once the standby is back every order is
/// delivered once by the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_waiting_for_a_gone_synchronous_standby_is_given_up_and_retried() -> Result<()> {
    let _servers = SERVERS.lock().await;
    script("postgres-ha", &["reset"], &[])?;
    let env = env_on("syncwait", Database::HighlyAvailable).await?;
    let seller = UniqueSeller::new();
    let mut herald = start_with(&env, &seller, &[("HERALD_DATABASE__QUERY_TIMEOUT_MS", "3000")]).await?;
    produce_orders(&env, 0, 5).await?;
    wait_accepted(&env, 10).await?;
    script("postgres-ha", &["stop-node", "b"], &[])?;
    produce_orders(&env, 5, 10).await?;
    herald
        .wait_log("a commit given up", WAIT, |l| l.contains("did not answer within"))
        .await?;
    script("postgres-ha", &["start-node", "b"], &[])?;
    wait_accepted(&env, 20).await?;
    ensure!(herald.is_running(), "herald exited while commits waited");
    check_ledger(&env, &seller, 10).await?;
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}

/// The canary of the failover test: with asynchronous replication and the standby down,
/// the crash loses intents Herald had committed and whose offsets it had committed: those
/// orders are never read again, and never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_asynchronous_replication_a_crash_loses_acknowledged_orders() -> Result<()> {
    let _servers = SERVERS.lock().await;
    let asynchronous = [("PG_HA_SYNC", "off")];
    script("postgres-ha", &["reset"], &asynchronous)?;
    let env = env_on("asyncloss", Database::HighlyAvailable).await?;
    let seller = UniqueSeller::new();
    let mut herald = start(&env, &seller).await?;
    script("postgres-ha", &["stop-node", "b"], &[])?;
    produce_orders(&env, 0, 10).await?;
    // Acknowledged on node a alone: the intents there, the offsets committed.
    wait_accepted(&env, 20).await?;
    let group = env.group("herald-ingest");
    wait_for("ingest offsets committed", WAIT, || async {
        Ok((committed_lag(&group, &[&env.topic("order-events")])? == 0).then_some(()))
    })
    .await?;
    script("postgres-ha", &["crash", "a"], &[])?;
    script("postgres-ha", &["start-node", "b"], &[])?;
    script("postgres-ha", &["promote", "b"], &[])?;
    let db = wait_for("the promoted node", WAIT, || async {
        Ok(Some(primary(&env).await?))
    })
    .await?;
    let intents = count(&db, "SELECT count(*) FROM notification_intents").await?;
    ensure!(
        intents < 20,
        "the crash lost nothing ({intents} intents): this canary shows nothing"
    );
    herald.terminate(Duration::from_secs(30)).await?;
    script("postgres-ha", &["reset"], &[])?;
    env.cleanup().await;
    Ok(())
}

/// Through PgBouncer in transaction mode, with `database.pooler = "transaction"` and a
/// direct session URL for the relay's LISTEN: every order delivered once, and a restart of
/// PgBouncer (every client connection closed) costs a retry. No statement outlived its
/// exchange: PostgreSQL never answered that a prepared statement does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_every_order_is_delivered_once() -> Result<()> {
    let _servers = SERVERS.lock().await;
    let (env, seller, mut herald) = behind_pgbouncer("pooler", "transaction", true).await?;
    produce_orders(&env, 0, 15).await?;
    wait_accepted(&env, 30).await?;
    script("pgbouncer", &["restart"], &[])?;
    produce_orders(&env, 15, 30).await?;
    wait_accepted(&env, 60).await?;
    check_ledger(&env, &seller, 30).await?;
    let [missing, polling] = herald.count_in_log(["prepared statement", "not listening"])?;
    ensure!(missing == 0, "{missing} log lines about prepared statements");
    ensure!(polling == 0, "the relay polls though it has a session URL");
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}

/// Behind a transaction pooler without a session URL (migrations over a direct owner_url),
/// the relay polls the outbox instead of LISTENing, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_without_a_session_the_relay_polls() -> Result<()> {
    let _servers = SERVERS.lock().await;
    let (env, seller, mut herald) = behind_pgbouncer("poolerpoll", "transaction", false).await?;
    produce_orders(&env, 0, 10).await?;
    wait_accepted(&env, 20).await?;
    check_ledger(&env, &seller, 10).await?;
    let [missing, polling] = herald.count_in_log(["prepared statement", "not listening"])?;
    ensure!(missing == 0, "{missing} log lines about prepared statements");
    ensure!(polling == 1, "the relay said {polling} times that it polls");
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}

/// The canary of the pooler tests: Herald's default statements (prepared once per
/// connection) behind the same PgBouncer meet server connections that never saw them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_behind_a_transaction_pooler_fail() -> Result<()> {
    let _servers = SERVERS.lock().await;
    let (env, _seller, mut herald) = behind_pgbouncer("poolercanary", "none", true).await?;
    produce_orders(&env, 0, 10).await?;
    wait_for(
        "a prepared statement missing on its server connection",
        WAIT,
        || async {
            let [missing] = herald.count_in_log(["prepared statement"])?;
            Ok((missing > 0).then_some(()))
        },
    )
    .await?;
    herald.terminate(Duration::from_secs(30)).await?;
    env.cleanup().await;
    Ok(())
}
