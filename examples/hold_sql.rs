//! Prints the service's hold statements for the benchmark's SQL ceiling, so
//! that pgbench runs exactly what the service runs.

fn main() {
    println!("{}", holdfast::store::HOLD_SNAPSHOT_SQL);
    println!("---");
    println!("{}", holdfast::store::HOLD_SQL);
}
