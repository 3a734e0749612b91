//! The README and the docs stay true: the source layout of docs/development.md lists every
//! source file and nothing else, the settings table of docs/configuration.md names every
//! setting with its variable and default, the metrics tables of docs/operations.md name every
//! metric the code registers, and the example requests of every document with `console`
//! blocks, run against a gateway, answer what the document shows.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use ojs_jetstream::config::Config;
use serde_json::{json, Value};

/// A document of the repository, by its path from the root.
fn document(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The tree of `root` (`src/`, `client/src/`) in docs/development.md: the code block that
/// starts with it.
fn layout_tree(root: &str) -> String {
    let doc = document("docs/development.md");
    let start = doc
        .find(&format!("```\n{root}/\n"))
        .unwrap_or_else(|| panic!("a module tree of {root}/ in docs/development.md"));
    let body = &doc[start + 4..];
    body[..body.find("```").expect("the tree's end")].to_owned()
}

/// The folder's line and the lines indented below it.
fn section(tree: &str, folder: &str) -> String {
    let mut lines = tree
        .lines()
        .skip_while(|l| !l.starts_with(&format!("  {folder}/")));
    let Some(first) = lines.next() else {
        return String::new();
    };
    let below = lines.take_while(|l| l.starts_with("    "));
    std::iter::once(first)
        .chain(below)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_source_layout_lists_every_source_file_and_nothing_else() {
    for root in ["src", "client/src"] {
        lists_every_source_file_and_nothing_else(root);
    }
}

fn lists_every_source_file_and_nothing_else(root: &str) {
    let tree = layout_tree(root);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
    let mut missing = Vec::new();
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let listed = section(&tree, &name);
            if listed.is_empty() {
                missing.push(format!("{name}/"));
            }
            for file in std::fs::read_dir(&path).unwrap() {
                let file = file.unwrap().path();
                // A folder within may list its files too (`store/jobs/`).
                if file.is_dir() {
                    files.extend(names_in(&file));
                }
                let file = file.file_name().unwrap().to_string_lossy().into_owned();
                files.insert(file.clone());
                if file != "mod.rs" && !listed.contains(&file) {
                    missing.push(format!("{name}/{file}"));
                }
            }
        } else {
            files.insert(name.clone());
            if !tree.contains(&name) {
                missing.push(name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in the tree of {root}/ in docs/development.md: {missing:?}"
    );
    let stale: Vec<&str> = tree
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| w.ends_with(".rs") && !files.contains(*w))
        .collect();
    assert!(stale.is_empty(), "listed but not in {root}/: {stale:?}");
}

/// The names of the files directly in `dir`.
fn names_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The texts between backticks in a table cell.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The cells of each row of the first table whose header row starts with `header`.
fn table_rows<'d>(doc: &'d str, header: &str) -> Vec<Vec<&'d str>> {
    doc.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect()
}

/// The settings table names each setting once, with its `OJS_` variable and its built-in
/// default (`empty` for an empty text or list), and names no setting the gateway lacks.
#[test]
fn the_settings_table_names_every_setting_with_its_variable_and_default() {
    let doc = document("docs/configuration.md");
    let defaults = serde_json::to_value(Config::default()).unwrap();
    let defaults = defaults.as_object().unwrap();
    let mut named = BTreeSet::new();
    for row in table_rows(&doc, "| Setting |") {
        let (settings, variables) = (code_spans(row[0]), code_spans(row[1]));
        assert_eq!(settings.len(), variables.len(), "row {row:?}");
        for (setting, variable) in settings.into_iter().zip(variables) {
            assert!(named.insert(setting), "{setting} is in the table twice");
            assert_eq!(variable, format!("OJS_{}", setting.to_uppercase()));
            let default = defaults
                .get(setting)
                .unwrap_or_else(|| panic!("{setting} is no setting of the gateway"));
            let shown = (!row[2].starts_with("empty")).then(|| code_spans(row[2])[0]);
            let real = match default {
                Value::String(s) if s.is_empty() => None,
                Value::Array(a) if a.is_empty() => None,
                Value::String(s) => Some(s.clone()),
                other => Some(other.to_string()),
            };
            assert_eq!(shown, real.as_deref(), "the default of {setting}");
        }
    }
    let settings: BTreeSet<&str> = defaults.keys().map(String::as_str).collect();
    assert_eq!(named, settings, "settings and the table's rows");
}

/// The metrics tables list what `src/telemetry/` registers: every metric name written there
/// as a string of its own, and nothing else.
#[test]
fn the_metrics_tables_name_every_metric_the_code_registers() {
    let mut registered = BTreeSet::new();
    for file in ["src/telemetry/metrics.rs", "src/telemetry/job_metrics.rs"] {
        let code = document(file);
        for (at, _) in code.match_indices("\"ojs_") {
            let name = &code[at + 1..];
            let name = &name[..name.find('"').expect("a closing quote")];
            if name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                registered.insert(name.to_owned());
            }
        }
    }
    let doc = document("docs/operations.md");
    let metrics = &doc[doc.find("## Metrics").expect("a Metrics section")..];
    let metrics = &metrics[..metrics[3..]
        .find("\n## ")
        .map_or(metrics.len(), |end| end + 3)];
    let tabled: BTreeSet<String> = metrics
        .lines()
        .filter(|l| l.starts_with("| `ojs_"))
        .flat_map(|l| code_spans(l.trim_matches('|').split('|').next().unwrap()))
        .map(str::to_owned)
        .collect();
    assert_eq!(tabled, registered, "the metrics tables and src/telemetry/");
}

/// Every document with `console` examples has a test below that runs them.
#[test]
fn every_document_with_console_examples_is_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut documents = vec!["README.md".to_owned()];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            documents.push(format!("docs/{name}"));
        }
    }
    for path in documents {
        if document(&path).contains("```console\n") {
            let test = format!("answers_what_it_shows(\"{path}\")");
            assert!(
                include_str!("readme.rs").contains(&test),
                "{path}'s console examples are not run: no test calls {test}"
            );
        }
    }
}

/// One `$ curl …` of a document's console blocks and the output shown under it.
struct Example {
    command: String,
    output: Vec<String>,
}

fn console_examples(path: &str) -> Vec<Example> {
    let doc = document(path);
    let mut examples: Vec<Example> = Vec::new();
    for block in doc.split("```console\n").skip(1) {
        let block = &block[..block.find("```").expect("a console block's end")];
        let mut continued = false;
        for line in block.lines() {
            if let Some(command) = line.strip_prefix("$ ") {
                examples.push(Example {
                    command: command.to_owned(),
                    output: Vec::new(),
                });
            } else if continued {
                examples.last_mut().unwrap().command.push_str(line);
            } else {
                examples
                    .last_mut()
                    .expect("a console block starts with a command")
                    .output
                    .push(line.to_owned());
            }
            continued = line.ends_with('\\');
            if continued {
                let command = &mut examples.last_mut().unwrap().command;
                command.truncate(command.len() - 1);
            }
        }
    }
    examples
}

/// Shell words, with single quotes (all the documents use) and `|` as a word of its own.
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            c if c.is_whitespace() => words.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// A curl invocation, then the `grep PATTERN` stages it is piped through.
struct Request {
    method: reqwest::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
    include_headers: bool,
    greps: Vec<String>,
}

fn request(command: &str) -> Request {
    let words = words(command);
    let mut stages = words.split(|w| w == "|");
    let curl = stages.next().unwrap();
    assert_eq!(
        curl[0], "curl",
        "only curl commands in console blocks: {command}"
    );
    let mut request = Request {
        method: reqwest::Method::GET,
        url: String::new(),
        headers: Vec::new(),
        body: None,
        include_headers: false,
        greps: Vec::new(),
    };
    let mut args = curl[1..].iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-s" => {}
            "-si" => request.include_headers = true,
            "-X" => request.method = args.next().unwrap().parse().unwrap(),
            "-H" => {
                let (name, value) = args.next().unwrap().split_once(": ").unwrap();
                request.headers.push((name.to_owned(), value.to_owned()));
            }
            "-d" => {
                request.body = Some(args.next().unwrap().clone());
                if request.method == reqwest::Method::GET {
                    request.method = reqwest::Method::POST;
                }
            }
            url if url.starts_with("http://") => request.url = url.to_owned(),
            other => panic!("curl option {other} is not understood by this test: {command}"),
        }
    }
    for stage in stages {
        match stage[0].as_str() {
            "grep" => request.greps.push(stage[1].clone()),
            // Which series comes first is not fixed; the shown one must be among the grep's.
            "head" => {}
            other => panic!("pipeline stage {other} is not understood by this test: {command}"),
        }
    }
    request
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The job ids a text mentions.
fn uuids(text: &str) -> Vec<&str> {
    (0..text.len().saturating_sub(35))
        .filter(|&i| text.is_char_boundary(i) && text.is_char_boundary(i + 36))
        .map(|i| &text[i..i + 36])
        .filter(|s| is_uuid(s))
        .collect()
}

/// A `"key":value` shown in an example's output; `None` for an object, array or `…`.
type Shown = (String, Option<Value>);

/// The keys and scalar values of a shown JSON body that elides parts with `…`.
fn shown_pairs(text: &str) -> Vec<Shown> {
    fn string_at(text: &str, start: usize) -> (String, usize) {
        let end = start + 1 + text[start + 1..].find('"').expect("a closing quote");
        (text[start + 1..end].to_owned(), end + 1)
    }
    let mut pairs = Vec::new();
    let mut i = 0;
    while let Some(offset) = text[i..].find('"') {
        let (word, after) = string_at(text, i + offset);
        i = after;
        if !text[i..].starts_with(':') {
            continue;
        }
        i += 1;
        let rest = &text[i..];
        let value = if rest.starts_with('"') {
            let (value, after) = string_at(text, i);
            i = after;
            Some(Value::String(value))
        } else {
            let end = rest.find([',', '}', ']']).unwrap_or(rest.len());
            serde_json::from_str(&rest[..end]).ok()
        };
        pairs.push((word, value));
    }
    pairs
}

/// Every value stored under `key` anywhere in `value`.
fn values_of<'v>(value: &'v Value, key: &str, found: &mut Vec<&'v Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == key {
                    found.push(v);
                }
                values_of(v, key, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| values_of(v, key, found)),
        _ => {}
    }
}

/// Checks a response body against the shown one: every key shown exists; shown booleans,
/// numbers (but not durations, which vary) and digit-free strings (a `…` ends a prefix)
/// are there under that key. A shown job id is learned the first time and must match
/// afterwards; other strings with digits (times, cursors) are not compared.
fn check_body(shown: &str, body: &Value, ids: &mut HashMap<String, String>) -> Result<(), String> {
    for (key, value) in shown_pairs(shown) {
        let mut found = Vec::new();
        values_of(body, &key, &mut found);
        if found.is_empty() {
            return Err(format!("no \"{key}\" in {body}"));
        }
        let matches = |want: &dyn Fn(&Value) -> bool| found.iter().any(|v| want(v));
        let ok = match &value {
            None => true,
            Some(Value::Number(_)) if key.ends_with("_ms") || key.ends_with("_seconds") => true,
            Some(Value::String(s)) if is_uuid(s) => match ids.get(s) {
                Some(real) => matches(&|v| v == real.as_str()),
                None => {
                    let real = found[0].as_str().ok_or(format!("\"{key}\" is no string"))?;
                    ids.insert(s.clone(), real.to_owned());
                    true
                }
            },
            Some(Value::String(s)) if s.contains(|c: char| c.is_ascii_digit()) => true,
            Some(Value::String(s)) => match s.split_once('…') {
                Some((prefix, _)) => {
                    matches(&|v| v.as_str().is_some_and(|v| v.starts_with(prefix)))
                }
                None => matches(&|v| v == s.as_str()),
            },
            Some(scalar) => matches(&|v| v == scalar),
        };
        if !ok {
            return Err(format!("\"{key}\":{value:?} not in {body}"));
        }
    }
    Ok(())
}

/// `text` with each job id the document shows replaced by the real one it stands for.
fn with_real_ids(text: &str, ids: &HashMap<String, String>) -> String {
    ids.iter().fold(text.to_owned(), |text, (shown, real)| {
        text.replace(shown, real)
    })
}

/// Runs one example against the gateway and checks its output.
async fn check_example(
    app: &common::TestApp,
    example: &Example,
    ids: &mut HashMap<String, String>,
) -> Result<(), String> {
    let command = with_real_ids(
        &example.command.replace("http://127.0.0.1:8080", &app.base),
        ids,
    );
    let request = request(&command);
    let mut builder = app.http.request(request.method.clone(), &request.url);
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    if let Some(body) = &request.body {
        builder = builder.body(body.clone());
    }
    let response = builder.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.map_err(|e| e.to_string())?;

    let mut output = example.output.iter().map(String::as_str);
    if !request.greps.is_empty() {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| request.greps.iter().all(|g| l.contains(g.as_str())))
            .collect();
        for shown in output {
            let (series, _count) = shown.rsplit_once(' ').unwrap();
            if !lines
                .iter()
                .any(|l| l.rsplit_once(' ').unwrap().0 == series)
            {
                return Err(format!("no series {series} among {lines:?}"));
            }
        }
        return Ok(());
    }
    let mut shown_headers = Vec::new();
    if request.include_headers {
        let status_line = output.next().unwrap();
        let code: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        if status.as_u16() != code {
            return Err(format!(
                "status {status}, the document shows {status_line}: {text}"
            ));
        }
        shown_headers = output.by_ref().take_while(|l| !l.is_empty()).collect();
    } else if !status.is_success() {
        return Err(format!("status {status}: {text}"));
    }
    let body: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    check_body(&output.collect::<Vec<_>>().join(""), &body, ids)?;
    for line in shown_headers.into_iter().filter(|l| *l != "…") {
        let (name, shown) = line.split_once(": ").unwrap();
        let want = with_real_ids(shown, ids);
        let got = headers.get(name).and_then(|v| v.to_str().ok());
        if got != Some(want.as_str()) {
            return Err(format!("header {name}: {got:?}, the document shows {want}"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_readme_requests_answer_what_the_readme_shows() {
    answers_what_it_shows("README.md").await;
}

#[tokio::test]
async fn the_api_tour_requests_answer_what_the_tour_shows() {
    answers_what_it_shows("docs/api-tour.md").await;
}

#[tokio::test]
async fn the_operations_requests_answer_what_the_guide_shows() {
    answers_what_it_shows("docs/operations.md").await;
}

/// A document's requests, run in order against a gateway of its own, answer what the
/// document shows. A job id first seen in a request (a job the text only mentions) is made
/// for it: a job enqueued and fetched. The commands are typed seconds apart by a reader, so
/// a job they name is given time to leave its retry backoff, and a read is retried while
/// events are still on their way.
async fn answers_what_it_shows(path: &str) {
    let nats = common::NatsServer::start();
    let app = common::spawn_app(&nats.url).await;
    let mut ids: HashMap<String, String> = HashMap::new();
    for example in console_examples(path) {
        for shown in uuids(&example.command) {
            if !ids.contains_key(shown) {
                let id = app
                    .enqueue(json!({"type": "readme.mentioned", "args": [], "queue": "readme"}))
                    .await;
                assert_eq!(
                    common::job_ids(&Value::Array(app.fetch(&["readme"], "w1").await)),
                    [id.as_str()]
                );
                ids.insert(shown.to_owned(), id);
            }
            let id = ids[shown].clone();
            common::eventually(
                Duration::from_secs(10),
                "the job out of its backoff",
                || {
                    let app = &app;
                    let id = id.clone();
                    async move {
                        // A workflow's id is no job's: nothing to wait for.
                        let r = app.get(&format!("/ojs/v1/jobs/{id}")).await;
                        let state = r.body["job"]["state"].clone();
                        (r.status == 404 || (state != "retryable" && state != "scheduled"))
                            .then_some(())
                    }
                },
            )
            .await;
        }
        let read_only = request(&example.command).method == reqwest::Method::GET;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match check_example(&app, &example, &mut ids).await {
                Ok(()) => break,
                Err(_) if read_only && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{path} example `{}`: {e}", example.command),
            }
        }
    }
    app.stop().await;
}
