//! Test harness: a real nats-server per test (from `NATS_SERVER_BIN` or `PATH`) on a free
//! loopback port with JetStream and a temp store, and gateways started in-process on it.
#![allow(dead_code)]

pub mod load;
pub mod relay;

use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ojs_jetstream::{app, config::Config};
use reqwest::{header::HeaderMap, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The gateway binary's allocator, so gateways run in-process by the tests perform as
/// deployed ones (timer lateness and failover times are measured here).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A test server's store directory: in `/dev/shm` where there is one (memory-backed), so
/// the disk writeback of the build that ran just before the tests (as in CI) cannot stall
/// the servers whose timing the tests measure; otherwise the system's temp directory.
fn store_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("temp dir")
}

/// A nats-server child process; killed and its store removed on drop.
pub struct NatsServer {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub url: String,
    /// Its `server_name`, when it is a node of a [`NatsCluster`].
    pub name: String,
    /// Options beyond the defaults: a cluster node's, or a configuration file.
    extra_args: Vec<String>,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        NatsServer::start_with_config("")
    }

    /// A server that also reads `config` (nats-server's configuration format): accounts,
    /// authorization, TLS. Its directory (`dir`) is where the test puts files it names.
    pub fn start_with_config(config: &str) -> NatsServer {
        let mut server = NatsServer::unstarted();
        if !config.is_empty() {
            let path = server.dir.path().join("nats.conf");
            std::fs::write(&path, config).expect("nats-server configuration");
            server.extra_args = vec!["-c".into(), path.display().to_string()];
        }
        // A free port can be taken by another test before nats-server binds it; then the
        // server exits and a new port is tried.
        for _ in 0..5 {
            server.port = free_port();
            server.url = format!("nats://127.0.0.1:{}", server.port);
            if server.spawn() {
                return server;
            }
        }
        panic!("nats-server did not start on any of five free ports");
    }

    fn unstarted() -> NatsServer {
        NatsServer {
            child: None,
            dir: store_dir(),
            port: 0,
            url: String::new(),
            name: String::new(),
            extra_args: Vec::new(),
        }
    }

    /// Starts the server on `self.port`; false when it exited instead of serving there.
    fn spawn(&mut self) -> bool {
        let bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
        let child = Command::new(&bin)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.path())
            .arg("--ports_file_dir")
            .arg(self.dir.path())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin} (set NATS_SERVER_BIN): {e}"));
        self.child = Some(child);
        self.serving()
    }

    /// Waits until this server listens on its port, which it announces in its ports file,
    /// and answers there as NATS does (an `INFO` line); false when it exited first. Another
    /// test's server on the same port answers too, so the answer alone proves nothing.
    fn serving(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let child = self.child.as_mut().expect("spawned");
        let ports_file = format!("_{}.ports", child.id());
        loop {
            if child.try_wait().expect("nats-server status").is_some() {
                return false;
            }
            let listening = std::fs::read_dir(self.dir.path())
                .expect("the server's directory")
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(&ports_file));
            if listening && speaks_nats(self.port) {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server abruptly (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server as an operator does (SIGTERM: it closes its clients and leaves
    /// the cluster in order), waiting until it exited.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "nats-server could not restart on port {}",
            self.port
        );
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A NATS client for `url` (one or more servers, comma-separated).
pub async fn connect(url: &str) -> async_nats::Client {
    async_nats::connect(url.split(',').collect::<Vec<_>>())
        .await
        .expect("a NATS connection")
}

/// The (major, minor) version of the nats-server at `url` (one or more, comma-separated).
pub async fn nats_version(url: &str) -> (u32, u32) {
    let client = connect(url).await;
    let version = client.server_info().version;
    let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The server leading the stream `stream` (its Raft group leader), asked through `url`;
/// waits while the stream has none (an election after a node came back).
pub async fn stream_leader(url: &str, stream: &str) -> String {
    let js = async_nats::jetstream::new(connect(url).await);
    eventually(Duration::from_secs(30), "a stream leader", || {
        let js = js.clone();
        async move {
            let info = js.get_stream(stream).await.ok()?.info().await.ok()?.clone();
            info.cluster?.leader
        }
    })
    .await
}

/// Three clustered nats-servers with JetStream (`n1`, `n2`, `n3`), routed to each other as
/// docker-compose.yml routes its nodes, except that every route runs through a [`Relay`]
/// the test can cut ([`NatsCluster::isolate`]). Each node advertises an unused port as its
/// route address, so a cut node cannot reach around its relays by the route addresses the
/// others gossip.
pub struct NatsCluster {
    pub nodes: Vec<NatsServer>,
    /// `(from, to, relay)`: the relay node `from` dials to reach node `to`.
    relays: Vec<(usize, usize, relay::Relay)>,
}

/// Whether every stream and consumer has a leader and every replica of it is current.
async fn all_current(js: &async_nats::jetstream::Context) -> Result<bool, async_nats::Error> {
    use futures::TryStreamExt;
    let current = |group: Option<&async_nats::jetstream::stream::ClusterInfo>| {
        group.is_some_and(|g| {
            g.leader.is_some() && g.replicas.iter().all(|r| r.current && !r.offline)
        })
    };
    let mut streams = js.streams();
    while let Some(info) = streams.try_next().await? {
        if !current(info.cluster.as_ref()) {
            return Ok(false);
        }
        let mut consumers = js.get_stream(&info.config.name).await?.consumers();
        while let Some(consumer) = consumers.try_next().await? {
            if !current(consumer.cluster.as_ref()) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

impl NatsCluster {
    /// Starts the nodes and waits until JetStream can place a stream on all three.
    pub async fn start() -> NatsCluster {
        // A free port can be taken by another test before a node binds it; then that node
        // exits, and the cluster is started again on new ports.
        for _ in 0..5 {
            if let Some(cluster) = NatsCluster::spawn().await {
                cluster.wait_for_jetstream().await;
                return cluster;
            }
        }
        panic!("a nats-server cluster did not start on any of five sets of free ports");
    }

    /// The three nodes and their relays on new ports; `None` when a node did not start.
    async fn spawn() -> Option<NatsCluster> {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut relays = Vec::new();
        for from in 0..3 {
            for to in (0..3).filter(|&to| to != from) {
                relays.push((from, to, relay::Relay::start(routes[to]).await));
            }
        }
        let mut nodes = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let route_urls = relays
                .iter()
                .filter(|(from, ..)| *from == i)
                .map(|(.., r)| format!("nats://127.0.0.1:{}", r.port))
                .collect::<Vec<_>>()
                .join(",");
            let mut node = NatsServer::unstarted();
            node.name = format!("n{}", i + 1);
            node.port = free_port();
            node.url = format!("nats://127.0.0.1:{}", node.port);
            node.extra_args = [
                "--server_name",
                &node.name,
                "--cluster_name",
                "ojs-test",
                "--cluster",
                &format!("nats://127.0.0.1:{route}"),
                "--cluster_advertise",
                &format!("127.0.0.1:{}", free_port()),
                // Clients keep to the nodes they are given.
                "--no_advertise",
                "--routes",
                &route_urls,
            ]
            .map(String::from)
            .to_vec();
            if !node.spawn() {
                return None;
            }
            nodes.push(node);
        }
        Some(NatsCluster { nodes, relays })
    }

    /// Cuts node `name` off from the other two (they still reach each other); its clients
    /// stay connected to it.
    pub fn isolate(&self, name: &str) {
        self.relays_of(name).for_each(relay::Relay::cut);
    }

    /// Ends [`NatsCluster::isolate`].
    pub fn heal(&self, name: &str) {
        self.relays_of(name).for_each(relay::Relay::mend);
    }

    /// Waits, up to a minute, until every stream and consumer of the cluster at `url` has
    /// a leader and all its replicas are current: what a rolling operation on a cluster
    /// waits for before it takes the next node out (a node back from a restart may still
    /// be catching up, and taking another then leaves a group without a quorum).
    pub async fn wait_current_at(url: &str) {
        let servers: Vec<async_nats::ServerAddr> =
            url.split(',').map(|u| u.parse().unwrap()).collect();
        let js = async_nats::jetstream::new(async_nats::connect(servers).await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !all_current(&js).await.unwrap_or(false) {
            assert!(
                Instant::now() < deadline,
                "the cluster's replicas did not catch up within a minute"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn relays_of(&self, name: &str) -> impl Iterator<Item = &relay::Relay> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"));
        self.relays
            .iter()
            .filter(move |(from, to, _)| *from == i || *to == i)
            .map(|(.., r)| r)
    }

    /// Every node's URL, comma-separated, as `nats_url` takes them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn node(&mut self, name: &str) -> &mut NatsServer {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    async fn wait_for_jetstream(&self) {
        let client = connect(&self.url()).await;
        let js = async_nats::jetstream::new(client);
        let config = async_nats::jetstream::stream::Config {
            name: "cluster-ready".into(),
            subjects: vec!["cluster-ready".into()],
            num_replicas: 3,
            ..Default::default()
        };
        eventually(Duration::from_secs(30), "a JetStream cluster", || {
            let js = js.clone();
            let config = config.clone();
            async move { js.create_stream(config).await.ok().map(|_| ()) }
        })
        .await;
        js.delete_stream("cluster-ready").await.unwrap();
    }
}

/// A free port below the kernel's ephemeral range (32768 and up on Linux). A server
/// restarted on its port must find it free again, and ports of that range go to every
/// outgoing connection and `bind(0)` meanwhile: a restart in CI once found its port taken.
fn free_port() -> u16 {
    loop {
        let port = rand::random_range(20_000..32_000);
        if StdListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Whether what listens on `port` greets like a NATS server (not, say, another test's
/// gateway that took the port).
fn speaks_nats(port: u16) -> bool {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
    let mut greeting = [0u8; 4];
    conn.read_exact(&mut greeting).is_ok() && &greeting == b"INFO"
}

/// A gateway running in this test's runtime.
pub struct TestApp {
    pub addr: SocketAddr,
    /// Where the gateway serves the gRPC binding (a gateway this test started).
    pub grpc_addr: Option<SocketAddr>,
    pub base: String,
    pub http: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// The settings every test gateway uses: memory-light, resettable, quick leader election.
pub fn test_config(nats_url: &str) -> Config {
    Config {
        nats_url: nats_url.to_string(),
        allow_reset: true,
        lease_ttl_ms: 900,
        ..Config::default()
    }
}

pub async fn spawn_app(nats_url: &str) -> TestApp {
    spawn_app_with(test_config(nats_url)).await
}

pub async fn spawn_app_with(config: Config) -> TestApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let listeners = app::Listeners {
        http: listener,
        grpc: Some(grpc),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        app::run(config, listeners, async move {
            let _ = rx.await;
        })
        .await
        .expect("gateway runs");
    });
    let app = TestApp {
        addr,
        grpc_addr: Some(grpc_addr),
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        shutdown: Some(tx),
        task: Some(task),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(r) = app.http.get(app.url("/ojs/v1/health")).send().await {
            // 401: health asks for an API key (`open_health_and_metrics = false`).
            if r.status() == StatusCode::OK || r.status() == StatusCode::UNAUTHORIZED {
                break;
            }
        }
        assert!(Instant::now() < deadline, "gateway did not become healthy");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    app
}

/// A response: status, headers and the JSON body (`Value::Null` when empty).
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts an OJS error body with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.body);
        assert_eq!(self.body["error"]["code"], code, "body: {}", self.body);
        assert!(self.body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert_eq!(self.header("content-type"), "application/openjobspec+json");
    }
}

impl TestApp {
    /// A handle for requests to the gateway at `base`; it does not stop the gateway.
    pub fn at(base: &str) -> TestApp {
        TestApp {
            addr: base.trim_start_matches("http://").parse().unwrap(),
            grpc_addr: None,
            base: base.to_owned(),
            http: reqwest::Client::new(),
            shutdown: None,
            task: None,
        }
    }

    /// Another handle for requests to this gateway (for a spawned task).
    pub fn client(&self) -> TestApp {
        TestApp::at(&self.base)
    }

    /// A handle whose requests carry `Authorization: Bearer <key>`.
    pub fn keyed(&self, key: &str) -> TestApp {
        self.with_header(
            reqwest::header::AUTHORIZATION.as_str(),
            &format!("Bearer {key}"),
        )
    }

    /// A handle whose requests carry the header `name: value`.
    pub fn with_header(&self, name: &str, value: &str) -> TestApp {
        let mut headers = HeaderMap::new();
        headers.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        TestApp {
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
            ..TestApp::at(&self.base)
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn reply(resp: reqwest::Response) -> Reply {
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON body")
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.send_json(reqwest::Method::PUT, path, body).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Reply {
        self.send_json(reqwest::Method::PATCH, path, body).await
    }

    /// DELETE with a JSON body (the admin API's purges).
    pub async fn delete_json(&self, path: &str, body: Value) -> Reply {
        self.send_json(reqwest::Method::DELETE, path, body).await
    }

    /// `body` as an OJS JSON request with `method`.
    async fn send_json(&self, method: reqwest::Method, path: &str, body: Value) -> Reply {
        let resp = self
            .http
            .request(method, self.url(path))
            .header("content-type", "application/openjobspec+json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        Self::reply(resp).await
    }

    pub async fn post_raw(&self, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Reply {
        let mut req = self.http.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        Self::reply(req.send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        Self::reply(self.http.get(self.url(path)).send().await.unwrap()).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        Self::reply(self.http.delete(self.url(path)).send().await.unwrap()).await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        let resp = self.http.get(self.url("/metrics")).send().await.unwrap();
        resp.text().await.unwrap()
    }

    /// ACK with this body (`/ojs/v1/workers/ack`).
    pub async fn ack(&self, body: Value) -> Reply {
        self.post("/ojs/v1/workers/ack", body).await
    }

    /// FAIL with this body, through `/ojs/v1/workers/nack`.
    pub async fn nack(&self, body: Value) -> Reply {
        self.post("/ojs/v1/workers/nack", body).await
    }

    /// FAIL with this body, through `/ojs/v1/workers/fail`.
    pub async fn fail(&self, body: Value) -> Reply {
        self.post("/ojs/v1/workers/fail", body).await
    }

    /// Enqueues a job and returns its id, asserting 201.
    pub async fn enqueue(&self, job: Value) -> String {
        let r = self.post("/ojs/v1/jobs", job).await;
        assert_eq!(r.status, StatusCode::CREATED, "enqueue failed: {}", r.body);
        r.body["job"]["id"].as_str().unwrap().to_string()
    }

    /// Fetches from `queues` (one job) and returns the jobs array.
    pub async fn fetch(&self, queues: &[&str], worker: &str) -> Vec<Value> {
        let r = self
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": queues, "worker_id": worker}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "fetch failed: {}", r.body);
        r.body["jobs"].as_array().unwrap().clone()
    }

    pub async fn job(&self, id: &str) -> Value {
        let r = self.get(&format!("/ojs/v1/jobs/{id}")).await;
        assert_eq!(r.status, StatusCode::OK, "info failed: {}", r.body);
        r.body["job"].clone()
    }

    /// Stops the gateway and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// A gateway as a separate `ojs-jetstream serve` process, for tests that kill it.
pub struct GatewayProcess {
    child: Child,
    pub base: String,
}

impl GatewayProcess {
    pub async fn start(nats_url: &str, extra_env: &[(&str, &str)]) -> GatewayProcess {
        GatewayProcess::start_logging_to(nats_url, extra_env, None).await
    }

    /// As [`GatewayProcess::start`], with the process's stderr (its log) written to `log`.
    pub async fn start_logging_to(
        nats_url: &str,
        extra_env: &[(&str, &str)],
        log: Option<&std::path::Path>,
    ) -> GatewayProcess {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ojs-jetstream"));
        cmd.arg("serve")
            .env("OJS_CONFIG", "/nonexistent/ojs-jetstream.toml")
            .env("OJS_NATS_URL", nats_url)
            .env("OJS_LISTEN", format!("127.0.0.1:{port}"))
            .env("OJS_GRPC_LISTEN", "")
            .env("OJS_LEASE_TTL_MS", "900")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(match log {
                Some(path) => Stdio::from(std::fs::File::create(path).expect("a log file")),
                None => Stdio::null(),
            });
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start the gateway binary");
        let gw = GatewayProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        // A gateway still waiting for NATS holds connections unanswered: ask again each second.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        eventually(Duration::from_secs(20), "gateway process health", || {
            let url = format!("{}/ojs/v1/health", gw.base);
            let http = http.clone();
            async move {
                http.get(url)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status() == StatusCode::OK)
                    .map(|_| ())
            }
        })
        .await;
        gw
    }

    /// A handle for requests to this gateway, as to an in-process one.
    pub fn client(&self) -> TestApp {
        TestApp::at(&self.base)
    }

    /// The process's resident memory, in MiB (from `/proc`).
    pub fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the gateway process's status");
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb / 1024.0
    }

    /// POSTs `body`; `None` when the process went away before it answered.
    pub async fn try_post(&self, path: &str, body: Value) -> Option<Reply> {
        let req = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/openjobspec+json")
            .body(body.to_string());
        Some(TestApp::reply(req.send().await.ok()?).await)
    }

    /// DELETEs `path`; `None` when the process went away before it answered.
    pub async fn try_delete(&self, path: &str) -> Option<Reply> {
        let req = reqwest::Client::new().delete(format!("{}{path}", self.base));
        Some(TestApp::reply(req.send().await.ok()?).await)
    }

    /// The exit code, once the process has ended by itself within `within`.
    pub async fn exit_code(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGSTOP: the process freezes, as in a long pause of its VM or host.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGKILL: no graceful shutdown, the lease is left to expire.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until no other test on this machine holds this, and holds it until dropped: the
/// tests that load one gateway's leader to the limit and bound its timings (thousands of
/// timers due at once, failovers) take it first, so two of them never share the CPU,
/// whichever suite, process or thread runs them (CI runs the suites against both
/// nats-servers side by side).
pub fn measuring() -> std::fs::File {
    let path = std::env::temp_dir().join("ojs-jetstream-tests-measuring.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
    file
}

/// Polls `check` every 20 ms until it returns `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A minimal job on `queue`.
pub fn job_on(queue: &str) -> Value {
    json!({"type": "test.job", "args": [1], "options": {"queue": queue}})
}

/// Enqueues a job on `queue` that fails once into the dead letter queue; its id.
pub async fn dead_letter_a_job(app: &TestApp, queue: &str) -> String {
    let id = app
        .enqueue(json!({"type": "t.d", "args": [], "options": {"queue": queue, "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}))
        .await;
    let fetched = app.fetch(&[queue], "w").await;
    let r = app
        .nack(json!({"job_id": id, "error": {"code": "handler_error", "message": "no"}}))
        .await;
    assert_eq!(
        r.body["state"], "discarded",
        "NACK of {id} answered {} {}; the FETCH before it got {fetched:?}",
        r.status, r.body
    );
    id
}

/// The ids of a `jobs` array in a response body, in order.
pub fn job_ids(jobs: &Value) -> Vec<&str> {
    jobs.as_array()
        .expect("a jobs array")
        .iter()
        .map(|j| j["id"].as_str().expect("a job id"))
        .collect()
}

/// A timestamp field of a job.
pub fn ts(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a timestamp"))
        .unwrap()
        .with_timezone(&chrono::Utc)
}

/// Long-polls `queue` through `app` until `n` scheduled jobs have come, acknowledging each
/// (as a worker that ran it; a job left active would get a deadline timer); how late each
/// reached the worker after its `scheduled_at`, in milliseconds, sorted.
pub async fn lateness_to_a_waiting_worker(app: &TestApp, queue: &str, n: usize) -> Vec<i64> {
    let mut lateness = Vec::new();
    while lateness.len() < n {
        let r = app
            .post(
                "/ojs/v1/workers/fetch",
                json!({"queues": [queue], "worker_id": "w", "wait_ms": 5000}),
            )
            .await;
        let got = chrono::Utc::now();
        let job = &r.body["jobs"][0];
        assert!(job.is_object(), "nothing came: {}", r.body);
        lateness.push((got - ts(&job["scheduled_at"])).num_milliseconds());
        let r = app
            .ack(json!({"job_id": job["id"], "worker_id": "w"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    lateness.sort_unstable();
    lateness
}
