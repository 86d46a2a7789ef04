//! The migrations are embedded at compile time (`embed_migrations!`): a
//! new or changed migration rebuilds the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
