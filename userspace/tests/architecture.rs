//! The layering docs/ARCHITECTURE.md describes ("What each module may
//! import"), checked on the source: every `crate::X` path in a module's
//! non-test code names a module of a layer it may import, so the crate's
//! top-level modules have no import cycle; the doc's table and this file's
//! say the same; and inside every module of every crate of the workspace,
//! the files import each other without a cycle either. A reviewer's check,
//! made on every test run instead of by eye.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may import. The table in
/// docs/ARCHITECTURE.md, as data: a change to one is a change to both.
const LAYERS: &[(&str, &[&str])] = &[
    ("abi", &[]),
    ("error", &[]),
    ("hist", &["abi", "error"]),
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
        "stall",
        &["abi", "error", "hist", "host", "records", "output"],
    ),
    (
        "metrics",
        &["abi", "error", "hist", "host", "records", "output"],
    ),
    ("report", &["abi", "error", "hist", "host", "records"]),
];

/// What every probe family (lib.rs's `with_families!`, read through
/// `records::FAMILIES`) may import: not each other, SQL Server only through
/// `enrich::Tagger`.
const FAMILY_MAY: &[&str] = &[
    "abi", "error", "hist", "host", "records", "output", "enrich", "probes",
];

/// LAYERS with every registered family in its layer, between `probes` and `stall`.
fn layers() -> Vec<(&'static str, &'static [&'static str])> {
    let probes = LAYERS
        .iter()
        .position(|(m, _)| *m == "probes")
        .expect("probes in LAYERS");
    let mut all = LAYERS[..=probes].to_vec();
    all.extend(
        stalltrace::records::FAMILIES
            .iter()
            .map(|f| (*f, FAMILY_MAY)),
    );
    all.extend_from_slice(&LAYERS[probes + 1..]);
    all
}

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

/// The crate root's modules of test code only (`#[cfg(test)]` in lib.rs).
const TEST_MODULES: &[&str] = &["schema_check", "tds_check"];

/// Test code may reach anywhere (fixtures build records of every family).
fn is_test_file(relative: &Path) -> bool {
    let name = relative.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let top = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("")
        .trim_end_matches(".rs");
    name.ends_with("_tests.rs")
        || name == "tests.rs"
        || name == "fixtures.rs"
        || TEST_MODULES.contains(&top)
}

/// The code before the file's `#[cfg(test)]` module, if it has one.
fn product_code(text: &str) -> &str {
    // `mod tests {`, not a `mod tests;` declaration: the code after one is the file's.
    text.find("#[cfg(test)]\nmod tests {")
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
            // lib.rs declares the families' record modules (records/NAME.rs)
            // as `family_records`, which `records` re-exports: they are `records`.
            let name = if name == "family_records" {
                "records".to_string()
            } else {
                name
            };
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
    let allowed: BTreeMap<&str, BTreeSet<&str>> = layers()
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
    // Over the modules as they are (not the table).
    if let Some(cycle) = find_cycle(&imports()) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_table_names_every_module_of_the_crate() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let declared: BTreeSet<&str> = lib
        .lines()
        // Top-level declarations only: the families' record modules are `records`.
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let listed: BTreeSet<&str> = layers()
        .iter()
        .map(|(m, _)| *m)
        .chain(COMMANDS.iter().copied())
        .collect();
    assert_eq!(
        declared, listed,
        "lib.rs's modules and LAYERS + COMMANDS differ"
    );
}

/// Each module's allowance as docs/ARCHITECTURE.md's table states it: the
/// "may import" column up to its first `:` or `;` (the rest is prose), read
/// as layer numbers ("layer 1", "1–3"), modules named in backticks, "nothing
/// of the crate" or "anything".
fn documented_layers() -> BTreeMap<String, BTreeSet<String>> {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/ARCHITECTURE.md");
    let rows: Vec<(u32, Vec<String>, String)> = doc
        .lines()
        .skip_while(|l| !l.starts_with("| layer | modules | may import |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let layer = cells[1].parse().expect("a layer number");
            let may = cells[3].split([':', ';']).next().unwrap_or("").to_string();
            // Other names in backticks there are prose (`enrich` (the `Tagger`
            // trait)); the families' row names where they are registered.
            let modules = if cells[2].contains("`with_families!`") {
                stalltrace::records::FAMILIES
                    .iter()
                    .map(|f| f.to_string())
                    .collect()
            } else {
                backticked(cells[2])
                    .into_iter()
                    .filter(|m| {
                        LAYERS.iter().any(|(l, _)| l == m) || COMMANDS.contains(&m.as_str())
                    })
                    .collect()
            };
            (layer, modules, may)
        })
        .collect();
    assert!(!rows.is_empty(), "no layer table in {}", doc_path.display());
    let in_layers = |lo: u32, hi: u32| -> BTreeSet<String> {
        rows.iter()
            .filter(|(l, _, _)| (lo..=hi).contains(l))
            .flat_map(|(_, modules, _)| modules.iter().cloned())
            .collect()
    };
    let mut out = BTreeMap::new();
    for (_, modules, may) in &rows {
        let mut allowed: BTreeSet<String> = backticked(may).into_iter().collect();
        let numbers: Vec<u32> = may
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        match numbers.as_slice() {
            [] => {}
            [one] => allowed.extend(in_layers(*one, *one)),
            [lo, hi] => allowed.extend(in_layers(*lo, *hi)),
            _ => panic!("cannot read the allowance {may:?}"),
        }
        if may.starts_with("anything") {
            allowed.extend(in_layers(0, u32::MAX));
        }
        for module in modules {
            let mut own = allowed.clone();
            own.remove(module);
            out.insert(module.clone(), own);
        }
    }
    out
}

/// The names in backticks in a table cell.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_doc_states_the_same_table() {
    let documented = documented_layers();
    for (module, may) in layers() {
        let tested: BTreeSet<String> = may.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            documented.get(module),
            Some(&tested),
            "{module}: docs/ARCHITECTURE.md's table and LAYERS (tests/architecture.rs) differ"
        );
    }
}

/// Every crate of the workspace: its source directory.
const CRATES: &[&str] = &["userspace", "xtask", "lab", "sim"];

/// A file's module path under `src` (`report/model.rs` and
/// `report/model/mod.rs`: report::model; the crate root: empty); None for a
/// file of its own binary crate (`src/bin/`).
fn module_path(relative: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_str().expect("UTF-8 name").to_string())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
        parts.pop();
    }
    Some(parts)
}

/// The modules a file's non-test code names through `crate::`, `super::`
/// or `self::` paths, groups (`use super::{a::X, b}`) included, each
/// resolved to the longest prefix that is a module of the crate. Line
/// comments are left out; an inline `mod` block's paths are read as the
/// file's (the crates have none outside tests).
fn named_modules(
    code: &str,
    own: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let code: Vec<&str> = code
        .lines()
        .map(|l| l.find("//").map_or(l, |at| &l[..at]))
        .collect();
    let code = code.join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'));
        let path = &rest[at..];
        rest = &rest[at + 1..];
        if boundary {
            let base = if path.starts_with("crate::") {
                Vec::new()
            } else {
                own.to_vec()
            };
            resolve(base, path, modules, &mut out);
        }
    }
    out
}

/// Walks the path at the start of `text` from the module `base`, adding the
/// deepest module it names to `out`; a `{…}` group after it, item by item.
fn resolve(
    mut base: Vec<String>,
    text: &str,
    modules: &BTreeSet<Vec<String>>,
    out: &mut BTreeSet<Vec<String>>,
) {
    let path: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let mut found = None;
    let mut in_modules = true;
    for segment in path.split("::").filter(|s| !s.is_empty()) {
        match segment {
            "crate" | "self" => {}
            "super" => {
                base.pop();
            }
            name => {
                base.push(name.to_string());
                if !modules.contains(&base) {
                    in_modules = false;
                    break;
                }
                found = Some(base.clone());
            }
        }
    }
    out.extend(found);
    let Some(group) = text[path.len()..].strip_prefix('{') else {
        return;
    };
    if !in_modules || !path.ends_with("::") {
        return;
    }
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth > 0 => depth -= 1,
            '}' | ',' if depth == 0 => {
                resolve(base.clone(), group[start..i].trim_start(), modules, out);
                if c == '}' {
                    return;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
}

/// For each directory module of `crate_dir`'s crate, the edges between its
/// children (a file or a subdirectory each): child -> child it imports ->
/// the first file that does.
type FileGraph = BTreeMap<String, BTreeMap<String, PathBuf>>;

fn file_graphs(crate_dir: &str) -> BTreeMap<Vec<String>, FileGraph> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut sources = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&root).expect("under src").to_path_buf();
        if let Some(module) = module_path(&relative) {
            sources.push((relative, module));
        }
    }
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|(_, m)| m.clone()).collect();
    let mut graphs: BTreeMap<Vec<String>, FileGraph> = BTreeMap::new();
    for (relative, own) in &sources {
        if is_test_file(relative) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(relative)).expect("readable source");
        for target in named_modules(product_code(&text), own, &modules) {
            // The deepest module holding both: an edge between two of its children.
            let common = own.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= own.len() || common >= target.len() {
                continue; // a module and its own parent or child
            }
            graphs
                .entry(own[..common].to_vec())
                .or_default()
                .entry(own[common].clone())
                .or_default()
                .entry(target[common].clone())
                .or_insert_with(|| Path::new(crate_dir).join("src").join(relative));
        }
    }
    graphs
}

/// A cycle in `graph`, by depth-first search for a back edge.
fn find_cycle(graph: &BTreeMap<String, BTreeMap<String, PathBuf>>) -> Option<Vec<String>> {
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
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_has_an_import_cycle_between_its_files() {
    let mut broken = Vec::new();
    for crate_dir in CRATES {
        for (module, graph) in file_graphs(crate_dir) {
            if let Some(cycle) = find_cycle(&graph) {
                let files: Vec<String> = cycle
                    .windows(2)
                    .map(|w| format!("{}", graph[&w[0]][&w[1]].display()))
                    .collect();
                broken.push(format!(
                    "{crate_dir}: {}: {} (imported in {})",
                    if module.is_empty() {
                        "the crate root".into()
                    } else {
                        module.join("::")
                    },
                    cycle.join(" -> "),
                    files.join(", ")
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "import cycles between the files of a module:\n{}",
        broken.join("\n")
    );
}

/// The cycle check itself, on a graph with a cycle and one without.
#[test]
fn the_cycle_check_finds_a_cycle() {
    let edge = |pairs: &[(&str, &str)]| -> BTreeMap<String, BTreeMap<String, PathBuf>> {
        let mut g: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(a.to_string())
                .or_default()
                .insert(b.to_string(), PathBuf::from(a));
        }
        g
    };
    assert_eq!(
        find_cycle(&edge(&[
            ("model", "health"),
            ("health", "split"),
            ("split", "model")
        ])),
        Some(vec![
            "health".into(),
            "split".into(),
            "model".into(),
            "health".into()
        ])
    );
    assert_eq!(
        find_cycle(&edge(&[
            ("model", "health"),
            ("health", "lines"),
            ("model", "lines")
        ])),
        None
    );
    let modules: BTreeSet<Vec<String>> = [
        vec!["report".to_string()],
        vec!["report".into(), "model".into()],
        vec!["report".into(), "lines".into()],
    ]
    .into_iter()
    .collect();
    let own = vec!["report".to_string(), "model".to_string()];
    let named = |code: &str| -> Vec<Vec<String>> {
        named_modules(code, &own, &modules).into_iter().collect()
    };
    let path = |names: &[&str]| -> Vec<String> { names.iter().map(|n| n.to_string()).collect() };
    let (lines, model) = (path(&["report", "lines"]), path(&["report", "model"]));
    assert_eq!(
        named(
            "use super::lines::LineRef;\n// use super::health::X;\nlet x = crate::report::lines::MAX; // super::model\nsubsuper::model"
        ),
        vec![path(&["report", "lines"])]
    );
    // Groups, nested and over lines; `self` in a group is the group's module.
    assert_eq!(
        named("use super::{\n    lines::{self, LineRef},\n    model::{Report},\n};"),
        [lines.clone(), model.clone()]
    );
    assert_eq!(
        named("use crate::report::{lines, Report};"),
        [vec!["report".to_string()], lines]
    );
    assert_eq!(named("use super::super::report::model::X;"), [model]);
}
