//! Observability, as an operator sees it: one trace in Jaeger from the producer's span to
//! the provider call; `/metrics` with bounded labels whose names match the alert rules and
//! the dashboard; logs without destinations or bodies; the admin API's inspection and its
//! refusal to change anything without the bearer token.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use integration_tests::http::{request, request_text, scrape};
use integration_tests::kafka::{produce, producer};
use integration_tests::samples::{order_event, UniqueSeller};
use integration_tests::trace_ui::{random_hex, send_traced_order, traced_env, TracedOrder};
use integration_tests::{produce_order, seed_orders, wait_for, workspace_root, HeraldProcess, TestEnv};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
const JAEGER: &str = "127.0.0.1:16686";

/// Spans of one trace from Jaeger's query API, once `complete` holds for them.
async fn jaeger_trace(trace_id: &str, complete: impl Fn(&[Value]) -> bool) -> Result<Vec<Value>> {
    wait_for("the trace in Jaeger", WAIT, || async {
        let (status, body) = request(JAEGER, "GET", &format!("/api/traces/{trace_id}"), None).await?;
        if status != 200 {
            return Ok(None);
        }
        let spans = body["data"][0]["spans"].as_array().cloned().unwrap_or_default();
        Ok(complete(&spans).then_some(spans))
    })
    .await
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["operationName"] == name).collect()
}

fn parent_id(span: &Value) -> Option<&str> {
    span["references"]
        .as_array()?
        .iter()
        .find(|r| r["refType"] == "CHILD_OF")
        .and_then(|r| r["spanID"].as_str())
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_producer_to_the_provider_call_and_nothing_leaks() -> Result<()> {
    let service = format!("herald-it-{}", random_hex(8));
    let env = traced_env("trace", &service).await?;
    let herald = env.spawn_roles("ingest,relay,deliver", "herald", &[])?;
    let seller = UniqueSeller::new();
    // The producer's span: Herald's spans must hang under it.
    let TracedOrder {
        trace_id,
        producer_span,
        ..
    } = send_traced_order(&env, &seller, WAIT).await?;

    let spans = jaeger_trace(&trace_id, |s| {
        !named(s, "SES SendEmail").is_empty() && !named(s, "SNS Publish").is_empty()
    })
    .await?;
    let by_id: BTreeMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["spanID"].as_str().unwrap_or_default(), s))
        .collect();
    let parent_name = |s: &Value| -> Option<String> {
        by_id
            .get(parent_id(s)?)
            .and_then(|p| p["operationName"].as_str())
            .map(str::to_owned)
    };
    let (orders, deliveries) = (env.topic("order-events"), env.topic("herald.deliveries"));
    let process_orders = format!("process {orders}");
    let send_deliveries = format!("send {deliveries}");
    let process_deliveries = format!("process {deliveries}");
    let process = named(&spans, &process_orders);
    let names: Vec<&str> = spans.iter().filter_map(|s| s["operationName"].as_str()).collect();
    assert_eq!(process.len(), 1, "one ingest span for the one event: {names:?}");
    assert_eq!(
        parent_id(process[0]),
        Some(producer_span.as_str()),
        "ingest continues the producer's span"
    );
    assert_eq!(tag(process[0], "messaging.system"), Some(&json!("kafka")));
    assert_eq!(tag(process[0], "span.kind"), Some(&json!("consumer")));
    for (child, parent, count) in [
        ("intent created", process_orders.as_str(), 2),
        (&send_deliveries, "intent created", 2),
        (&process_deliveries, &send_deliveries, 2),
        ("attempt", &process_deliveries, 2),
        ("SES SendEmail", "attempt", 1),
        ("SNS Publish", "attempt", 1),
    ] {
        let found = named(&spans, child);
        assert_eq!(found.len(), count, "{count} {child:?} span(s) in {spans:#?}");
        for s in found {
            assert_eq!(parent_name(s).as_deref(), Some(parent), "parent of {child:?}");
        }
    }
    // The batch the event was converged in: its `receive` span (linked from `process`, in
    // a trace of its own) with the ingest hop's stages under it, in the order they ran.
    let (batch_trace, batch_span) = process[0]["references"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["refType"] == "FOLLOWS_FROM")
        .and_then(|r| {
            Some((
                r["traceID"].as_str()?.to_owned(),
                r["spanID"].as_str()?.to_owned(),
            ))
        })
        .context("the process span links to its batch")?;
    let batch = jaeger_trace(&batch_trace, |s| !named(s, "ingest report").is_empty()).await?;
    let mut stages: Vec<&Value> = batch
        .iter()
        .filter(|s| parent_id(s) == Some(batch_span.as_str()) && tag(s, "herald.ingest.stage").is_some())
        .collect();
    stages.sort_by_key(|s| s["startTime"].as_u64());
    let stage_names: Vec<&str> = stages
        .iter()
        .filter_map(|s| tag(s, "herald.ingest.stage")?.as_str())
        .filter(|s| *s != "profiles")
        .collect();
    assert_eq!(
        stage_names,
        [
            "connection",
            "begin",
            "templates",
            "sellers",
            "render",
            "converge",
            "commit",
            "report"
        ],
        "the ingest stages under the batch's receive span"
    );
    let intent_ids: BTreeSet<String> = env
        .db
        .query("SELECT id::text FROM notification_intents", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let traced: BTreeSet<String> = named(&spans, "attempt")
        .iter()
        .filter_map(|s| tag(s, "herald.intent.id")?.as_str().map(str::to_owned))
        .collect();
    assert_eq!(traced, intent_ids, "each attempt span names its intent");
    // Herald's spans carry what they name, not the trace layer's default extras (a third
    // of the span bytes; see `trace_layer`): no code location, thread or busy/idle time.
    for s in &spans {
        for extra in [
            "code.file.path",
            "code.module.name",
            "code.line.number",
            "thread.name",
            "thread.id",
            "busy_ns",
            "idle_ns",
        ] {
            assert_eq!(tag(s, extra), None, "{extra} on {:?}", s["operationName"]);
        }
    }

    // Nothing of the destination or the body on any span, nor in Herald's own log.
    let bodies: Vec<String> = env
        .db
        .query("SELECT body_text FROM notification_payloads", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let spans_text = serde_json::to_string(&spans)?;
    let log = herald.log();
    assert!(log.contains("attempt finished"), "the log has the attempts");
    for secret in [seller.email.as_str(), seller.phone.as_str()]
        .into_iter()
        .chain(bodies.iter().map(String::as_str))
    {
        assert!(!spans_text.contains(secret), "{secret:?} on a span");
        assert!(!log.contains(secret), "{secret:?} in Herald's log");
    }
    // The log lines of the attempts carry the trace id.
    assert!(
        log.lines()
            .filter(|l| l.contains("attempt finished"))
            .all(|l| l.contains(&trace_id)),
        "attempt log lines name the trace"
    );
    drop(herald);
    env.cleanup().await;
    Ok(())
}

/// `(name, labels)` of every sample in a Prometheus text exposition.
fn series(text: &str) -> Vec<(String, BTreeMap<String, String>)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name_labels, _value) = l.rsplit_once(' ')?;
            let (name, labels) = match name_labels.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (name_labels, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.to_owned(), v.trim_matches('"').to_owned()))
                })
                .collect();
            Some((name.to_owned(), labels))
        })
        .collect()
}

/// Metric families (`# TYPE` lines) of a scrape.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every `herald_*` metric name an alert rule or a dashboard panel uses.
fn names_in_rules_and_dashboard() -> Result<BTreeSet<String>> {
    let root = workspace_root();
    let alerts = std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml"))?;
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        root.join("deploy/grafana/herald-dashboard.json"),
    )?)?;
    let mut exprs: Vec<String> = alerts
        .split("expr:")
        .skip(1)
        .map(|rest| {
            // An expression runs until the next key of the rule.
            rest.split("\n        for:").next().unwrap_or(rest).to_owned()
        })
        .collect();
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if k == "expr" || k == "query" {
                        if let Some(s) = v.as_str() {
                            out.push(s.to_owned());
                        }
                    }
                    collect(v, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    collect(&dashboard, &mut exprs);
    if exprs.len() < 10 {
        bail!(
            "found only {} expressions in the rules and dashboard",
            exprs.len()
        );
    }
    let mut names = BTreeSet::new();
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("herald_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    Ok(names)
}

async fn produce_orders(env: &TestEnv, sellers: std::ops::Range<usize>, per_seller: usize) -> Result<()> {
    let p = producer()?;
    for s in sellers {
        let seller = format!("seller-{s}");
        let profile = json!({"seller_id": seller, "marketplace_id": "acme", "email": format!("{seller}@card.example"),
            "phone": "+15555550123", "locale": "en", "email_opt_in": true, "sms_opt_in": false, "version": 1});
        produce(
            &p,
            &env.topic("seller-profiles"),
            Some(format!("acme:{seller}").as_bytes()),
            Some(profile.to_string().as_bytes()),
            &[],
        )
        .await?;
        for o in 0..per_seller {
            let order = format!("9{s:03}{o:02}");
            produce_order(env, &p, &format!("evt-{order}"), &order, &seller, "12.00").await?;
        }
    }
    Ok(())
}

async fn settled(env: &TestEnv, intents: i64) -> Result<()> {
    let waited = env
        .wait_count(
            "every intent final",
            "SELECT count(*) FROM notification_intents WHERE state IN ('accepted', 'suppressed')",
            intents,
            WAIT,
        )
        .await;
    if let Err(e) = waited {
        let states: Vec<(String, String, i64)> = env
            .db
            .query(
                "SELECT state, consent, count(*) FROM notification_intents GROUP BY 1, 2 ORDER BY 1, 2",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        return Err(e.context(format!("intents by state and consent: {states:?}")));
    }
    env.wait_lag_zero("herald-ingest", &["order-events", "seller-profiles"])
        .await?;
    env.wait_lag_zero("herald-delivery", &["herald.deliveries"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_bounded_labels_and_cover_the_rules_and_the_dashboard() -> Result<()> {
    // Every role, the reconcile role with its own event queue: the rules and the dashboard
    // name the metrics of all of them.
    let queue = integration_tests::ses_events::EventQueue::create("metrics").await?;
    let env = TestEnv::new("metrics", &queue.config(600)).await?;
    let herald = env.spawn_roles("ingest,relay,deliver,reconcile", "herald", &[])?;
    let admin = herald.admin_addr(WAIT).await?;
    let p = producer()?;

    // Round 1: 10 sellers x 2 orders (2 intents each: e-mail sent, SMS suppressed), plus
    // one of everything else the metrics count.
    produce_orders(&env, 0..10, 2).await?;
    let orders = env.topic("order-events");
    for copy in ["evt-800000", "evt-800000-again"] {
        let same = order_event(copy, "order.created", "acme", "800000", "seller-0", "12.00");
        produce(&p, &orders, Some(b"800000"), Some(&same), &[]).await?;
    }
    let changed = order_event(
        "evt-800000-changed",
        "order.created",
        "acme",
        "800000",
        "seller-0",
        "99.00",
    );
    produce(&p, &orders, Some(b"800000"), Some(&changed), &[]).await?;
    let unrouted = order_event("evt-viewed", "order.viewed", "acme", "800001", "seller-0", "1.00");
    produce(&p, &orders, Some(b"800001"), Some(&unrouted), &[]).await?;
    produce(&p, &orders, Some(b"poison"), Some(b"{not json"), &[]).await?;
    settled(&env, 42).await?;
    // A delivery message for an intent already accepted: acknowledged, not sent.
    let accepted: String = env
        .db
        .query_one(
            "SELECT id::text FROM notification_intents WHERE state = 'accepted' LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    produce(
        &p,
        &env.topic("herald.deliveries"),
        Some(accepted.as_bytes()),
        Some(accepted.as_bytes()),
        &[],
    )
    .await?;

    let wanted = names_in_rules_and_dashboard()?;
    let first = wait_for("every metric of the rules and dashboard", WAIT, || async {
        let text = scrape(&admin).await?;
        let have = families(&text);
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|n| {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s).filter(|b| have.contains(*b)))
                    .unwrap_or(n);
                !have.contains(base)
            })
            .collect();
        // Per-partition series appear once librdkafka's statistics know the partition's
        // lag (an interval after its first commit): the count is bounded by the 7
        // partitions herald consumes, and is only compared once all of them are there.
        let partitions = series(&text)
            .iter()
            .filter(|(n, _)| n == "herald_kafka_consumer_lag")
            .count();
        Ok((missing.is_empty() && partitions == 7).then_some(text))
    })
    .await
    .with_context(|| format!("wanted {wanted:?} and the lag of 7 partitions"))?;
    let find = |text: &str, name: &str, label: (&str, &str)| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("{}=\"{}\"", label.0, label.1)))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
    };
    assert_eq!(
        find(&first, "herald_fingerprint_conflicts_total", ("channel", "email")),
        Some(1.0)
    );
    assert_eq!(
        find(&first, "herald_duplicates_converged_total", ("channel", "email")),
        Some(1.0)
    );
    assert_eq!(
        find(&first, "herald_events_ignored_total", ("reason", "no_route")),
        Some(1.0)
    );
    assert_eq!(
        find(&first, "herald_dead_letters_total", ("reason", "not_json")),
        Some(1.0)
    );
    assert_eq!(
        find(&first, "herald_attempts_total", ("outcome", "accepted")),
        Some(21.0),
        "{first}"
    );

    // Round 2: as many new sellers and orders again. The series stay the same.
    let count1 = series(&scrape(&admin).await?).len();
    produce_orders(&env, 10..20, 2).await?;
    settled(&env, 82).await?;
    let text = scrape(&admin).await?;
    let all = series(&text);
    assert!(
        all.len() < count1 + 10,
        "series grew with the orders: {count1} -> {}:\n{text}",
        all.len()
    );
    // No label value names an order, seller, intent or trace.
    let mut forbidden: BTreeSet<String> = env
        .db
        .query(
            "SELECT id::text, order_id, seller_id, COALESCE(trace_context, '') FROM notification_intents",
            &[],
        )
        .await?
        .iter()
        .flat_map(|r| (0..4).map(|i| r.get::<_, String>(i)).collect::<Vec<_>>())
        .filter(|v| !v.is_empty())
        .collect();
    forbidden.extend((0..20).map(|s| format!("seller-{s}")));
    for (name, labels) in &all {
        for v in labels.values() {
            assert!(!forbidden.contains(v), "{name} has label value {v:?}");
            assert!(v.len() < 40, "{name}: label value {v:?} looks like an id");
        }
    }
    drop(herald);
    queue.delete().await;
    env.cleanup().await;
    Ok(())
}

/// The read-only operator's token of the admin test.
const READ_TOKEN: &str = "it-admin-read-token-7d1e0123456789abcdef";

/// An admin request with `token`; a `GET` under `/v1` without one carries the read-only
/// token (reads need a token: the test of that calls without this helper).
async fn admin_call(
    admin: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let token = token.or((method == "GET" && path.starts_with("/v1/")).then_some(READ_TOKEN));
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let (status, text) = request_text(admin, method, path, &headers, body).await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

async fn ready(herald: &HeraldProcess) -> Result<String> {
    let admin = herald.admin_addr(WAIT).await?;
    wait_for("GET /readyz answers 200", WAIT, || async {
        let (status, _) = admin_call(&admin, "GET", "/readyz", None, None).await?;
        Ok((status == 200).then_some(()))
    })
    .await?;
    Ok(admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_shows_the_ledger_and_changes_nothing_without_the_token() -> Result<()> {
    const TOKEN: &str = "it-admin-token-3f9c0123456789abcdef0123";
    let env = TestEnv::new("admin", "").await?;
    let herald = env.spawn_roles(
        "ingest,relay,deliver",
        "herald",
        &[
            ("HERALD_ADMIN__TOKEN", TOKEN),
            ("HERALD_ADMIN__READ_TOKEN", READ_TOKEN),
        ],
    )?;
    let admin = ready(&herald).await?;
    let (status, health) = admin_call(&admin, "GET", "/healthz", None, None).await?;
    assert_eq!((status, health["status"].as_str()), (200, Some("alive")));

    let seller = UniqueSeller::new();
    seed_orders(&env, &seller, &["4242"]).await?;
    let p = producer()?;
    produce(
        &p,
        &env.topic("order-events"),
        Some(b"poison"),
        Some(b"\xff\xfe"),
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

    let (status, list) = admin_call(
        &admin,
        "GET",
        "/v1/intents?marketplace_id=acme&order_id=4242",
        None,
        None,
    )
    .await?;
    assert_eq!(status, 200, "{list}");
    let intents = list["intents"].as_array().context("intents")?;
    assert_eq!(intents.len(), 2);
    let text = list.to_string();
    assert!(
        !text.contains(&seller.email) && !text.contains(&seller.phone),
        "destinations are masked: {text}"
    );
    let email = intents
        .iter()
        .find(|i| i["channel"] == "email")
        .context("email")?;
    assert!(email["payload"]["destination"]
        .as_str()
        .is_some_and(|d| d.contains("***@seller.example")));
    assert_eq!(email["attempts"][0]["outcome"], "accepted");
    assert!(email["attempts"][0]["provider_message_id"].is_string());
    let id = email["id"].as_str().context("id")?.to_owned();
    let (status, one) = admin_call(&admin, "GET", &format!("/v1/intents/{id}"), None, None).await?;
    assert_eq!((status, one["state"].as_str()), (200, Some("accepted")));
    let (status, _) = admin_call(&admin, "GET", "/v1/intents/not-a-uuid", None, None).await?;
    assert_eq!(status, 400);
    // By business key: the same intent; a key of another order (a ':' inside a part is
    // encoded) is a 404, a path that is not a key a 400.
    let (status, by_key) = admin_call(
        &admin,
        "GET",
        "/v1/intents/by-key/acme:4242:order.created:email",
        None,
        None,
    )
    .await?;
    assert_eq!(
        (status, by_key["id"].as_str()),
        (200, Some(id.as_str())),
        "{by_key}"
    );
    for (path, expected) in [
        ("/v1/intents/by-key/acme:4242%3A1:order.created:email", 404),
        ("/v1/intents/by-key/acme:4242:order.created:sms", 200),
        ("/v1/intents/by-key/acme:4242:order.created", 400),
        ("/v1/intents/by-key/acme:4242:order.created:fax", 400),
    ] {
        let (status, body) = admin_call(&admin, "GET", path, None, None).await?;
        assert_eq!(status, expected, "{path}: {body}");
    }
    let (status, _) = admin_call(
        &admin,
        "GET",
        &format!("/v1/intents/{}", uuid::Uuid::new_v4()),
        None,
        None,
    )
    .await?;
    assert_eq!(status, 404);

    // Reads: 401 without a token or with a wrong one; the operator's token reads too.
    for auth in [&[][..], &[("Authorization", "Bearer wrong-token")][..]] {
        for path in [
            "/v1/intents?marketplace_id=acme&order_id=4242",
            "/v1/dead-letters",
            "/v1/suppressions",
        ] {
            let (status, text) = request_text(&admin, "GET", path, auth, None).await?;
            assert_eq!(status, 401, "{path} with {auth:?}: {text}");
            assert!(!text.contains(&seller.email) && !text.contains("4242"), "{text}");
        }
    }
    let (status, _) = admin_call(&admin, "GET", &format!("/v1/intents/{id}"), Some(TOKEN), None).await?;
    assert_eq!(status, 200, "the operator's token reads");

    // Mutations: 401 without a token or with a wrong one, 403 with the read-only one, and
    // nothing changes.
    let resolve = format!("/v1/intents/{id}/resolve");
    let body = json!({"as": "retry", "reason": "seller says nothing arrived"});
    for (token, refused) in [(None, 401), (Some("wrong-token"), 401), (Some(READ_TOKEN), 403)] {
        let (status, _) = admin_call(&admin, "POST", &resolve, token, Some(&body)).await?;
        assert_eq!(status, refused, "resolve with token {token:?}");
        let (status, _) = admin_call(
            &admin,
            "POST",
            "/v1/dead-letters/replay",
            token,
            Some(&json!({"all": true})),
        )
        .await?;
        assert_eq!(status, refused, "replay with token {token:?}");
    }
    assert_eq!(
        env.count("SELECT count(*) FROM intent_resolutions").await?,
        0,
        "nothing resolved"
    );
    // With the token: an accepted intent is not `unknown`, so the API refuses (409).
    let (status, err) = admin_call(&admin, "POST", &resolve, Some(TOKEN), Some(&body)).await?;
    assert_eq!(status, 409, "{err}");

    // The suppression list: as a bounce put the seller's address on it before the digests
    // were keyed (an unkeyed entry, V17), listed by digest only, lifted only with the token.
    env.db
        .execute(
            "INSERT INTO suppressions (channel, destination_digest, reason, digest_version)
             VALUES ('email', herald_destination_digest('email', $1), 'bounced', 1)",
            &[&seller.email],
        )
        .await?;
    let (status, listed) = admin_call(&admin, "GET", "/v1/suppressions", None, None).await?;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["suppressions"].as_array().map(Vec::len), Some(1));
    assert_eq!(listed["suppressions"][0]["reason"], "bounced");
    assert!(
        !listed.to_string().contains(&seller.email),
        "digests only: {listed}"
    );
    let lift = json!({"channel": "email", "address": seller.email, "reason": "the seller fixed the mailbox"});
    for (token, refused) in [(None, 401), (Some("wrong-token"), 401), (Some(READ_TOKEN), 403)] {
        let (status, _) = admin_call(&admin, "POST", "/v1/suppressions/lift", token, Some(&lift)).await?;
        assert_eq!(status, refused, "lift with token {token:?}");
    }
    assert_eq!(
        env.count("SELECT count(*) FROM suppressions WHERE lifted_at IS NULL")
            .await?,
        1,
        "nothing lifted"
    );
    let both = json!({"channel": "email", "address": seller.email, "digest": "x", "reason": "r"});
    let (status, _) = admin_call(&admin, "POST", "/v1/suppressions/lift", Some(TOKEN), Some(&both)).await?;
    assert_eq!(status, 400, "one of address and digest");
    let (status, lifted) =
        admin_call(&admin, "POST", "/v1/suppressions/lift", Some(TOKEN), Some(&lift)).await?;
    assert_eq!(
        (status, lifted["lifted_by"].as_str()),
        (200, Some("admin-api")),
        "{lifted}"
    );
    let (status, _) = admin_call(&admin, "POST", "/v1/suppressions/lift", Some(TOKEN), Some(&lift)).await?;
    assert_eq!(status, 404, "nothing left to lift");
    let (_, listed) = admin_call(&admin, "GET", "/v1/suppressions", None, None).await?;
    assert_eq!(listed["suppressions"].as_array().map(Vec::len), Some(0));
    let (_, all) = admin_call(&admin, "GET", "/v1/suppressions?all=true", None, None).await?;
    assert_eq!(
        all["suppressions"][0]["lift_reason"],
        "the seller fixed the mailbox"
    );

    // The dead letter, listed, then replayed to its source and dead-lettered again.
    let dl = wait_for("the poison message dead-lettered", WAIT, || async {
        let (status, dl) = admin_call(&admin, "GET", "/v1/dead-letters", None, None).await?;
        Ok((status == 200 && dl["records"].as_array().map(Vec::len) == Some(1)).then_some(dl))
    })
    .await?;
    assert_eq!(dl["records"][0]["reason"], "not_utf8");
    let (status, replayed) = admin_call(
        &admin,
        "POST",
        "/v1/dead-letters/replay",
        Some(TOKEN),
        Some(&json!({"reason": "not_utf8"})),
    )
    .await?;
    assert_eq!(
        (status, replayed["replayed"].as_u64()),
        (200, Some(1)),
        "{replayed}"
    );
    wait_for("the replay dead-lettered again", WAIT, || async {
        let (_, dl) = admin_call(&admin, "GET", "/v1/dead-letters", None, None).await?;
        Ok((dl["records"].as_array().map(Vec::len) == Some(2)).then_some(()))
    })
    .await?;

    let (status, doc) = admin_call(&admin, "GET", "/openapi.json", None, None).await?;
    assert_eq!(status, 200);
    for path in [
        "/v1/intents",
        "/v1/intents/{intent_id}",
        "/v1/intents/by-key/{business_key}",
        "/v1/intents/{intent_id}/resolve",
        "/v1/dead-letters/replay",
        "/v1/suppressions",
        "/v1/suppressions/lift",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    assert!(
        !herald.log().contains(TOKEN) && !herald.log().contains(READ_TOKEN),
        "the tokens never appear in the log"
    );
    drop(herald);
    env.cleanup().await;
    Ok(())
}
