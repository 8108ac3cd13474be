//! Applies `migrations/` (refinery, versioned SQL files embedded at build time) and keeps
//! the monthly partitions of `notification_attempts` created ahead of time.

use chrono::{Datelike, NaiveDate, Utc};

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
    pub partitions_created: Vec<String>,
}

impl Store {
    /// Applies pending migrations and creates the attempt partitions for this month and the
    /// next `months_ahead`. Safe to run concurrently: an advisory lock serialises runners.
    pub async fn migrate(&self, months_ahead: u32) -> Result<MigrationReport> {
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
                let partitions_created = ensure_attempt_partitions(&client, months_ahead).await?;
                Ok(MigrationReport {
                    applied,
                    partitions_created,
                })
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

/// Creates `notification_attempts_YYYY_MM` for the current month and `months_ahead` more.
/// Idempotent. Returns the names it created.
async fn ensure_attempt_partitions(
    client: &tokio_postgres::Client,
    months_ahead: u32,
) -> Result<Vec<String>> {
    let today = Utc::now().date_naive();
    let mut month = NaiveDate::from_ymd_opt(today.year(), today.month(), 1).expect("valid date");
    let mut created = Vec::new();
    for _ in 0..=months_ahead {
        let next = next_month(month);
        let name = format!("notification_attempts_{:04}_{:02}", month.year(), month.month());
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
            .await?
            .get(0);
        if !exists {
            // Partition bounds are dates computed here, not input: formatting them into the
            // DDL is safe (DDL takes no bind parameters).
            client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {name} PARTITION OF notification_attempts \
                     FOR VALUES FROM ('{month}') TO ('{next}')"
                ))
                .await?;
            created.push(name);
        }
        month = next;
    }
    Ok(created)
}

fn next_month(d: NaiveDate) -> NaiveDate {
    if d.month() == 12 {
        NaiveDate::from_ymd_opt(d.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(d.year(), d.month() + 1, 1)
    }
    .expect("valid date")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_month_wraps_the_year() {
        let d = |y, m| NaiveDate::from_ymd_opt(y, m, 1).unwrap();
        assert_eq!(next_month(d(2026, 12)), d(2027, 1));
        assert_eq!(next_month(d(2026, 1)), d(2026, 2));
    }
}
