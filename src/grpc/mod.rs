//! The OJS gRPC binding (ojs-grpc-binding.md) on tonic: `OJSService` on a listener of its
//! own beside HTTP, over the same store, so a job enqueued over one protocol is fetched,
//! acknowledged and listed over the other. Requests become the JSON the HTTP binding reads
//! (`convert.rs`), so both protocols share every rule and limit; errors become statuses
//! with `ErrorInfo` details (`status.rs`); `streams.rs` holds `StreamJobs` and
//! `StreamEvents`. The standard health and reflection services are served beside it.

mod convert;
pub mod pb;
mod server;
mod service;
mod status;
mod streams;

pub use server::serve;
pub use service::CONFORMANCE_LEVEL;
