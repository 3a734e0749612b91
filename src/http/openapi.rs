//! `GET /ojs/v1/openapi.json`: an OpenAPI 3.1 document of this build's routes, made from
//! the rows of the route table (`routes.rs`) that the router and the API-key check are
//! built from, so it lists exactly what is served and who may call it.

use std::collections::BTreeMap;

use axum::http::Method;
use serde_json::{json, Map, Value};

use super::auth::Access;
use super::respond::OJS_MEDIA_TYPE;

/// Where the document is served.
pub const PATH: &str = "/ojs/v1/openapi.json";

/// One route, as the route table (`routes.rs`) adds it.
pub struct Operation {
    pub method: Method,
    pub path: &'static str,
    pub access: Access,
    pub summary: &'static str,
}

/// The document of `operations`: the API's routes; the dashboard's pages are left out.
pub fn document(operations: &[Operation]) -> Value {
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in operations.iter().filter(|op| op.access != Access::Page) {
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
    match op.access {
        Access::Page | Access::Probe => {
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
