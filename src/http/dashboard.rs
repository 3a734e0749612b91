//! The operator dashboard at `/ojs/admin/` (where OJS backends serve their admin UI): three
//! static files compiled into the binary, no build step and no server of its own. It reads
//! only the admin API and the event stream, with the API key the operator types in, so
//! the files themselves hold nothing secret and are served to anyone.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};

const INDEX: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/app.css");

pub async fn redirect() -> Redirect {
    Redirect::permanent("/ojs/admin/")
}

pub async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}

pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The page may only run its own script and talk to this gateway.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
