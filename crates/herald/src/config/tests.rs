//! What a configuration is refused for, and what each section defaults to.

use chrono::{DateTime, Utc};

use super::routes::RouteMode;
use super::*;

fn load_str(toml: &str) -> anyhow::Result<Config> {
    let c: Config = Figment::from(Toml::string(DEFAULTS))
        .merge(Toml::string(toml))
        .extract()?;
    c.validate()?;
    Ok(c)
}

#[test]
fn shipped_configs_are_valid() {
    for f in ["herald.example.toml", "local.toml", "local-sasl.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config").join(f);
        let text = std::fs::read_to_string(&path).unwrap();
        load_str(&text).unwrap_or_else(|e| panic!("{f}: {e:#}"));
    }
}

#[test]
fn a_bad_value_names_its_key() {
    let e = load_str("[ingest]\nbatch_max_messages = 0").unwrap_err();
    assert!(format!("{e:#}").contains("ingest.batch_max_messages"), "{e:#}");
    let e = load_str("[ingest]\nbatch_max_messages = \"many\"").unwrap_err();
    assert!(format!("{e:#}").contains("batch_max_messages"), "{e:#}");
    let e = load_str("[kafka]\nbrokerz = \"x\"").unwrap_err();
    assert!(format!("{e:#}").contains("brokerz"), "{e:#}");
    let e = load_str("[[routes]]\nevent_kind = \"a\"\ntemplate = \"t\"\nchannels = [\"fax\"]").unwrap_err();
    assert!(format!("{e:#}").contains("fax"), "{e:#}");
    let e = load_str("[database]\nurl = \"postgres://h:notaport/db\"").unwrap_err();
    assert!(format!("{e:#}").contains("database.url"), "{e:#}");
}

#[test]
fn a_route_delivers_unless_it_says_observe() {
    let route = |extra: &str| {
        load_str(&format!(
            "[[routes]]\nevent_kind = \"order.created\"\ntemplate = \"t\"\nchannels = [\"email\"]\n{extra}"
        ))
    };
    let c = route("").unwrap();
    assert_eq!(c.route("order.created").unwrap().mode, RouteMode::Deliver);
    let c = route("mode = \"observe\"").unwrap();
    assert_eq!(c.route("order.created").unwrap().mode, RouteMode::Observe);
    let e = route("mode = \"shadow\"").unwrap_err();
    assert!(format!("{e:#}").contains("shadow"), "{e:#}");
    let e = route("mode = \"observe\"\ndeliver_from = \"2026-12-05T10:00:00Z\"").unwrap_err();
    assert!(format!("{e:#}").contains("deliver_from"), "{e:#}");

    // The switch is a property of the event: before deliver_from, observed.
    let c = route("deliver_from = \"2026-12-05T10:00:00Z\"").unwrap();
    let r = c.route("order.created").unwrap();
    let at = |t: &str| t.parse::<DateTime<Utc>>().unwrap();
    assert!(r.observes(at("2026-12-05T09:59:59.999Z")));
    assert!(!r.observes(at("2026-12-05T10:00:00Z")));
    let c = route("mode = \"observe\"").unwrap();
    assert!(c
        .route("order.created")
        .unwrap()
        .observes(at("2030-01-01T00:00:00Z")));
    assert!(!route("")
        .unwrap()
        .route("order.created")
        .unwrap()
        .observes(at("2000-01-01T00:00:00Z")));
}

#[test]
fn properties_that_would_break_the_offset_discipline_are_refused_naming_the_key() {
    for (key, why) in [
        ("auto.offset.reset", "skip"),
        ("enable.auto.offset.store", "durable"),
        ("enable.auto.commit", "durable"),
        ("auto.commit.enable", "durable"),
        ("group.id", "ingest.group_id"),
        ("isolation.level", "aborted"),
        ("enable.idempotence", "duplicate"),
        ("acks", "acks=all"),
        ("request.required.acks", "acks=all"),
    ] {
        let e = load_str(&format!("[kafka.properties]\n\"{key}\" = \"x\"")).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains(&format!("kafka.properties.\"{key}\"")), "{key}: {e}");
        assert!(e.contains(why), "{key}: {e}");
    }
    // Case, spaces and librdkafka's `topic.` prefix do not get around it.
    assert!(load_str("[kafka.properties]\n\" Auto.Offset.Reset \" = \"latest\"").is_err());
    assert!(load_str("[kafka.properties]\n\"topic.auto.offset.reset\" = \"latest\"").is_err());
    assert!(load_str("[kafka.properties]\n\"topic.acks\" = \"1\"").is_err());
    // Tuning stays settable.
    let c = load_str("[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"ssl.cipher.suites\" = \"x\"")
        .unwrap();
    assert_eq!(c.kafka.properties.len(), 2);
}

#[test]
fn security_properties_are_refused_for_the_keys_that_own_them() {
    for (key, owner) in [
        ("security.protocol", "kafka.security_protocol"),
        ("sasl.mechanisms", "kafka.sasl.mechanism"),
        ("sasl.password", "password_file"),
        ("ssl.ca.location", "kafka.tls.ca_file"),
        ("ssl.key.password", "key_password_file"),
        ("ssl.endpoint.identification.algorithm", "always verifies"),
        ("enable.ssl.certificate.verification", "always verifies"),
        ("enable.sasl.oauthbearer.unsecure.jwt", "kafka.sasl.mechanism"),
    ] {
        let e = load_str(&format!("[kafka.properties]\n\"{key}\" = \"x\"")).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains(&format!("kafka.properties.\"{key}\"")) && e.contains(owner),
            "{key}: {e}"
        );
    }
}

#[test]
fn kafka_security_that_cannot_work_is_refused_naming_the_key() {
    let sasl = |extra: &str| {
        load_str(&format!(
            "[kafka]\nsecurity_protocol = \"sasl_ssl\"\n[kafka.sasl]\nmechanism = \"scram-sha-512\"\n{extra}"
        ))
    };
    sasl("username = \"herald\"\npassword_file = \"/run/secrets/kafka\"").unwrap();
    let e = format!(
        "{:#}",
        sasl("password_file = \"/run/secrets/kafka\"").unwrap_err()
    );
    assert!(e.contains("kafka.sasl.username"), "{e}");
    let e = format!("{:#}", sasl("username = \"herald\"").unwrap_err());
    assert!(e.contains("kafka.sasl.password_file"), "{e}");
    let e = format!(
        "{:#}",
        load_str("[kafka]\nsecurity_protocol = \"tls\"").unwrap_err()
    );
    assert!(
        e.contains("kafka.security_protocol") && e.contains("sasl_ssl"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        load_str("[kafka.sasl]\nmechanism = \"gssapi\"").unwrap_err()
    );
    assert!(
        e.contains("kafka.sasl.mechanism") && e.contains("scram-sha-512"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        load_str("[kafka]\nsecurity_protocol = \"sasl_ssl\"").unwrap_err()
    );
    assert!(e.contains("needs kafka.sasl.mechanism"), "{e}");
    let e = format!(
        "{:#}",
        load_str(
            "[kafka]\nsecurity_protocol = \"sasl_plaintext\"\n[kafka.sasl]\nmechanism = \"aws_msk_iam\""
        )
        .unwrap_err()
    );
    assert!(e.contains("sasl_ssl"), "{e}");
    let e = format!(
        "{:#}",
        load_str("[kafka.tls]\nca_file = \"/etc/ca.crt\"").unwrap_err()
    );
    assert!(e.contains("does not use TLS"), "{e}");
    load_str("[kafka]\nsecurity_protocol = \"ssl\"\n[kafka.tls]\ncert_file = \"/c\"\nkey_file = \"/k\"")
        .unwrap();
    load_str("[kafka]\nsecurity_protocol = \"SASL_SSL\"\n[kafka.sasl]\nmechanism = \"aws_msk_iam\"").unwrap();
}

/// The secrets are read only when a command is about to use Kafka, from the file or the
/// environment's value; a file's trailing line break is not part of the password.
#[tokio::test]
async fn kafka_secrets_are_read_from_their_files_when_resolved() {
    let dir = std::env::temp_dir().join(format!("herald-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "pa ss\n").unwrap();
    let mut c = load_str(&format!(
        "[kafka]\nsecurity_protocol = \"sasl_ssl\"\n[kafka.sasl]\nmechanism = \"scram-sha-256\"\nusername = \"u\"\npassword_file = {:?}",
        file.display().to_string()
    ))
    .unwrap();
    c.resolve_kafka_security().await.unwrap();
    let settings = c.kafka_settings();
    let consumer = settings.consumer("g", &[]);
    assert_eq!(consumer.get("sasl.password"), Some("pa ss"));
    assert_eq!(consumer.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
    assert_eq!(consumer.get("security.protocol"), Some("sasl_ssl"));
    assert!(!format!("{c:?}").contains("pa ss"), "Debug shows no password");
    std::fs::write(&file, "").unwrap();
    let e = c.resolve_kafka_security().await.unwrap_err();
    assert!(format!("{e:#}").contains("is empty"), "{e:#}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ingest_memory_bounds_are_validated_naming_the_key() {
    let c = load_str("[ingest]\nbatch_max_bytes = 1048576\nprefetch_max_kbytes = 4096").unwrap();
    assert_eq!(c.ingest.batch_max_bytes, 1 << 20);
    assert_eq!(c.ingest.prefetch_max_kbytes, 4096);
    let defaults = load_str("").unwrap();
    assert_eq!(defaults.ingest.batch_max_bytes, 8 << 20);
    assert_eq!(defaults.ingest.prefetch_max_kbytes, 16 * 1024);
    let e = load_str("[ingest]\nbatch_max_bytes = 0").unwrap_err();
    assert!(format!("{e:#}").contains("ingest.batch_max_bytes"), "{e:#}");
    let e = load_str("[ingest]\nprefetch_max_kbytes = 3000000").unwrap_err();
    assert!(format!("{e:#}").contains("ingest.prefetch_max_kbytes"), "{e:#}");
}

#[test]
fn a_lease_that_cannot_cover_one_send_at_the_rate_is_refused_naming_the_keys() {
    // 15 s lease, 5 s attempts, 3 s margin: 2 s of rate wait. 1/s fits two; fine.
    let ok = "[delivery]\nlease_secs = 15\n[aws]\nattempt_timeout_ms = 5000\n[channels.email]\nrate_per_second = 1";
    assert_eq!(load_str(ok).unwrap().lease_budget().claim_window(1), 2);
    // 13 s: nothing is left for the rate.
    let e = load_str(&ok.replace("lease_secs = 15", "lease_secs = 13")).unwrap_err();
    let e = format!("{e:#}");
    for key in [
        "delivery.lease_secs",
        "channels.email",
        "rate_per_second",
        "aws.attempt_timeout_ms",
        "delivery.lease_margin_ms",
    ] {
        assert!(e.contains(key), "{key} not named in: {e}");
    }
}

#[test]
fn a_batch_linger_that_would_eat_the_lease_margin_is_refused_naming_both_keys() {
    // A record waits up to the linger inside the margin: half of it is the most accepted.
    let c = load_str("[delivery]\nlease_margin_ms = 3000\ndb_batch_linger_ms = 1500").unwrap();
    assert_eq!(c.delivery.db_batch_linger_ms, 1500);
    let e = load_str("[delivery]\nlease_margin_ms = 3000\ndb_batch_linger_ms = 1501").unwrap_err();
    let e = format!("{e:#}");
    for key in ["delivery.db_batch_linger_ms", "delivery.lease_margin_ms"] {
        assert!(e.contains(key), "{key} not named in: {e}");
    }
    // At the smallest margin, 100 ms, at most 50 is accepted.
    assert!(load_str("[delivery]\nlease_margin_ms = 100\ndb_batch_linger_ms = 51").is_err());
    assert!(load_str("[delivery]\nlease_margin_ms = 100\ndb_batch_linger_ms = 50").is_ok());
}

#[test]
fn topics_ask_for_two_in_sync_replicas_where_there_are_three() {
    let min_insync = |toml: &str| -> Vec<String> {
        load_str(toml)
            .unwrap()
            .topic_specs()
            .iter()
            .map(|t| {
                t.config
                    .iter()
                    .find(|(k, _)| k == "min.insync.replicas")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            })
            .collect()
    };
    assert_eq!(min_insync(""), vec!["2"; 4], "replication factor 3 by default");
    assert_eq!(min_insync("[kafka]\nreplication_factor = 1"), vec!["1"; 4]);
    assert_eq!(
        min_insync("[kafka]\nreplication_factor = 5\nmin_insync_replicas = 3"),
        vec!["3"; 4]
    );
    let e = load_str("[kafka]\nreplication_factor = 1\nmin_insync_replicas = 2").unwrap_err();
    assert!(format!("{e:#}").contains("kafka.min_insync_replicas"), "{e:#}");
}

#[test]
fn http_ingest_is_off_by_default_and_needs_a_token_and_a_day_of_keys() {
    let c = load_str("").unwrap();
    assert!(c.http_ingest.listen.is_empty());
    assert_eq!(c.http_ingest.key_retention(), Duration::from_secs(168 * 3600));
    let on = "[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"\n";
    assert_eq!(
        load_str(on)
            .unwrap()
            .http_ingest
            .bearer_token()
            .unwrap()
            .as_deref(),
        Some("t")
    );
    for (toml, key) in [
        ("[http_ingest]\nlisten = \"127.0.0.1:9465\"", "http_ingest.token"),
        ("[http_ingest]\nkey_retention_hours = 23", "http_ingest.key_retention_hours"),
        (
            "[database]\npool_size = 4\n[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"\nmax_in_flight = 4",
            "http_ingest.max_in_flight",
        ),
        ("[http_ingest]\nlisten = \"nowhere\"\ntoken = \"t\"", "http_ingest.listen"),
        (
            "[admin]\nlisten = \"127.0.0.1:9465\"\n[http_ingest]\nlisten = \"127.0.0.1:9465\"\ntoken = \"t\"",
            "admin.listen",
        ),
    ] {
        let e = load_str(toml).unwrap_err().to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
}

#[test]
fn retention_defaults_keep_intents_and_bad_values_name_their_key() {
    let c = load_str("").unwrap();
    assert_eq!(
        (
            c.retention.attempt_months,
            c.retention.payload_body_days,
            c.retention.intent_days
        ),
        (6, 90, None)
    );
    assert_eq!((c.retention.interval_secs, c.retention.batch_size), (3600, 1000));
    assert_eq!(
        load_str("[retention]\nintent_days = 400")
            .unwrap()
            .retention
            .intent_days,
        Some(400)
    );
    assert_eq!(
        load_str("[retention]\ninterval_secs = 0")
            .unwrap()
            .retention
            .interval_secs,
        0
    );
    for (toml, key) in [
        ("attempt_months = 0", "retention.attempt_months"),
        ("payload_body_days = 365001", "retention.payload_body_days"),
        ("intent_days = 0", "retention.intent_days"),
        ("interval_secs = 5", "retention.interval_secs"),
        ("batch_size = 0", "retention.batch_size"),
        ("batch_size = 1000000", "retention.batch_size"),
    ] {
        let e = load_str(&format!("[retention]\n{toml}")).unwrap_err();
        assert!(format!("{e:#}").contains(key), "{toml}: {e:#}");
    }
}

/// Every table of the configuration that has keys of its own (a struct, not a free
/// map such as `kafka.properties`), as a dotted path.
fn tables() -> Vec<String> {
    fn walk(prefix: &str, dict: &figment::value::Dict, out: &mut Vec<String>) {
        for (k, v) in dict {
            if let figment::value::Value::Dict(_, d) = v {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if !d.is_empty() {
                    out.push(path.clone());
                }
                walk(&path, d, out);
            }
        }
    }
    let Ok(figment::value::Value::Dict(_, top)) = figment::value::Value::serialize(Config::defaults()) else {
        unreachable!()
    };
    let mut out = Vec::new();
    walk("", &top, &mut out);
    out
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API returns its own large error
fn every_table_refuses_unknown_keys_from_the_file_and_the_environment() {
    let tables = tables();
    for t in [
        "log",
        "kafka",
        "kafka.topics",
        "channels.email",
        "channels.sms",
        "reconcile",
    ] {
        assert!(tables.iter().any(|x| x == t), "{t} missing from {tables:?}");
    }
    for table in &tables {
        let e = load_str(&format!(
            "[{table}]
zz_unknown_key = 1"
        ))
        .err()
        .unwrap_or_else(|| panic!("[{table}] took an unknown key"));
        assert!(format!("{e:#}").contains("zz_unknown_key"), "[{table}]: {e:#}");
    }
    for table in &tables {
        let var = format!(
            "HERALD_{}__ZZ_UNKNOWN_KEY",
            table.replace('.', "__").to_uppercase()
        );
        figment::Jail::expect_with(|jail| {
            jail.set_env(&var, "1");
            let e = Config::load(Path::new("absent.toml"), false)
                .err()
                .unwrap_or_else(|| panic!("{var} was ignored or taken"));
            assert!(format!("{e:#}").contains("zz_unknown_key"), "{var}: {e:#}");
            Ok(())
        });
    }
}

#[test]
fn the_example_is_the_defaults_and_every_table_takes_overrides() {
    let c = Config::defaults();
    assert!(c.routes.is_empty(), "no route by default");
    assert_eq!(c.database.pool_size, 16);
    assert_eq!(c.channels.sms.retry.rate_per_second, 20);
    // The telemetry crate's own defaults (for its callers outside the configuration)
    // are the same values.
    fn json<T: Serialize>(v: &T) -> serde_json::Value {
        serde_json::to_value(v).unwrap()
    }
    assert_eq!(json(&c.log), json(&LogSettings::default()));
    assert_eq!(json(&c.telemetry), json(&OtelSettings::default()));
    let sections = Config::sections();
    let Ok(serde_json::Value::Object(top)) = serde_json::to_value(&c) else {
        unreachable!()
    };
    let mut tables: Vec<&String> = top.keys().filter(|k| *k != "routes").collect();
    tables.sort();
    let mut sections: Vec<&String> = sections.iter().collect();
    sections.sort();
    assert_eq!(sections, tables);
    assert_eq!(sections.len(), 16, "{sections:?}");
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API returns its own large error
fn environment_overrides_the_file() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("h.toml", "[ingest]\nbatch_max_messages = 100")?;
        jail.set_env("HERALD_INGEST__BATCH_MAX_MESSAGES", "250");
        jail.set_env("HERALD_RETENTION__INTENT_DAYS", "730");
        jail.set_env("HERALD_BIN", "/not/configuration");
        let c = Config::load(Path::new("h.toml"), true).map_err(|e| e.to_string())?;
        assert_eq!(c.ingest.batch_max_messages, 250);
        assert_eq!(c.retention.intent_days, Some(730));
        Ok(())
    });
}

#[test]
fn a_transaction_pooler_needs_a_session_for_the_advisory_locks() {
    let c = load_str("").unwrap();
    assert_eq!(c.store().pooler, herald_store::Pooler::None);
    let pooled = "[database]\nurl = \"postgres://h@127.0.0.1:16432/h\"\npooler = \"transaction\"\n";
    let e = load_str(pooled).unwrap_err().to_string();
    assert!(e.contains("database.session_url"), "{e}");
    let with_session = format!("{pooled}session_url = \"postgres://h@127.0.0.1:15432/h\"\n");
    let c = load_str(&with_session).unwrap();
    assert_eq!(c.store().pooler, herald_store::Pooler::Transaction);
    assert_eq!(
        c.store().session_url.as_deref(),
        Some("postgres://h@127.0.0.1:15432/h")
    );
    // The owner's work goes over the session URL, through no pooler.
    assert_eq!(
        c.owner_store().session_url.as_deref(),
        Some("postgres://h@127.0.0.1:15432/h")
    );
    // A direct owner URL is enough for the locks; the owner's connection is then not pooled.
    let with_owner = format!("{pooled}owner_url = \"postgres://o@127.0.0.1:15432/h\"\n");
    let c = load_str(&with_owner).unwrap();
    assert_eq!(c.owner_store().pooler, herald_store::Pooler::None);
    assert_eq!(c.store().session_url, None);
    let e = load_str("[database]\npooler = \"statement\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pooler"), "{e}");
}

#[test]
fn admin_tokens_are_long_the_read_token_is_its_own_and_listeners_outlast_queries() {
    let short = load_str("[admin]\ntoken = \"0123456789abcdef0123456789abcde\"\n").unwrap_err();
    assert!(
        format!("{short:#}").contains("admin.token is 31 bytes"),
        "{short:#}"
    );
    let short = load_str("[admin]\nread_token = \"short\"\n").unwrap_err();
    assert!(
        format!("{short:#}").contains("admin.read_token is 5 bytes"),
        "{short:#}"
    );
    let c = load_str(
        "[admin]\ntoken = \"0123456789abcdef0123456789abcdef\"\nread_token = \"r123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    assert_eq!(
        c.admin.read_token().unwrap().as_deref(),
        Some("r123456789abcdef0123456789abcdef")
    );
    let same = load_str(
        "[admin]\ntoken = \"0123456789abcdef0123456789abcdef\"\nread_token = \"0123456789abcdef0123456789abcdef\"\n",
    )
    .unwrap();
    assert!(
        same.admin.read_token().is_err(),
        "the read-only token may not be the operator's"
    );
    let starved = load_str("[admin]\nmax_concurrent_requests = 16\n").unwrap_err();
    assert!(
        format!("{starved:#}").contains("admin.max_concurrent_requests"),
        "{starved:#}"
    );
    let cut = load_str("[listeners]\nidle_timeout_secs = 30\n").unwrap_err();
    assert!(
        format!("{cut:#}").contains("listeners.idle_timeout_secs"),
        "{cut:#}"
    );
}

#[test]
fn provider_evidence_needs_its_topic_unless_the_queue_gets_raw_records() {
    let queue = "[reconcile]\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/1/q\"\n";
    let missing = load_str(queue).unwrap_err();
    assert!(
        format!("{missing:#}").contains("reconcile.sns_topic_arns is empty"),
        "{missing:#}"
    );
    assert!(load_str(&format!("{queue}raw_delivery = true\n")).is_ok());
    let bad = load_str(&format!("{queue}sns_topic_arns = [\"herald-ses-events\"]\n")).unwrap_err();
    assert!(format!("{bad:#}").contains("is not an SNS topic ARN"), "{bad:#}");
    let plain = load_str(&format!(
        "{queue}sns_topic_arns = [\"arn:aws:sns:eu-west-1:1:t\"]\nsns_certificate_endpoint = \"http://x\"\n"
    ))
    .unwrap_err();
    assert!(format!("{plain:#}").contains("over HTTPS only"), "{plain:#}");
    let topic = "sns_topic_arns = [\"arn:aws:sns:eu-west-1:1:t\"]\nsns_signatures = \"unchecked\"\n";
    let unchecked = load_str(&format!("{queue}{topic}")).unwrap_err();
    assert!(
        format!("{unchecked:#}").contains("local stand-in SNS"),
        "{unchecked:#}"
    );
    assert!(load_str(&format!(
        "[aws]\nendpoint_url = \"http://127.0.0.1:14566\"\n{queue}{topic}"
    ))
    .is_ok());
    let ok = load_str(&format!(
        "{queue}sns_topic_arns = [\"arn:aws:sns:eu-west-1:1:t\"]\n"
    ))
    .unwrap();
    assert_eq!(
        ok.reconcile.sns_signatures,
        herald_channels::reconcile::sns::SignatureCheck::Verify
    );
}

#[test]
fn the_suppression_key_is_required_long_and_never_shown() {
    // Herald's defaults set none: the commands that need it say so.
    let mut c = load_str("").unwrap();
    let e = c.resolve_destination_key().unwrap_err();
    assert!(format!("{e:#}").contains("suppression.key is required"), "{e:#}");
    assert!(c.suppression.require().is_err());
    let e = load_str("[suppression]\nkey = \"short-key\"").unwrap_err();
    assert!(format!("{e:#}").contains("suppression.key is 9 bytes"), "{e:#}");

    let dir = std::env::temp_dir().join(format!("herald-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("key");
    let secret = "file-key-0123456789abcdef0123456789";
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let mut c = load_str(&format!(
        "[suppression]\nkey_file = {:?}",
        file.display().to_string()
    ))
    .unwrap();
    c.resolve_destination_key().unwrap();
    let from_file = c.store().destination_key.expect("the key reaches the store");
    let expected = herald_store::destination::DestinationKey::new(secret.as_bytes()).unwrap();
    assert_eq!(
        from_file.digest("email", "a@example.com"),
        expected.digest("email", "a@example.com"),
        "the file's key, trailing newline ignored"
    );
    assert_eq!(
        c.owner_store()
            .destination_key
            .map(|k| k.id().to_owned())
            .as_deref(),
        Some(expected.id())
    );
    assert!(!format!("{c:?}").contains(secret), "Debug shows no key");
    std::fs::write(&file, "too-short\n").unwrap();
    assert!(c.resolve_destination_key().is_err());
    std::fs::remove_dir_all(&dir).unwrap();

    let mut c = load_str("[suppression]\nkey = \"inline-key-0123456789abcdef0123456789\"").unwrap();
    c.resolve_destination_key().unwrap();
    assert!(
        !format!("{c:?}").contains("inline-key-0123"),
        "Debug shows no key"
    );
    assert!(
        !serde_json::to_string(&c).unwrap().contains("inline-key-0123"),
        "never serialized"
    );
    // The same secret with a trailing newline (from an environment variable) is the same key.
    let mut nl = load_str("[suppression]\nkey = \"inline-key-0123456789abcdef0123456789\\n\"").unwrap();
    nl.resolve_destination_key().unwrap();
    assert_eq!(
        nl.store().destination_key.unwrap().id(),
        c.store().destination_key.unwrap().id()
    );
}
