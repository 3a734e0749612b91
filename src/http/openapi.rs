//! `GET /ojs/v1/openapi.json`: an OpenAPI 3.1 document of this build's routes. Every route
//! is added to the router through [`Routes::add`], which records its method, path and
//! summary, so the document lists exactly what the router serves and nothing else; who may
//! call a route comes from the same rule the API keys are checked by (`auth::access`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::routing::{on, MethodFilter};
use axum::Router;
use serde_json::{json, Map, Value};

use super::auth::{access, Access};
use super::{respond, SharedState, OJS_MEDIA_TYPE};

/// Where the document is served.
pub const PATH: &str = "/ojs/v1/openapi.json";

/// One documented operation.
struct Operation {
    method: Method,
    path: &'static str,
    summary: &'static str,
}

/// A router under construction, and the operations added to it.
pub struct Routes {
    router: Router<SharedState>,
    operations: Vec<Operation>,
}

impl Routes {
    pub fn new() -> Routes {
        Routes {
            router: Router::new(),
            operations: Vec::new(),
        }
    }

    /// Serves `handler` for `method` on `path`, documented as `summary`.
    pub fn add<H, T>(
        mut self,
        method: Method,
        path: &'static str,
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
            summary,
        });
        self
    }

    /// The router, with the document of every route added (its own included).
    pub fn finish(mut self) -> Router<SharedState> {
        self.operations.push(Operation {
            method: Method::GET,
            path: PATH,
            summary: "This OpenAPI document: every route of this build",
        });
        let document = Arc::new(document(&self.operations));
        self.router.route(
            PATH,
            on(MethodFilter::GET, move || {
                let document = document.clone();
                async move { respond(StatusCode::OK, &*document) }
            }),
        )
    }
}

fn document(operations: &[Operation]) -> Value {
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in operations {
        paths
            .entry(op.path)
            .or_default()
            .insert(op.method.as_str().to_lowercase(), operation(op));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ojs-jetstream",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "An Open Job Spec server that keeps all of its state in NATS JetStream. Request and response bodies are JSON (application/openjobspec+json or application/json); errors use the OJS error body.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer", "description": "An API key (api_keys), or an admin key (admin_api_keys) on admin routes. Only asked for when keys are configured."}},
            "schemas": {"Error": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {
                    "type": "object",
                    "required": ["code", "message", "retryable"],
                    "properties": {
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "retryable": {"type": "boolean"},
                        "details": {"type": "object"},
                        "request_id": {"type": "string"},
                    },
                }},
            }},
        },
    })
}

fn operation(op: &Operation) -> Value {
    let parameters: Vec<Value> = op
        .path
        .split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    let error = json!({"description": "An OJS error", "content": {OJS_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let mut out = json!({
        "summary": op.summary,
        "operationId": operation_id(op),
        "responses": {"2XX": {"description": "Success"}, "default": error},
    });
    if !parameters.is_empty() {
        out["parameters"] = json!(parameters);
    }
    if matches!(op.method, Method::POST | Method::PUT) {
        out["requestBody"] = json!({
            "required": false,
            "content": {OJS_MEDIA_TYPE: {"schema": {"type": "object"}}, "application/json": {"schema": {"type": "object"}}},
        });
    }
    match access(&op.method, op.path) {
        Access::Open | Access::Probe => {
            out["security"] = json!([{}, {"apiKey": []}]);
        }
        Access::Key => out["security"] = json!([{"apiKey": []}]),
        Access::Admin => {
            out["security"] = json!([{"apiKey": []}]);
            out["x-ojs-admin"] = json!(true);
        }
    }
    out
}

/// `get_ojs_v1_jobs_id` from `GET /ojs/v1/jobs/{id}`: unique per method and path.
fn operation_id(op: &Operation) -> String {
    let path: String = op
        .path
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path: Vec<&str> = path.split('_').filter(|s| !s.is_empty()).collect();
    format!("{}_{}", op.method.as_str().to_lowercase(), path.join("_"))
}
