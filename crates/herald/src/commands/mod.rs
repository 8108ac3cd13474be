//! One module per subcommand; each takes the validated configuration.

pub mod dead_letter;
pub mod intent;
pub mod lag;
pub mod migrate;
pub mod retention;
pub mod run;
pub mod suppression;
pub mod template;
pub mod topics;
