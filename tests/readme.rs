//! The README's module tree stays true: every source file is listed under its folder, and
//! every file listed exists.

use std::collections::BTreeSet;
use std::path::Path;

/// The README's tree of `src/`: the code block that starts with `src/`.
fn readme_tree() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let start = readme
        .find("```\nsrc/\n")
        .expect("a module tree in the README");
    let body = &readme[start + 4..];
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
fn the_readme_lists_every_source_file_and_nothing_else() {
    let tree = readme_tree();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
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
                let file = file.unwrap().file_name().to_string_lossy().into_owned();
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
    assert!(missing.is_empty(), "not in the README's tree: {missing:?}");
    let stale: Vec<&str> = tree
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .filter(|w| w.ends_with(".rs") && !files.contains(*w))
        .collect();
    assert!(stale.is_empty(), "listed but not in src/: {stale:?}");
}
