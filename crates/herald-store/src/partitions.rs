//! The monthly partitions of `notification_attempts` (RANGE on `started_at`, named
//! `notification_attempts_YYYY_MM`, plus `notification_attempts_default`): created ahead
//! of time, rows that reached the default partition moved into their month's partition
//! when it is created, and whole months dropped by retention.
//!
//! Run by `herald migrate`, at start-up and on the daemon's schedule, always as the schema
//! owner (DDL). One runner at a time: the advisory lock [`PARTITION_LOCK`]. Partition
//! bounds are dates formatted into the DDL (DDL takes no bind parameters), interpreted in
//! the session's time zone as they always were; every range test here uses the same
//! literals, so a row is compared against exactly the bounds its partition has.

use chrono::{Datelike, NaiveDate};
use tokio_postgres::Client;

use crate::{Result, Sql, Store};

/// Serialises partition DDL (creation, the move out of the default partition, drops)
/// between `herald migrate`, start-ups and the schedule of every instance. Not the
/// migration lock: a scheduled upkeep must not wait for a migration, nor the reverse for
/// long. ASCII "heraldp\0".
pub const PARTITION_LOCK: i64 = 0x6865_7261_6c64_7000;

/// The parent table and its default partition.
const PARENT: &str = "notification_attempts";
const DEFAULT_PARTITION: &str = "notification_attempts_default";
/// How long DDL waits for its lock: `ALTER TABLE ... PARTITION` queues for an exclusive
/// lock on the parent, and every insert of an attempt would queue behind it. Better to
/// give up and try again at the next pass.
const DDL_LOCK_TIMEOUT: &str = "10s";
/// Every statement of an upkeep gives up after this long waiting for a lock (the advisory
/// lock included): start-up must never hang on the upkeep, nor fail because of it.
pub(crate) const SESSION_LOCK_TIMEOUT: &str = "SET lock_timeout = '10s'";

/// What one upkeep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UpkeepReport {
    /// Partitions created, oldest first.
    pub created: Vec<String>,
    /// Partitions created with rows moved into them from the default partition, and how many.
    pub moved: Vec<(String, u64)>,
}

/// `notification_attempts_YYYY_MM` of the month starting `month`.
pub fn partition_name(month: NaiveDate) -> String {
    format!("{PARENT}_{:04}_{:02}", month.year(), month.month())
}

/// The first day of the month a partition named by [`partition_name`] starts; `None` for
/// any other name (the default partition, a table Herald did not create).
pub fn partition_month(name: &str) -> Option<NaiveDate> {
    let rest = name.strip_prefix(PARENT)?.strip_prefix('_')?;
    let (y, m) = rest.split_once('_')?;
    if y.len() != 4 || m.len() != 2 || !(y.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)
}

pub fn month_of(d: NaiveDate) -> NaiveDate {
    NaiveDate::from_ymd_opt(d.year(), d.month(), 1).expect("valid date")
}

pub fn next_month(d: NaiveDate) -> NaiveDate {
    if d.month() == 12 {
        NaiveDate::from_ymd_opt(d.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(d.year(), d.month() + 1, 1)
    }
    .expect("valid date")
}

/// Waits for the partition lock (`herald migrate`, start-up) or only tries (the schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    Wait,
    Try,
}

impl Store {
    /// Partition upkeep on a connection of its own: see [`upkeep`]. `Ok(None)`: `Try` and
    /// another instance holds the lock (it is doing this work).
    pub async fn partition_upkeep(
        &self,
        today: NaiveDate,
        months_ahead: u32,
        keep_from: NaiveDate,
        mode: LockMode,
    ) -> Result<Option<UpkeepReport>> {
        let mut client = self.session("partition upkeep (its advisory lock)").await?;
        client.batch_execute(SESSION_LOCK_TIMEOUT).await?;
        if !lock(&client, mode).await? {
            return Ok(None);
        }
        let report = upkeep(&mut client, today, months_ahead, keep_from).await;
        // The lock is the session's: a failed unlock ends with the connection, dropped here.
        let _ = client
            .execute("SELECT pg_advisory_unlock($1)", &[&PARTITION_LOCK])
            .await;
        report.map(Some)
    }

    /// Rows in the default partition, counted up to `cap` (reading at most `cap` rows):
    /// attempts whose month had no partition. 0 in a healthy database.
    pub async fn default_partition_rows(&self, cap: i64) -> Result<i64> {
        let conn = self.conn().await?;
        // notification_attempts_default is only ever small; the LIMIT bounds the read if not.
        let row = conn
            .query_one(
                "SELECT count(*) FROM (SELECT 1 FROM ONLY notification_attempts_default LIMIT $1) s",
                &[&cap],
            )
            .await?;
        Ok(row.get(0))
    }
}

/// Takes [`PARTITION_LOCK`] on `client`'s session; false: `Try` and it is held elsewhere.
pub(crate) async fn lock(client: &Client, mode: LockMode) -> Result<bool> {
    Ok(match mode {
        LockMode::Wait => {
            client
                .execute("SELECT pg_advisory_lock($1)", &[&PARTITION_LOCK])
                .await?;
            true
        }
        LockMode::Try => client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&PARTITION_LOCK])
            .await?
            .get(0),
    })
}

/// Creates the partitions of `today`'s month and the `months_ahead` after it, and of any
/// month the default partition holds rows of (attempts written while their month had no
/// partition: they are moved into it) that ends after `keep_from` (the attempts' retention
/// cutoff: older rows are deleted, not given a partition to be dropped). The caller holds [`PARTITION_LOCK`]. Idempotent;
/// each partition is its own transaction, so a failure keeps what was done before it.
pub(crate) async fn upkeep(
    client: &mut Client,
    today: NaiveDate,
    months_ahead: u32,
    keep_from: NaiveDate,
) -> Result<UpkeepReport> {
    let mut report = UpkeepReport::default();
    for month in missing_months(client, today, months_ahead, keep_from).await? {
        let name = partition_name(month);
        let moved = create_partition(client, month).await?;
        if moved > 0 {
            report.moved.push((name.clone(), moved));
        }
        report.created.push(name);
    }
    Ok(report)
}

/// The months [`upkeep`] would create a partition for, oldest first: `today`'s and the
/// `months_ahead` after it, and those the default partition holds rows of, without one,
/// unless the month ends at or before `keep_from` (retention deletes those rows instead).
async fn missing_months(
    client: &impl Sql,
    today: NaiveDate,
    months_ahead: u32,
    keep_from: NaiveDate,
) -> Result<Vec<NaiveDate>> {
    let mut months = Vec::new();
    let mut month = month_of(today);
    for _ in 0..=months_ahead {
        months.push(month);
        month = next_month(month);
    }
    // A sequential scan of the default partition, which is empty unless upkeep failed to
    // run in time (`herald_attempts_default_partition_rows` alerts on it).
    let stray = client
        .query(
            "SELECT DISTINCT to_char(date_trunc('month', started_at), 'YYYY-MM-DD')
               FROM ONLY notification_attempts_default",
            &[],
        )
        .await?;
    for row in stray {
        let text: String = row.get(0);
        match NaiveDate::parse_from_str(&text, "%Y-%m-%d") {
            Ok(d) if next_month(d) > keep_from => months.push(d),
            _ => {}
        }
    }
    months.sort_unstable();
    months.dedup();
    let mut missing = Vec::new();
    for month in months {
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&partition_name(month)])
            .await?
            .get(0);
        if !exists {
            missing.push(month);
        }
    }
    Ok(missing)
}

/// The `WHERE` of the rows a partition of `month` holds, with the literals of its bounds.
fn month_range(month: NaiveDate) -> String {
    format!("started_at >= '{month}' AND started_at < '{}'", next_month(month))
}

impl Store {
    /// What [`Store::partition_upkeep`] would do now (`--dry-run`): changes nothing.
    pub async fn partition_upkeep_preview(
        &self,
        today: NaiveDate,
        months_ahead: u32,
        keep_from: NaiveDate,
    ) -> Result<UpkeepReport> {
        let client = self.session("the partition upkeep preview").await?;
        let mut report = UpkeepReport::default();
        for month in missing_months(&client, today, months_ahead, keep_from).await? {
            let name = partition_name(month);
            let rows: i64 = client
                .query_one(
                    &format!(
                        "SELECT count(*) FROM ONLY {DEFAULT_PARTITION} WHERE {}",
                        month_range(month)
                    ),
                    &[],
                )
                .await?
                .get(0);
            if rows > 0 {
                report.moved.push((name.clone(), rows as u64));
            }
            report.created.push(name);
        }
        Ok(report)
    }
}

/// Creates the partition of `month`; when the default partition holds rows of that month
/// (PostgreSQL would refuse the partition then), moves them into it in the same
/// transaction. Returns the rows moved.
async fn create_partition(client: &mut Client, month: NaiveDate) -> Result<u64> {
    let name = partition_name(month);
    let next = next_month(month);
    let range = month_range(month);
    let tx = client.transaction().await?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
        .await?;
    let stranded: bool = tx
        .query_one(
            &format!("SELECT EXISTS (SELECT 1 FROM ONLY {DEFAULT_PARTITION} WHERE {range})"),
            &[],
        )
        .await?
        .get(0);
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {name} PARTITION OF {PARENT} FOR VALUES FROM ('{month}') TO ('{next}')"
    );
    if !stranded {
        tx.batch_execute(&create).await?;
        // Failure policy: a crash before this commit creates nothing; the next upkeep does.
        tx.commit().await?;
        return Ok(0);
    }
    // The columns in the parent's order, from the catalog (a move must not depend on the
    // order the migrations happened to add them in).
    let columns: String = tx
        .query_one(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)
               FROM pg_attribute
              WHERE attrelid = 'notification_attempts'::regclass AND attnum > 0 AND NOT attisdropped",
            &[],
        )
        .await?
        .get(0);
    // The parent is locked exclusively from the detach to the commit: attempts being
    // recorded wait for as long as the move takes (the default partition is small).
    tx.batch_execute(&format!(
        "ALTER TABLE {PARENT} DETACH PARTITION {DEFAULT_PARTITION};
         {create};"
    ))
    .await?;
    let moved = tx
        .execute(
            &format!(
                "WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE {range} RETURNING {columns})
                 INSERT INTO {PARENT} ({columns}) SELECT {columns} FROM moved"
            ),
            &[],
        )
        .await?;
    tx.batch_execute(&format!(
        "ALTER TABLE {PARENT} ATTACH PARTITION {DEFAULT_PARTITION} DEFAULT"
    ))
    .await?;
    // Failure policy: a crash anywhere before this commit rolls back the detach, the new
    // partition and the move together: the rows are still in the default partition, which
    // is still attached, and the next upkeep starts over. Nothing half-moved is visible.
    tx.commit().await?;
    tracing::warn!(partition = %name, rows = moved, "attempts moved from the default partition into their month's partition");
    Ok(moved)
}

/// Herald's monthly partitions whose upper bound is at or before `cutoff` (every row
/// started before it), oldest first. Other tables attached to the parent are never listed.
pub(crate) async fn partitions_before(client: &impl Sql, cutoff: NaiveDate) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
              WHERE i.inhparent = 'notification_attempts'::regclass",
            &[],
        )
        .await?;
    let mut old: Vec<(NaiveDate, String)> = rows
        .into_iter()
        .filter_map(|r| {
            let name: String = r.get(0);
            let month = partition_month(&name)?;
            (next_month(month) <= cutoff).then_some((month, name))
        })
        .collect();
    old.sort();
    Ok(old.into_iter().map(|(_, n)| n).collect())
}

/// Detaches and drops one partition listed by [`partitions_before`], in one transaction.
pub(crate) async fn drop_partition(client: &mut Client, name: &str) -> Result<()> {
    debug_assert!(partition_month(name).is_some());
    let tx = client.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}';
         ALTER TABLE {PARENT} DETACH PARTITION {name};
         DROP TABLE {name};"
    ))
    .await?;
    // Failure policy: a crash before this commit leaves the partition attached with all
    // its rows; the next pass drops it. Detached-but-not-dropped is never visible.
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(y: i32, m: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, 1).unwrap()
    }

    #[test]
    fn next_month_wraps_the_year() {
        assert_eq!(next_month(d(2026, 12)), d(2027, 1));
        assert_eq!(next_month(d(2026, 1)), d(2026, 2));
    }

    #[test]
    fn only_herald_month_partitions_are_recognised() {
        assert_eq!(partition_name(d(2026, 3)), "notification_attempts_2026_03");
        assert_eq!(partition_month("notification_attempts_2026_03"), Some(d(2026, 3)));
        for other in [
            "notification_attempts_default",
            "notification_attempts_2026_13",
            "notification_attempts_2026_3",
            "notification_attempts_2026_03_old",
            "notification_attempts_20x6_03",
            "outbox_2026_03",
        ] {
            assert_eq!(partition_month(other), None, "{other}");
        }
    }
}
