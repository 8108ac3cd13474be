//! The hot statements and the index each must use, for `EXPLAIN` checks: a test runs them
//! against a populated database and fails when a plan stops using its index (a plan
//! regression as the intents grow). The SQL is the very text the store runs.

use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use crate::{Result, Store};

/// One hot statement: where it runs, its SQL, and the indexes its plan may use (any one
/// of them; the first is the one designed for it).
pub struct HotStatement {
    pub name: &'static str,
    pub sql: &'static str,
    pub indexes: &'static [&'static str],
    /// Run as [`crate::Hot`]: prepared once per connection (unless `database.pooler` is
    /// `transaction`), so PostgreSQL may settle on its generic plan after the first
    /// executions. The others are prepared on every call and always planned for their values.
    pub prepared: bool,
    /// Its plan may join tables. A statement without (the relay's claim) reads its table
    /// alone: a join in its plan fails the check, a sub-plan's probe (an `InitPlan` or
    /// `SubPlan` for a rare row) does not.
    pub joins: bool,
    params: fn() -> Vec<Box<dyn ToSql + Sync + Send>>,
}

/// The partial index of live intents (see `state_is_one_of!`).
const LIVE_INTENTS: &str = "notification_intents_state_idx";

fn texts() -> Vec<String> {
    vec!["k-1".to_owned()]
}

/// `n` random ids: a batch's worth.
fn ids(n: usize) -> Vec<Uuid> {
    (0..n).map(|_| Uuid::new_v4()).collect()
}

/// The default largest claim batch (`delivery.db_batch_max`), also used for a release.
const DB_BATCH_MAX: usize = 256;

/// Every statement on a per-event or per-attempt path.
pub const HOT_STATEMENTS: &[HotStatement] = &[
    HotStatement {
        name: "ingest: intents already holding a batch's keys",
        sql: crate::ingest::EXISTING_BY_BUSINESS_KEY,
        indexes: &["notification_intents_business_key"],
        prepared: false,
        joins: true,
        params: || {
            vec![
                Box::new(texts()),
                Box::new(texts()),
                Box::new(texts()),
                Box::new(texts()),
            ]
        },
    },
    HotStatement {
        name: "ingest: the batch's seller profiles",
        sql: crate::ingest::sellers::SELLERS_BY_KEY,
        indexes: &["sellers_pkey"],
        prepared: true,
        joins: true,
        params: || vec![Box::new(texts()), Box::new(texts())],
    },
    HotStatement {
        name: "ingest: the suppression-list entries of the profiles' destinations",
        sql: crate::ingest::sellers::SUPPRESSED_DESTINATIONS,
        indexes: &["suppressions_live"],
        prepared: true,
        joins: true,
        params: || vec![Box::new(texts()), Box::new(texts()), Box::new(texts())],
    },
    HotStatement {
        name: "relay: due outbox rows",
        sql: crate::relay::CLAIM_DUE,
        indexes: &["outbox_available_at_idx"],
        prepared: true,
        joins: false,
        params: || vec![Box::new(500i64)],
    },
    HotStatement {
        name: "relay: delete published rows",
        sql: crate::relay::DELETE_PUBLISHED,
        indexes: &["outbox_pkey"],
        prepared: true,
        joins: true,
        params: || vec![Box::new(vec![1i64, 2, 3])],
    },
    HotStatement {
        name: "delivery: claim intents by id",
        sql: crate::delivery::CLAIM,
        indexes: &["intent_states_pkey"],
        prepared: true,
        joins: true,
        // The largest batch: the more ids, the nearer a scan of the candidates looks.
        params: || {
            vec![
                Box::new(ids(DB_BATCH_MAX)),
                Box::new(ids(DB_BATCH_MAX)),
                Box::new("worker".to_owned()),
                Box::new(60.0f64),
            ]
        },
    },
    HotStatement {
        name: "delivery: record attempts' outcomes and intents' next states",
        sql: crate::delivery::RECORD,
        // Each partition's primary key (id, started_at), e.g. "notification_attempts_2026_12_pkey".
        indexes: &["_pkey on notification_attempts"],
        prepared: true,
        joins: true,
        params: || {
            let one = || vec![Some("x".to_owned())];
            vec![
                Box::new(vec![Uuid::nil()]),
                Box::new(vec![chrono::Utc::now()]),
                Box::new(vec!["accepted".to_owned()]),
                Box::new(one()),
                Box::new(one()),
                Box::new(one()),
                Box::new(vec![Uuid::nil()]),
                Box::new(vec!["accepted".to_owned()]),
                Box::new(vec![None::<f64>]),
            ]
        },
    },
    // Holds: per seller profile that arrives, and each round of the deadline sweep; after
    // an outage of the profile topic, a backlog of held intents.
    HotStatement {
        name: "holds: open holds of the sellers whose profiles came",
        sql: crate::ingest::holds::OPEN_HOLDS_OF_SELLERS,
        indexes: &["intent_holds_open_seller_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(texts()), Box::new(texts())],
    },
    HotStatement {
        name: "holds: open holds whose sellers have profiles (the backstop round)",
        sql: crate::ingest::holds::OPEN_HOLDS_WITH_PROFILE,
        // The deadline order of the open holds, whatever the decided ones number.
        indexes: &["intent_holds_open_until_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(500i64)],
    },
    HotStatement {
        name: "holds: release held intents by id",
        sql: crate::ingest::holds::RELEASE,
        indexes: &["intent_states_pkey"],
        prepared: false,
        joins: true,
        params: || {
            let many = || vec!["k-1".to_owned(); DB_BATCH_MAX];
            vec![
                Box::new(ids(DB_BATCH_MAX)),
                Box::new(many()),
                Box::new(many()),
                Box::new(many()),
                Box::new(vec![1i64; DB_BATCH_MAX]),
            ]
        },
    },
    HotStatement {
        name: "holds: expire holds past their deadline",
        sql: crate::ingest::holds::EXPIRE_DUE,
        // Either partial index of open holds: both hold the open set only, however many
        // decided holds the table keeps.
        indexes: &["intent_holds_open_until_idx", "intent_holds_open_seller_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(500i64)],
    },
    HotStatement {
        name: "delivery: expired leases",
        sql: crate::delivery::EXPIRED_LEASES,
        // With few intents in `sending` the planner may prefer the partial index of
        // non-terminal states; both stay small however large the table grows.
        indexes: &[
            "notification_intents_sending_lease_idx",
            "notification_intents_state_idx",
        ],
        prepared: true,
        joins: true,
        params: || vec![Box::new(None::<Vec<Uuid>>), Box::new(500i64)],
    },
    // Evidence: once per provider event, or per intent the silence sweep decides; a backlog
    // of `unknown` intents after a provider outage must not make each of them read it all.
    HotStatement {
        name: "evidence: settle an unknown intent by its provider's event",
        sql: crate::reconcile::SETTLE,
        indexes: &["intent_states_pkey"],
        prepared: true,
        joins: true,
        params: || {
            vec![
                Box::new(Uuid::nil()),
                Box::new("accepted".to_owned()),
                Box::new(Uuid::nil()),
                Box::new(1i64),
                Box::new("reconciler".to_owned()),
                Box::new(1i32),
            ]
        },
    },
    HotStatement {
        name: "evidence: the policy's decision after silence",
        sql: crate::reconcile::SILENCE_DECIDED,
        indexes: &["intent_states_pkey"],
        prepared: true,
        joins: true,
        params: || {
            vec![
                Box::new(Uuid::nil()),
                Box::new(Some(60.0f64)),
                Box::new("retry".to_owned()),
                Box::new("silence".to_owned()),
                Box::new("reconciler".to_owned()),
            ]
        },
    },
    HotStatement {
        name: "inspect: an intent by business key",
        sql: crate::inspect::INTENT_BY_BUSINESS_KEY,
        indexes: &["notification_intents_business_key"],
        prepared: false,
        joins: true,
        params: || {
            vec![
                Box::new("acme".to_owned()),
                Box::new("1".to_owned()),
                Box::new("order.created".to_owned()),
                Box::new("email".to_owned()),
            ]
        },
    },
    HotStatement {
        name: "inspect: an intent's attempts",
        sql: crate::inspect::ATTEMPTS_OF_INTENT,
        // Each partition's index is named after its columns.
        indexes: &["intent_id_attempt_no_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(Uuid::nil())],
    },
    // Retention: not per event, but hourly on the largest tables, where a sequential scan
    // would read them whole each pass.
    HotStatement {
        name: "retention: payloads whose body is due",
        sql: crate::retention::PURGE_CANDIDATES,
        indexes: &["notification_payloads_unpurged_idx"],
        prepared: false,
        joins: true,
        params: || {
            let cutoff = chrono::Utc::now() - chrono::Duration::days(90);
            vec![
                Box::new(cutoff),
                Box::new(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
                Box::new(String::new()),
                Box::new(1000i64),
            ]
        },
    },
    HotStatement {
        name: "retention: purge bodies no live intent references",
        sql: crate::retention::PURGE_BODIES,
        indexes: &["notification_intents_payload_digest_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(texts()), Box::new(texts())],
    },
    HotStatement {
        name: "retention: terminal intents created before the cutoff",
        sql: crate::retention::INTENT_CANDIDATES,
        indexes: &["notification_intents_pkey"],
        prepared: false,
        joins: true,
        params: || {
            let cutoff = chrono::Utc::now() - chrono::Duration::days(730);
            vec![
                Box::new(Uuid::nil()),
                Box::new(crate::retention::v7_floor(cutoff)),
                Box::new(cutoff),
                Box::new(1000i64),
            ]
        },
    },
    HotStatement {
        name: "retention: delete payloads no intent references",
        sql: crate::retention::DELETE_UNREFERENCED_PAYLOADS,
        indexes: &["notification_intents_payload_digest_idx"],
        prepared: false,
        joins: true,
        params: || vec![Box::new(texts())],
    },
];

impl HotStatement {
    /// The plans PostgreSQL may run this statement with.
    pub fn plan_kinds(&self) -> &'static [PlanKind] {
        if self.prepared {
            &[PlanKind::Custom, PlanKind::Generic]
        } else {
            &[PlanKind::Custom]
        }
    }

    /// What is wrong with `plan` (from [`Store::explain`]), if anything: none of the
    /// statement's indexes is used, or a table with rows is scanned sequentially (empty
    /// partitions, costed 0.00..0.00, are scanned at no cost and allowed).
    pub fn check(&self, plan: &str) -> Option<String> {
        if !self.indexes.iter().any(|i| plan.contains(i)) {
            return Some(format!("uses none of {:?}", self.indexes));
        }
        // Its size is the backlog's: only statements meant to read the live intents may.
        if plan.contains(LIVE_INTENTS) && !self.indexes.contains(&LIVE_INTENTS) {
            return Some(format!("reads {LIVE_INTENTS}, every live intent"));
        }
        if !self.joins {
            if let Some(l) = plan
                .lines()
                .find(|l| l.contains(" Join ") || l.contains("Nested Loop"))
            {
                return Some(format!("joins another table: {}", l.trim()));
            }
        }
        plan.lines()
            .find(|l| l.contains("Seq Scan on ") && !l.contains("cost=0.00..0.00 "))
            .map(|l| format!("sequential scan: {}", l.trim()))
    }
}

/// Which plan [`Store::explain`] shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// Planned for the sample parameters' values, as PostgreSQL plans a prepared
    /// statement's first executions.
    Custom,
    /// The generic plan, for any values, which PostgreSQL may cache and use for every later
    /// execution of a statement prepared once per connection ([`HotStatement::prepared`]):
    /// its estimates do not see how many ids an array holds.
    Generic,
}

/// The prepared statement [`Store::explain`] makes for a generic plan.
const CHECKED: &str = "herald_plan_check";

impl Store {
    /// `EXPLAIN` (costs only; nothing is executed) of `statement` with sample parameters.
    pub async fn explain(&self, statement: &HotStatement, kind: PlanKind) -> Result<String> {
        // A connection of its own: a generic plan's session setting and prepared statement
        // go with it, whatever happens, and never back to the pool.
        let conn = self.session("a plan check").await?;
        let params = (statement.params)();
        let refs: Vec<&(dyn ToSql + Sync)> =
            params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let rows = match kind {
            PlanKind::Custom => conn.query(&format!("EXPLAIN {}", statement.sql), &refs).await?,
            PlanKind::Generic => {
                // EXPLAIN EXECUTE takes no bound parameters: each sample value goes in as a
                // literal of the type PostgreSQL infers for its parameter, into a named
                // prepared statement explained while the session forces generic plans.
                let types = conn.prepare(statement.sql).await?.params().to_vec();
                let mut args = Vec::with_capacity(refs.len());
                for (ty, value) in types.iter().zip(&refs) {
                    let literal = conn
                        .prepare_typed(
                            "SELECT coalesce(quote_literal($1::text), 'NULL') || '::' || format_type($2, NULL)",
                            &[ty.clone(), Type::OID],
                        )
                        .await?;
                    args.push(
                        conn.query_one(&literal, &[*value, &ty.oid()])
                            .await?
                            .get::<_, String>(0),
                    );
                }
                conn.batch_execute(&format!(
                    "SET plan_cache_mode = force_generic_plan; PREPARE {CHECKED} AS {}",
                    statement.sql
                ))
                .await?;
                conn.query(&format!("EXPLAIN EXECUTE {CHECKED}({})", args.join(", ")), &[])
                    .await?
            }
        };
        Ok(rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::HOT_STATEMENTS;

    #[test]
    fn the_check_finds_what_it_must() {
        let relay = HOT_STATEMENTS
            .iter()
            .find(|s| s.name.starts_with("relay: due"))
            .unwrap();
        let good = "Limit  (cost=0.28..30.1 rows=500 width=50)\n  ->  Index Scan using outbox_available_at_idx on outbox";
        assert_eq!(relay.check(good), None);
        let seq = "Limit\n  ->  Sort\n        ->  Seq Scan on outbox  (cost=0.00..155.00 rows=6000 width=50)";
        assert!(relay.check(seq).is_some());
        let mixed = format!("{good}\n  ->  Seq Scan on outbox_2027  (cost=0.00..35.50 rows=2550 width=50)");
        assert!(relay.check(&mixed).unwrap().contains("sequential scan"));
        let empty_partition = format!(
            "{good}\n  ->  Seq Scan on notification_attempts_default a  (cost=0.00..0.00 rows=1 width=0)"
        );
        assert_eq!(relay.check(&empty_partition), None);
        // The relay reads the outbox alone: a row's channel is on it (V14); only a row
        // without one probes its intent, in a sub-plan.
        let fallback = format!(
            "{good}\n  SubPlan 1\n    ->  Index Scan using intent_contents_pkey on intent_contents i"
        );
        assert_eq!(relay.check(&fallback), None);
        let joined = "Limit\n  ->  Nested Loop\n        ->  Index Scan using outbox_available_at_idx on outbox o\n        ->  Index Scan using intent_contents_pkey on intent_contents i";
        assert!(relay.check(joined).unwrap().contains("joins another table"));
        let hashed = format!("{good}\n  ->  Hash Join  (cost=1.00..2.00 rows=1 width=50)");
        assert!(relay.check(&hashed).unwrap().contains("joins another table"));
        // A plan that probes by id but also reads the live intents fails; the sweeper may.
        let claim = HOT_STATEMENTS
            .iter()
            .find(|s| s.name.starts_with("delivery: claim"))
            .unwrap();
        let both = "  ->  Index Scan using notification_intents_state_idx on intent_states s\n  ->  Index Scan using intent_states_pkey on intent_states s";
        assert!(claim.check(both).unwrap().contains("every live intent"));
        let leases = HOT_STATEMENTS
            .iter()
            .find(|s| s.name.starts_with("delivery: expired leases"))
            .unwrap();
        assert_eq!(
            leases.check("Index Scan using notification_intents_state_idx on intent_states"),
            None
        );
    }
}
