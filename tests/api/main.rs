//! Black-box tests: the real service over HTTP against real databases. Every
//! test body runs once on PostgreSQL and once on SQLite.

mod helpers;

mod access;
mod assets;
mod audit;
mod backups;
mod catalogue;
mod commits;
mod console;
mod edges;
mod errors;
mod faults;
mod holds;
mod idempotency;
mod import;
mod janitor;
mod lifecycle;
mod migrations;
mod model;
mod openapi;
mod operations;
mod orders;
mod payments;
mod proxy;
mod races;
mod receiver;
mod releases;
mod statements;
mod waitlists;
mod webhooks;
