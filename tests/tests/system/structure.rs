//! The shape of the code, held as the tidy pass left it: no product file
//! over [`MAX_FILE_LINES`] lines outside its tests, no function over
//! [`MAX_FN_LINES`] lines, and no import circle between the files of a
//! crate. `cargo test -p skyport-tests --test system structure` prints what
//! breaks a rule, with the file, the function or the circle.
//!
//! Read from the text, as rustfmt leaves it: a file's tests are its
//! `#[cfg(test)] mod tests { … }` (or a `tests.rs` beside it, not counted);
//! a function runs from its `fn` line to the `}` at the same indentation;
//! a file imports the modules its `crate::`, `super::` and `self::` paths
//! name outside comments. A module may use what its ancestors hold (a folder's `mod.rs`
//! shares its toolkit with the files under it), so a path up to an
//! ancestor is no arrow; every other arrow counts, and a circle of them
//! fails.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use skyport_tests::workspace;

/// The most lines a product file may have outside its tests.
const MAX_FILE_LINES: usize = 600;
/// The most lines one function may have, its signature and closing brace included.
const MAX_FN_LINES: usize = 150;

/// The crates' sources: each folder is one crate's module tree, its root
/// `lib.rs` or `main.rs`.
const CRATES: [&str; 11] = [
    "src",
    "api/src",
    "worker/src",
    "callbacks/src",
    "shared/core/src",
    "shared/runtime/src",
    "shared/embedded/src",
    "shared/azure/src",
    "shared/kafka/src",
    "shared/simulator/src",
    "benches/skyport",
];

/// A source file of a crate and the module it is.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    /// The text before its tests module.
    product: String,
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// Whether `path` holds only tests: a `tests.rs` beside its module, or a
/// file under a `tests` folder.
fn is_tests(relative: &Path) -> bool {
    relative.file_name().is_some_and(|name| name == "tests.rs")
        || relative.components().any(|c| c.as_os_str() == "tests")
}

/// The module a file is: `a/b.rs` and `a/b/mod.rs` are `a::b`; the root
/// (`lib.rs`, `main.rs`) is the crate.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return Vec::new();
    }
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    parts
}

/// The text of `text` before its inline tests module.
fn product_part(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_end() != "#[cfg(test)]" {
            continue;
        }
        let next = lines[i + 1..]
            .iter()
            .find(|l| !l.trim_start().starts_with("#["));
        if next.is_some_and(|l| {
            let l = l
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            l.starts_with("mod tests {")
        }) {
            return lines[..i].join("\n");
        }
    }
    text.to_owned()
}

fn sources(crate_dir: &str) -> Vec<Source> {
    let root = workspace().join(crate_dir);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files
        .into_iter()
        .filter_map(|path| {
            let relative = path.strip_prefix(&root).unwrap().to_path_buf();
            if is_tests(&relative) {
                return None;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            Some(Source {
                module: module_of(&relative),
                product: product_part(&text),
                path,
            })
        })
        .collect()
}

/// The functions of `text` longer than [`MAX_FN_LINES`]: (name, first line, lines).
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let before = &trimmed[..at];
        let qualifiers = before
            .split_whitespace()
            .all(|word| word.starts_with("pub") || ["async", "const", "unsafe"].contains(&word));
        if !qualifiers || trimmed.starts_with("//") {
            continue;
        }
        let name: String = trimmed[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let closing = format!("{}}}", " ".repeat(indent));
        // A declaration without a body ends with `;` before any `{`.
        let mut body = None;
        for (j, rest) in lines.iter().enumerate().skip(i) {
            if body.is_none() {
                if rest.trim_end().ends_with(';') && !rest.contains('{') {
                    break;
                }
                if rest.trim_end().ends_with('{') || rest.contains("{ ") {
                    body = Some(j);
                }
                if rest.trim_end().ends_with('}') && rest.contains('{') {
                    break;
                }
            } else if rest.trim_end() == closing {
                let length = j - i + 1;
                if length > MAX_FN_LINES {
                    long.push((name.clone(), i + 1, length));
                }
                break;
            }
        }
    }
    long
}

/// The modules a file's paths name (`crate::a::b`, `super::c`, `self::d`,
/// and the names inside `use …::{…}` groups), resolved against `known`.
fn imports(source: &Source, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    // Code only: a doc link names a module without importing it.
    let text = &source
        .product
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let mut path = text[at..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .filter(|part| !part.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>();
            let mut base: Vec<String> = match path.first().map(String::as_str) {
                Some("crate") => Vec::new(),
                _ => source.module.clone(),
            };
            // `super` is the parent of the file's module, whether the file
            // is `a/b.rs` or `a/b/mod.rs`.
            path.remove(0);
            while path.first().is_some_and(|p| p == "super") {
                path.remove(0);
                base.pop();
            }
            if path.first().is_some_and(|p| p == "self") {
                path.remove(0);
            }
            let mut full = base;
            let mut target = None;
            for part in &path {
                full.push(part.clone());
                if known.contains(&full) {
                    target = Some(full.clone());
                }
            }
            // A group (`use super::{a, b::C}`) names modules inside the braces.
            let after = &text[at..];
            if let Some(open) = after.find('{')
                && after[..open].ends_with("::")
                && !after[..open].contains(';')
            {
                let group =
                    &after[open + 1..after[open..].find('}').map_or(open + 1, |c| open + c)];
                let prefix = target.clone().unwrap_or_else(|| full.clone());
                for name in group.split(',') {
                    let first = name
                        .trim()
                        .split("::")
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    let mut member = prefix.clone();
                    member.push(first);
                    if known.contains(&member) {
                        found.insert(member);
                    }
                }
            }
            if let Some(target) = target {
                found.insert(target);
            }
        }
    }
    found
}

/// The circles among `edges`, each once, as the files it passes.
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // Tarjan's strongly connected components (the graphs are small enough to recurse).
    struct Search<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a Vec<String>) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flatten() {
                let Some((next, _)) = self.edges.get_key_value(next) else {
                    continue;
                };
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.clone());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

#[test]
fn no_product_file_is_too_long_no_function_either_and_no_imports_go_round() {
    let mut problems = Vec::new();
    for crate_dir in CRATES {
        let sources = sources(crate_dir);
        let known: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module.clone()).collect();
        let mut edges = BTreeMap::new();
        for source in &sources {
            let shown = source
                .path
                .strip_prefix(workspace())
                .unwrap()
                .display()
                .to_string();
            let lines = source.product.lines().count();
            if lines > MAX_FILE_LINES {
                problems.push(format!(
                    "{shown}: {lines} lines outside its tests (at most {MAX_FILE_LINES})"
                ));
            }
            for (name, line, length) in long_functions(&source.product) {
                problems.push(format!(
                    "{shown}:{line}: fn {name} is {length} lines (at most {MAX_FN_LINES})"
                ));
            }
            let arrows: BTreeSet<Vec<String>> = imports(source, &known)
                .into_iter()
                .filter(|target| *target != source.module && !source.module.starts_with(target))
                .collect();
            edges.insert(source.module.clone(), arrows);
        }
        for circle in circles(&edges) {
            let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
            problems.push(format!(
                "{crate_dir}: these modules import each other in a circle: {}",
                names.join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_structure_check_sees_a_long_function_and_a_circle() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let text = format!("pub(crate) async fn long() {{\n{body}}}\n\nfn short() {{}}\n");
    let long = long_functions(&text);
    assert_eq!(long.len(), 1, "{long:?}");
    assert_eq!(long[0].0, "long");
    let module = |name: &str| vec![name.to_owned()];
    let edges = BTreeMap::from([
        (module("a"), BTreeSet::from([module("b")])),
        (module("b"), BTreeSet::from([module("c")])),
        (module("c"), BTreeSet::from([module("a")])),
        (module("d"), BTreeSet::from([module("a")])),
    ]);
    assert_eq!(
        circles(&edges),
        vec![vec![module("a"), module("b"), module("c")]]
    );
    let known = BTreeSet::from([vec![], module("a"), vec!["a".into(), "b".into()]]);
    let source = Source {
        path: PathBuf::from("a/c.rs"),
        module: vec!["a".into(), "c".into()],
        product: "use super::b::Thing;\nuse crate::a::{self, b};\n".into(),
    };
    assert_eq!(
        imports(&source, &known),
        BTreeSet::from([module("a"), vec!["a".into(), "b".into()]])
    );
}
