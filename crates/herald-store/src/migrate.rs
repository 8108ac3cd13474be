//! Applies `migrations/` (refinery, versioned SQL files embedded at build time), then the
//! partition upkeep of `notification_attempts` ([`crate::partitions`]).

use chrono::{NaiveDate, Utc};

use crate::partitions::{self, LockMode, UpkeepReport};
use crate::{Result, Store};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// Serialises concurrent `herald migrate` runs and start-ups (any constant will do; this
/// one spells "herald" in ASCII).
const MIGRATION_LOCK: i64 = 0x0068_6572_616c_6400;

#[derive(Debug)]
pub struct MigrationReport {
    pub applied: Vec<String>,
    /// The partition upkeep after the migrations. Its failure does not fail the migration:
    /// start-up must not depend on it (the schedule tries again); `herald migrate` reports it.
    pub partitions: Result<UpkeepReport>,
}

impl Store {
    /// Applies pending migrations, then runs the partition upkeep (this month and the next
    /// `months_ahead`, and any month after `keep_from` stranded in the default partition). Safe to run
    /// concurrently: advisory locks serialise runners. `Err`: the migrations failed.
    pub async fn migrate(&self, months_ahead: u32, keep_from: NaiveDate) -> Result<MigrationReport> {
        let mut client = self.dedicated().await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let report = embedded::migrations::runner()
            .set_migration_table_name("herald_schema_history")
            .run_async(&mut client)
            .await;
        let result = match report {
            Ok(report) => {
                let applied = report
                    .applied_migrations()
                    .iter()
                    .map(|m| format!("V{}__{}", m.version(), m.name()))
                    .collect();
                let partitions = upkeep_locked(&mut client, months_ahead, keep_from).await;
                Ok(MigrationReport { applied, partitions })
            }
            Err(e) => Err(e.into()),
        };
        client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await?;
        result
    }

    /// Grants `role` what `herald run` needs and nothing more: reading and writing the
    /// rows of every table in the schema, and its sequences. No CREATE on the schema, no
    /// TRUNCATE, no ownership: DDL from `role` fails. Idempotent; run by the schema owner
    /// after each migration (new tables get their grants then).
    pub async fn grant_runtime(&self, role: &str) -> Result<()> {
        let client = self.dedicated().await?;
        let schema: String = client.query_one("SELECT current_schema()", &[]).await?.get(0);
        let (schema, role) = (quote_ident(&schema), quote_ident(role));
        client
            .batch_execute(&format!(
                "GRANT USAGE ON SCHEMA {schema} TO {role};
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
                 GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
                 REVOKE INSERT, UPDATE, DELETE ON {schema}.herald_schema_history FROM {role};"
            ))
            .await?;
        Ok(())
    }
}

/// `name` as a quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The partition upkeep on the migration's session, under [`partitions::PARTITION_LOCK`]
/// too (the schedule of a running instance may be at it).
async fn upkeep_locked(
    client: &mut tokio_postgres::Client,
    months_ahead: u32,
    keep_from: NaiveDate,
) -> Result<UpkeepReport> {
    client.batch_execute(partitions::SESSION_LOCK_TIMEOUT).await?;
    let report = match partitions::lock(client, LockMode::Wait).await {
        Ok(_) => {
            let report = partitions::upkeep(client, Utc::now().date_naive(), months_ahead, keep_from).await;
            client
                .execute("SELECT pg_advisory_unlock($1)", &[&partitions::PARTITION_LOCK])
                .await?;
            report
        }
        Err(e) => Err(e),
    };
    client.batch_execute("RESET lock_timeout").await?;
    report
}
