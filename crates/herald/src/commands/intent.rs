//! `herald intent show | list | resolve`: an intent as the ledger holds it (frozen
//! content's digest, template revision, consent, state, every attempt, conflicts kept as
//! evidence), named by business key or id; and an operator's decision on an intent whose
//! last attempt is `unknown` (`--as accepted|retry --reason R`, recorded with who decided).

use clap::Subcommand;
use herald_core::Resolution;
use herald_core::{BusinessKey, Channel};
use herald_store::inspect::IntentView;
use herald_store::{IntentFilter, IntentRef, Store};
use uuid::Uuid;

use crate::config::Config;

#[derive(Subcommand)]
pub enum IntentCommand {
    /// Show one intent: payload digest, template revision, state, attempts, conflicts.
    /// Name it by business key (`<marketplace_id> <order_id> <event_kind> <channel>`) or
    /// by its id.
    Show {
        #[arg(num_args = 1..=4, required = true, value_name = "INTENT_ID | BUSINESS KEY")]
        which: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the intents of one order, one line each.
    List {
        marketplace_id: String,
        order_id: String,
        #[arg(long)]
        event_kind: Option<String>,
        #[arg(long)]
        channel: Option<Channel>,
        /// Print JSON (every intent in full) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Decide an intent whose last attempt's outcome is unknown: `accepted` (the seller
    /// got it) or `retry` (send again; the attempt is flagged as following an unknown).
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        #[arg(long = "as", value_parser = resolution_parser())]
        resolution: Resolution,
        /// Why: stored with the resolution (a ticket, what the provider's logs showed).
        #[arg(long)]
        reason: String,
        /// Who decided; defaults to $USER.
        #[arg(long)]
        operator: Option<String>,
    },
}

/// The business key, as positional arguments.
#[derive(clap::Args)]
pub struct KeyArgs {
    marketplace_id: String,
    order_id: String,
    event_kind: String,
    channel: Channel,
}

impl From<KeyArgs> for BusinessKey {
    fn from(k: KeyArgs) -> Self {
        BusinessKey {
            marketplace_id: k.marketplace_id,
            order_id: k.order_id,
            event_kind: k.event_kind,
            channel: k.channel,
        }
    }
}

/// `--as`: one of [`Resolution::ALL`], listed in `--help`.
fn resolution_parser() -> impl clap::builder::TypedValueParser<Value = Resolution> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Resolution::ALL.map(Resolution::as_str))
        .map(|s| s.parse::<Resolution>().expect("a possible value is a resolution"))
}

pub async fn run(config: &Config, command: IntentCommand) -> anyhow::Result<()> {
    match command {
        IntentCommand::Show { which, json } => show(config, &which, json).await,
        IntentCommand::List {
            marketplace_id,
            order_id,
            event_kind,
            channel,
            json,
        } => {
            let store = Store::new(&config.store())?;
            let views = store
                .intent_views(&IntentFilter {
                    marketplace_id,
                    order_id,
                    event_kind,
                    channel: channel.map(|c| c.as_str().to_owned()),
                })
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else {
                print_list(&views);
            }
            Ok(())
        }
        IntentCommand::Resolve {
            key,
            resolution,
            reason,
            operator,
        } => {
            let key: BusinessKey = key.into();
            if reason.trim().is_empty() {
                anyhow::bail!("--reason is empty: say why, it is stored with the resolution");
            }
            let operator = operator
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "unknown-operator".into());
            let store = Store::new(&config.store())?;
            let (id, _) = store
                .resolve_unknown(IntentRef::Key(&key), resolution, reason.trim(), &operator)
                .await?;
            println!(
                "intent {id} ({key}) resolved as {} by {operator}",
                resolution.as_str()
            );
            Ok(())
        }
    }
}

fn print_list(views: &[IntentView]) {
    println!(
        "{:<36}  {:<14}  {:<5}  {:<8}  {:<15}  {:>8}  {:<10}  LAST PROVIDER ID",
        "INTENT", "EVENT KIND", "CHAN", "REVISION", "STATE", "ATTEMPTS", "LAST"
    );
    for v in views {
        let last = v.attempts.last();
        println!(
            "{:<36}  {:<14}  {:<5}  {:<8}  {:<15}  {:>8}  {:<10}  {}",
            v.id,
            v.event_kind,
            v.channel,
            v.template_revision.as_deref().unwrap_or("-"),
            v.state,
            v.attempts.len(),
            last.map_or("-", |a| a.outcome.as_str()),
            last.and_then(|a| a.provider_message_id.as_deref()).unwrap_or("-"),
        );
    }
    if views.is_empty() {
        println!("(no intents)");
    }
}

async fn show(config: &Config, which: &[String], json: bool) -> anyhow::Result<()> {
    let key;
    let r = match which {
        [id] => IntentRef::Id(
            id.parse::<Uuid>()
                .map_err(|_| anyhow::anyhow!("{id:?} is not an intent id; or give the business key: <marketplace_id> <order_id> <event_kind> <channel>"))?,
        ),
        [m, o, k, c] => {
            key = BusinessKey {
                marketplace_id: m.clone(),
                order_id: o.clone(),
                event_kind: k.clone(),
                channel: c.parse().map_err(|e| anyhow::anyhow!("channel {c:?}: {e}"))?,
            };
            IntentRef::Key(&key)
        }
        _ => anyhow::bail!("give an intent id, or the business key: <marketplace_id> <order_id> <event_kind> <channel>"),
    };
    let store = Store::new(&config.store())?;
    let Some(v) = store.intent_view(r).await? else {
        anyhow::bail!("no intent for {r}");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let opt = |o: Option<String>| o.unwrap_or_else(|| "-".into());
    println!("intent            {}", v.id);
    println!(
        "business key      {}/{}/{}/{}",
        v.marketplace_id, v.order_id, v.event_kind, v.channel
    );
    println!("idempotency key   {}", v.idempotency_key);
    println!("fingerprint       {}", v.request_fingerprint);
    println!("state             {}", v.state);
    println!("consent           {}", opt(v.consent.clone()));
    println!("seller            {}", v.seller_id);
    match &v.payload {
        Some(p) => {
            println!(
                "template          {} revision {} (locale {})",
                v.template,
                opt(v.template_revision.clone()),
                p.locale
            );
            println!("payload digest    {}", opt(v.payload_digest.clone()));
            println!("destination       {}", opt(p.destination.clone()));
            println!("subject           {}", opt(p.subject.clone()));
        }
        None => println!(
            "template          {} (not rendered yet: revision, locale, destination and consent are frozen when the profile arrives)",
            v.template
        ),
    }
    if let Some(h) = &v.hold {
        let decided = match (h.decision.as_deref(), h.decided_at) {
            (Some("released"), Some(at)) => format!(
                "released {} with profile version {}",
                at.to_rfc3339(),
                h.profile_version.map_or("-".into(), |v| v.to_string())
            ),
            (Some(d), Some(at)) => format!("{d} {} (no profile within the wait)", at.to_rfc3339()),
            _ => format!("open, expires {}", h.hold_until.to_rfc3339()),
        };
        println!("held for profile  from {}: {decided}", h.held_at.to_rfc3339());
        if let Some(e) = &h.last_error {
            println!("                  last release failed: {e}");
        }
    }
    println!(
        "attempts          {} ({} not sent){}",
        v.attempt_count,
        v.unsent_attempts,
        if v.had_unknown {
            "; an attempt was recorded unknown"
        } else {
            ""
        }
    );
    println!(
        "next attempt at   {}",
        opt(v.next_attempt_at.map(|t| t.to_rfc3339()))
    );
    println!(
        "lease             {} until {}",
        opt(v.lease_owner.clone()),
        opt(v.lease_until.map(|t| t.to_rfc3339()))
    );
    // The trace id (and the trace UI's page of it) for finding this intent's trace; the
    // same id is on every log line of the intent (`trace_id`).
    match v
        .trace_context
        .as_deref()
        .and_then(herald_telemetry::propagation::trace_id)
    {
        Some(id) => match config.telemetry.trace_link(id) {
            Some(link) => println!("trace             {id}  {link}"),
            None => println!("trace             {id}"),
        },
        None => println!("trace             -"),
    }
    println!("trace context     {}", opt(v.trace_context.clone()));
    println!(
        "event             {} occurred {} from {}",
        v.event_id,
        v.occurred_at.to_rfc3339(),
        v.source
    );
    println!(
        "created / updated {} / {}",
        v.created_at.to_rfc3339(),
        v.updated_at.to_rfc3339()
    );
    println!("outbox rows       {}", v.outbox_rows);
    println!("attempt log:");
    if v.attempts.is_empty() {
        println!("  (none)");
    }
    for a in &v.attempts {
        println!(
            "  #{:<3} {:<10} {} -> {} worker={} provider_id={} error={}{}",
            a.attempt_no,
            a.outcome,
            a.started_at.to_rfc3339(),
            opt(a.finished_at.map(|t| t.to_rfc3339())),
            a.worker,
            opt(a.provider_message_id.clone()),
            opt(a.error_category.clone()),
            if a.after_unknown { " (after unknown)" } else { "" }
        );
        if let Some(late) = &a.late {
            println!(
                "       late outcome {} at {} provider_id={} error={} (stored beside the unknown, which stays)",
                late.outcome,
                opt(late.recorded_at.map(|t| t.to_rfc3339())),
                opt(late.provider_message_id.clone()),
                opt(late.error_category.clone()),
            );
        }
        for e in &a.provider_events {
            let what = [&e.bounce_type, &e.bounce_subtype, &e.complaint_type, &e.detail]
                .into_iter()
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
                .join(" ");
            println!(
                "       provider event #{} {} at {} (matched by {}, {}){}",
                e.id,
                e.event_type,
                e.occurred_at.to_rfc3339(),
                opt(e.matched_by.clone()),
                e.effect,
                if what.is_empty() {
                    String::new()
                } else {
                    format!(": {what}")
                }
            );
        }
    }
    println!("resolutions:");
    if v.resolutions.is_empty() {
        println!("  (none)");
    }
    for r in &v.resolutions {
        println!(
            "  {} by {} ({}) at {}{}: {}",
            r.resolved_as,
            r.settled_by,
            r.operator,
            r.resolved_at.to_rfc3339(),
            r.provider_event_id
                .map_or(String::new(), |id| format!(" from provider event #{id}")),
            r.reason
        );
    }
    println!("conflicts:");
    if v.conflicts.is_empty() {
        println!("  (none)");
    }
    for c in &v.conflicts {
        println!(
            "  event {} fingerprint {} from {} at {}",
            c.offending_event_id,
            c.offending_fingerprint,
            c.source,
            c.detected_at.to_rfc3339()
        );
    }
    Ok(())
}
