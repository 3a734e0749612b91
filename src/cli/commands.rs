//! What each client command sends and prints.

use serde_json::{json, Value};

use super::args::{
    Cli, Command, CronAction, DeadLetterAction, EventsAction, JobsAction, QueueAction,
};
use super::failure::Failure;
use super::table::{cell, render, rows};
use ojs_client::{Client, JobListing, JobSpec};

/// Runs a client command (anything but `serve`).
///
/// # Errors
/// As [`Failure`] says; the caller turns it into the exit code.
pub async fn run(cli: &Cli, command: &Command) -> Result<(), Failure> {
    if cli
        .api_key
        .as_deref()
        .is_some_and(|k| k.chars().any(char::is_control))
    {
        return Err(Failure::Usage("the API key has a control character".into()));
    }
    let client = cli.client();
    let json = cli.json;
    match command {
        Command::Serve => unreachable!("serve runs the gateway, not a client command"),
        Command::Queues => queues(&client, json).await,
        Command::Queue { action } => queue(&client, json, action).await,
        Command::Jobs { action } => jobs(&client, json, action).await,
        Command::Workers => workers(&client, json).await,
        Command::DeadLetter { action } => dead_letter(&client, json, action).await,
        Command::Cron { action } => cron(&client, json, action).await,
        Command::Enqueue {
            job_type,
            args,
            queue,
            priority,
            scheduled_at,
            max_attempts,
        } => {
            let mut spec = JobSpec::new(job_type, json_array("args", args)?).queue(queue);
            if let Some(p) = priority {
                spec = spec.option("priority", json!(p));
            }
            if let Some(at) = scheduled_at {
                spec = spec.option("scheduled_at", json!(at));
            }
            if let Some(n) = max_attempts {
                spec = spec.option("retry", json!({"max_attempts": n}));
            }
            let job = client.enqueue(spec).await?;
            print(json, &job, |j| {
                format!(
                    "{} {} {}",
                    cell(&j["id"]),
                    cell(&j["state"]),
                    cell(&j["queue"])
                )
            });
            Ok(())
        }
        Command::Events { action } => events(&client, json, action).await,
    }
}

/// The JSON answer with `--json`, else what `human` makes of it.
fn print(json: bool, value: &Value, human: impl FnOnce(&Value) -> String) {
    if json {
        println!("{value}");
    } else {
        println!("{}", human(value));
    }
}

/// A command-line argument that must be a JSON array.
fn json_array(what: &str, raw: &str) -> Result<Value, Failure> {
    match serde_json::from_str::<Value>(raw) {
        Ok(v @ Value::Array(_)) => Ok(v),
        _ => Err(Failure::Usage(format!(
            "{what} must be a JSON array, e.g. '[\"ada@example.com\", 2]'; got {raw:?}"
        ))),
    }
}

/// Every state a queue's statistics count, in lifecycle order.
const STATES: [&str; 8] = [
    "scheduled",
    "available",
    "pending",
    "active",
    "retryable",
    "completed",
    "cancelled",
    "discarded",
];

async fn queues(client: &Client, json: bool) -> Result<(), Failure> {
    let mut stats = Vec::new();
    let mut offset = 0;
    loop {
        let page = client.queues(100, offset).await?;
        let names: Vec<String> = page["queues"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|q| q["name"].as_str().map(str::to_owned))
            .collect();
        offset += names.len();
        for name in names {
            stats.push(client.queue_stats(&name).await?["queue"].clone());
        }
        if page["pagination"]["has_more"] != true {
            break;
        }
    }
    let stats = Value::Array(stats);
    print(json, &stats, |all| {
        let upper: Vec<String> = STATES.iter().map(|s| s.to_uppercase()).collect();
        let mut headers = vec!["QUEUE", "STATUS"];
        headers.extend(upper.iter().map(String::as_str));
        headers.push("DEAD");
        let rows: Vec<Vec<String>> = all
            .as_array()
            .into_iter()
            .flatten()
            .map(|q| {
                let mut row = vec![cell(&q["name"]), cell(&q["status"])];
                row.extend(STATES.iter().map(|s| cell(&q[*s])));
                row.push(cell(&q["dead"]));
                row
            })
            .collect();
        render(&headers, &rows)
    });
    Ok(())
}

async fn queue(client: &Client, json: bool, action: &QueueAction) -> Result<(), Failure> {
    let (name, answer) = match action {
        QueueAction::Pause { name } => (name, client.set_paused(name, true).await?),
        QueueAction::Resume { name } => (name, client.set_paused(name, false).await?),
        QueueAction::Stats { name } => {
            let stats = client.queue_stats(name).await?;
            print(json, &stats, |s| {
                let q = &s["queue"];
                let mut rows = vec![
                    vec!["status".into(), cell(&q["status"])],
                    vec![
                        "throughput_per_second".into(),
                        cell(&q["throughput_per_second"]),
                    ],
                ];
                rows.extend(
                    STATES
                        .iter()
                        .chain(&["dead"])
                        .map(|s| vec![(*s).into(), cell(&q[*s])]),
                );
                render(&["QUEUE", name], &rows)
            });
            return Ok(());
        }
    };
    print(json, &answer, |q| format!("{name} {}", cell(&q["status"])));
    Ok(())
}

/// The fields of a job a person looks at first, in that order.
const JOB_FIELDS: [&str; 12] = [
    "id",
    "type",
    "queue",
    "state",
    "attempt",
    "max_attempts",
    "priority",
    "created_at",
    "scheduled_at",
    "started_at",
    "completed_at",
    "progress",
];

async fn jobs(client: &Client, json: bool, action: &JobsAction) -> Result<(), Failure> {
    match action {
        JobsAction::Get { id } => {
            let job = client.get(id).await?;
            print(json, &job, |j| {
                let mut rows: Vec<Vec<String>> = JOB_FIELDS
                    .iter()
                    .filter(|f| !j[**f].is_null())
                    .map(|f| vec![(*f).into(), cell(&j[*f])])
                    .collect();
                for field in ["args", "result"] {
                    if !j[field].is_null() {
                        rows.push(vec![field.into(), cell(&j[field])]);
                    }
                }
                if !j["error"].is_null() {
                    rows.push(vec!["error".into(), error_line(&j["error"])]);
                }
                render(&["FIELD", "VALUE"], &rows)
            });
        }
        JobsAction::Cancel { id } => {
            let job = client.cancel(id).await?;
            print(json, &job, |j| {
                format!("{} {}", cell(&j["id"]), cell(&j["state"]))
            });
        }
        JobsAction::Retry { id } => {
            let job = client.retry_job(id).await?;
            print(json, &job, |j| {
                format!("{} {}", cell(&j["id"]), cell(&j["state"]))
            });
        }
        JobsAction::List {
            queue,
            state,
            job_type,
            limit,
            cursor,
        } => {
            let page = client
                .list_jobs(&JobListing {
                    queue: queue.clone(),
                    state: state.clone(),
                    job_type: job_type.clone(),
                    per_page: *limit,
                    cursor: cursor.clone(),
                })
                .await?;
            print(json, &page, |p| {
                let rows = rows(
                    &p["items"],
                    &["id", "type", "queue", "state", "attempt", "created_at"],
                );
                let mut out = render(
                    &["ID", "TYPE", "QUEUE", "STATE", "ATTEMPT", "CREATED"],
                    &rows,
                );
                if let Some(next) = p["pagination"]["next_cursor"].as_str() {
                    out.push_str(&format!("\nmore: --cursor {next}"));
                }
                out
            });
        }
    }
    Ok(())
}

async fn workers(client: &Client, json: bool) -> Result<(), Failure> {
    let all = client.workers().await?;
    print(json, &all, |w| {
        let rows = rows(
            &w["items"],
            &[
                "id",
                "state",
                "hostname",
                "active_jobs",
                "last_heartbeat_at",
            ],
        );
        render(
            &["WORKER", "STATE", "HOSTNAME", "ACTIVE", "LAST HEARTBEAT"],
            &rows,
        )
    });
    Ok(())
}

fn error_line(error: &Value) -> String {
    let kind = if error["type"].is_null() {
        &error["code"]
    } else {
        &error["type"]
    };
    format!("{}: {}", cell(kind), cell(&error["message"]))
}

async fn dead_letter(
    client: &Client,
    json: bool,
    action: &DeadLetterAction,
) -> Result<(), Failure> {
    match action {
        DeadLetterAction::List {
            queue,
            limit,
            offset,
        } => {
            let page = client
                .dead_letters(queue.as_deref(), *limit, *offset)
                .await?;
            print(json, &page, |p| {
                let rows: Vec<Vec<String>> = p["jobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|j| {
                        vec![
                            cell(&j["id"]),
                            cell(&j["type"]),
                            cell(&j["queue"]),
                            cell(&j["attempt"]),
                            error_line(&j["error"]),
                        ]
                    })
                    .collect();
                let total = cell(&p["pagination"]["total"]);
                format!(
                    "{}\n({total} in all)",
                    render(&["ID", "TYPE", "QUEUE", "ATTEMPTS", "ERROR"], &rows)
                )
            });
        }
        DeadLetterAction::Retry { id } => {
            let job = client.retry_dead_letter(id).await?;
            print(json, &job, |j| {
                format!("{} {}", cell(&j["id"]), cell(&j["state"]))
            });
        }
        DeadLetterAction::Delete { id } => {
            client.delete_dead_letter(id).await?;
            print(json, &json!({"deleted": true, "job_id": id}), |_| {
                format!("{id} deleted")
            });
        }
    }
    Ok(())
}

async fn cron(client: &Client, json: bool, action: &CronAction) -> Result<(), Failure> {
    match action {
        CronAction::List => {
            let entries = Value::Array(client.list_cron().await?);
            print(json, &entries, |all| {
                let rows = rows(
                    all,
                    &[
                        "name",
                        "expression",
                        "timezone",
                        "type",
                        "status",
                        "next_run_at",
                        "last_run_at",
                    ],
                );
                render(
                    &[
                        "NAME",
                        "EXPRESSION",
                        "TIMEZONE",
                        "TYPE",
                        "STATUS",
                        "NEXT RUN",
                        "LAST RUN",
                    ],
                    &rows,
                )
            });
        }
        CronAction::Add {
            name,
            expression,
            job_type,
            args,
            queue,
            timezone,
        } => {
            let entry = client
                .register_cron(json!({
                    "name": name,
                    "expression": expression,
                    "timezone": timezone,
                    "job_template": {"type": job_type, "args": json_array("args", args)?, "options": {"queue": queue}},
                }))
                .await?;
            print(json, &entry, |e| {
                format!("{} next run {}", cell(&e["name"]), cell(&e["next_run_at"]))
            });
        }
        CronAction::Delete { name } => {
            let entry = client.delete_cron(name).await?;
            print(json, &entry, |_| format!("{name} deleted"));
        }
    }
    Ok(())
}

async fn events(client: &Client, json: bool, action: &EventsAction) -> Result<(), Failure> {
    let EventsAction::Tail { queue, job, types } = action;
    let channel = match (queue, job) {
        (Some(q), _) => format!("queue:{q}"),
        (None, Some(id)) => format!("job:{id}"),
        (None, None) => "*".into(),
    };
    let types: Vec<&str> = types.iter().map(String::as_str).collect();
    let mut stream = client.follow_events(&channel, &types).await?;
    while let Some(event) = stream.next().await {
        let event = event?;
        let line = json!({"id": event.id, "type": event.event_type, "data": event.data});
        print(json, &line, |_| {
            let (time, data) = (&event.data["time"], &event.data["data"]);
            let fields = ["job_id", "queue", "state"].map(|key| cell(&data[key]));
            format!("{} {} {}", cell(time), event.event_type, fields.join(" "))
        });
    }
    Ok(())
}
