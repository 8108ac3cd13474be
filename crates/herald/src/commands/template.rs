//! `herald template publish | activate`: immutable template revisions. Publishing a
//! revision again with the same content is a no-op, with other content it is refused;
//! activating makes a published revision the one new intents render with.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Subcommand;
use herald_core::render::TemplateRevision;
use herald_core::Channel;
use herald_store::{PublishOutcome, Store};

use crate::config::Config;

#[derive(Subcommand)]
pub enum TemplateCommand {
    /// Publish an immutable template revision. Publishing an existing revision with the
    /// same content is a no-op; with other content it is refused.
    Publish {
        #[arg(long)]
        template: String,
        #[arg(long)]
        channel: Channel,
        #[arg(long)]
        locale: String,
        #[arg(long)]
        revision: String,
        /// Subject (e-mail only). May use template syntax.
        #[arg(long)]
        subject: Option<String>,
        /// Text body file.
        #[arg(long, value_name = "FILE")]
        body_file: PathBuf,
        /// HTML body file (e-mail only).
        #[arg(long, value_name = "FILE")]
        html_file: Option<PathBuf>,
        /// Make this revision the active one of its (template, channel, locale).
        #[arg(long)]
        activate: bool,
    },
    /// Make an already published revision the active one.
    Activate {
        #[arg(long)]
        template: String,
        #[arg(long)]
        channel: Channel,
        #[arg(long)]
        locale: String,
        #[arg(long)]
        revision: String,
    },
}

pub async fn run(config: &Config, command: TemplateCommand) -> anyhow::Result<()> {
    // Templates are the schema owner's to write: the runtime role only reads them.
    let store = Store::new(&config.owner_store())?;
    match command {
        TemplateCommand::Publish {
            template,
            channel,
            locale,
            revision,
            subject,
            body_file,
            html_file,
            activate,
        } => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
            };
            let rev = TemplateRevision {
                template,
                channel,
                locale,
                revision,
                subject,
                body_text: read(&body_file)?,
                body_html: html_file.as_ref().map(read).transpose()?,
            };
            if let Err(why) = rev.validate() {
                bail!(
                    "template {:?} revision {:?} ({}, {}) is not publishable: {why}",
                    rev.template,
                    rev.revision,
                    rev.channel,
                    rev.locale
                );
            }
            let outcome = store.publish_template(&rev, activate).await?;
            let what = match outcome {
                PublishOutcome::Published => "published",
                PublishOutcome::AlreadyPublished => "already published (same content)",
            };
            println!(
                "{} revision {} of {} ({}, {}){}",
                what,
                rev.revision,
                rev.template,
                rev.channel,
                rev.locale,
                if activate { ", active" } else { "" }
            );
            Ok(())
        }
        TemplateCommand::Activate {
            template,
            channel,
            locale,
            revision,
        } => {
            store
                .activate_template(&template, channel, &locale, &revision)
                .await?;
            println!("activated revision {revision} of {template} ({channel}, {locale})");
            Ok(())
        }
    }
}
