//! The `ojs-jetstream` command line, run as a process: `--help` and `--version` everywhere
//! (and `serve --help` starting nothing), exit codes, and the client commands against a
//! gateway on a real nats-server.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{dead_letter_a_job, spawn_app, spawn_app_with, test_config, NatsServer};
use ojs_jetstream::config::{Config, KeyList};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// What a run of the command line printed and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }
}

fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_ojs-jetstream"));
    cmd.args(args)
        .env_remove("OJS_URL")
        .env_remove("OJS_API_KEY")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs the command line with `args`; a run that does not end within 10 s fails the test.
async fn ojs(args: &[&str]) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(10), command(args).output())
        .await
        .unwrap_or_else(|_| panic!("`ojs-jetstream {}` did not end", args.join(" ")))
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn help_and_version_answer_on_every_command_and_serve_help_starts_nothing() {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["queues", "--help"],
        vec!["queue", "pause", "--help"],
        vec!["jobs", "get", "--help"],
        vec!["jobs", "list", "--help"],
        vec!["workers", "--help"],
        vec!["dead-letter", "retry", "--help"],
        vec!["cron", "add", "--help"],
        vec!["events", "tail", "--help"],
        vec!["enqueue", "--help"],
    ] {
        let run = ojs(&args).await;
        assert_eq!(run.code, 0, "{args:?}: {}", run.stderr);
        assert!(
            run.stdout.contains("Usage: ojs-jetstream"),
            "{args:?}: {}",
            run.stdout
        );
    }
    assert!(ojs(&["serve", "--help"])
        .await
        .stdout
        .contains("Run the gateway"));
    for args in [
        vec!["--version"],
        vec!["serve", "--version"],
        vec!["cron", "list", "--version"],
    ] {
        let run = ojs(&args).await;
        assert_eq!(run.code, 0, "{args:?}");
        assert!(
            run.stdout.starts_with("ojs-jetstream")
                && run
                    .stdout
                    .ends_with(concat!(" ", env!("CARGO_PKG_VERSION"))),
            "{args:?}: {}",
            run.stdout
        );
    }
    for args in [
        vec!["queues", "--bogus"],
        vec!["serve", "--bogus"],
        vec!["frobnicate"],
        vec!["queue", "pause"],
    ] {
        let run = ojs(&args).await;
        assert_eq!(run.code, 2, "{args:?} is a usage error");
        assert!(run.stderr.contains("Usage:"), "{args:?}: {}", run.stderr);
    }
}

#[tokio::test]
async fn client_commands_print_tables_or_json_and_exit_codes_scripts_can_trust() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let url = app.base.as_str();

    let run = ojs(&[
        "--url",
        url,
        "enqueue",
        "mail.send",
        r#"["ada@example.com"]"#,
        "--queue",
        "cli",
    ])
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let (id, rest) = run.stdout.split_once(' ').unwrap();
    assert_eq!(rest, "available cli");
    let second = ojs(&[
        "--url",
        url,
        "--json",
        "enqueue",
        "mail.send",
        "--queue",
        "cli",
        "--priority",
        "3",
    ])
    .await;
    assert_eq!(second.json()["priority"], 3);
    assert_eq!(app.job(id).await["args"][0], "ada@example.com");

    let queues = ojs(&["--url", url, "queues"]).await;
    let lines: Vec<&str> = queues.stdout.lines().collect();
    assert!(
        lines[0].starts_with("QUEUE  STATUS  SCHEDULED  AVAILABLE"),
        "{}",
        queues.stdout
    );
    let row: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("cli "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!((row[1], row[3]), ("active", "2"), "{row:?}");

    assert_eq!(
        ojs(&["--url", url, "queue", "pause", "cli"]).await.stdout,
        "cli paused"
    );
    assert_eq!(
        ojs(&["--url", url, "--json", "queue", "stats", "cli"])
            .await
            .json()["paused"],
        true
    );
    assert_eq!(
        ojs(&["--url", url, "queue", "resume", "cli"]).await.stdout,
        "cli active"
    );

    let job = ojs(&["--url", url, "jobs", "get", id]).await;
    assert!(
        job.stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["state", "available"]),
        "{}",
        job.stdout
    );
    assert_eq!(
        ojs(&["--url", url, "jobs", "cancel", id]).await.stdout,
        format!("{id} cancelled")
    );
    let unknown = ojs(&[
        "--url",
        url,
        "jobs",
        "get",
        "01a21824-488f-7496-b2f9-7844e5a317c3",
    ])
    .await;
    assert_eq!(unknown.code, 1);
    assert!(
        unknown.stderr.contains("404 not_found"),
        "{}",
        unknown.stderr
    );

    let dead = dead_letter_a_job(&app, "cli-dlq").await;
    let listed = ojs(&["--url", url, "dead-letter", "list", "--queue", "cli-dlq"]).await;
    assert!(
        listed.stdout.lines().nth(1).unwrap().starts_with(&dead),
        "{}",
        listed.stdout
    );
    assert!(listed.stdout.ends_with("(1 in all)"));
    assert_eq!(
        ojs(&["--url", url, "dead-letter", "retry", &dead])
            .await
            .stdout,
        format!("{dead} available")
    );
    let dead = dead_letter_a_job(&app, "cli-dlq-2").await;
    assert_eq!(
        ojs(&["--url", url, "dead-letter", "delete", &dead])
            .await
            .stdout,
        format!("{dead} deleted")
    );
    assert_eq!(
        ojs(&["--url", url, "dead-letter", "delete", &dead])
            .await
            .code,
        1
    );

    let added = ojs(&[
        "--url",
        url,
        "cron",
        "add",
        "nightly",
        "0 3 * * *",
        "report.build",
        "[1]",
        "--queue",
        "reports",
    ])
    .await;
    assert_eq!(added.code, 0, "{}", added.stderr);
    assert!(
        added.stdout.starts_with("nightly next run 20"),
        "{}",
        added.stdout
    );
    let crons = ojs(&["--url", url, "cron", "list"]).await;
    assert!(
        crons.stdout.lines().any(|l| l.starts_with("nightly")
            && l.contains("0 3 * * *")
            && l.contains("report.build")),
        "{}",
        crons.stdout
    );
    assert_eq!(
        ojs(&["--url", url, "cron", "delete", "nightly"]).await.code,
        0
    );
    assert_eq!(
        ojs(&["--url", url, "cron", "delete", "nightly"]).await.code,
        1
    );

    let bad = ojs(&["--url", url, "enqueue", "t.x", "not json"]).await;
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("must be a JSON array"),
        "{}",
        bad.stderr
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    assert_eq!(ojs(&["--url", &nowhere, "queues"]).await.code, 3);
}

#[tokio::test]
async fn the_url_and_api_key_come_from_the_environment_too() {
    const KEY: &str = "5e0c1b9e6d2a47c58e1f0a9b7c6d5e4f-cli";
    let nats = NatsServer::start();
    let app = spawn_app_with(Config {
        api_keys: KeyList(vec![KEY.into()]),
        ..test_config(&nats.url)
    })
    .await;
    let refused = ojs(&["--url", &app.base, "queues"]).await;
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("401"), "{}", refused.stderr);
    let out = command(&["queues"])
        .env("OJS_URL", &app.base)
        .env("OJS_API_KEY", KEY)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("QUEUE"));
}

#[tokio::test]
async fn events_tail_prints_each_event_as_it_happens() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let mut tail = command(&[
        "--url",
        &app.base,
        "events",
        "tail",
        "--queue",
        "tailed",
        "--type",
        "job.enqueued",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    // The stream starts once the command has connected: enqueue until an event shows.
    let mut ids = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        assert!(Instant::now() < deadline, "no event printed");
        ids.push(app.enqueue(common::job_on("tailed")).await);
        app.enqueue(common::job_on("elsewhere")).await;
        if let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_millis(500), lines.next_line()).await
        {
            break line;
        }
    };
    let mut printed = vec![first];
    let last = app.enqueue(common::job_on("tailed")).await;
    app.enqueue(common::job_on("elsewhere")).await;
    while !printed.last().unwrap().contains(&last) {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await;
        printed.push(line.expect("the last job's event").unwrap().unwrap());
    }
    ids.push(last);
    for line in &printed {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.len(), 5, "{line}");
        assert_eq!(
            (words[1], words[3], words[4]),
            ("job.enqueued", "tailed", "available"),
            "{line}"
        );
        assert!(ids.iter().any(|id| id == words[2]), "{line}");
        assert!(
            chrono::DateTime::parse_from_rfc3339(words[0]).is_ok(),
            "{line}"
        );
    }
    tail.kill().await.unwrap();
}

#[tokio::test]
async fn jobs_list_and_retry_and_workers_read_the_admin_api() {
    let nats = NatsServer::start();
    let app = spawn_app(&nats.url).await;
    let url = app.base.as_str();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        waiting.push(app.enqueue(common::job_on("cli-list")).await);
    }

    // Newest first, two a page, the cursor printed for the next page.
    let first = ojs(&[
        "--url", url, "jobs", "list", "--queue", "cli-list", "--limit", "2",
    ])
    .await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let lines: Vec<&str> = first.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ID", "TYPE", "QUEUE", "STATE", "ATTEMPT", "CREATED"]
    );
    assert!(
        lines[1].starts_with(&waiting[2]) && lines[2].starts_with(&waiting[1]),
        "{}",
        first.stdout
    );
    let cursor = lines[3]
        .strip_prefix("more: --cursor ")
        .expect("a cursor line");
    let second = ojs(&[
        "--url", url, "--json", "jobs", "list", "--queue", "cli-list", "--limit", "2", "--cursor",
        cursor,
    ])
    .await;
    let page = second.json();
    assert_eq!(page["items"][0]["id"], waiting[0].as_str());
    assert!(page["pagination"]["next_cursor"].is_null(), "{page}");
    let bad = ojs(&["--url", url, "jobs", "list", "--state", "done"]).await;
    assert_eq!(bad.code, 1);
    assert!(bad.stderr.contains("400 invalid_request"), "{}", bad.stderr);

    // A dead-lettered job listed and retried.
    let dead = dead_letter_a_job(&app, "cli-retry").await;
    let listed = ojs(&[
        "--url",
        url,
        "--json",
        "jobs",
        "list",
        "--state",
        "discarded",
        "--queue",
        "cli-retry",
    ])
    .await;
    assert_eq!(listed.json()["items"][0]["id"], dead.as_str());
    assert_eq!(
        ojs(&["--url", url, "jobs", "retry", &dead]).await.stdout,
        format!("{dead} available")
    );
    let again = ojs(&["--url", url, "jobs", "retry", &dead]).await;
    assert_eq!(again.code, 1);
    assert!(again.stderr.contains("409 conflict"), "{}", again.stderr);

    // Workers, once one has heartbeated.
    let beat = app
        .post(
            "/ojs/v1/workers/heartbeat",
            serde_json::json!({"worker_id": "cli-worker", "hostname": "box-7"}),
        )
        .await;
    assert_eq!(beat.status, 200, "{}", beat.body);
    let workers = ojs(&["--url", url, "workers"]).await;
    let row: Vec<&str> = workers
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..4],
        ["cli-worker", "running", "box-7", "0"],
        "{}",
        workers.stdout
    );
    assert_eq!(
        ojs(&["--url", url, "--json", "workers"]).await.json()["summary"]["total"],
        1
    );
}
