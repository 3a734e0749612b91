//! Every route of the gateway, one row each: method, path, who may call it, what it does
//! and its handler. The router, the API-key check and `GET /ojs/v1/openapi.json` are all
//! built from these rows, so no route is served without its access rule or left out of the
//! document.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::routing::{on, MethodFilter};
use axum::Router;

use super::auth::{self, Access, Gate, Keys};
use super::conventions::{conventions, cors, method_not_allowed, not_found};
use super::openapi::{self, Operation};
use super::respond::respond;
use super::state::SharedState;
use super::{
    admin, bulk, cron, dashboard, dead_letter, events, jobs, progress, queues, rate_limits,
    schemas, stream, system, unique_jobs, workers, workflows,
};

/// The whole HTTP API and the dashboard; `keys` guard the routes as their rows say.
pub fn router(state: SharedState, keys: Keys) -> Router {
    let document = Arc::new(OnceLock::new());
    let served = document.clone();
    let routes = table(Routes::default(), state.config.allow_reset).add(
        Method::GET,
        openapi::PATH,
        Access::Key,
        "This OpenAPI document: every route of this build",
        || async move { respond(StatusCode::OK, served.get().expect("set before serving")) },
    );
    document
        .set(openapi::document(&routes.operations))
        .expect("set once");
    let gate = Arc::new(Gate::new(keys, routes.rules()));
    let cors = cors(&state.config.cors_origins().unwrap_or_default());
    let router = routes
        .router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(gate, auth::authenticate))
        .layer(middleware::from_fn_with_state(state.clone(), conventions));
    // Outermost: a preflight carries no key, and is answered before any route.
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
    .with_state(state)
}

/// The rows. `allow_reset` adds the conformance reset, never routed by default.
fn table(routes: Routes, allow_reset: bool) -> Routes {
    use Access::{Admin, Key, Page, Probe};
    use Method as M;
    let routes = routes
        .add(
            M::GET,
            "/ojs/manifest",
            Key,
            "What this server implements",
            system::manifest,
        )
        .add(
            M::GET,
            "/ojs/v1/health",
            Probe,
            "Health and NATS connectivity",
            system::health,
        )
        .add(
            M::GET,
            "/ojs/v1/health/live",
            Probe,
            "Liveness: the process serves HTTP",
            system::live,
        )
        .add(M::GET, "/healthz", Probe, "Liveness (alias)", system::live)
        .add(
            M::GET,
            "/ojs/v1/health/ready",
            Probe,
            "Readiness: 503 while NATS is unreachable",
            system::ready,
        )
        .add(
            M::GET,
            "/ojs/v1/metrics",
            Key,
            "Job totals as JSON (format=prometheus: /metrics)",
            system::metrics_summary,
        )
        .add(M::GET, "/readyz", Probe, "Readiness (alias)", system::ready)
        .add(
            M::GET,
            "/metrics",
            Probe,
            "Prometheus metrics",
            system::metrics,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs",
            Key,
            "Enqueue a job (PUSH)",
            jobs::enqueue,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/batch",
            Key,
            "Enqueue jobs, all or none",
            jobs::enqueue_batch,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/cancel",
            Admin,
            "Cancel jobs by id",
            bulk::cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/retry",
            Admin,
            "Retry discarded or retryable jobs by id",
            bulk::retry,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/bulk/delete",
            Admin,
            "Delete finished jobs by id",
            bulk::delete,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs",
            Admin,
            "Jobs by queue, state and type, newest first (the admin listing)",
            jobs::list,
        )
        .add(M::GET, "/ojs/v1/jobs/{id}", Key, "A job (INFO)", jobs::info)
        .add(
            M::DELETE,
            "/ojs/v1/jobs/{id}",
            Key,
            "Cancel a job (CANCEL)",
            jobs::cancel,
        )
        .add(
            M::PATCH,
            "/ojs/v1/jobs/{id}",
            Key,
            "Change a waiting job's priority",
            jobs::reprioritize,
        )
        .add(
            M::POST,
            "/ojs/v1/jobs/{id}/activate",
            Key,
            "Release a pending job",
            jobs::activate,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/progress",
            Key,
            "A job's progress",
            progress::get,
        )
        .add(
            M::PUT,
            "/ojs/v1/jobs/{id}/progress",
            Key,
            "Report progress (also a heartbeat)",
            progress::put,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/result",
            Key,
            "A job's outcome; with wait=true, once it finishes",
            jobs::result,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/retries",
            Key,
            "A job's failed attempts and its retry policy",
            jobs::retries,
        )
        .add(
            M::GET,
            "/ojs/v1/jobs/{id}/events",
            Key,
            "A job's live events (SSE)",
            stream::job,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/fetch",
            Key,
            "Claim jobs (FETCH)",
            workers::fetch,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/ack",
            Key,
            "Report success (ACK)",
            workers::ack,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/nack",
            Key,
            "Report failure (FAIL)",
            workers::fail,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/fail",
            Key,
            "Report failure (FAIL)",
            workers::fail,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/heartbeat",
            Key,
            "A worker's heartbeat (BEAT)",
            workers::heartbeat,
        )
        .add(
            M::POST,
            "/ojs/v1/workers/progress",
            Key,
            "Report progress as a percentage",
            progress::post,
        )
        .add(M::GET, "/ojs/v1/queues", Key, "Queues", queues::list)
        .add(
            M::GET,
            "/ojs/v1/queues/{name}/stats",
            Key,
            "A queue's statistics",
            queues::stats,
        )
        .add(
            M::GET,
            "/ojs/v1/queues/{name}/priority-stats",
            Key,
            "A queue's waiting and running jobs by priority",
            queues::priority_stats,
        )
        .add(
            M::POST,
            "/ojs/v1/queues/{name}/pause",
            Admin,
            "Pause a queue",
            queues::pause,
        )
        .add(
            M::POST,
            "/ojs/v1/queues/{name}/resume",
            Admin,
            "Resume a queue",
            queues::resume,
        )
        .add(
            M::GET,
            "/ojs/v1/queues/{name}/events",
            Key,
            "A queue's live events (SSE)",
            stream::queue,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter",
            Key,
            "Dead-lettered jobs",
            dead_letter::list,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter/{id}",
            Key,
            "A dead-lettered job",
            dead_letter::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/dead-letter/{id}",
            Admin,
            "Delete a dead-lettered job",
            dead_letter::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/dead-letter/{id}/retry",
            Key,
            "Retry a dead-lettered job",
            dead_letter::retry,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/stats/history",
            Admin,
            "Jobs enqueued, completed and failed per period, and the depth",
            admin::stats::history,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/stats",
            Admin,
            "Aggregate statistics",
            admin::stats::get,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/system/maintenance",
            Admin,
            "Maintenance mode as it stands",
            admin::system::maintenance,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/system/maintenance",
            Admin,
            "Switch maintenance mode: no FETCH, promotion or cron tick",
            admin::system::set_maintenance,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/maintenance",
            Admin,
            "Maintenance mode as it stands (alias)",
            admin::system::maintenance,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/maintenance",
            Admin,
            "Switch maintenance mode: no FETCH, promotion or cron tick (alias)",
            admin::system::set_maintenance,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/system/config",
            Admin,
            "The settings in force, without secrets",
            admin::system::config,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/config",
            Admin,
            "The settings in force (alias, the ojs command line's)",
            admin::system::config,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/queues",
            Admin,
            "Queues with their counts",
            admin::queues::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/queues/{name}",
            Admin,
            "A queue: counts, limits, dead letters",
            admin::queues::get,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/queues/{name}/pause",
            Admin,
            "Pause a queue",
            queues::pause,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/queues/{name}/resume",
            Admin,
            "Resume a queue",
            queues::resume,
        )
        .add(
            M::PUT,
            "/ojs/v1/admin/queues/{name}/config",
            Admin,
            "Set a queue's concurrency and rate limits",
            admin::queues::configure,
        )
        .add(
            M::POST,
            "/ojs/v1/queues",
            Admin,
            "Create a queue, with limits or a bound",
            admin::queues::create,
        )
        .add(
            M::DELETE,
            "/ojs/v1/queues/{name}",
            Admin,
            "Delete a queue that holds no unfinished job",
            admin::queues::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/queues/{name}/purge",
            Admin,
            "Purge a queue's finished jobs of some states",
            admin::queues::purge,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/queues/{name}/jobs",
            Admin,
            "Purge a queue's finished jobs",
            admin::queues::purge_jobs,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/jobs",
            Admin,
            "List jobs by queue, state and type",
            admin::jobs::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/jobs/{id}",
            Admin,
            "A job's whole envelope",
            admin::jobs::get,
        )
        .add(
            M::PATCH,
            "/ojs/v1/admin/jobs/{id}",
            Admin,
            "Change a waiting job's priority (the admin UI's path)",
            jobs::reprioritize,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/{id}/cancel",
            Admin,
            "Cancel a job",
            jobs::cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/{id}/retry",
            Admin,
            "Retry a discarded or retryable job now",
            admin::jobs::retry,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/retry",
            Admin,
            "Retry jobs by ids or filter",
            admin::jobs::bulk_retry,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/cancel",
            Admin,
            "Cancel jobs by ids or filter",
            admin::jobs::bulk_cancel,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/jobs/bulk/delete",
            Admin,
            "Delete finished jobs by ids or filter",
            admin::jobs::bulk_delete,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/dead-letter",
            Admin,
            "List dead-lettered jobs",
            admin::dead_letter::list,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/dead-letter",
            Admin,
            "Purge dead-lettered jobs",
            admin::dead_letter::purge_all,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/dead-letter/retry",
            Admin,
            "Retry every dead-lettered job a filter matches",
            admin::dead_letter::retry_all,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/dead-letter/stats",
            Admin,
            "Dead letter queue counts (alias of /ojs/v1/dead-letter/stats)",
            dead_letter::stats,
        )
        .add(
            M::POST,
            "/ojs/v1/dead-letter/purge",
            Admin,
            "Purge dead-lettered jobs older than an age",
            admin::dead_letter::purge_by_age,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/dead-letter/{id}/retry",
            Admin,
            "Retry a dead-lettered job",
            dead_letter::retry,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/dead-letter/{id}",
            Admin,
            "Delete a dead-lettered job",
            dead_letter::delete,
        )
        .add(
            M::GET,
            "/ojs/v1/dead-letter/stats",
            Key,
            "Dead letter queue statistics",
            dead_letter::stats,
        )
        .add(
            M::GET,
            "/ojs/v1/rate-limits",
            Key,
            "Limited queues and their use",
            rate_limits::list,
        )
        .add(
            M::GET,
            "/ojs/v1/rate-limits/{key}",
            Key,
            "A queue's limits and their use",
            rate_limits::get,
        )
        .add(
            M::PUT,
            "/ojs/v1/rate-limits/{key}",
            Admin,
            "Override a queue's limits for a while",
            rate_limits::set_override,
        )
        .add(
            M::PUT,
            "/ojs/v1/rate-limits/{key}/override",
            Admin,
            "Override a queue's limits (the command line's path)",
            rate_limits::set_override,
        )
        .add(
            M::DELETE,
            "/ojs/v1/rate-limits/{key}/override",
            Admin,
            "Remove an override: the queue's own limits apply",
            rate_limits::remove_override,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/workers",
            Admin,
            "Workers with their state",
            admin::workers::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/workers/{id}",
            Admin,
            "A worker's registry entry",
            admin::workers::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/admin/workers/{id}",
            Admin,
            "Deregister a stale worker",
            admin::workers::deregister,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/workers/{id}/quiet",
            Admin,
            "Tell a worker to stop fetching",
            admin::workers::quiet,
        )
        .add(
            M::POST,
            "/ojs/v1/admin/workers/{id}/terminate",
            Admin,
            "Tell a worker to stop",
            admin::workers::terminate,
        )
        .add(
            M::GET,
            "/ojs/v1/events",
            Key,
            "Page through stored events",
            events::list,
        )
        .add(
            M::GET,
            "/ojs/v1/events/stream",
            Key,
            "Live events (SSE), by channel",
            stream::events,
        )
        .add(
            M::POST,
            "/ojs/v1/schemas",
            Key,
            "Register a JSON Schema for job arguments",
            schemas::register,
        )
        .add(
            M::GET,
            "/ojs/v1/schemas",
            Key,
            "Registered schemas",
            schemas::list,
        )
        .add(
            M::GET,
            "/ojs/v1/admin/schemas",
            Admin,
            "Registered schemas (the admin UI's path)",
            schemas::list,
        )
        .add(
            M::GET,
            "/ojs/v1/schemas/{uri}",
            Key,
            "A schema (its URI percent-encoded)",
            schemas::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/schemas/{uri}",
            Key,
            "Remove a schema",
            schemas::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/cron",
            Key,
            "Register or replace a cron entry",
            cron::register,
        )
        .add(M::GET, "/ojs/v1/cron", Key, "Cron entries", cron::list)
        .add(
            M::GET,
            "/ojs/v1/crons",
            Key,
            "Cron entries (alias, the admin UI's)",
            cron::list,
        )
        .add(
            M::GET,
            "/ojs/v1/crons/{name}",
            Key,
            "A cron entry (alias)",
            cron::get,
        )
        .add(
            M::PATCH,
            "/ojs/v1/crons/{name}",
            Key,
            "Change a cron entry (alias)",
            cron::update,
        )
        .add(
            M::DELETE,
            "/ojs/v1/crons/{name}",
            Key,
            "Remove a cron entry (alias)",
            cron::delete,
        )
        .add(
            M::PATCH,
            "/ojs/v1/cron/{name}",
            Key,
            "Change a cron entry's schedule, template or enabled",
            cron::update,
        )
        .add(
            M::GET,
            "/ojs/v1/cron/{name}/history",
            Key,
            "The jobs of a cron entry's last runs",
            cron::history,
        )
        .add(
            M::GET,
            "/ojs/v1/cron/{name}",
            Key,
            "A cron entry",
            cron::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/cron/{name}",
            Key,
            "Remove a cron entry",
            cron::delete,
        )
        .add(
            M::POST,
            "/ojs/v1/cron/{name}/pause",
            Key,
            "Stop a cron entry firing (enabled false)",
            cron::pause,
        )
        .add(
            M::POST,
            "/ojs/v1/cron/{name}/resume",
            Key,
            "Let a cron entry fire again from its next occurrence",
            cron::resume,
        )
        .add(
            M::POST,
            "/ojs/v1/cron/{name}/trigger",
            Key,
            "Enqueue one job of a cron entry now",
            cron::trigger,
        )
        .add(
            M::GET,
            "/ojs/v1/unique-jobs",
            Admin,
            "The uniqueness locks held and their jobs",
            unique_jobs::list,
        )
        .add(
            M::POST,
            "/ojs/v1/workflows",
            Key,
            "Create a workflow",
            workflows::create,
        )
        .add(
            M::GET,
            "/ojs/v1/workflows",
            Key,
            "The workflows changed last",
            workflows::list,
        )
        .add(
            M::GET,
            "/ojs/v1/workflows/{id}/progress",
            Key,
            "A workflow's share of steps finished, and each step's",
            workflows::progress,
        )
        .add(
            M::POST,
            "/ojs/v1/workflows/{id}/cancel",
            Key,
            "Cancel a workflow (alias of DELETE)",
            workflows::cancel,
        )
        .add(
            M::GET,
            "/ojs/v1/workflows/{id}",
            Key,
            "A workflow and its steps",
            workflows::get,
        )
        .add(
            M::DELETE,
            "/ojs/v1/workflows/{id}",
            Key,
            "Cancel a workflow",
            workflows::cancel,
        )
        .add(
            M::GET,
            "/ojs/admin",
            Page,
            "The dashboard",
            dashboard::redirect,
        )
        .add(
            M::GET,
            "/ojs/admin/",
            Page,
            "The dashboard",
            dashboard::index,
        )
        .add(
            M::GET,
            "/ojs/admin/app.js",
            Page,
            "The dashboard's script",
            dashboard::script,
        )
        .add(
            M::GET,
            "/ojs/admin/app.css",
            Page,
            "The dashboard's style",
            dashboard::style,
        );
    if allow_reset {
        return routes.add(
            M::POST,
            "/ojs/v1/admin/reset",
            Admin,
            "Delete all data (allow_reset only)",
            admin::reset,
        );
    }
    routes
}

/// A router under construction, and the rows added to it.
#[derive(Default)]
struct Routes {
    router: Router<SharedState>,
    operations: Vec<Operation>,
}

impl Routes {
    /// Serves `handler` for `method` on `path` to callers `access` admits.
    fn add<H, T>(
        mut self,
        method: Method,
        path: &'static str,
        access: Access,
        summary: &'static str,
        handler: H,
    ) -> Routes
    where
        H: Handler<T, SharedState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("a routable method");
        self.router = self.router.route(path, on(filter, handler));
        self.operations.push(Operation {
            method,
            path,
            access,
            summary,
        });
        self
    }

    /// Who may call each route, by method and path pattern.
    fn rules(&self) -> HashMap<(Method, &'static str), Access> {
        self.operations
            .iter()
            .map(|op| ((op.method.clone(), op.path), op.access))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_ask_for_what_they_do() {
        let rules = table(Routes::default(), true).rules();
        let access = |method: Method, path| rules.get(&(method, path)).copied();
        use Access::{Admin, Key, Page, Probe};
        assert_eq!(access(Method::GET, "/ojs/v1/health"), Some(Probe));
        assert_eq!(access(Method::GET, "/metrics"), Some(Probe));
        assert_eq!(access(Method::GET, "/readyz"), Some(Probe));
        assert_eq!(access(Method::POST, "/ojs/v1/jobs"), Some(Key));
        assert_eq!(access(Method::GET, "/ojs/manifest"), Some(Key));
        assert_eq!(access(Method::POST, "/ojs/v1/workers/fetch"), Some(Key));
        assert_eq!(
            access(Method::POST, "/ojs/v1/queues/{name}/pause"),
            Some(Admin)
        );
        assert_eq!(
            access(Method::GET, "/ojs/v1/queues/{name}/stats"),
            Some(Key)
        );
        assert_eq!(
            access(Method::DELETE, "/ojs/v1/dead-letter/{id}"),
            Some(Admin)
        );
        assert_eq!(access(Method::GET, "/ojs/v1/dead-letter/{id}"), Some(Key));
        assert_eq!(
            access(Method::POST, "/ojs/v1/dead-letter/{id}/retry"),
            Some(Key)
        );
        assert_eq!(
            access(Method::POST, "/ojs/v1/jobs/bulk/delete"),
            Some(Admin)
        );
        assert_eq!(access(Method::POST, "/ojs/v1/admin/reset"), Some(Admin));
        assert_eq!(access(Method::GET, "/ojs/admin/app.js"), Some(Page));
        // Every admin route asks for the admin keys.
        for ((_, path), level) in &rules {
            if path.starts_with("/ojs/v1/admin/") {
                assert_eq!(*level, Admin, "{path}");
            }
        }
        assert_eq!(
            table(Routes::default(), false)
                .rules()
                .get(&(Method::POST, "/ojs/v1/admin/reset")),
            None
        );
    }
}
