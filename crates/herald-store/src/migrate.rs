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
    ///
    /// With `runtime_role`, the role then gets [`RUNTIME_PRIVILEGES`] (see
    /// [`grant_runtime`]), still under the migration lock: two instances starting together
    /// cannot interleave their grants, nor grant on a schema another is still changing.
    pub async fn migrate(
        &self,
        months_ahead: u32,
        keep_from: NaiveDate,
        runtime_role: Option<&str>,
    ) -> Result<MigrationReport> {
        let mut client = self.session("migrations (their advisory lock)").await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        let report = embedded::migrations::runner()
            .set_migration_table_name("herald_schema_history")
            .run_async(&mut client)
            .await;
        let report = match (report, runtime_role) {
            (Ok(report), Some(role)) => grant_runtime(&mut client, role).await.map(|()| report),
            (Ok(report), None) => Ok(report),
            (Err(e), _) => Err(e.into()),
        };
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
            Err(e) => Err(e),
        };
        client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await?;
        result
    }
}

/// What `herald run` and the commands that run as the runtime role (intent resolve,
/// suppression remove, dead-letter replay) do to each table, and so all the runtime role
/// may do. Retention, migrations, partitions and template publishing run as the schema
/// owner. `ON CONFLICT DO UPDATE` and `SELECT ... FOR UPDATE` need UPDATE; cascaded
/// deletes and foreign-key checks run as the owner. No DELETE on the ledger (intents,
/// payloads, attempts, conflicts, resolutions, provider evidence), no write to templates.
pub const RUNTIME_PRIVILEGES: &[(&str, &str)] = &[
    // The intent: its frozen contents (UPDATE: a held intent's decision), its state, and
    // the view joining them, which Herald only reads.
    ("intent_contents", "SELECT, INSERT, UPDATE"),
    ("intent_states", "SELECT, INSERT, UPDATE"),
    ("notification_intents", "SELECT"),
    ("notification_payloads", "SELECT, INSERT, UPDATE"),
    ("notification_attempts", "SELECT, INSERT, UPDATE"),
    ("intent_conflicts", "SELECT, INSERT"),
    ("intent_resolutions", "SELECT, INSERT"),
    ("intent_holds", "SELECT, INSERT, UPDATE"),
    // Claimed FOR UPDATE and deleted once published.
    ("outbox", "SELECT, INSERT, UPDATE, DELETE"),
    ("provider_events", "SELECT, INSERT, UPDATE"),
    ("provider_event_rejects", "SELECT, INSERT"),
    ("provider_log_cursors", "SELECT, INSERT, UPDATE"),
    ("suppressions", "SELECT, INSERT, UPDATE"),
    ("suppression_key", "SELECT, INSERT"),
    // Tombstones delete a seller's profile.
    ("sellers", "SELECT, INSERT, UPDATE, DELETE"),
    ("templates", "SELECT"),
    // Expired keys are deleted (their mismatches go by cascade, as the owner).
    ("http_requests", "SELECT, INSERT, UPDATE, DELETE"),
    ("http_request_mismatches", "SELECT, INSERT"),
    ("herald_schema_history", "SELECT"),
    // A partition: the database gauges count what lands here (`FROM ONLY`), an alert's
    // input. The monthly partitions are reached through their parent only.
    ("notification_attempts_default", "SELECT"),
];

/// Grants `role` [`RUNTIME_PRIVILEGES`] and nothing more, in one transaction (a running
/// instance never sees a moment with fewer): everything it had on the schema's tables is
/// revoked first, so a privilege dropped from the list is taken away on the next
/// migration. No CREATE on the schema, no TRUNCATE, no ownership: DDL fails. A table of
/// the schema the list does not name fails the grant: every new table needs a decision.
async fn grant_runtime(client: &mut tokio_postgres::Client, role: &str) -> Result<()> {
    let row = client
        .query_one("SELECT current_schema(), current_user", &[])
        .await?;
    let (schema, owner): (String, String) = (row.get(0), row.get(1));
    if owner == role {
        // REVOKE ALL would take the owner's own rights on its tables away.
        return Err(crate::StoreError::Config(format!(
            "database.runtime_role {role:?} is the role migrating (database.owner_url's user): \
             the runtime role must be another"
        )));
    }
    // Every table, partition and view of the schema, with whether it is a partition.
    let tables: Vec<(String, bool)> = client
        .query(
            "SELECT c.relname, c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v')
              ORDER BY 1",
            &[],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let unlisted: Vec<&String> = tables
        .iter()
        .filter(|(t, partition)| !partition && !RUNTIME_PRIVILEGES.iter().any(|(name, _)| name == t))
        .map(|(t, _)| t)
        .collect();
    if !unlisted.is_empty() {
        return Err(crate::StoreError::Config(format!(
            "no runtime privileges are listed for {unlisted:?} (herald_store::migrate::RUNTIME_PRIVILEGES)"
        )));
    }
    let (schema, role) = (quote_ident(&schema), quote_ident(role));
    let mut sql = format!(
        "REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role};
         GRANT USAGE ON SCHEMA {schema} TO {role};
         GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};"
    );
    for (table, privileges) in RUNTIME_PRIVILEGES {
        if tables.iter().any(|(t, _)| t == table) {
            sql.push_str(&format!(
                "GRANT {privileges} ON {schema}.{} TO {role};",
                quote_ident(table)
            ));
        }
    }
    let tx = client.transaction().await?;
    tx.batch_execute(&sql).await?;
    tx.commit().await?;
    Ok(())
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
