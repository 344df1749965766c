//! The top-level modules import one another without cycles: the check that keeps it so. A cycle
//! is where a change in one place needs a change in another that needs one in the first, and
//! where "which module owns this rule" stops having an answer. Read from the source (each file's
//! `crate::x` and, in a top-level file, `super::x` paths), test code left out: a unit test may
//! use any part of the crate.
//!
//! A cycle fails the test with every edge in it and the files that make each edge, so the one to
//! cut is plain. The usual cuts: a helper both sides use goes down to the module that owns the
//! concept (durations to `domain::time`), and a command that drives several parts moves up to
//! `commands` rather than into the part it serves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The import graph: for each top-level module, the modules it uses and the files that do.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[test]
fn the_top_level_modules_import_one_another_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = import_graph(&src);
    assert!(graph.len() > 10, "the modules were not found: {graph:?}");
    let cycles: Vec<Vec<String>> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    let mut report = String::new();
    for cycle in &cycles {
        report.push_str(&format!("a cycle of {} modules:\n", cycle.len()));
        for from in cycle {
            for (to, files) in &graph[from] {
                if cycle.contains(to) {
                    let files: Vec<&str> = files.iter().map(String::as_str).collect();
                    report.push_str(&format!("  {from} -> {to}: {}\n", files.join(", ")));
                }
            }
        }
    }
    assert!(cycles.is_empty(), "{report}");
}

/// Only the store knows the database drivers: everything else (the API error, `domain/`, the
/// operations) meets a storage error as the driver-free `Error::Storage` that `store/fault.rs`
/// makes at the store's edge. Test code is left out.
#[test]
fn only_the_store_names_a_database_driver() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut named = Vec::new();
    for (file, code) in non_test_sources(&src) {
        let relative = file.strip_prefix(&src).unwrap();
        if relative.starts_with("store") || relative == Path::new("layering.rs") {
            continue;
        }
        for driver in ["sqlx::", "rusqlite::"] {
            if code.contains(driver) {
                named.push(format!("{} names {driver}", relative.display()));
            }
        }
    }
    assert!(named.is_empty(), "{named:#?}");
}

#[test]
fn a_cycle_is_found_and_test_code_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n");
    write("a.rs", "use crate::b::X;\n");
    write(
        "b/mod.rs",
        "pub mod inner;\n#[cfg(test)]\nmod testing;\n#[cfg(test)]\nmod tests {\n    use crate::c::Y;\n    fn f() { if true { } }\n}\n",
    );
    write(
        "b/inner.rs",
        "use crate::{\n    a::Z,\n    domain::W,\n};\n// crate::c in a comment\n",
    );
    write("b/testing.rs", "use crate::c::Y;\n");
    write("c.rs", "use super::a::Q;\n");
    let graph = import_graph(dir.path());
    let edges: Vec<(String, String)> = graph
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |to| (from.clone(), to.clone())))
        .collect();
    let expected = [("a", "b"), ("b", "a"), ("c", "a")];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(edges, expected);
    let cycles: Vec<Vec<String>> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(cycles, vec![vec!["a".to_string(), "b".to_string()]]);
}

/// The top-level modules `lib.rs` declares.
fn modules(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// Every source file below `src` that is not test code, with its comments and test modules
/// left out: `(path, code)`.
fn non_test_sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut test_only = BTreeSet::new();
    let mut sources = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let (code, test_modules) = without_test_code(&strip_comments(&text));
        for name in test_modules {
            let dir = if file
                .file_name()
                .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
            {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            test_only.insert(dir.join(format!("{name}.rs")));
            test_only.insert(dir.join(name).join("mod.rs"));
        }
        sources.push((file, code));
    }
    sources.retain(|(file, _)| !test_only.contains(file));
    sources
}

fn import_graph(src: &Path) -> Graph {
    let modules = modules(src);
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for (file, code) in non_test_sources(src) {
        let relative = file.strip_prefix(src).unwrap();
        let mut parts = relative.iter().map(|p| p.to_string_lossy().into_owned());
        let first = parts.next().unwrap();
        let top = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        if !modules.contains(&top) {
            continue;
        }
        let at_top = relative.components().count() == 1;
        for used in used_modules(&code, at_top) {
            if used != top && modules.contains(&used) {
                graph
                    .get_mut(&top)
                    .unwrap()
                    .entry(used)
                    .or_default()
                    .insert(relative.display().to_string());
            }
        }
    }
    graph
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with `//` comments (doc comments too) removed; string literals are kept whole, so
/// a `//` inside one (a URL) is not taken for a comment.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut cut = line.len();
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            if in_string {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
            } else if b == b'"' {
                in_string = true;
            } else if b == b'/' && bytes.get(i + 1) == Some(&b'/') {
                cut = i;
                break;
            }
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

/// The code with every `#[cfg(test)]` item taken out (a block to its closing brace, or a
/// statement to its semicolon), and the names of the modules declared test-only (`mod x;`).
fn without_test_code(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut test_modules = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let end = item
            .find(['{', ';'])
            .unwrap_or(item.len().saturating_sub(1));
        if item.as_bytes().get(end) == Some(&b';') {
            let head = item[..end].trim();
            if let Some(name) = head.rsplit("mod ").next().filter(|_| head.contains("mod ")) {
                test_modules.push(name.trim().to_owned());
            }
            rest = &item[end + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut close = item.len();
        for (i, c) in item.char_indices().skip_while(|(i, _)| *i < end) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[close..];
    }
    out.push_str(rest);
    (out, test_modules)
}

/// The top-level names `code` reaches: `crate::x`, the first names of `crate::{x, y::z}`, and,
/// in a file at the top (`at_top`), `super::x`.
fn used_modules(code: &str, at_top: bool) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut prefixes = vec!["crate::"];
    if at_top {
        prefixes.push("super::");
    }
    for prefix in prefixes {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let after = &code[at + prefix.len()..];
            if let Some(group) = after.strip_prefix('{') {
                for name in first_names(group) {
                    used.insert(name);
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    used.insert(name);
                }
            }
        }
    }
    used
}

/// The first name of each comma-separated path of a `{...}` group (given from after its `{`).
fn first_names(group: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    let mut taking = true;
    for c in group.chars() {
        match c {
            '{' => {
                depth += 1;
                taking = false;
            }
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                if !current.is_empty() {
                    names.push(std::mem::take(&mut current));
                }
                taking = true;
            }
            c if taking && (c.is_alphanumeric() || c == '_') => current.push(c),
            c if taking && c.is_whitespace() && current.is_empty() => {}
            _ => taking = false,
        }
    }
    if !current.is_empty() {
        names.push(current);
    }
    names
}

/// Tarjan's strongly connected components, each sorted: a component of more than one module is
/// a cycle.
fn components(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                self.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}
