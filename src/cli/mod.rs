//! The `ojs-jetstream` command line: `serve` runs the gateway; every other command is a
//! client of any OJS server over HTTP (`--url`, `OJS_URL`; `--api-key`, `OJS_API_KEY`),
//! built on the `ojs-client` crate. Tables for people by default, the server's JSON with
//! `--json`.
//!
//! Exit codes, for scripts: 0 done; 1 the server refused (its error on stderr); 2 a usage
//! error; 3 the server could not be reached or answered something else than OJS JSON.

mod args;
mod commands;
mod failure;
mod table;

pub use args::{Cli, Command};
pub use commands::run;
