//! Kafka as managed clusters serve it (issue 41): Herald's whole pipeline through the local
//! broker's SASL_SSL listener, with SCRAM-SHA-512 and with OAUTHBEARER tokens from Herald's
//! own token source (the path MSK IAM takes), and the ways a deployment gets it wrong, each
//! a fast failure that names the broker and the cause.
//!
//! What a user checks: orders in, e-mails out, offsets committed; the broker's own count
//! of the authentications it accepted on that listener (JMX); Herald's connections, from
//! /proc, all to the SASL_SSL port and none to the plaintext one; and no password in the
//! log, even at debug level.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use integration_tests::moto::{emails_to, sms_to};
use integration_tests::samples::UniqueSeller;
use integration_tests::secure_kafka::{
    auth_stats, oauthbearer_env, password, password_file, remote_ports, scram_env, MTLS, MTLS_PORT,
    PLAINTEXT_PORT, SASL_PORT, SASL_SSL, WRONG_HOST,
};
use integration_tests::{herald_bin, seed_orders, HeraldProcess, TestEnv};

const WAIT: Duration = Duration::from_secs(90);
/// How long a refused credential or certificate may take to stop start-up.
const FAST: Duration = Duration::from_secs(15);

fn vars<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn successful_sasl_ssl() -> Result<u64> {
    auth_stats()?
        .get("SASL_SSL")
        .map(|(ok, _)| *ok)
        .context("the broker reports no SASL_SSL listener (`deploy/local/kafka.sh auth-stats`)")
}

/// Orders seeded through the test's own (plaintext) producer are delivered by a herald
/// whose every client goes through SASL_SSL; its committed offsets reach the ends.
async fn deliver_three(env: &TestEnv, herald: &HeraldProcess, first: u32) -> Result<()> {
    let seller = UniqueSeller::new();
    let orders: Vec<String> = (first..first + 3).map(|n| n.to_string()).collect();
    let order_refs: Vec<&str> = orders.iter().map(String::as_str).collect();
    seed_orders(env, &seller, &order_refs).await?;
    env.wait_count(
        "three orders accepted on both channels",
        "SELECT count(*) FROM notification_intents WHERE state = 'accepted'",
        6,
        WAIT,
    )
    .await
    .with_context(|| format!("herald's log:\n{}", herald.log()))?;
    ensure!(emails_to(&seller.email).await?.len() == 3, "three e-mails");
    ensure!(sms_to(&seller.phone).await?.len() == 3, "three SMS");
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"])
        .await?;
    Ok(())
}

/// Herald's connections to the local brokers: some to SASL_SSL, none to plaintext.
fn expect_only_sasl_ssl(herald: &HeraldProcess) -> Result<()> {
    let ports = remote_ports(herald.pid().context("herald runs")?)?;
    ensure!(ports.contains(&SASL_PORT), "connected to {SASL_PORT}: {ports:?}");
    ensure!(
        !ports.contains(&PLAINTEXT_PORT),
        "no connection to plaintext {PLAINTEXT_PORT}: {ports:?}"
    );
    Ok(())
}

/// The shipped `config/local-sasl.toml` as it is (its `[kafka]`, `[kafka.tls]` and
/// `[kafka.sasl]`), in this test's namespace: its database, topic prefix and ports.
fn shipped_sasl_config(env: &TestEnv) -> Vec<(&'static str, String)> {
    vec![
        ("HERALD_DATABASE__URL", env.db_url.clone()),
        ("HERALD_KAFKA__TOPIC_PREFIX", env.prefix.clone()),
        ("HERALD_KAFKA__CONSUMER_SESSION_TIMEOUT_MS", "10000".to_owned()),
        ("HERALD_ADMIN__LISTEN", "127.0.0.1:0".to_owned()),
        ("HERALD_HTTP_INGEST__LISTEN", String::new()),
        ("HERALD_TELEMETRY__TRACES_ENDPOINT", String::new()),
        ("HERALD_LOG__FORMAT", "json".to_owned()),
        ("HERALD_LOG__LEVEL", "debug".to_owned()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_through_sasl_ssl_with_scram_authenticated_and_never_plaintext() -> Result<()> {
    let env = TestEnv::new("sasl_scram", "").await?;
    let secret = password()?;
    let before = successful_sasl_ssl()?;
    let config = integration_tests::workspace_root().join("config/local-sasl.toml");
    let mut herald = env.launcher().spawn_with(
        &config,
        "ingest,relay,deliver",
        "herald",
        &vars(&shipped_sasl_config(&env)),
    )?;
    deliver_three(&env, &herald, 7101).await?;
    expect_only_sasl_ssl(&herald)?;
    // Herald's clients (the start-up check, readiness, the ingest and delivery consumers,
    // the relay and dead-letter producers) each authenticated at least once.
    let after = successful_sasl_ssl()?;
    ensure!(
        after >= before + 6,
        "SASL_SSL authentications {before} -> {after}"
    );
    let log = herald.log();
    ensure!(
        log.contains("Kafka answered") && log.contains("sasl_ssl"),
        "the start-up check passed"
    );
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    ensure!(
        !herald.log().contains(&secret),
        "the password never reaches the debug log"
    );
    env.cleanup().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_gets_its_oauthbearer_token_the_admin_and_metadata_ones_included() -> Result<()> {
    let env = TestEnv::new("sasl_oauth", "").await?;
    let oauth = oauthbearer_env();
    let before = successful_sasl_ssl()?;
    // The admin client (topics ensure: rust-rdkafka never polls it) and a metadata-only
    // reader (lag) through OAUTHBEARER, before and beside the daemon.
    let ensure = herald_command(&env, &oauth, &["topics", "ensure"])?;
    ensure!(
        ensure.status.success(),
        "topics ensure through OAUTHBEARER: {}",
        output_text(&ensure)
    );
    let mut herald = env.spawn_roles("ingest,relay,deliver", "herald", &vars(&oauth))?;
    deliver_three(&env, &herald, 7201).await?;
    expect_only_sasl_ssl(&herald)?;
    let lag = herald_command(&env, &oauth, &["lag"])?;
    ensure!(
        lag.status.success(),
        "herald lag through OAUTHBEARER: {}",
        output_text(&lag)
    );
    ensure!(
        String::from_utf8_lossy(&lag.stdout).contains(&env.topic("order-events")),
        "lag lists the topics: {}",
        output_text(&lag)
    );
    let after = successful_sasl_ssl()?;
    ensure!(
        after >= before + 8,
        "SASL_SSL authentications {before} -> {after}"
    );
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}

fn herald_command(env: &TestEnv, vars: &[(&str, String)], args: &[&str]) -> Result<std::process::Output> {
    let mut cmd = Command::new(herald_bin());
    cmd.arg("--config")
        .arg(&env.config_path)
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().context("running herald")
}

fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `herald run` with `vars`: it must exit non-zero within [`FAST`], its error naming
/// `expected` (each of them). Returns how long it took, and its output.
fn run_must_fail_fast(
    env: &TestEnv,
    vars: &[(&str, String)],
    expected: &[&str],
) -> Result<(Duration, String)> {
    let started = Instant::now();
    let mut cmd = Command::new(herald_bin());
    cmd.arg("--config")
        .arg(&env.config_path)
        .args(["run", "--roles", "ingest,relay,deliver"])
        .env("HERALD_LOG__LEVEL", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn()?;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > FAST * 2 {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    let out = child.wait_with_output()?;
    let text = output_text(&out);
    ensure!(!out.status.success(), "herald run must stop: {text}");
    ensure!(took < FAST, "stopped after {took:?}, not within {FAST:?}: {text}");
    let error = text
        .lines()
        .find(|l| l.starts_with("herald: "))
        .with_context(|| format!("no `herald: ` error line: {text}"))?;
    for e in expected {
        ensure!(error.contains(e), "the error names {e:?}: {error}");
    }
    Ok((took, text))
}

fn with(base: &[(&'static str, String)], changes: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = base
        .iter()
        .filter(|(k, _)| !changes.iter().any(|(c, _)| c == k))
        .cloned()
        .collect();
    v.extend(changes.iter().cloned());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_ca_or_host_stops_start_up_within_seconds_naming_the_broker_and_the_cause(
) -> Result<()> {
    let env = TestEnv::new("sasl_refused", "").await?;
    let scram = scram_env();
    let sentinel = format!("sentinel-kafka-{}", uuid::Uuid::new_v4().simple());
    let failed_before = auth_stats()?.get("SASL_SSL").map_or(0, |(_, f)| *f);

    // A wrong password, from the environment: refused by the broker, named, never printed.
    let (took, text) = run_must_fail_fast(
        &env,
        &with(&scram, &[("HERALD_KAFKA__SASL__PASSWORD", sentinel.clone())])
            .into_iter()
            .filter(|(k, _)| *k != "HERALD_KAFKA__SASL__PASSWORD_FILE")
            .collect::<Vec<_>>(),
        &[SASL_SSL, "refused Herald's credentials", "SCRAM-SHA-512"],
    )?;
    ensure!(
        !text.contains(&sentinel),
        "the wrong password is never printed: {text}"
    );
    let failed_after = auth_stats()?.get("SASL_SSL").map_or(0, |(_, f)| *f);
    ensure!(
        failed_after > failed_before,
        "the broker counted the refusal: {failed_before} -> {failed_after}"
    );
    eprintln!("wrong password: stopped after {took:?}");

    // A CA that did not sign the broker's certificate (the local PostgreSQL's).
    let other_ca = integration_tests::local_dir().join("postgres/tls/ca.crt");
    let (took, _) = run_must_fail_fast(
        &env,
        &with(
            &scram,
            &[("HERALD_KAFKA__TLS__CA_FILE", other_ca.display().to_string())],
        ),
        &[
            SASL_SSL,
            "could not be reached over TLS",
            "UnknownIssuer",
            "certificate verify failed",
        ],
    )?;
    eprintln!("untrusted CA: stopped after {took:?}");

    // A certificate for another host (signed by the trusted CA).
    let (took, _) = run_must_fail_fast(
        &env,
        &with(&scram, &[("HERALD_KAFKA__BROKERS", WRONG_HOST.to_owned())]),
        &[
            WRONG_HOST,
            "could not be reached over TLS",
            "not valid for name \"127.0.0.1\"",
            "kafka.wrong-host.invalid",
        ],
    )?;
    eprintln!("certificate for another host: stopped after {took:?}");

    // TLS expected where the listener speaks plain TCP: a connection closed in the
    // handshake, as a restarting broker closes one too, so only once it keeps happening.
    let (took, _) = run_must_fail_fast(
        &env,
        &with(
            &scram,
            &[("HERALD_KAFKA__BROKERS", integration_tests::BROKERS.to_owned())],
        ),
        &[
            integration_tests::BROKERS,
            "closes every connection as a listener of another protocol would",
            "kafka.security_protocol",
        ],
    )?;
    eprintln!("TLS against a plaintext listener: stopped after {took:?}");

    // Canary: the same checks with everything right do not stop it.
    let password_file = password_file().display().to_string();
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "right",
        &vars(&with(
            &scram,
            &[("HERALD_KAFKA__SASL__PASSWORD_FILE", password_file)],
        )),
    )?;
    herald
        .wait_log("the start-up check passed", WAIT, |l| {
            l.contains("Kafka answered")
        })
        .await?;
    ensure!(herald.is_running(), "right settings keep it running");
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    env.cleanup().await;
    Ok(())
}

/// `kafka.sh client-cert NAME`: a client certificate and key signed by the local CA.
fn client_cert(name: &str) -> Result<(String, String)> {
    let out = Command::new(integration_tests::workspace_root().join("deploy/local/kafka.sh"))
        .args(["client-cert", name])
        .output()?;
    ensure!(
        out.status.success(),
        "kafka.sh client-cert: {}",
        output_text(&out)
    );
    let dir = integration_tests::local_dir().join("kafka/tls");
    Ok((
        dir.join(format!("{name}.crt")).display().to_string(),
        dir.join(format!("{name}.key")).display().to_string(),
    ))
}

/// A self-signed certificate and key (openssl), which the broker's CA never signed.
fn self_signed(dir: &std::path::Path) -> Result<(String, String)> {
    let (crt, key) = (dir.join("rogue.crt"), dir.join("rogue.key"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=rogue",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .context("openssl (deploy/local/kafka.sh installs it)")?;
    ensure!(out.status.success(), "openssl req: {}", output_text(&out));
    Ok((crt.display().to_string(), key.display().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_certificate_the_ca_signed_works_and_without_one_start_up_stops() -> Result<()> {
    let env = TestEnv::new("mtls", "").await?;
    let mtls = |cert: Option<(String, String)>| {
        let mut v: Vec<(&'static str, String)> = vec![
            ("HERALD_KAFKA__BROKERS", MTLS.to_owned()),
            ("HERALD_KAFKA__SECURITY_PROTOCOL", "ssl".to_owned()),
            (
                "HERALD_KAFKA__TLS__CA_FILE",
                integration_tests::secure_kafka::ca_file().display().to_string(),
            ),
        ];
        if let Some((crt, key)) = cert {
            v.extend([
                ("HERALD_KAFKA__TLS__CERT_FILE", crt),
                ("HERALD_KAFKA__TLS__KEY_FILE", key),
            ]);
        }
        v
    };
    let count = || -> Result<u64> { Ok(auth_stats()?.get("MTLS").map_or(0, |(ok, _)| *ok)) };
    let before = count()?;
    // A client certificate the local CA signed: the whole pipeline through it.
    let mut herald = env.spawn_roles(
        "ingest,relay,deliver",
        "mtls",
        &vars(&mtls(Some(client_cert("herald-it")?))),
    )?;
    deliver_three(&env, &herald, 7301).await?;
    let ports = remote_ports(herald.pid().context("herald runs")?)?;
    ensure!(
        ports.contains(&MTLS_PORT) && !ports.contains(&PLAINTEXT_PORT),
        "connected to {MTLS_PORT} only: {ports:?}"
    );
    ensure!(herald.terminate(WAIT).await?.success(), "SIGTERM exits 0");
    let after = count()?;
    ensure!(
        after > before,
        "the broker counted the certificate logins: {before} -> {after}"
    );
    // No certificate, and one the CA did not sign (librdkafka sends only a certificate
    // whose issuer the broker names): refused at the handshake, named at once.
    let (took, _) = run_must_fail_fast(&env, &mtls(None), &[MTLS, "could not be reached over TLS"])?;
    eprintln!("no client certificate: stopped after {took:?}");
    let (took, _) = run_must_fail_fast(
        &env,
        &mtls(Some(self_signed(&env.dir)?)),
        &[MTLS, "could not be reached over TLS"],
    )?;
    eprintln!("a client certificate the CA did not sign: stopped after {took:?}");
    env.cleanup().await;
    Ok(())
}

/// The commands that make no Kafka client (the migration Job, retention, the ledger's)
/// neither read the Kafka secrets nor need their files mounted; those that do name the
/// missing file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_commands_that_use_kafka_read_its_secrets() -> Result<()> {
    let env = TestEnv::new("kafka_secret_absent", "").await?;
    let absent = with(
        &scram_env(),
        &[(
            "HERALD_KAFKA__SASL__PASSWORD_FILE",
            "/nonexistent/kafka-password".to_owned(),
        )],
    );
    for args in [
        &["migrate"][..],
        &["intent", "list", "acme", "1"],
        &["retention", "run", "--dry-run"],
    ] {
        let out = herald_command(&env, &absent, args)?;
        ensure!(
            out.status.success(),
            "herald {}: {}",
            args.join(" "),
            output_text(&out)
        );
    }
    for args in [&["topics", "ensure"][..], &["lag"]] {
        let out = herald_command(&env, &absent, args)?;
        let text = output_text(&out);
        ensure!(
            !out.status.success(),
            "herald {} without its password file",
            args.join(" ")
        );
        ensure!(
            text.contains("kafka.sasl.password_file /nonexistent/kafka-password"),
            "herald {} names the file: {text}",
            args.join(" ")
        );
    }
    env.cleanup().await;
    Ok(())
}
