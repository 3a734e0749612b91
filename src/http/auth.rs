//! API keys (security spec §6): `Authorization: Bearer <key>` on every route once keys are
//! set, a separate set of keys for the admin routes, health and metrics open to probes.
//! Keys are held only as SHA-256 digests and compared in constant time, so neither a
//! memory dump nor response timing gives one away; no key is ever logged.

use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, SharedState};
use crate::config::Config;
use crate::domain::error::{ErrorCode, OjsError};

/// Shortest key accepted as given: 32 characters, so a random key carries the spec's 256
/// bits when it is hex of 32 random bytes or longer (`openssl rand -hex 32`).
const MIN_KEY_CHARS: usize = 32;

/// A set of API keys as SHA-256 digests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(Vec<Digest32>);

impl ApiKeys {
    /// Reads keys as set: each the key itself or `sha256:<64 hex digits>`.
    ///
    /// # Errors
    /// The first key that is too short or a digest that is not 64 hex digits (the message
    /// names its position, never the key).
    pub fn parse(keys: &[String]) -> Result<ApiKeys, String> {
        keys.iter()
            .enumerate()
            .map(|(i, key)| match key.strip_prefix("sha256:") {
                Some(hex) => digest_from_hex(hex)
                    .ok_or_else(|| format!("key {}: sha256: needs 64 hex digits", i + 1)),
                None if key.chars().count() < MIN_KEY_CHARS => Err(format!(
                    "key {} is shorter than {MIN_KEY_CHARS} characters",
                    i + 1
                )),
                None => Ok(digest_of(key)),
            })
            .collect::<Result<_, _>>()
            .map(ApiKeys)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the key whose digest is `presented` is one of these. Every key is compared,
    /// each in constant time.
    fn admit(&self, presented: &Digest32) -> bool {
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |found, key| {
                found | key.ct_eq(presented)
            })
            .into()
    }
}

type Digest32 = [u8; 32];

fn digest_of(key: &str) -> Digest32 {
    Sha256::digest(key.as_bytes()).into()
}

fn digest_from_hex(hex: &str) -> Option<Digest32> {
    // `from_str_radix` alone would take a sign ("+f") as a digit pair.
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut digest = Digest32::default();
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// The keys a gateway checks, read from its settings once at start.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    api: ApiKeys,
    admin: ApiKeys,
    open_health_and_metrics: bool,
}

impl Keys {
    /// # Errors
    /// As [`ApiKeys::parse`]; `Config::validate` has refused such settings already.
    pub fn from_config(config: &Config) -> Result<Keys, String> {
        Ok(Keys {
            api: ApiKeys::parse(&config.api_keys.0)?,
            admin: ApiKeys::parse(&config.admin_api_keys.0)?,
            open_health_and_metrics: config.open_health_and_metrics,
        })
    }

    /// No key is set: every route is open.
    fn no_keys(&self) -> bool {
        self.api.is_empty() && self.admin.is_empty()
    }

    /// What a request needs, `None` when it may pass.
    fn check(&self, access: Access, bearer: Option<&str>) -> Option<OjsError> {
        // The keys that guard the route, and the admin keys, which open every route.
        let (needed, admin_too) = match access {
            Access::Open => return None,
            Access::Probe if self.open_health_and_metrics => return None,
            Access::Probe | Access::Key => (&self.api, true),
            Access::Admin if self.admin.is_empty() => (&self.api, false),
            Access::Admin => (&self.admin, false),
        };
        if needed.is_empty() {
            return None;
        }
        let Some(key) = bearer else {
            return Some(
                OjsError::new(
                    ErrorCode::Unauthenticated,
                    "An API key is required: send it as Authorization: Bearer <key>.",
                )
                .with_detail("scheme", "Bearer"),
            );
        };
        let key = digest_of(key);
        if needed.admit(&key) || (admin_too && self.admin.admit(&key)) {
            return None;
        }
        if access == Access::Admin && self.api.admit(&key) {
            return Some(OjsError::new(
                ErrorCode::PermissionDenied,
                "This route needs an admin API key.",
            ));
        }
        Some(OjsError::new(
            ErrorCode::Unauthenticated,
            "The API key is not valid.",
        ))
    }
}

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Browsers' CORS preflights carry no credentials; the dashboard's static files.
    Open,
    /// Health, probes and metrics: open when `open_health_and_metrics` says so.
    Probe,
    Key,
    /// Operator actions that stop or destroy work: the admin keys when set.
    Admin,
}

pub(super) fn access(method: &Method, path: &str) -> Access {
    if method == Method::OPTIONS {
        return Access::Open;
    }
    if matches!(
        path,
        "/ojs/v1/health"
            | "/ojs/v1/health/live"
            | "/ojs/v1/health/ready"
            | "/healthz"
            | "/readyz"
            | "/metrics"
    ) {
        return Access::Probe;
    }
    // The dashboard's static files; its requests to the API carry the key.
    if path == "/ojs/admin" || path.starts_with("/ojs/admin/") {
        return Access::Open;
    }
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let admin = match segments.as_slice() {
        ["", "ojs", "v1", "admin", ..] | ["", "ojs", "v1", "jobs", "bulk", ..] => true,
        ["", "ojs", "v1", "queues", _, "pause" | "resume"] => true,
        ["", "ojs", "v1", "dead-letter", _] => method == Method::DELETE,
        _ => false,
    };
    if admin {
        Access::Admin
    } else {
        Access::Key
    }
}

/// The bearer token of `Authorization`, when the header has that scheme.
fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware: lets a request through when its key admits it, answers 401 or 403 otherwise.
pub async fn authenticate(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    if state.keys.no_keys() {
        return next.run(req).await;
    }
    let need = access(req.method(), req.uri().path());
    match state.keys.check(need, bearer(&req)) {
        None => next.run(req).await,
        Some(err) => ApiError(err).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef-producer";
    const ADMIN: &str = "0123456789abcdef0123456789abcdef-operator";

    fn keys(api: &[&str], admin: &[&str], open: bool) -> Keys {
        let list =
            |k: &[&str]| ApiKeys::parse(&k.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        Keys {
            api: list(api).unwrap(),
            admin: list(admin).unwrap(),
            open_health_and_metrics: open,
        }
    }

    fn code(err: Option<OjsError>) -> Option<ErrorCode> {
        err.map(|e| e.code)
    }

    #[test]
    fn a_key_matches_itself_or_its_digest_and_nothing_shorter_is_accepted() {
        let hex: String = Sha256::digest(KEY.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let by_digest = ApiKeys::parse(&[format!("sha256:{hex}")]).unwrap();
        assert!(by_digest.admit(&digest_of(KEY)));
        assert!(!by_digest.admit(&digest_of(ADMIN)));
        assert!(!by_digest.admit(&digest_of(&format!("sha256:{hex}"))));
        assert!(ApiKeys::parse(&["short".into()])
            .unwrap_err()
            .contains("key 1"));
        assert!(ApiKeys::parse(&["sha256:abc".into()]).is_err());
        assert!(ApiKeys::parse(&[format!("sha256:{}", "zz".repeat(32))]).is_err());
        assert!(ApiKeys::parse(&[format!("sha256:{}", "+f".repeat(32))]).is_err());
    }

    #[test]
    fn routes_ask_for_what_they_do() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(access(&get, "/ojs/v1/health"), Access::Probe);
        assert_eq!(access(&get, "/metrics"), Access::Probe);
        assert_eq!(access(&get, "/readyz"), Access::Probe);
        assert_eq!(access(&post, "/ojs/v1/jobs"), Access::Key);
        assert_eq!(access(&get, "/ojs/manifest"), Access::Key);
        assert_eq!(access(&post, "/ojs/v1/workers/fetch"), Access::Key);
        assert_eq!(access(&post, "/ojs/v1/queues/q/pause"), Access::Admin);
        assert_eq!(access(&post, "/ojs/v1/queues/q/resume/"), Access::Admin);
        assert_eq!(access(&get, "/ojs/v1/queues/q/stats"), Access::Key);
        assert_eq!(
            access(&Method::DELETE, "/ojs/v1/dead-letter/x"),
            Access::Admin
        );
        assert_eq!(access(&get, "/ojs/v1/dead-letter/x"), Access::Key);
        assert_eq!(access(&post, "/ojs/v1/dead-letter/x/retry"), Access::Key);
        assert_eq!(
            access(&post, "/ojs/v1/admin/workers/w/quiet"),
            Access::Admin
        );
        assert_eq!(access(&post, "/ojs/v1/jobs/bulk/delete"), Access::Admin);
        assert_eq!(access(&Method::OPTIONS, "/ojs/v1/jobs"), Access::Open);
    }

    #[test]
    fn without_keys_everything_is_open() {
        let open = keys(&[], &[], false);
        for need in [Access::Probe, Access::Key, Access::Admin] {
            assert_eq!(code(open.check(need, None)), None);
        }
    }

    #[test]
    fn api_keys_guard_every_route_and_admin_keys_only_the_admin_ones() {
        let api_only = keys(&[KEY], &[], true);
        assert_eq!(code(api_only.check(Access::Probe, None)), None);
        assert_eq!(
            code(api_only.check(Access::Key, None)),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(
            code(api_only.check(Access::Key, Some(ADMIN))),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(code(api_only.check(Access::Key, Some(KEY))), None);
        assert_eq!(code(api_only.check(Access::Admin, Some(KEY))), None);

        let both = keys(&[KEY], &[ADMIN], false);
        assert_eq!(
            code(both.check(Access::Probe, None)),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(code(both.check(Access::Key, Some(ADMIN))), None);
        assert_eq!(
            code(both.check(Access::Admin, Some(KEY))),
            Some(ErrorCode::PermissionDenied)
        );
        assert_eq!(code(both.check(Access::Admin, Some(ADMIN))), None);

        let admin_only = keys(&[], &[ADMIN], true);
        assert_eq!(code(admin_only.check(Access::Key, None)), None);
        assert_eq!(
            code(admin_only.check(Access::Admin, None)),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(code(admin_only.check(Access::Admin, Some(ADMIN))), None);
    }
}
