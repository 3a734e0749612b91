//! API keys (security spec §6): `Authorization: Bearer <key>` on every route once keys are
//! set, a separate set of keys for the admin routes, health and metrics open to probes.
//! Keys are held only as SHA-256 digests and compared in constant time, so neither a
//! memory dump nor response timing gives one away; no key is ever logged.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::config::{key_digest, Config, KeyDigest};
use crate::domain::error::{ErrorCode, OjsError};

/// A set of API keys as SHA-256 digests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ApiKeys(Vec<KeyDigest>);

impl ApiKeys {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the key whose digest is `presented` is one of these. Every key is compared,
    /// each in constant time.
    fn admit(&self, presented: &KeyDigest) -> bool {
        self.0
            .iter()
            .fold(subtle::Choice::from(0), |found, key| {
                found | key.ct_eq(presented)
            })
            .into()
    }
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
    /// As [`crate::config::KeyList::digests`]; `Config::validate` has refused such settings
    /// already.
    pub fn from_config(config: &Config) -> Result<Keys, String> {
        Ok(Keys {
            api: ApiKeys(config.api_keys.digests()?),
            admin: ApiKeys(config.admin_api_keys.digests()?),
            open_health_and_metrics: config.open_health_and_metrics,
        })
    }

    /// No key is set: every route is open.
    pub(crate) fn no_keys(&self) -> bool {
        self.api.is_empty() && self.admin.is_empty()
    }

    /// What a request needs, `None` when it may pass.
    pub(crate) fn check(&self, access: Access, bearer: Option<&str>) -> Option<OjsError> {
        // The keys that guard the route, and the admin keys, which open every route.
        let (needed, admin_too) = match access {
            Access::Page => return None,
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
        let key = key_digest(key);
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

/// What a route asks of its caller; each row of the route table names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The dashboard's static files: open; its requests to the API carry the key.
    Page,
    /// Health, probes and metrics: open when `open_health_and_metrics` says so.
    Probe,
    Key,
    /// Operator actions that stop or destroy work: the admin keys when set.
    Admin,
}

/// What the middleware checks a request against: the keys, and who may call each route by
/// method and path pattern (from the route table).
pub struct Gate {
    keys: Keys,
    rules: HashMap<(Method, &'static str), Access>,
}

impl Gate {
    pub fn new(keys: Keys, rules: HashMap<(Method, &'static str), Access>) -> Gate {
        Gate { keys, rules }
    }

    /// What a request for `route` (the pattern it matched) asks. A request that matched
    /// no route needs a key: an unknown path tells a caller without one nothing. CORS
    /// preflights carry no credentials, so `OPTIONS` asks nothing.
    fn access(&self, method: &Method, route: Option<&str>) -> Option<Access> {
        if method == Method::OPTIONS {
            return None;
        }
        let known = route.and_then(|path| self.rules.get(&(method.clone(), path)));
        Some(known.copied().unwrap_or(Access::Key))
    }
}

/// The bearer token of `Authorization`, when the header has that scheme.
fn bearer(req: &Request) -> Option<&str> {
    bearer_token(req.headers().get(header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of an `Authorization` value of the `Bearer` scheme (HTTP header or gRPC
/// metadata).
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware: lets a request through when its key admits it, answers 401 or 403 otherwise.
pub async fn authenticate(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    if gate.keys.no_keys() {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let Some(need) = gate.access(req.method(), route) else {
        return next.run(req).await;
    };
    match gate.keys.check(need, bearer(&req)) {
        None => next.run(req).await,
        Some(err) => ApiError(err).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyList;

    const KEY: &str = "0123456789abcdef0123456789abcdef-producer";
    const ADMIN: &str = "0123456789abcdef0123456789abcdef-operator";

    fn keys(api: &[&str], admin: &[&str], open: bool) -> Keys {
        let list = |k: &[&str]| {
            KeyList(k.iter().map(|s| s.to_string()).collect())
                .digests()
                .map(ApiKeys)
        };
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
