//! Schemas for job arguments (core §3 `schema`, HTTP binding §15): what a registration may
//! hold, and checking a job's `args` against the schema it names. Schemas are JSON Schema
//! draft 2020-12 (the default when `$schema` is absent). Pure: a schema is compiled from
//! itself and the drafts' meta-schemas only — a `$ref` to any other document is refused,
//! so registering a schema never makes the server read a file or fetch a URL.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::envelope::{too_large, validate_type};
use super::error::{ErrorCode, OjsError};
use super::fields::{self, missing};
use super::time;

/// Most schemas registered at once.
pub const MAX_SCHEMAS: usize = 1_000;
/// Most violations one refused job names.
const MAX_VIOLATIONS: usize = 10;

/// A registered schema, as stored and answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchemaEntry {
    pub uri: String,
    /// The job type the schema is for.
    #[serde(rename = "type")]
    pub job_type: String,
    /// As the client gave it: the HTTP binding writes an integer, some clients a string.
    pub version: Value,
    pub schema: Value,
    #[serde(with = "time::millis")]
    pub created_at: DateTime<Utc>,
}

impl SchemaEntry {
    /// The entry without its schema document, as listed.
    pub fn summary(&self) -> Value {
        json!({
            "uri": self.uri,
            "type": self.job_type,
            "version": self.version,
            "created_at": time::format(self.created_at),
        })
    }
}

/// A registration (`POST /ojs/v1/schemas`): `uri`, `type`, `version` and a `schema` that
/// compiles, within `max_bytes` in all.
///
/// # Errors
/// 400 naming the field at fault; 413 past `max_bytes`.
pub fn registration(
    body: &Map<String, Value>,
    now: DateTime<Utc>,
    max_bytes: usize,
) -> Result<SchemaEntry, OjsError> {
    let uri = match body.get("uri") {
        Some(Value::String(uri)) => uri.clone(),
        Some(_) => return Err(OjsError::invalid("uri", "uri must be a string.")),
        None => return Err(missing("uri", "the schema's URI")),
    };
    fields::absolute_uri(&uri, "uri")?;
    let job_type = match body.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(_) => return Err(OjsError::invalid("type", "type must be a string.")),
        None => return Err(missing("type", "the job type the schema is for")),
    };
    validate_type(&job_type)?;
    let version = match body.get("version") {
        Some(v @ Value::Number(n)) if n.as_u64().is_some_and(|n| n > 0) => v.clone(),
        Some(v @ Value::String(s)) if !s.is_empty() && s.len() <= 64 => v.clone(),
        Some(_) => {
            return Err(OjsError::invalid(
                "version",
                "version must be a positive integer or a string of 1 to 64 bytes.",
            ))
        }
        None => return Err(missing("version", "the schema's version")),
    };
    let schema = match body.get("schema") {
        Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
        Some(_) => {
            return Err(OjsError::invalid(
                "schema",
                "schema must be a JSON Schema (an object or a boolean).",
            ))
        }
        None => {
            return Err(missing(
                "schema",
                "the JSON Schema the job's args must match",
            ))
        }
    };
    let entry = SchemaEntry {
        uri,
        job_type,
        version,
        schema,
        created_at: now,
    };
    let bytes = serde_json::to_vec(&entry).map_or(0, |b| b.len());
    if bytes > max_bytes {
        return Err(too_large("schema", bytes, max_bytes).with_detail("setting", "max_job_bytes"));
    }
    Compiled::new(&entry)?;
    Ok(entry)
}

/// A schema compiled for checking jobs; `Send + Sync`, so a replica keeps one per entry.
pub struct Compiled {
    uri: String,
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl Compiled {
    /// Compiles `entry`'s schema from itself alone.
    ///
    /// # Errors
    /// 400 (field `schema`) for a schema that is not valid JSON Schema, names a draft other
    /// than 2020-12, or refers to another document.
    pub fn new(entry: &SchemaEntry) -> Result<Compiled, OjsError> {
        if let Some(draft) = entry.schema.get("$schema") {
            if draft.as_str().map(|d| d.trim_end_matches('#'))
                != Some("https://json-schema.org/draft/2020-12/schema")
            {
                return Err(invalid_schema("$schema must name draft 2020-12 (https://json-schema.org/draft/2020-12/schema), or be left out."));
            }
        }
        let mut compiler = boon::Compiler::new();
        compiler.set_default_draft(boon::Draft::V2020_12);
        // No loader: the drafts' meta-schemas are built in, everything else is refused.
        compiler.use_loader(Box::new(boon::SchemeUrlLoader::new()));
        let mut schemas = boon::Schemas::new();
        let refused = |err: boon::CompileError| {
            invalid_schema(&format!(
                "The schema is not valid JSON Schema draft 2020-12: {err:#}"
            ))
        };
        compiler
            .add_resource(&entry.uri, entry.schema.clone())
            .map_err(refused)?;
        let index = compiler
            .compile(&entry.uri, &mut schemas)
            .map_err(refused)?;
        Ok(Compiled {
            uri: entry.uri.clone(),
            schemas,
            index,
        })
    }

    /// Whether `args` match the schema (core §7.1 step 7).
    ///
    /// # Errors
    /// 400 `schema_validation` naming where the args do not match (at most 10 places).
    pub fn check(&self, job_id: &str, args: &[Value]) -> Result<(), OjsError> {
        let args = Value::Array(args.to_vec());
        let Err(failed) = self.schemas.validate(&args, self.index) else {
            return Ok(());
        };
        let mut violations = Vec::new();
        leaves(&failed, &mut violations);
        Err(OjsError::new(
            ErrorCode::SchemaValidation,
            format!("The job's args do not match the schema {}.", self.uri),
        )
        .with_detail("job_id", job_id)
        .with_detail("schema", self.uri.as_str())
        .with_detail("violations", Value::Array(violations)))
    }
}

/// The innermost causes of a validation failure: where in the args, and what.
fn leaves(err: &boon::ValidationError<'_, '_>, out: &mut Vec<Value>) {
    if out.len() >= MAX_VIOLATIONS {
        return;
    }
    if err.causes.is_empty() {
        out.push(json!({
            "path": err.instance_location.to_string(),
            "message": err.kind.to_string(),
        }));
    }
    for cause in &err.causes {
        leaves(cause, out);
    }
}

fn invalid_schema(message: &str) -> OjsError {
    OjsError::invalid("schema", message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        time::parse("2026-02-12T10:30:00Z").unwrap()
    }

    fn args(v: Value) -> Vec<Value> {
        v.as_array().unwrap().clone()
    }

    fn register(body: Value) -> Result<SchemaEntry, OjsError> {
        registration(body.as_object().unwrap(), now(), 1 << 20)
    }

    fn email_schema() -> Value {
        json!({
            "uri": "urn:ojs:schema:email.send:v1",
            "type": "email.send",
            "version": 1,
            "schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "array",
                "prefixItems": [
                    {"type": "string", "format": "email"},
                    {"type": "string", "enum": ["welcome", "invoice"]}
                ],
                "minItems": 2,
                "maxItems": 3
            }
        })
    }

    #[test]
    fn args_are_checked_against_the_registered_schema() {
        let entry = register(email_schema()).unwrap();
        let compiled = Compiled::new(&entry).unwrap();
        assert!(compiled
            .check("j", &args(json!(["a@example.com", "welcome"])))
            .is_ok());
        let err = compiled
            .check("j", &args(json!(["a@example.com", "spam"])))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::SchemaValidation);
        assert_eq!(err.details["schema"], "urn:ojs:schema:email.send:v1");
        assert_eq!(err.details["violations"][0]["path"], "/1");
        let short = compiled
            .check("j", &args(json!(["a@example.com"])))
            .unwrap_err();
        assert!(
            short.details["violations"][0]["message"]
                .as_str()
                .unwrap()
                .contains("minimum 2 items"),
            "{short:?}"
        );
    }

    #[test]
    fn registrations_are_refused_field_by_field() {
        let with = |field: &str, value: Value| {
            let mut body = email_schema();
            body[field] = value;
            register(body).unwrap_err().details["field"].clone()
        };
        assert_eq!(with("uri", json!("not a uri")), "uri");
        assert_eq!(with("uri", json!("x:".repeat(300))), "uri");
        assert_eq!(with("type", json!("bad type!")), "type");
        assert_eq!(with("version", json!(0)), "version");
        assert_eq!(with("version", json!([1])), "version");
        assert_eq!(with("schema", json!("array")), "schema");
        assert_eq!(with("schema", json!({"type": "nonsense"})), "schema");
        assert_eq!(
            with(
                "schema",
                json!({"$schema": "http://json-schema.org/draft-07/schema#"})
            ),
            "schema"
        );
        // A reference to another document is never loaded: not a file, not a URL.
        for target in [
            "file:///etc/passwd",
            "https://example.com/s.json",
            "other.json",
        ] {
            assert_eq!(
                with("schema", json!({"$ref": target})),
                "schema",
                "{target}"
            );
        }
        let mut body = email_schema();
        body.as_object_mut().unwrap().remove("version");
        assert_eq!(register(body).unwrap_err().details["field"], "version");
        let big = registration(email_schema().as_object().unwrap(), now(), 100).unwrap_err();
        assert_eq!(big.code, ErrorCode::EnvelopeTooLarge);
    }

    #[test]
    fn internal_references_and_string_versions_are_accepted() {
        let mut body = email_schema();
        body["version"] = json!("2");
        body["schema"] = json!({
            "$defs": {"id": {"type": "integer", "minimum": 1}},
            "type": "array",
            "items": {"$ref": "#/$defs/id"}
        });
        let entry = register(body).unwrap();
        let compiled = Compiled::new(&entry).unwrap();
        assert!(compiled.check("j", &args(json!([1, 2]))).is_ok());
        assert!(compiled.check("j", &args(json!([0]))).is_err());
        assert_eq!(entry.summary()["version"], "2");
    }
}
