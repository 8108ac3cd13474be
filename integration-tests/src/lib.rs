//! Harness for end-to-end tests against the real local stack (`make stack-up`): each test
//! gets its own PostgreSQL database and its own Kafka topic prefix, so tests run in
//! parallel without seeing each other, and drives the real `herald` binary as a child
//! process.
//!
//! Tests assert what a user would check: rows in PostgreSQL, messages on the dead-letter
//! topic, committed offsets. They wait for conditions with a deadline, never sleep and hope.

pub mod history;
pub mod http;
pub mod kafka;
pub mod mixed;
pub mod moto;
pub mod otlp;
pub mod samples;
pub mod secure_kafka;
pub mod segments;
pub mod ses_events;
pub mod sns_signer;
pub mod standin;
pub mod toxiproxy;
pub mod trace_ui;

/// The admin token of every test's configuration (a test may set its own with
/// `HERALD_ADMIN__TOKEN`).
pub const ADMIN_TOKEN: &str = "it-admin-token-0123456789abcdef0123456789";

/// The suppression list's digest key of every test's configuration (`suppression.key`).
pub const SUPPRESSION_KEY: &str = "it-suppression-key-0123456789abcdef0123";

/// [`SUPPRESSION_KEY`] as Herald holds it: what a test computes a keyed digest with.
pub fn destination_key() -> herald_store::destination::DestinationKey {
    herald_store::destination::DestinationKey::new(SUPPRESSION_KEY.as_bytes()).expect("a long enough key")
}

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::producer::FutureProducer;
use tokio_postgres::{Client, NoTls};

/// The single local broker: every test's cluster.
pub const BROKERS: &str = "127.0.0.1:19092";
/// The three-node cluster of the broker fault scenarios (deploy/local/kafka-cluster.sh).
pub const CLUSTER_BROKERS: &str = "127.0.0.1:19192,127.0.0.1:19292,127.0.0.1:19392";

static TARGET: std::sync::RwLock<&'static str> = std::sync::RwLock::new(BROKERS);

/// The cluster this process's test clients and new namespaces use: [`BROKERS`], unless a
/// fault scenario switched to [`CLUSTER_BROKERS`] ([`use_brokers`]).
pub fn brokers() -> &'static str {
    *TARGET.read().unwrap_or_else(|e| e.into_inner())
}

/// Switches this process's test clients and the namespaces made from now on to `brokers`
/// (herald-chaos runs one scenario at a time; the test binaries never switch).
pub fn use_brokers(brokers: &'static str) {
    *TARGET.write().unwrap_or_else(|e| e.into_inner()) = brokers;
}

/// Replicas per topic on the current cluster: one per broker, up to three.
pub fn replication() -> i32 {
    (brokers().split(',').count() as i32).min(3)
}
pub const PG_ADMIN_URL: &str = "postgres://herald@127.0.0.1:15432/herald";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The local stack's directory: `HERALD_LOCAL_DIR` as deploy/local/lib.sh reads it, or
/// `.local` in the workspace.
pub fn local_dir() -> PathBuf {
    std::env::var_os("HERALD_LOCAL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".local"))
}

/// The herald binary under test: `HERALD_BIN`, or the workspace's debug build.
pub fn herald_bin() -> PathBuf {
    std::env::var_os("HERALD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/debug/herald"))
}

/// Connects to a database of the local stack.
pub async fn pg_connect(url: &str) -> Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url} (is the local stack up? `make stack-up`)"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Polls `check` until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The partition counts of a test namespace's topics (unprefixed names), as its
/// configuration gives them to `herald topics ensure`.
pub const PARTITIONS: [(&str, i32); 4] = [
    ("order-events", 3),
    ("seller-profiles", 2),
    ("herald.deliveries", 2),
    ("herald.dead-letter", 1),
];

fn partitions(topic: &str) -> i32 {
    PARTITIONS
        .iter()
        .find(|(t, _)| *t == topic)
        .map_or(1, |(_, n)| *n)
}

/// Variations of the generated configuration.
pub struct EnvOptions {
    /// Where herald sends SES/SNS calls (moto, or a fault proxy in front of it).
    pub aws_endpoint: Option<String>,
    /// "hold" or "retry".
    pub on_unknown: &'static str,
    /// Topic configs (unprefixed topic, key, value), e.g. `max.message.bytes`: each topic
    /// named here is created with them (and its usual partitions) before `herald topics
    /// ensure`, which then leaves it as it is.
    pub topic_configs: Vec<(&'static str, &'static str, String)>,
    /// The `order.created` route's mode: "deliver" or "observe" ([`TestEnv::set_route`]
    /// changes the route for processes started afterwards).
    pub route_mode: &'static str,
    /// Which PostgreSQL Herald reaches, and how.
    pub database: Database,
    /// More `[database]` keys (`key = value` lines), for the whole test's processes.
    pub database_extra: &'static str,
}

/// Where a test's database lives and how Herald reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// The stack's PostgreSQL, directly (127.0.0.1:15432).
    Direct,
    /// The stack's PostgreSQL through PgBouncer in transaction mode (127.0.0.1:16432,
    /// deploy/local/pgbouncer.sh), with `database.pooler` = `pooler` and, if `session`, a
    /// direct `database.session_url` (else a direct `owner_url` for migrations, and the
    /// relay polls).
    PgBouncer { pooler: &'static str, session: bool },
    /// The primary and standby of deploy/local/postgres-ha.sh (127.0.0.1:15442 first, then
    /// 15443), found by `target_session_attrs=read-write`.
    HighlyAvailable,
}

/// PgBouncer's port (deploy/local/pgbouncer.sh).
pub const PGBOUNCER_PORT: u16 = 16432;
/// The nodes of deploy/local/postgres-ha.sh, in the order Herald's URL lists them.
pub const HA_PORTS: [u16; 2] = [15442, 15443];

impl Database {
    /// The server a test's database is created on.
    fn admin_url(self) -> String {
        match self {
            Database::Direct | Database::PgBouncer { .. } => PG_ADMIN_URL.to_owned(),
            Database::HighlyAvailable => ha_url("herald"),
        }
    }

    /// Herald's `database.url`, and the other lines of its `[database]`.
    fn herald_settings(self, database: &str) -> (String, String) {
        let direct = format!("postgres://herald@127.0.0.1:15432/{database}");
        match self {
            Database::Direct => (direct, String::new()),
            Database::PgBouncer { pooler, session } => {
                let extra = if session {
                    format!("pooler = \"{pooler}\"\nsession_url = \"{direct}\"\n")
                } else {
                    format!("pooler = \"{pooler}\"\nowner_url = \"{direct}\"\n")
                };
                (
                    format!("postgres://herald@127.0.0.1:{PGBOUNCER_PORT}/{database}"),
                    extra,
                )
            }
            Database::HighlyAvailable => (ha_url(database), String::new()),
        }
    }
}

/// A URL naming both nodes of the HA pair, asking for the writable one.
pub fn ha_url(database: &str) -> String {
    format!(
        "postgres://herald@127.0.0.1:{},127.0.0.1:{}/{database}?target_session_attrs=read-write",
        HA_PORTS[0], HA_PORTS[1]
    )
}

impl Default for EnvOptions {
    fn default() -> Self {
        Self {
            aws_endpoint: None,
            on_unknown: "hold",
            topic_configs: Vec::new(),
            route_mode: "deliver",
            database: Database::Direct,
            database_extra: "",
        }
    }
}

/// The `order.created` route's settings in the generated config, between markers that
/// [`TestEnv::set_route`] finds.
const ROUTE_BEGIN: &str = "# order.created route settings (TestEnv::set_route)\n";
const ROUTE_END: &str = "# end of route settings\n";

/// One test's isolated world: a fresh database, a topic prefix, a config file.
pub struct TestEnv {
    pub name: String,
    pub prefix: String,
    pub database: String,
    /// Where the database was created (and is dropped).
    admin_url: String,
    /// The test's own connections to its database (directly, or to the current primary).
    pub db_url: String,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub db: Client,
}

impl TestEnv {
    /// Creates the database and topics, migrates, and publishes the sample templates.
    /// `extra_toml` is appended to the generated configuration.
    pub async fn new(name: &str, extra_toml: &str) -> Result<Self> {
        Self::with_options(name, extra_toml, EnvOptions::default()).await
    }

    pub async fn with_options(name: &str, extra_toml: &str, options: EnvOptions) -> Result<Self> {
        let aws_endpoint = options
            .aws_endpoint
            .unwrap_or_else(|| format!("http://{}", moto::MOTO));
        let on_unknown = options.on_unknown;
        let route_settings = format!("{ROUTE_BEGIN}mode = \"{}\"\n{ROUTE_END}", options.route_mode);
        let unique = format!("{}_{}", name, &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let database = format!("herald_it_{unique}");
        let prefix = format!("it-{}-", unique.replace('_', "-"));
        let admin = pg_connect(&options.database.admin_url()).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .await
            .with_context(|| format!("creating database {database}"))?;
        let (herald_url, mut database_settings) = options.database.herald_settings(&database);
        database_settings.push_str(options.database_extra);
        let db_url = match options.database {
            Database::HighlyAvailable => ha_url(&database),
            _ => format!("postgres://herald@127.0.0.1:15432/{database}"),
        };
        let dir = workspace_root().join("target/it").join(&unique);
        std::fs::create_dir_all(&dir)?;
        let config_path = dir.join("herald.toml");
        let (brokers, replication) = (brokers(), replication());
        let config = format!(
            r#"[log]
format = "json"
level = "info"

# An ephemeral port per process; HeraldProcess::admin_url reads it from the log. The
# token every /v1 request needs (http::admin_request sends it).
[admin]
listen = "127.0.0.1:0"
token = "{ADMIN_TOKEN}"

[suppression]
key = "{SUPPRESSION_KEY}"

[database]
url = "{herald_url}"
pool_size = 4
attempt_partitions_ahead = 1
{database_settings}
[kafka]
brokers = "{brokers}"
topic_prefix = "{prefix}"
replication_factor = {replication}
# Tests kill consumers and start replacements, which wait for the dead member's session
# to end: shorter than the production default (45 s) so they wait less.
consumer_session_timeout_ms = 10000

[kafka.partitions]
order_events = {}
seller_profiles = {}
deliveries = {}
dead_letter = {}

[ingest]
batch_max_messages = 200
batch_linger_ms = 20
max_message_bytes = 8192

[relay]
poll_interval_ms = 200

[aws]
region = "us-east-1"
endpoint_url = "{aws_endpoint}"
access_key_id = "testing"
secret_access_key = "testing"
connect_timeout_ms = 500
attempt_timeout_ms = 2000

[delivery]
lease_secs = 10
sweep_interval_ms = 500
drain_timeout_ms = 5000

[channels.email]
sender = "notifications@herald.example"
base_backoff_ms = 200
max_backoff_ms = 1000
on_unknown = "{on_unknown}"
rate_per_second = 200

[channels.sms]
base_backoff_ms = 200
max_backoff_ms = 1000
on_unknown = "{on_unknown}"
rate_per_second = 200

[[routes]]
event_kind = "order.created"
template = "order_created"
channels = ["email", "sms"]
{route_settings}
{extra_toml}
"#,
            partitions("order-events"),
            partitions("seller-profiles"),
            partitions("herald.deliveries"),
            partitions("herald.dead-letter"),
        );
        std::fs::write(&config_path, config)?;
        let db = pg_connect(&db_url).await?;
        let env = Self {
            name: name.to_owned(),
            prefix,
            database,
            admin_url: options.database.admin_url(),
            db_url,
            dir,
            config_path,
            db,
        };
        env.herald(&["migrate"])?;
        env.create_topics_with(&options.topic_configs).await?;
        env.herald(&["topics", "ensure"])?;
        env.publish_sample_templates()?;
        Ok(env)
    }

    /// A test's world whose SES and SNS calls go through a toxiproxy proxy of its own in
    /// front of moto (for network faults), with `on_unknown` for both channels.
    pub async fn behind_proxy(
        name: &str,
        extra_toml: &str,
        on_unknown: &'static str,
    ) -> Result<(Self, toxiproxy::Proxy)> {
        let proxy = toxiproxy::Proxy::create(
            &format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            moto::MOTO,
        )
        .await?;
        let env = Self::with_options(
            name,
            extra_toml,
            EnvOptions {
                aws_endpoint: Some(proxy.url()),
                on_unknown,
                ..EnvOptions::default()
            },
        )
        .await?;
        Ok((env, proxy))
    }

    /// Creates each topic named in `configs` with its configs, as `herald topics ensure`
    /// would (partitions, `min.insync.replicas`, compaction of seller profiles) plus these.
    async fn create_topics_with(&self, configs: &[(&'static str, &'static str, String)]) -> Result<()> {
        let mut topics: Vec<&str> = configs.iter().map(|(t, _, _)| *t).collect();
        topics.sort_unstable();
        topics.dedup();
        for topic in topics {
            let mut settings: Vec<(&str, &str)> = vec![("min.insync.replicas", "1")];
            if topic == "seller-profiles" {
                settings.push(("cleanup.policy", "compact"));
            }
            settings.extend(
                configs
                    .iter()
                    .filter(|(t, _, _)| *t == topic)
                    .map(|(_, k, v)| (*k, v.as_str())),
            );
            kafka::create_topic(&self.topic(topic), partitions(topic), &settings).await?;
        }
        Ok(())
    }

    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Rewrites the `order.created` route's settings (`mode`, `deliver_from`: TOML lines) in
    /// the config file: processes started afterwards read them (an operator's config change
    /// and restart).
    pub fn set_route(&self, settings: &str) -> Result<()> {
        let config = std::fs::read_to_string(&self.config_path)?;
        let (head, rest) = config
            .split_once(ROUTE_BEGIN)
            .context("the generated config has no route settings")?;
        let (_, tail) = rest
            .split_once(ROUTE_END)
            .context("the generated config's route settings do not end")?;
        std::fs::write(
            &self.config_path,
            format!("{head}{ROUTE_BEGIN}{}\n{ROUTE_END}{tail}", settings.trim_end()),
        )?;
        Ok(())
    }

    pub fn group(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Runs a herald command to completion; fails with its output when it fails.
    pub fn herald(&self, args: &[&str]) -> Result<String> {
        let out = self.herald_output(args)?;
        if !out.status.success() {
            bail!(
                "herald {} failed ({}):\n{}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn herald_output(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(herald_bin())
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .output()
            .with_context(|| format!("running {} (built? `make build`)", herald_bin().display()))
    }

    /// Publishes the templates of config/templates/manifest.tsv, active.
    pub fn publish_sample_templates(&self) -> Result<()> {
        let dir = workspace_root().join("config/templates");
        let manifest = std::fs::read_to_string(dir.join("manifest.tsv"))?;
        for line in manifest.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let f: Vec<&str> = line.split('\t').collect();
            let body = dir.join(f[5]);
            let html = dir.join(f[6]);
            let mut args = vec![
                "template",
                "publish",
                "--template",
                f[0],
                "--channel",
                f[1],
                "--locale",
                f[2],
                "--revision",
                f[3],
                "--body-file",
                body.to_str().unwrap(),
                "--activate",
            ];
            if f[4] != "-" {
                args.extend(["--subject", f[4]]);
            }
            if f[6] != "-" {
                args.extend(["--html-file", html.to_str().unwrap()]);
            }
            self.herald(&args)?;
        }
        Ok(())
    }

    /// Starts `herald run --roles ingest` with extra environment; killed when dropped.
    pub fn spawn_ingest(&self, label: &str, env: &[(&str, &str)]) -> Result<HeraldProcess> {
        self.spawn_roles("ingest", label, env)
    }

    /// Starts `herald run --roles ROLES` with extra environment; killed when dropped.
    pub fn spawn_roles(&self, roles: &str, label: &str, env: &[(&str, &str)]) -> Result<HeraldProcess> {
        self.launcher().spawn_roles(roles, label, env)
    }

    /// What starting this namespace's herald processes takes, apart from the namespace.
    pub fn launcher(&self) -> Launcher {
        Launcher {
            config_path: self.config_path.clone(),
            dir: self.dir.clone(),
        }
    }

    /// Herald's own store on this test's database, with `pool_size` connections: for tests
    /// that drive Herald's statements directly.
    pub fn store(&self, pool_size: usize) -> Result<herald_store::Store> {
        Ok(herald_store::Store::new(&herald_store::StoreConfig {
            url: self.db_url.clone(),
            pool_size,
            connect_timeout: Duration::from_secs(5),
            tls_ca_file: None,
            password_file: None,
            pooler: herald_store::Pooler::None,
            session_url: None,
            max_connection_age: Duration::from_secs(1800),
            query_timeout: Duration::from_secs(30),
            idle_check_after: herald_store::primary::IDLE_CHECK_AFTER,
            destination_key: Some(destination_key()),
        })?)
    }

    pub async fn count(&self, sql: &str) -> Result<i64> {
        Ok(self.db.query_one(sql, &[]).await?.get(0))
    }

    /// Waits until `sql` (a count) returns `expected`.
    pub async fn wait_count(&self, what: &str, sql: &str, expected: i64, timeout: Duration) -> Result<()> {
        wait_for(what, timeout, || async {
            let n = self.count(sql).await?;
            Ok((n == expected).then_some(()))
        })
        .await
        .with_context(|| format!("{what}: `{sql}` never reached {expected}"))
    }

    /// Waits until consumer group `group` (unprefixed name, e.g. "herald-delivery") has
    /// committed everything on the given (unprefixed) topics.
    pub async fn wait_lag_zero(&self, group: &str, topics: &[&str]) -> Result<()> {
        let group = self.group(group);
        let topics: Vec<String> = topics.iter().map(|t| self.topic(t)).collect();
        wait_for(&format!("{group} lag 0"), Duration::from_secs(90), || async {
            let t: Vec<&str> = topics.iter().map(String::as_str).collect();
            Ok((kafka::committed_lag(&group, &t)? == 0).then_some(()))
        })
        .await
    }

    /// Drops the database (best effort); topics are left to the broker's retention.
    pub async fn cleanup(self) {
        let runtime_role = self.runtime_role_name();
        drop(self.db);
        if let Ok(admin) = pg_connect(&self.admin_url).await {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.database))
                .await;
            // Its privileges went with the database.
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {runtime_role}"))
                .await;
        }
    }

    fn runtime_role_name(&self) -> String {
        format!("{}_rt", self.database)
    }

    /// Creates this namespace's runtime role, migrates granting it (as production does:
    /// `database.runtime_role`), and returns the environment that runs Herald as it:
    /// `HERALD_DATABASE__URL` and no migration at start. The role goes with [`Self::cleanup`].
    pub async fn as_runtime_role(&self) -> Result<[(&'static str, String); 2]> {
        let role = self.runtime_role_name();
        self.db
            .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
            .await?;
        let out = Command::new(herald_bin())
            .arg("--config")
            .arg(&self.config_path)
            .arg("migrate")
            .env("HERALD_DATABASE__RUNTIME_ROLE", &role)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "herald migrate granting {role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok([
            (
                "HERALD_DATABASE__URL",
                self.db_url
                    .replacen("postgres://herald@", &format!("postgres://{role}@"), 1),
            ),
            ("HERALD_DATABASE__MIGRATE_ON_START", "false".to_owned()),
        ])
    }
}

/// Starts `herald run` processes with one namespace's configuration, logging to its
/// directory.
#[derive(Clone)]
pub struct Launcher {
    config_path: PathBuf,
    dir: PathBuf,
}

impl Launcher {
    /// Starts `herald run --roles ROLES` with extra environment; killed when dropped.
    pub fn spawn_roles(&self, roles: &str, label: &str, env: &[(&str, &str)]) -> Result<HeraldProcess> {
        self.spawn_with(&self.config_path, roles, label, env)
    }

    /// Starts `herald --config CONFIG run --roles ROLES` from the workspace's root (where a
    /// shipped configuration's relative paths point), with extra environment (this
    /// namespace's database and topic prefix, for one); killed when dropped.
    pub fn spawn_with(
        &self,
        config: &Path,
        roles: &str,
        label: &str,
        env: &[(&str, &str)],
    ) -> Result<HeraldProcess> {
        let log_path = self.dir.join(format!("{label}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(herald_bin());
        cmd.current_dir(workspace_root())
            .arg("--config")
            .arg(config)
            .args(["run", "--roles", roles])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("spawning herald run")?;
        Ok(HeraldProcess {
            child: Some(child),
            log_path,
        })
    }
}

/// A running herald child process. Dropping it kills it (SIGKILL) so a failing test leaves
/// nothing behind.
pub struct HeraldProcess {
    child: Option<Child>,
    pub log_path: PathBuf,
}

impl HeraldProcess {
    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// SIGTERM and wait for a clean exit; returns its exit status.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let Some(mut c) = self.child.take() else {
            bail!("process already stopped");
        };
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = c.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                bail!(
                    "herald did not exit within {timeout:?} of SIGTERM; log: {}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits until a line of the process's log satisfies `pred`.
    pub async fn wait_log(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> Result<()> {
        wait_for(what, timeout, || async {
            Ok(self.log().lines().any(&pred).then_some(()))
        })
        .await
        .with_context(|| format!("log {}:\n{}", self.log_path.display(), self.log()))
    }

    /// Waits until the consumer group gave this instance at least one partition.
    pub async fn wait_partitions_assigned(&self, timeout: Duration) -> Result<()> {
        self.wait_log("partitions assigned to this instance", timeout, |l| {
            l.contains("partitions assigned") && !l.contains("\"partitions\":\"\"")
        })
        .await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// How many of the log's lines hold each of `needles`, read line by line (a process
    /// that logged in a loop may have left gigabytes).
    pub fn count_in_log<const N: usize>(&self, needles: [&str; N]) -> Result<[usize; N]> {
        use std::io::BufRead;
        let mut counts = [0; N];
        let file = std::fs::File::open(&self.log_path)?;
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            for (count, needle) in counts.iter_mut().zip(needles) {
                *count += usize::from(line.contains(needle));
            }
        }
        Ok(counts)
    }

    /// `127.0.0.1:PORT` of this process's admin endpoint (an ephemeral port, read from its
    /// "admin endpoint listening" log line).
    pub async fn admin_addr(&self, timeout: Duration) -> Result<String> {
        self.listening("admin endpoint listening", timeout).await
    }

    /// `127.0.0.1:PORT` of this process's HTTP ingest listener (`[http_ingest] listen =
    /// "127.0.0.1:0"`), read from its "HTTP ingest listening" log line.
    pub async fn http_ingest_addr(&self, timeout: Duration) -> Result<String> {
        self.listening("HTTP ingest listening", timeout).await
    }

    /// `127.0.0.1:PORT` of this process's probe listener (`admin.probe_listen =
    /// "127.0.0.1:0"`).
    pub async fn probe_addr(&self, timeout: Duration) -> Result<String> {
        self.listening("probe endpoint listening", timeout).await
    }

    async fn listening(&self, message: &str, timeout: Duration) -> Result<String> {
        wait_for(message, timeout, || async {
            Ok(self.log().lines().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["message"] == message)
                    .then(|| v["listen"].as_str().map(str::to_owned))
                    .flatten()
            }))
        })
        .await
        .with_context(|| format!("log {}:\n{}", self.log_path.display(), self.log()))
    }
}

impl Drop for HeraldProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Produces one seller profile on the env's `seller-profiles`, keyed as Herald expects.
pub async fn produce_seller(env: &TestEnv, p: &FutureProducer, profile: &samples::Seller<'_>) -> Result<()> {
    kafka::produce(
        p,
        &env.topic("seller-profiles"),
        Some(&profile.key()),
        Some(&profile.value()),
        &[],
    )
    .await?;
    Ok(())
}

/// Produces one `order.created` event of `acme` ([`samples::order_event`]) on the env's
/// `order-events`, keyed by its order id.
pub async fn produce_order(
    env: &TestEnv,
    p: &FutureProducer,
    event_id: &str,
    order: &str,
    seller: &str,
    total: &str,
) -> Result<()> {
    let value = samples::order_event(event_id, "order.created", "acme", order, seller, total);
    kafka::produce(
        p,
        &env.topic("order-events"),
        Some(order.as_bytes()),
        Some(&value),
        &[],
    )
    .await?;
    Ok(())
}

/// Produces the seller profiles and waits until they are all stored (needs an ingest role
/// running, and a namespace with no other sellers).
pub async fn publish_sellers(env: &TestEnv, profiles: &[samples::Seller<'_>]) -> Result<()> {
    let p = kafka::producer()?;
    for profile in profiles {
        produce_seller(env, &p, profile).await?;
    }
    env.wait_count(
        "sellers stored",
        "SELECT count(*) FROM sellers",
        profiles.len() as i64,
        Duration::from_secs(60),
    )
    .await
}

/// Produces `seller` as `acme:seller-1`, waits until it is stored, then produces one
/// `order.created` event per order id (needs an ingest role running).
pub async fn seed_orders(env: &TestEnv, seller: &samples::UniqueSeller, orders: &[&str]) -> Result<()> {
    publish_sellers(env, &[seller.profile("seller-1")]).await?;
    let p = kafka::producer()?;
    for order in orders {
        produce_order(env, &p, &format!("evt-{order}"), order, "seller-1", "12.00").await?;
    }
    Ok(())
}
