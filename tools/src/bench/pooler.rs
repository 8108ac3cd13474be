//! The cost of a transaction-mode pooler (issue 42): Herald through PgBouncer in
//! transaction mode (deploy/local/pgbouncer.sh; `database.pooler = "transaction"`, every
//! statement unnamed, planned each time; LISTEN over a direct session URL) against the same
//! PostgreSQL directly with its statements prepared once per connection (see
//! [`super::compare`]).

use std::process::Command;

use anyhow::{ensure, Result};
use integration_tests::{workspace_root, TestEnv, PGBOUNCER_PORT};

use super::compare::Sides;

pub const SIDES: Sides = Sides {
    names: ["direct", "PgBouncer (transaction mode)"],
    namespace: "pooler",
    second: through_pgbouncer,
    prepare: start,
};

fn through_pgbouncer(env: &TestEnv) -> Vec<(&'static str, String)> {
    vec![
        (
            "HERALD_DATABASE__URL",
            format!("postgres://herald@127.0.0.1:{PGBOUNCER_PORT}/{}", env.database),
        ),
        ("HERALD_DATABASE__POOLER", "transaction".to_owned()),
        ("HERALD_DATABASE__SESSION_URL", env.db_url.clone()),
    ]
}

/// Starts PgBouncer (deploy/local/pgbouncer.sh: a no-op when it runs).
fn start() -> Result<()> {
    let out = Command::new(workspace_root().join("deploy/local/pgbouncer.sh"))
        .arg("start")
        .output()?;
    ensure!(
        out.status.success(),
        "deploy/local/pgbouncer.sh start: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
