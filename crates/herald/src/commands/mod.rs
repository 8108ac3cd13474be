//! One module per subcommand; each takes the validated configuration.

pub mod intent;
pub mod migrate;
pub mod run;
pub mod template;
pub mod topics;
