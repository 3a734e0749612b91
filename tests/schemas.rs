//! Schemas for job arguments (HTTP binding §15, core §7.1 step 7): the registry's routes in
//! the forms the OJS clients read, and PUSH refusing args that do not match — on every
//! replica, for single jobs and batches, and no longer once the schema is removed.

use crate::common;

use common::{spawn_app, NatsServer};
use reqwest::StatusCode;
use serde_json::{json, Value};

const URI: &str = "urn:ojs:schema:email.send:v1";
const ENCODED: &str = "urn%3Aojs%3Aschema%3Aemail.send%3Av1";

fn registration() -> Value {
    json!({
        "uri": URI,
        "type": "email.send",
        "version": 1,
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "array",
            "prefixItems": [
                {"type": "string"},
                {"type": "string", "enum": ["welcome", "invoice"]}
            ],
            "minItems": 2
        }
    })
}

fn job(args: Value) -> Value {
    json!({"type": "email.send", "args": args, "schema": URI, "options": {"queue": "schemas"}})
}

#[tokio::test]
async fn jobs_naming_a_registered_schema_are_checked_on_every_replica() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let other = spawn_app(&nats.url).await;
    let r = app.post("/ojs/v1/schemas", registration()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["schema"]["uri"], URI);
    assert_eq!(r.body["uri"], URI, "also at the top level");
    assert_eq!(r.body["schema"]["schema"]["minItems"], 2);
    // The same registration again is answered with the entry already there.
    let again = app.post("/ojs/v1/schemas", registration()).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["created_at"], r.body["created_at"]);
    let mut changed = registration();
    changed["schema"]["minItems"] = json!(1);
    let r = app.post("/ojs/v1/schemas", changed).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "duplicate");

    // The other replica checks against it at once.
    let ok = other
        .post("/ojs/v1/jobs", job(json!(["a@example.com", "welcome"])))
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    assert_eq!(ok.body["job"]["schema"], URI);
    let bad = other
        .post("/ojs/v1/jobs", job(json!(["a@example.com", "spam"])))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert_eq!(bad.body["error"]["code"], "schema_validation");
    assert_eq!(bad.body["error"]["details"]["violations"][0]["path"], "/1");
    // A batch with one job that does not match enqueues nothing.
    let batch = app
        .post(
            "/ojs/v1/jobs/batch",
            json!({"jobs": [job(json!(["b@example.com", "invoice"])), job(json!(["c@example.com"]))]}),
        )
        .await;
    assert_eq!(batch.status, StatusCode::BAD_REQUEST, "{}", batch.body);
    assert_eq!(batch.body["error"]["details"]["index"], 1);
    let fetched = app.fetch(&["schemas"], "w").await;
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0]["id"], ok.body["job"]["id"]);
    assert!(app.fetch(&["schemas"], "w").await.is_empty());
    // A schema nobody registered cannot be checked: refused, not let through.
    let mut unknown = job(json!(["a@example.com", "welcome"]));
    unknown["schema"] = json!("urn:ojs:schema:email.send:v9");
    let r = app.post("/ojs/v1/jobs", unknown).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["error"]["details"]["field"], "schema");

    // Listed and read back in the forms the clients read.
    let list = other.get("/ojs/v1/schemas?page=1&per_page=10").await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.body["schemas"][0]["uri"], URI);
    assert_eq!(list.body["schemas"][0]["version"], 1);
    assert!(
        list.body["schemas"][0].get("schema").is_none(),
        "summaries only"
    );
    assert_eq!(list.body["pagination"]["total"], 1);
    let got = other.get(&format!("/ojs/v1/schemas/{ENCODED}")).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["schema"]["type"], "email.send");
    assert_eq!(got.body["schema"]["schema"]["type"], "array");

    // Removed: jobs naming it are refused again, the one enqueued stays.
    let r = other.delete(&format!("/ojs/v1/schemas/{ENCODED}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, json!({"deleted": true, "uri": URI}));
    assert_eq!(
        app.get(&format!("/ojs/v1/schemas/{ENCODED}")).await.status,
        StatusCode::NOT_FOUND
    );
    let r = app
        .post("/ojs/v1/jobs", job(json!(["a@example.com", "welcome"])))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let id = ok.body["job"]["id"].as_str().unwrap();
    assert_eq!(app.job(id).await["state"], "active");
    let manifest = app.get("/ojs/manifest").await;
    assert_eq!(manifest.body["capabilities"]["schema_validation"], true);
}

/// A schema is data from a client: one that is not JSON Schema, refers to a file or a URL,
/// or is larger than a job may be is refused with the field at fault, and stores nothing.
#[tokio::test]
async fn schemas_that_are_invalid_or_reach_outside_are_refused() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let with_schema = |schema: Value| {
        let mut body = registration();
        body["schema"] = schema;
        body
    };
    let big = "x".repeat(2 << 20);
    for (body, status, field) in [
        (
            with_schema(json!({"$ref": "file:///etc/passwd"})),
            400,
            "schema",
        ),
        (
            with_schema(json!({"$ref": "http://169.254.169.254/latest"})),
            400,
            "schema",
        ),
        (with_schema(json!({"type": 7})), 400, "schema"),
        (
            json!({"uri": "no uri", "type": "t", "version": 1, "schema": {}}),
            400,
            "uri",
        ),
        (
            json!({"uri": URI, "type": "t", "schema": {}}),
            400,
            "version",
        ),
        (with_schema(json!({"description": big})), 413, ""),
    ] {
        let r = app.post("/ojs/v1/schemas", body).await;
        assert_eq!(r.status.as_u16(), status, "{}", r.body);
        if !field.is_empty() {
            assert_eq!(r.body["error"]["details"]["field"], field, "{}", r.body);
        }
    }
    let list = app.get("/ojs/v1/schemas").await;
    assert_eq!(list.body["schemas"], json!([]));
}
