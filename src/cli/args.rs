//! The command line's arguments: every command and its options, as clap reads them.

use clap::{Parser, Subcommand};
use ojs_client::Client;

/// An Open Job Spec server on NATS JetStream, and a command line for any OJS server.
#[derive(Debug, Parser)]
#[command(name = "ojs-jetstream", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Base URL of the OJS server the commands talk to
    #[arg(
        long,
        env = "OJS_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// API key sent as `Authorization: Bearer <key>`
    #[arg(long, env = "OJS_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
    /// Print the server's JSON answers instead of tables
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default without a command). Settings come from
    /// config/ojs-jetstream.toml (or $OJS_CONFIG) and OJS_* variables, e.g.
    /// OJS_NATS_URL=nats://127.0.0.1:4222 OJS_LISTEN=127.0.0.1:8080
    Serve,
    /// List the queues with their jobs by state
    Queues,
    /// Pause, resume or inspect one queue
    Queue {
        #[command(subcommand)]
        action: QueueAction,
    },
    /// List, inspect, cancel or retry jobs
    Jobs {
        #[command(subcommand)]
        action: JobsAction,
    },
    /// The workers the server knows, with their state and last heartbeat
    Workers,
    /// Browse, retry or delete dead-lettered jobs
    DeadLetter {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// List, add or delete cron entries
    Cron {
        #[command(subcommand)]
        action: CronAction,
    },
    /// Enqueue a job
    Enqueue {
        /// The job type, e.g. email.send
        job_type: String,
        /// The job's arguments as a JSON array
        #[arg(default_value = "[]")]
        args: String,
        #[arg(long, default_value = "default")]
        queue: String,
        /// Lower runs first
        #[arg(long)]
        priority: Option<i64>,
        /// When to run it (RFC 3339)
        #[arg(long)]
        scheduled_at: Option<String>,
        /// Attempts before it is discarded or dead-lettered
        #[arg(long)]
        max_attempts: Option<u32>,
    },
    /// Follow live events
    Events {
        #[command(subcommand)]
        action: EventsAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueAction {
    /// Stop handing out the queue's jobs (it still takes new ones)
    Pause { name: String },
    /// Hand out the queue's jobs again
    Resume { name: String },
    /// The queue's jobs by state and its throughput
    Stats { name: String },
}

#[derive(Debug, Subcommand)]
pub enum JobsAction {
    /// List jobs newest first, by queue, state and type (the admin API)
    List {
        #[arg(long)]
        queue: Option<String>,
        /// scheduled, available, pending, active, retryable, completed, cancelled, discarded
        #[arg(long)]
        state: Option<String>,
        #[arg(long = "type")]
        job_type: Option<String>,
        /// Jobs a page, 1 to 100
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Where to continue: the cursor a previous page printed
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show one job
    Get { id: String },
    /// Cancel a job that has not finished
    Cancel { id: String },
    /// Run a discarded or retryable job again now
    Retry { id: String },
}

#[derive(Debug, Subcommand)]
pub enum DeadLetterAction {
    /// List dead-lettered jobs, newest first
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long, default_value_t = 0)]
        offset: usize,
    },
    /// Move a dead-lettered job back to its queue with fresh attempts
    Retry { id: String },
    /// Delete a dead-lettered job for good
    Delete { id: String },
}

#[derive(Debug, Subcommand)]
pub enum CronAction {
    /// List the cron entries with their next fire times
    List,
    /// Add (or replace) a cron entry
    Add {
        name: String,
        /// A cron expression, e.g. "*/5 * * * *"
        expression: String,
        /// The type of the jobs it enqueues
        job_type: String,
        /// Their arguments as a JSON array
        #[arg(default_value = "[]")]
        args: String,
        #[arg(long, default_value = "default")]
        queue: String,
        /// IANA time zone of the expression
        #[arg(long, default_value = "UTC")]
        timezone: String,
    },
    /// Delete a cron entry
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum EventsAction {
    /// Print events as they happen, until interrupted
    Tail {
        /// Only this queue's events
        #[arg(long, conflicts_with = "job")]
        queue: Option<String>,
        /// Only this job's events (ends with the job)
        #[arg(long)]
        job: Option<String>,
        /// Only these event types (repeat, or comma-separated)
        #[arg(long = "type", value_delimiter = ',')]
        types: Vec<String>,
    },
}

impl Cli {
    /// A client of the server the arguments name, with their key.
    pub fn client(&self) -> Client {
        let client = Client::new(&self.url);
        match &self.api_key {
            Some(key) => client.with_api_key(key),
            None => client,
        }
    }
}
