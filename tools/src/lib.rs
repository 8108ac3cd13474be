//! Herald's tools on the real local stack, beside the tests (`integration-tests`, whose
//! harness they use): the benchmark behind `make bench` ([`bench`](mod@bench)), the reliability
//! scenarios behind `make chaos` ([`chaos`]), and the binaries in `src/bin/` (the demo, the
//! rate, memory and telemetry-volume measurements). Nothing here is a test: each tool runs
//! bounded, stops by itself and reports what it measured or found.

pub mod bench;
pub mod chaos;
