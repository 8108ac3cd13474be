//! Template revisions: publish (immutable), activate, and load the active set.

use herald_core::render::TemplateRevision;
use herald_core::Channel;

use crate::{Hot, Result, Sql, Store, StoreError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    /// A new revision was stored.
    Published,
    /// The same revision with the same content already existed: nothing changed.
    AlreadyPublished,
}

impl Store {
    /// Stores a revision; refuses a revision that exists with other content. With
    /// `activate`, makes it the one active revision of its (template, channel, locale) in
    /// the same transaction.
    pub async fn publish_template(&self, rev: &TemplateRevision, activate: bool) -> Result<PublishOutcome> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        let digest = rev.content_digest();
        // templates_pkey (template, channel, locale, revision)
        let inserted = tx
            .execute(
                "INSERT INTO templates (template, channel, locale, revision, subject, body_text, body_html, content_digest)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT ON CONSTRAINT templates_pkey DO NOTHING",
                &[
                    &rev.template,
                    &rev.channel.as_str(),
                    &rev.locale,
                    &rev.revision,
                    &rev.subject,
                    &rev.body_text,
                    &rev.body_html,
                    &digest,
                ],
            )
            .await?;
        let outcome = if inserted == 1 {
            PublishOutcome::Published
        } else {
            let existing: String = tx
                .query_one(
                    "SELECT content_digest FROM templates
                     WHERE template = $1 AND channel = $2 AND locale = $3 AND revision = $4",
                    &[&rev.template, &rev.channel.as_str(), &rev.locale, &rev.revision],
                )
                .await?
                .get(0);
            if existing != digest {
                return Err(StoreError::RevisionContentMismatch {
                    template: rev.template.clone(),
                    channel: rev.channel.to_string(),
                    locale: rev.locale.clone(),
                    revision: rev.revision.clone(),
                });
            }
            PublishOutcome::AlreadyPublished
        };
        if activate {
            activate_in(&tx, &rev.template, rev.channel, &rev.locale, &rev.revision).await?;
        }
        // Failure policy: a crash before this commit leaves no trace; publishing is
        // idempotent and can simply be run again.
        tx.commit().await?;
        Ok(outcome)
    }

    /// Makes `revision` the active one of its (template, channel, locale).
    pub async fn activate_template(
        &self,
        template: &str,
        channel: Channel,
        locale: &str,
        revision: &str,
    ) -> Result<()> {
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await?;
        activate_in(&tx, template, channel, locale, revision).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Every active revision. Ingest loads this once per batch inside its transaction; the set
/// is small (templates x channels x locales).
pub(crate) async fn load_active(client: &impl Sql) -> Result<Vec<TemplateRevision>> {
    // templates_one_active_idx; prepared once per connection, as every ingest batch
    // reads it.
    let rows = client
        .query(
            Hot(
                "SELECT template, channel, locale, revision, subject, body_text, body_html
                 FROM templates WHERE active",
            ),
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(TemplateRevision {
                template: r.get(0),
                channel: crate::stored_channel("templates.channel", r.get(1))?,
                locale: r.get(2),
                revision: r.get(3),
                subject: r.get(4),
                body_text: r.get(5),
                body_html: r.get(6),
            })
        })
        .collect()
}

async fn activate_in(
    tx: &impl Sql,
    template: &str,
    channel: Channel,
    locale: &str,
    revision: &str,
) -> Result<()> {
    // Deactivate first: templates_one_active_idx allows one active row per key.
    tx.execute(
        "UPDATE templates SET active = false
         WHERE template = $1 AND channel = $2 AND locale = $3 AND active AND revision <> $4",
        &[&template, &channel.as_str(), &locale, &revision],
    )
    .await?;
    let n = tx
        .execute(
            "UPDATE templates SET active = true, activated_at = now()
             WHERE template = $1 AND channel = $2 AND locale = $3 AND revision = $4 AND NOT active",
            &[&template, &channel.as_str(), &locale, &revision],
        )
        .await?;
    if n == 0 {
        let exists = tx
            .query_opt(
                "SELECT 1 FROM templates WHERE template = $1 AND channel = $2 AND locale = $3 AND revision = $4",
                &[&template, &channel.as_str(), &locale, &revision],
            )
            .await?
            .is_some();
        if !exists {
            return Err(StoreError::RevisionNotFound {
                template: template.to_owned(),
                channel: channel.to_string(),
                locale: locale.to_owned(),
                revision: revision.to_owned(),
            });
        }
    }
    Ok(())
}
