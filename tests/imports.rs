//! The shape of `src/`: imports point one way and the outside crates stay in their rooms.
//! - No import cycle between source files: each file can be read knowing only the files it
//!   imports, never one that imports it back.
//! - `http/` is the only importer of axum, `store/` the only importer of async_nats: the
//!   domain, the coordinator and the wiring do not depend on the web framework or on NATS.
//!
//! A file imports the module files its `use` items and the `crate::`, `super::`, `self::`
//! and child-module paths in its code name (each resolved to the deepest module that is a
//! file); declaring a child with `mod`, or naming a module in a visibility
//! (`pub(in crate::store)`), is not an import. Comments and a trailing
//! `#[cfg(test)] mod tests` are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file: its crate, its module path (`store::jobs`; empty for a crate root) and
/// its code.
struct Module {
    file: String,
    krate: &'static str,
    path: Vec<String>,
    code: String,
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn modules() -> Vec<Module> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files
        .into_iter()
        .filter_map(|file| {
            let rel = file
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let mut path: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(String::from)
                .collect();
            // The command line (`main.rs`, `cli/`) is the binary crate; the rest the library.
            let krate = if path[0] == "main" || path[0] == "cli" {
                "bin"
            } else {
                "lib"
            };
            let last = path.pop().unwrap();
            if !matches!(last.as_str(), "mod" | "lib" | "main") {
                path.push(last);
            }
            let code = without_comments_and_tests(&std::fs::read_to_string(&file).ok()?);
            Some(Module {
                file: format!("src/{rel}"),
                krate,
                path,
                code,
            })
        })
        .collect()
}

fn without_comments_and_tests(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    code.lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a `use` tree names, expanded: `a::{b, c::{d, e}}` gives `a::b`, `a::c::d`,
/// `a::c::e`.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        if let Some(item) = tree.split_whitespace().next() {
            out.push(format!("{prefix}{item}"));
        }
        return;
    };
    let head = format!("{prefix}{}", tree[..open].trim());
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&inner[start..i], &head, out);
                start = i + 1;
            }
            _ => {}
        }
    }
    expand(&inner[start..], &head, out);
}

/// The paths a file names: its `use` items expanded, and the `crate::`, `super::`,
/// `self::` and `child::` paths written in its code (`children`: its child modules).
fn named_paths(code: &str, children: &[String]) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    let mut other_code = String::new();
    while let Some(at) = use_item(rest) {
        other_code.push_str(&rest[..at]);
        let item = &rest[at + 4..];
        let end = item.find(';').unwrap_or(item.len());
        let tree = item[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        expand(&tree, "", &mut paths);
        rest = &item[end..];
    }
    other_code.push_str(rest);
    // A visibility such as `pub(in crate::store)` names a module without importing it.
    while let Some(at) = other_code.find("pub(in ") {
        let end = at + other_code[at..].find(')').unwrap_or(other_code.len() - at);
        other_code.replace_range(at..end, "pub(");
    }
    let roots = ["crate", "super", "self"]
        .into_iter()
        .chain(children.iter().map(String::as_str));
    for root in roots.map(|r| format!("{r}::")) {
        let mut rest = other_code.as_str();
        while let Some(at) = find_word(rest, &root) {
            let path: String = rest[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            paths.push(path.trim_end_matches(':').to_owned());
            rest = &rest[at + root.len()..];
        }
    }
    paths
}

/// Where the next `use` item starts: `use` first on its line but for a visibility.
fn use_item(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = find_word(&text[from..], "use ") {
        let at = from + at;
        let line = text[..at].rsplit('\n').next().unwrap().trim();
        if matches!(line, "" | "pub" | "pub(crate)" | "pub(super)") {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// Where `word` starts in `text` not as the tail of a longer name.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = text[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The source file a path leads to, from module `from`: the deepest module of the path
/// that is a file of the same crate; `None` for another crate.
fn resolve(
    path: &str,
    from: &Module,
    files: &BTreeMap<(&str, Vec<String>), String>,
) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = match parts[0] {
        "crate" => {
            parts.remove(0);
            Vec::new()
        }
        "self" | "super" => {
            let mut base = from.path.clone();
            if parts[0] == "self" {
                parts.remove(0);
            }
            while parts.first() == Some(&"super") {
                parts.remove(0);
                base.pop();
            }
            base
        }
        // A relative path starts with a child module, or names another crate.
        child => {
            let mut base = from.path.clone();
            base.push(child.to_owned());
            if !files.contains_key(&(from.krate, base)) {
                return None;
            }
            from.path.clone()
        }
    };
    let mut found = files.get(&(from.krate, base.clone())).cloned();
    for part in parts {
        base.push(part.to_owned());
        match files.get(&(from.krate, base.clone())) {
            Some(file) => found = Some(file.clone()),
            None => break,
        }
    }
    found
}

fn import_graph(modules: &[Module]) -> BTreeMap<String, BTreeSet<String>> {
    let files: BTreeMap<(&str, Vec<String>), String> = modules
        .iter()
        .map(|m| ((m.krate, m.path.clone()), m.file.clone()))
        .collect();
    modules
        .iter()
        .map(|m| {
            let children: Vec<String> = modules
                .iter()
                .filter(|c| c.krate == m.krate && c.path.len() == m.path.len() + 1)
                .filter(|c| c.path.starts_with(&m.path))
                .map(|c| c.path.last().unwrap().clone())
                .collect();
            let imports = named_paths(&m.code, &children)
                .iter()
                .filter_map(|p| resolve(p, m, &files))
                .filter(|f| *f != m.file)
                .collect();
            (m.file.clone(), imports)
        })
        .collect()
}

/// The sets of files that reach each other through imports (Tarjan's algorithm), larger
/// than one file.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for u in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(u.as_str()) {
                visit(w, u);
                let low = w.low[v].min(w.low[u.as_str()]);
                w.low.insert(v, low);
            } else if w.stack.contains(&u.as_str()) {
                let low = w.low[v].min(w.index[u.as_str()]);
                w.low.insert(v, low);
            }
        }
        if w.low[v] == w.index[v] {
            let at = w.stack.iter().rposition(|x| *x == v).unwrap();
            let set: Vec<String> = w.stack.drain(at..).map(String::from).collect();
            if set.len() > 1 {
                w.found.push(set);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            visit(&mut walk, v);
        }
    }
    walk.found
}

#[test]
fn no_source_file_imports_one_that_imports_it_back() {
    let graph = import_graph(&modules());
    let found: Vec<String> = cycles(&graph)
        .into_iter()
        .map(|set| {
            let edges: Vec<String> = set
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| set.contains(b))
                        .map(move |b| format!("  {a} -> {b}"))
                })
                .collect();
            format!("{} files in a circle:\n{}", set.len(), edges.join("\n"))
        })
        .collect();
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn the_import_check_sees_use_trees_relative_paths_and_inline_paths() {
    let m = |file: &str, path: &[&str], code: &str| Module {
        file: file.into(),
        krate: "lib",
        path: path.iter().map(|s| s.to_string()).collect(),
        code: without_comments_and_tests(code),
    };
    let graph = import_graph(&[
        m("src/lib.rs", &[], "pub mod a;\npub mod b;\nfn f() { a::go() }"),
        m("src/a/mod.rs", &["a"], "mod x;\npub use x::Thing;"),
        m("src/a/x.rs", &["a", "x"], "use crate::{a::y, b::{self, Other}};\n// crate::a::y in a comment\nfn f() { super::y::g() }"),
        m("src/a/y.rs", &["a", "y"], "fn g() { crate::a::x::h() }\n#[cfg(test)]\nmod tests { use crate::b; }"),
        m("src/b.rs", &["b"], "use super::a::x as z;\npub(in crate::a) fn k() {}"),
    ]);
    let of = |f: &str| graph[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(of("src/lib.rs"), ["src/a/mod.rs"]);
    assert_eq!(of("src/a/mod.rs"), ["src/a/x.rs"]);
    assert_eq!(of("src/a/x.rs"), ["src/a/y.rs", "src/b.rs"]);
    assert_eq!(of("src/a/y.rs"), ["src/a/x.rs"]);
    assert_eq!(of("src/b.rs"), ["src/a/x.rs"]);
    let found = cycles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3, "{found:?}");
}

#[test]
fn only_http_imports_axum_and_only_store_imports_async_nats() {
    let mut misplaced = Vec::new();
    for m in modules() {
        for (krate, room) in [("axum", "src/http/"), ("async_nats", "src/store/")] {
            if find_word(&m.code, &format!("{krate}::")).is_some() && !m.file.starts_with(room) {
                misplaced.push(format!("{} uses {krate} (only {room} may)", m.file));
            }
        }
    }
    assert!(misplaced.is_empty(), "{}", misplaced.join("\n"));
}
