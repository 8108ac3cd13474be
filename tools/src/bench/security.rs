//! The cost of TLS and SASL (issue 41): Herald through the local broker's SASL_SSL listener
//! (SCRAM-SHA-512, TLS verified against the local CA) against its plaintext listener (see
//! [`super::compare`]).

use integration_tests::secure_kafka::scram_env;
use integration_tests::TestEnv;

use super::compare::Sides;

pub const SIDES: Sides = Sides {
    names: ["plaintext", "SASL_SSL (SCRAM-SHA-512)"],
    namespace: "security",
    second: sasl,
    // The SASL_SSL listener is the stack's broker's own.
    prepare: || Ok(()),
};

fn sasl(_: &TestEnv) -> Vec<(&'static str, String)> {
    scram_env()
}
