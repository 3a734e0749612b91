//! Securing a deployment: API keys on the HTTP API (security spec §6), and a gateway on a
//! NATS that asks for credentials (user and password, token, nkey, a JWT credentials file)
//! or TLS with client certificates — each a real nats-server started in that mode.

use crate::common;

use common::{spawn_app_with, test_config, NatsServer, TestApp};
use ojs_client::{Client, ClientError, JobSpec};
use ojs_jetstream::config::{Config, KeyList, Secret, TextList};
use serde_json::json;

const PRODUCER_KEY: &str = "3f0c1b9e6d2a47c58e1f0a9b7c6d5e4f-producer";
const WORKER_KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90-worker";
const ADMIN_KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0-operator";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An enqueue, a fetch and an ACK: the gateway reads and writes its NATS.
async fn round_trip(app: &TestApp) {
    let id = app
        .enqueue(json!({"type": "secure.echo", "args": [1], "options": {"queue": "secure"}}))
        .await;
    let jobs = app.fetch(&["secure"], "w-1").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["id"], id.as_str());
    let r = app.ack(json!({"job_id": id, "result": "ok"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(app.job(&id).await["state"], "completed");
}

#[tokio::test]
async fn api_keys_guard_every_route_and_admin_routes_take_only_the_admin_key() {
    let nats = NatsServer::start();
    let config = Config {
        // One key as given, one by its digest only.
        api_keys: KeyList(vec![
            PRODUCER_KEY.into(),
            format!("sha256:{}", sha256_hex(WORKER_KEY)),
        ]),
        admin_api_keys: KeyList(vec![ADMIN_KEY.into()]),
        ..test_config(&nats.url)
    };
    assert!(
        !format!("{config:?}").contains("producer"),
        "settings' Debug shows no key"
    );
    let app = spawn_app_with(config).await;
    let job = json!({"type": "secure.echo", "args": []});

    // No key, a wrong key, another scheme: 401 in the OJS error format, WWW-Authenticate.
    let r = app.post("/ojs/v1/jobs", job.clone()).await;
    r.assert_error(401, "unauthenticated");
    assert_eq!(r.header("www-authenticate"), "Bearer realm=\"ojs\"");
    assert!(r.body["error"]["request_id"].is_string());
    app.keyed("not-a-key-not-a-key-not-a-key-not-a-key")
        .post("/ojs/v1/jobs", job.clone())
        .await
        .assert_error(401, "unauthenticated");
    let basic = app
        .http
        .post(app.url("/ojs/v1/jobs"))
        .header("authorization", format!("Basic {PRODUCER_KEY}"))
        .header("content-type", "application/openjobspec+json")
        .body(job.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 401);
    // The digest itself is no key.
    app.keyed(&format!("sha256:{}", sha256_hex(WORKER_KEY)))
        .get("/ojs/v1/queues")
        .await
        .assert_error(401, "unauthenticated");
    // Unknown routes do not tell a caller without a key what exists.
    app.get("/ojs/v1/nothing-here")
        .await
        .assert_error(401, "unauthenticated");

    // Probes stay open.
    for probe in [
        "/ojs/v1/health",
        "/ojs/v1/health/ready",
        "/readyz",
        "/healthz",
    ] {
        assert_eq!(app.get(probe).await.status, 200, "{probe}");
    }
    let metrics = app.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);

    // Each key opens the API, any case of the scheme.
    let producer = app.keyed(PRODUCER_KEY);
    let worker = app.keyed(WORKER_KEY);
    let id = producer
        .enqueue(json!({"type": "secure.echo", "args": [], "options": {"queue": "keys"}}))
        .await;
    let lower = app
        .http
        .get(app.url(&format!("/ojs/v1/jobs/{id}")))
        .header("authorization", format!("bearer {WORKER_KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), 200);
    assert_eq!(worker.fetch(&["keys"], "w-1").await.len(), 1);
    let r = worker.ack(json!({"job_id": id})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // Admin routes: an API key is not enough, the admin key is; it opens the rest too.
    producer
        .post("/ojs/v1/queues/keys/pause", json!({}))
        .await
        .assert_error(403, "permission_denied");
    producer
        .delete("/ojs/v1/dead-letter/019a0000-0000-7000-8000-000000000000")
        .await
        .assert_error(403, "permission_denied");
    let admin = app.keyed(ADMIN_KEY);
    let r = admin.post("/ojs/v1/queues/keys/pause", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = admin.post("/ojs/v1/queues/keys/resume", json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    admin
        .enqueue(json!({"type": "secure.echo", "args": []}))
        .await;

    // The Rust client sends its key.
    let client = Client::new(&app.base);
    match client.enqueue(JobSpec::new("secure.echo", json!([]))).await {
        Err(ClientError::Server { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (401, "unauthenticated"));
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let job = Client::new(&app.base)
        .with_api_key(PRODUCER_KEY)
        .enqueue(JobSpec::new("secure.echo", json!([])))
        .await
        .unwrap();
    assert_eq!(job["state"], "available");
}

#[tokio::test]
async fn health_and_metrics_ask_for_a_key_when_not_open() {
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        api_keys: KeyList(vec![PRODUCER_KEY.into()]),
        open_health_and_metrics: false,
        ..test_config(&nats.url)
    })
    .await;
    app.get("/ojs/v1/health")
        .await
        .assert_error(401, "unauthenticated");
    let metrics = app.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 401);
    let keyed = app.keyed(PRODUCER_KEY);
    assert_eq!(keyed.get("/ojs/v1/health").await.status, 200);
    let metrics = keyed.http.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
}

/// Pages of an allowed origin call the API from a browser (HTTP binding §20): the
/// preflight is answered before any key is asked for, the answers name the origin and
/// expose the headers clients read; another origin gets no CORS header, and without the
/// setting no origin does.
#[tokio::test]
async fn pages_of_allowed_origins_call_from_a_browser_and_no_others() {
    const UI: &str = "http://localhost:5173";
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        api_keys: KeyList(vec![PRODUCER_KEY.into()]),
        cors_allowed_origins: TextList(vec![UI.into(), "https://ops.example.com".into()]),
        ..test_config(&nats.url)
    })
    .await;
    let preflight = |origin: &'static str| {
        app.http
            .request(
                reqwest::Method::OPTIONS,
                app.url("/ojs/v1/admin/queues/q/pause"),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization",
            )
            .send()
    };
    let r = preflight(UI).await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], UI);
    let methods = h["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_owned();
    for m in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
        assert!(methods.contains(m), "{methods}");
    }
    let allowed = h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("content-type"),
        "{allowed}"
    );
    assert_eq!(h["access-control-max-age"], "86400");

    let r = app
        .keyed(PRODUCER_KEY)
        .http
        .get(app.url("/ojs/v1/queues"))
        .header("origin", UI)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], UI);
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        exposed.contains("x-request-id") && exposed.contains("retry-after"),
        "{exposed}"
    );

    let r = preflight("https://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    let closed = spawn_app_with(test_config(&nats.url)).await;
    let r = closed
        .http
        .get(closed.url("/ojs/v1/queues"))
        .header("origin", UI)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// Connecting without credentials is refused: the server really asks for them.
async fn refuses_anonymous(url: &str) {
    let anonymous =
        tokio::time::timeout(std::time::Duration::from_secs(5), async_nats::connect(url)).await;
    assert!(
        !matches!(anonymous, Ok(Ok(_))),
        "an anonymous client was served"
    );
}

/// A gateway with `settings` on `nats` serves jobs, where an anonymous client is refused.
async fn only_the_configured_gateway_is_served(nats: &NatsServer, settings: Config) {
    refuses_anonymous(&nats.url).await;
    round_trip(&spawn_app_with(settings).await).await;
}

#[tokio::test]
async fn a_gateway_connects_with_a_user_and_password() {
    let nats =
        NatsServer::start_with_config("authorization { user: ojs, password: \"s3cret-password\" }");
    let settings = Config {
        nats_user: "ojs".into(),
        nats_password: Secret("s3cret-password".into()),
        ..test_config(&nats.url)
    };
    only_the_configured_gateway_is_served(&nats, settings).await;
}

#[tokio::test]
async fn a_gateway_connects_with_a_token() {
    let nats = NatsServer::start_with_config("authorization { token: \"t0ken-of-the-nats\" }");
    let settings = Config {
        nats_token: Secret("t0ken-of-the-nats".into()),
        ..test_config(&nats.url)
    };
    only_the_configured_gateway_is_served(&nats, settings).await;
}

#[tokio::test]
async fn a_gateway_connects_with_an_nkey() {
    let user = nkeys::KeyPair::new_user();
    let nats = NatsServer::start_with_config(&format!(
        "authorization {{ users: [ {{ nkey: {} }} ] }}",
        user.public_key()
    ));
    let settings = Config {
        nats_nkey_seed: Secret(user.seed().unwrap()),
        ..test_config(&nats.url)
    };
    only_the_configured_gateway_is_served(&nats, settings).await;
}

#[tokio::test]
async fn a_gateway_connects_with_mutual_tls() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ojs-jetstream test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = Issuer::new(ca_params, ca_key);
    let signed = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = signed(vec!["127.0.0.1".into(), "localhost".into()]);
    let (client_cert, client_key) = signed(vec!["ojs-gateway".into()]);

    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let ca_file = write("ca.pem", &ca_cert.pem());
    let server_cert = write("server.pem", &server_cert);
    let server_key = write("server-key.pem", &server_key);
    let client_cert = write("client.pem", &client_cert);
    let client_key = write("client-key.pem", &client_key);

    let nats = NatsServer::start_with_config(&format!(
        "tls {{ cert_file: \"{server_cert}\", key_file: \"{server_key}\", ca_file: \"{ca_file}\", verify: true }}"
    ));
    // Without a client certificate the server refuses.
    refuses_anonymous(&nats.url).await;
    let without_cert = async_nats::ConnectOptions::new()
        .add_root_certificates(ca_file.clone().into())
        .connect(nats.url.as_str());
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(5), without_cert)
            .await
            .map_or(true, |r| r.is_err()),
        "a client without a certificate was served"
    );

    let app = spawn_app_with(Config {
        nats_url: nats.url.replace("nats://", "tls://"),
        nats_tls_ca_file: ca_file,
        nats_tls_cert_file: client_cert,
        nats_tls_key_file: client_key,
        nats_tls_required: true,
        ..test_config(&nats.url)
    })
    .await;
    round_trip(&app).await;
}

/// A JWT as nats-server reads them: header, claims and the issuer's ed25519 signature,
/// each base64url without padding.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = json!({
        "jti": uuid::Uuid::now_v7().to_string(),
        "iat": chrono::Utc::now().timestamp(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{claims}");
    let signature = URL_SAFE_NO_PAD.encode(issuer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{signature}")
}

#[tokio::test]
async fn a_gateway_connects_with_a_credentials_file() {
    // Operator mode, as `nsc` and NATS providers set it up: an operator signs a system
    // account and an account with JetStream; the account signs the gateway's user.
    let operator = nkeys::KeyPair::new_operator();
    let system = nkeys::KeyPair::new_account();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    // Every limit is set: one left out is 0, which denies.
    let unlimited = json!({"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1});
    let mut with_jetstream = unlimited.clone();
    for limit in ["mem_storage", "disk_storage", "streams", "consumer"] {
        with_jetstream[limit] = json!(-1);
    }
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "OP",
        json!({"type": "operator", "version": 2}),
    );
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        json!({"limits": unlimited, "type": "account", "version": 2}),
    );
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "APP",
        json!({"limits": with_jetstream, "type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "ojs-gateway",
        json!({"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}),
    );
    let nats = NatsServer::start_with_config(&format!(
        "operator: {operator_jwt}\nsystem_account: {system}\nresolver: MEMORY\n\
         resolver_preload: {{\n  {system}: {system_jwt}\n  {account}: {account_jwt}\n}}\n",
        system = system.public_key(),
        account = account.public_key(),
    ));
    let creds = nats.dir.path().join("gateway.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    let settings = Config {
        nats_credentials_file: creds.display().to_string(),
        ..test_config(&nats.url)
    };
    only_the_configured_gateway_is_served(&nats, settings).await;
}

#[tokio::test]
async fn a_credentials_file_that_cannot_be_read_stops_the_gateway_at_start() {
    let nats = NatsServer::start();
    let listeners = ojs_jetstream::app::Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        grpc: None,
    };
    let config = Config {
        nats_credentials_file: "/nonexistent/gateway.creds".into(),
        ..test_config(&nats.url)
    };
    let run = ojs_jetstream::app::run(config, listeners, std::future::pending());
    let err = tokio::time::timeout(std::time::Duration::from_secs(5), run)
        .await
        .expect("the gateway stops at once instead of waiting for NATS")
        .expect_err("a credentials file that cannot be read");
    assert!(
        err.message.contains("/nonexistent/gateway.creds"),
        "{}",
        err.message
    );
}
