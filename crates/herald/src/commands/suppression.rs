//! `herald suppression list|remove`: the destinations the provider reported as permanently
//! bounced or complaining. Ingest suppresses later intents to a listed destination
//! (consent `bounced` or `complained`); lifting the entry lets the next ones through.

use clap::Subcommand;
use herald_core::Channel;
use herald_store::reconcile::{Destination, Suppression};
use herald_store::Store;

use crate::config::Config;

#[derive(Subcommand)]
pub enum SuppressionCommand {
    /// The live entries, newest first (`--all`: lifted ones too).
    List {
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Lift the live entry of a destination: later intents to it are sent again. Name it
    /// by address (digested, as ingest does; never stored) or by the digest `list` shows.
    Remove {
        #[arg(long)]
        channel: Channel,
        #[arg(long, conflicts_with = "digest", required_unless_present = "digest")]
        address: Option<String>,
        #[arg(long)]
        digest: Option<String>,
        /// Why: stored with the entry (the seller fixed the mailbox, a ticket).
        #[arg(long)]
        reason: String,
        /// Who decided; defaults to $USER.
        #[arg(long)]
        operator: Option<String>,
    },
}

pub async fn run(config: &Config, command: SuppressionCommand) -> anyhow::Result<()> {
    let store = Store::new(&config.store())?;
    match command {
        SuppressionCommand::List { all, limit, json } => {
            let entries = store.suppressions(all, limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                print_list(&entries);
            }
            Ok(())
        }
        SuppressionCommand::Remove {
            channel,
            address,
            digest,
            reason,
            operator,
        } => {
            if reason.trim().is_empty() {
                anyhow::bail!("--reason is empty: say why, it is stored with the entry");
            }
            let operator = operator
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "unknown-operator".into());
            let destination = match (&address, &digest) {
                (Some(a), _) => Destination::Address(a),
                (None, Some(d)) => Destination::Digest(d),
                (None, None) => anyhow::bail!("give --address or --digest"),
            };
            match store
                .lift_suppression(channel, destination, &operator, &reason)
                .await?
            {
                Some(s) => {
                    println!(
                        "suppression {} lifted: {} {} ({}) by {operator}",
                        s.id, s.channel, s.destination_digest, s.reason
                    );
                    Ok(())
                }
                None => anyhow::bail!("no live suppression for that {channel} destination"),
            }
        }
    }
}

fn print_list(entries: &[Suppression]) {
    println!(
        "{:>6}  {:<5}  {:<64}  {:<10}  {:<25}  LIFTED",
        "ID", "CHAN", "DESTINATION DIGEST", "REASON", "SINCE"
    );
    for s in entries {
        println!(
            "{:>6}  {:<5}  {:<64}  {:<10}  {:<25}  {}",
            s.id,
            s.channel,
            s.destination_digest,
            s.reason,
            s.created_at.to_rfc3339(),
            match (&s.lifted_at, &s.lifted_by, &s.lift_reason) {
                (Some(at), Some(by), Some(why)) => format!("{} by {by}: {why}", at.to_rfc3339()),
                _ => "-".into(),
            }
        );
    }
    if entries.is_empty() {
        println!("(no suppressions)");
    }
}
