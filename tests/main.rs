//! The integration tests, one binary: each file under tests/ is a module here, so the
//! harness (`common`) is compiled and the test binary linked once, not once per file.
//! `cargo test --test integration <file>::` runs one file's tests.

mod common;

mod admin;
mod backpressure;
mod bulk;
mod cli;
mod clients;
mod cluster;
mod coordinator;
mod cron;
mod envelope;
mod events;
mod failpoints;
mod faults;
mod fuzz_http;
mod grpc;
mod hostile;
mod imports;
mod leader_services;
mod leader_stall;
mod lifecycle;
mod metrics;
mod nats_restart;
mod progress;
mod properties;
mod queues;
mod readme;
mod reliability;
mod replicas;
mod retention;
mod schemas;
mod security;
mod soak;
mod stream;
mod system;
mod timers;
mod unique;
mod worker;
mod workflows;
