//! ojs-jetstream: an Open Job Spec server that keeps all of its state in NATS JetStream.
//!
//! # Layout
//! - [`domain`]: pure OJS logic (envelope, states, retry math, events); no I/O.
//! - [`store`]: the JetStream layer, the only user of `async_nats`.
//! - [`http`]: the OJS HTTP binding on axum.
//! - [`coordinator`]: background work led by one replica at a time.
//! - [`config`]: settings from `config/ojs-jetstream.toml` and `OJS_*` variables.
//! - [`failpoint`]: named points where fault-injection tests make a gateway fail.
//! - [`telemetry`]: logging and metrics.
//! - [`app`]: wiring of all of the above into a running gateway.
//!
//! The command line (`src/cli/`) belongs to the binary; the Rust client and worker for any
//! OJS server are the `ojs-client` crate (`client/`).

pub mod app;
pub mod config;
pub mod coordinator;
pub mod domain;
pub mod failpoint;
pub mod grpc;
pub mod http;
pub mod store;
pub mod telemetry;
