//! The layering docs/ARCHITECTURE.md describes ("What each module may
//! import"), checked on the source: every `crate::X` path in a module's
//! non-test code names a module of a layer it may import, so the crate's
//! top-level modules have no import cycle. A reviewer's check, made on every
//! test run instead of by eye.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may import. The table in
/// docs/ARCHITECTURE.md, as data: a change to one is a change to both.
const LAYERS: &[(&str, &[&str])] = &[
    ("abi", &[]),
    ("error", &[]),
    ("hist", &["abi"]),
    ("host", &["abi", "error"]),
    ("records", &["abi", "error", "hist", "host"]),
    ("output", &["abi", "error", "hist", "host", "records"]),
    ("enrich", &["abi", "error", "hist", "host", "records"]),
    (
        "probes",
        &[
            "abi", "error", "hist", "host", "records", "output", "enrich",
        ],
    ),
    (
        "sqlserver",
        &[
            "abi", "error", "hist", "host", "records", "output", "enrich", "probes",
        ],
    ),
    (
        "block",
        &[
            "abi", "error", "hist", "host", "records", "output", "enrich", "probes",
        ],
    ),
    (
        "tcp",
        &[
            "abi", "error", "hist", "host", "records", "output", "enrich", "probes",
        ],
    ),
    (
        "netdev",
        &[
            "abi", "error", "hist", "host", "records", "output", "enrich", "probes",
        ],
    ),
    (
        "stall",
        &["abi", "error", "hist", "host", "records", "output"],
    ),
    (
        "metrics",
        &["abi", "error", "hist", "host", "records", "output"],
    ),
    ("report", &["abi", "error", "hist", "host", "records"]),
];

/// The commands wire the stages together: they may import anything, and
/// nothing but another command imports them.
const COMMANDS: &[&str] = &["cli", "run", "check", "investigate"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Test code may reach anywhere (fixtures build records of every family).
fn is_test_file(relative: &Path) -> bool {
    let name = relative.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with("_tests.rs")
        || name == "tests.rs"
        || name == "fixtures.rs"
        || relative
            .components()
            .any(|c| c.as_os_str() == "schema_check")
}

/// The code before the file's `#[cfg(test)]` module, if it has one.
fn product_code(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |at| &text[..at])
}

/// Top-level module -> (module it imports -> the first file that does).
fn imports() -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut out: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&root).expect("under src").to_path_buf();
        if is_test_file(&relative) {
            continue;
        }
        let first = relative.components().next().expect("a path");
        let module = first
            .as_os_str()
            .to_str()
            .expect("UTF-8 name")
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        let code = product_code(&text);
        for (at, _) in code.match_indices("crate::") {
            let name: String = code[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                out.entry(module.clone())
                    .or_default()
                    .entry(name)
                    .or_insert_with(|| relative.clone());
            }
        }
    }
    out
}

#[test]
fn every_module_imports_only_what_its_layer_may() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = LAYERS
        .iter()
        .map(|(m, may)| (*m, may.iter().copied().collect()))
        .collect();
    let mut broken = Vec::new();
    for (module, imported) in imports() {
        if COMMANDS.contains(&module.as_str()) {
            continue;
        }
        let Some(may) = allowed.get(module.as_str()) else {
            broken.push(format!(
                "{module}: not in LAYERS (tests/architecture.rs) nor in docs/ARCHITECTURE.md's table"
            ));
            continue;
        };
        for (target, file) in imported {
            if !may.contains(target.as_str()) {
                broken.push(format!("{module} imports {target} ({})", file.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports across layers:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_modules_have_no_import_cycle() {
    let graph = imports();
    // Depth-first search for a back edge, over the modules as they are (not the table).
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeMap<String, PathBuf>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if !done.insert(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(cycle) = visit(module, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_table_names_every_module_of_the_crate() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let listed: BTreeSet<&str> = LAYERS
        .iter()
        .map(|(m, _)| *m)
        .chain(COMMANDS.iter().copied())
        .collect();
    assert_eq!(
        declared, listed,
        "lib.rs's modules and LAYERS + COMMANDS differ"
    );
}
