use clap::Subcommand;
use herald_core::{BusinessKey, Channel};
use herald_store::delivery::Resolution;
use herald_store::Store;

use crate::config::Config;

#[derive(Subcommand)]
pub enum IntentCommand {
    /// Show one intent: payload digest, template revision, state, attempts, conflicts.
    Show {
        #[command(flatten)]
        key: KeyArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Decide an intent whose last attempt's outcome is unknown: `accepted` (the seller
    /// got it) or `retry` (send again; the attempt is flagged as following an unknown).
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        #[arg(long = "as", value_enum)]
        resolution: ResolveAs,
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

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ResolveAs {
    Accepted,
    Retry,
}

pub async fn run(config: &Config, command: IntentCommand) -> anyhow::Result<()> {
    match command {
        IntentCommand::Show { key, json } => show(config, key.into(), json).await,
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
            let resolution = match resolution {
                ResolveAs::Accepted => Resolution::Accepted,
                ResolveAs::Retry => Resolution::Retry,
            };
            let store = Store::new(&config.store())?;
            let id = store
                .resolve_unknown(&key, resolution, reason.trim(), &operator)
                .await?;
            println!(
                "intent {id} ({key}) resolved as {} by {operator}",
                resolution.as_str()
            );
            Ok(())
        }
    }
}

async fn show(config: &Config, key: BusinessKey, json: bool) -> anyhow::Result<()> {
    let store = Store::new(&config.store())?;
    let Some(v) = store.intent_view(&key).await? else {
        anyhow::bail!("no intent for {key}");
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
    println!("consent           {}", v.consent);
    println!("seller            {}", v.seller_id);
    println!(
        "template          {} revision {} (locale {})",
        v.template, v.template_revision, v.payload.locale
    );
    println!("payload digest    {}", v.payload_digest);
    println!("destination       {}", opt(v.payload.destination.clone()));
    println!("subject           {}", opt(v.payload.subject.clone()));
    println!("attempts          {}", v.attempt_count);
    println!(
        "next attempt at   {}",
        opt(v.next_attempt_at.map(|t| t.to_rfc3339()))
    );
    println!(
        "lease             {} until {}",
        opt(v.lease_owner.clone()),
        opt(v.lease_until.map(|t| t.to_rfc3339()))
    );
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
