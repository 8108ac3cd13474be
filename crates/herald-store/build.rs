//! `migrate.rs` embeds `migrations/` at compile time (refinery's `embed_migrations!`): a
//! migration added, changed or removed must rebuild this crate even when no Rust source
//! changed, or the binary carries the old set.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
