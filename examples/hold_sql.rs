//! Prints the service's statements of a hold that came alone (its snapshot,
//! then the hold) for the benchmark's diagnosis run, so that pgbench runs
//! exactly what the service runs.

fn main() {
    println!("{}", holdfast::store::HOLD_SNAPSHOT_ONE_SQL);
    println!("---");
    println!("{}", holdfast::store::HOLD_SQL);
}
