//! The OJS HTTP binding on axum: the route table (`routes.rs`), the conventions every
//! response shares (`conventions.rs`), API keys (`auth.rs`) and one file of handlers per
//! resource.

mod admin;
pub mod auth;
mod bulk;
mod conventions;
mod cron;
mod dashboard;
mod dead_letter;
mod error;
mod events;
mod extract;
mod jobs;
mod openapi;
mod progress;
pub mod queues;
mod rate_limits;
mod respond;
mod routes;
mod schemas;
mod server;
mod state;
mod stream;
mod system;
mod unique_jobs;
mod workers;
mod workflows;

pub use error::ApiError;
pub use server::serve;
pub use state::{AppState, SharedState};
pub use stream::MAX_STREAMS as MAX_EVENT_STREAMS;
