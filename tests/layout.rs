//! The workspace's shape, checked so it cannot drift: every crate's `lib.rs` names each of its
//! modules in its **Layout** section, no crate's modules import each other in a circle, and the
//! root crate's product wiring never imports its dev tooling. Reads source files only; no
//! servers, well under a second.

// A test reads as one scenario from its set-up to its last check: the 70-line bound
// (too_many_lines) is for the code under test.
#![allow(clippy::too_many_lines)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every crate of the workspace, by the folder holding its `lib.rs`.
const CRATES: &[&str] = &[
    "protocol/src",
    "ledger/src",
    "node/src",
    "coordinator/src",
    "orders/src",
    "safeguards/src",
    "auth/src",
    "backing/src",
    "telemetry/src",
    "paysim/src",
    "web/src",
    "testkit/src",
    "nemesis/src",
    "src",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_crate_layout_section_names_each_of_its_modules() {
    let mut missing = Vec::new();
    for dir in CRATES {
        let lib = read(&root().join(dir).join("lib.rs"));
        let Some(layout) = layout_section(&lib) else {
            missing.push(format!("{dir}/lib.rs has no `//! **Layout.**` section"));
            continue;
        };
        for module in declared_modules(&lib) {
            if !mentions(&layout, &module) {
                missing.push(format!("{dir}/lib.rs: its Layout section does not name module `{module}`"));
            }
        }
    }
    assert!(missing.is_empty(), "layout sections out of date:\n{}", missing.join("\n"));
}

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let mut circles = Vec::new();
    for dir in CRATES {
        let graph = import_graph(&root().join(dir));
        if let Some(circle) = find_circle(&graph) {
            circles.push(format!("{dir}: {}", circle.join(" → ")));
        }
    }
    assert!(circles.is_empty(), "modules importing each other in a circle:\n{}", circles.join("\n"));
}

/// The module graph above merges a folder into one module; inside a folder (a `mod.rs` and
/// its files) the files may not import each other in a circle either.
#[test]
fn no_folder_has_an_import_circle_between_its_files() {
    let mut circles = Vec::new();
    for dir in CRATES {
        let src = root().join(dir);
        for (folder, graph) in folder_graphs(&src) {
            if let Some(circle) = find_circle(&graph) {
                let at = folder.strip_prefix(root()).unwrap_or(&folder).display().to_string();
                circles.push(format!("{at}: {}", circle.join(" → ")));
            }
        }
    }
    assert!(circles.is_empty(), "files of a folder importing each other in a circle:\n{}", circles.join("\n"));
}

/// For every folder with a `mod.rs` under `src`: which of its files (and subfolders) name which
/// others, through `super::` or the folder's `crate::` path.
fn folder_graphs(src: &Path) -> Vec<(PathBuf, BTreeMap<String, BTreeSet<String>>)> {
    let mut graphs = Vec::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let mut siblings = BTreeMap::new();
        for entry in std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("listing {}: {e}", folder.display())) {
            let path = entry.expect("directory entry").path();
            let name = path.file_stem().map(|stem| stem.to_string_lossy().to_string()).unwrap_or_default();
            if path.is_dir() {
                folders.push(path.clone());
                siblings.insert(name, rust_files(&path));
            } else if path.extension().is_some_and(|ext| ext == "rs") && name != "mod" {
                siblings.insert(name, vec![path]);
            }
        }
        if folder == src || !folder.join("mod.rs").is_file() {
            continue;
        }
        let path_in_crate = folder.strip_prefix(src).unwrap_or(&folder).to_string_lossy().replace('/', "::");
        let prefixes = ["super::".to_string(), format!("crate::{path_in_crate}::")];
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, files) in &siblings {
            for file in files {
                let code = without_tests_and_comments(&read(file));
                for prefix in &prefixes {
                    for (at, _) in code.match_indices(prefix.as_str()) {
                        let named: String = code[at + prefix.len()..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if &named != name && siblings.contains_key(&named) {
                            graph.entry(name.clone()).or_default().insert(named);
                        }
                    }
                }
            }
        }
        graphs.push((folder, graph));
    }
    graphs
}

#[test]
fn the_product_wiring_never_imports_the_dev_tooling() {
    let graph = import_graph(&root().join("src"));
    let offenders: Vec<&String> = graph
        .iter()
        .filter(|(from, to)| *from != "dev" && *from != "cli" && to.contains("dev"))
        .map(|(m, _)| m)
        .collect();
    assert!(offenders.is_empty(), "product modules importing src/dev: {offenders:?}");
    let into_cli: Vec<&String> = graph.iter().filter(|(_, to)| to.contains("cli")).map(|(m, _)| m).collect();
    assert!(into_cli.is_empty(), "modules importing the command line (it sits on top): {into_cli:?}");
}

/// The crates only the lab links (the `lab` feature): the server build, the one in every
/// image, must hold none of them.
const LAB_CRATES: [&str; 3] = ["testkit", "nemesis", "paysim"];

/// What `cargo tree -p seckill -e normal --no-default-features` would show, read from the
/// manifests: the root reaches a lab crate only through an optional dependency the `lab`
/// feature turns on, and no product crate it links depends on one at all.
#[test]
fn the_server_build_links_no_lab_crate() {
    let manifest = |dir: &str| -> toml::Table {
        toml::from_str(&read(&root().join(dir).join("Cargo.toml"))).expect("a manifest that parses")
    };
    let dependencies = |table: &toml::Table| -> toml::Table {
        table.get("dependencies").and_then(toml::Value::as_table).cloned().unwrap_or_default()
    };
    let root_manifest = manifest(".");
    let lab: Vec<&str> = root_manifest["features"]["lab"]
        .as_array()
        .expect("a `lab` feature")
        .iter()
        .filter_map(toml::Value::as_str)
        .collect();
    let mut problems = Vec::new();
    let mut linked = Vec::new();
    for (name, spec) in dependencies(&root_manifest) {
        let optional = spec.get("optional").and_then(toml::Value::as_bool) == Some(true);
        if LAB_CRATES.contains(&name.as_str()) && !(optional && lab.contains(&format!("dep:{name}").as_str())) {
            problems.push(format!("the root depends on {name} outside the `lab` feature"));
        }
        if !optional && root().join(&name).join("Cargo.toml").is_file() {
            linked.push(name);
        }
    }
    // The product crates the server links, and theirs in turn.
    while let Some(name) = linked.pop() {
        for (dependency, _) in dependencies(&manifest(&name)) {
            if LAB_CRATES.contains(&dependency.as_str()) {
                problems.push(format!("{name} (linked by the server build) depends on {dependency}"));
            } else if root().join(&dependency).join("Cargo.toml").is_file() && !linked.contains(&dependency) {
                linked.push(dependency);
            }
        }
    }
    assert!(problems.is_empty(), "the server build would link the lab:\n{}", problems.join("\n"));
}

#[test]
fn architecture_md_stays_a_ten_minute_read_that_names_every_ledger_script() {
    let map = read(&root().join("ARCHITECTURE.md"));
    let words = map.split_whitespace().count();
    assert!(words <= 2_500, "ARCHITECTURE.md has {words} words: a ten-minute map stays within 2,500");
    let mut unnamed = Vec::new();
    for entry in std::fs::read_dir(root().join("ledger/src/lua")).expect("ledger/src/lua") {
        let path = entry.expect("directory entry").path();
        let script = path.file_stem().map(|stem| stem.to_string_lossy().to_string()).unwrap_or_default();
        if !map.contains(&format!("`{script}`")) {
            unnamed.push(script);
        }
    }
    assert!(unnamed.is_empty(), "ARCHITECTURE.md does not name the ledger's scripts {unnamed:?}");
}

/// One wall clock (`protocol::clock`): a product crate reading the system clock itself is how
/// five helpers and two `Clock` traits grew before.
#[test]
fn only_protocol_reads_the_wall_clock_in_the_product_crates() {
    let mut readers = Vec::new();
    for dir in ["ledger/src", "node/src", "coordinator/src", "orders/src", "safeguards/src", "auth/src", "paysim/src"] {
        for file in rust_files(&root().join(dir)) {
            if without_tests_and_comments(&read(&file)).contains("UNIX_EPOCH") {
                readers.push(file.strip_prefix(root()).unwrap_or(&file).display().to_string());
            }
        }
    }
    assert!(readers.is_empty(), "read the time through protocol::clock, not UNIX_EPOCH: {readers:?}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The crate doc from its `**Layout.**` line to the end of the `//!` block.
fn layout_section(lib: &str) -> Option<String> {
    let docs: Vec<&str> = lib.lines().take_while(|line| line.starts_with("//!") || line.is_empty()).collect();
    let start = docs.iter().position(|line| line.contains("**Layout.**"))?;
    Some(docs[start..].join("\n"))
}

/// The modules `lib.rs` declares, but not its `#[cfg(test)]` ones.
fn declared_modules(lib: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut test_only = false;
    for line in lib.lines() {
        let line = line.trim();
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        let declaration = line.strip_prefix("pub ").unwrap_or(line);
        let declaration = declaration.strip_prefix("pub(crate) ").unwrap_or(declaration);
        if let Some(name) = declaration.strip_prefix("mod ").and_then(|rest| rest.strip_suffix(';')) {
            if !test_only {
                modules.push(name.to_string());
            }
        }
        test_only = false;
    }
    modules
}

/// Whether `text` names `word` as a whole word (`sku` is not named by `skus`).
fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !is_ident(before) && !is_ident(after)
    })
}

/// Top-level module → the top-level modules it names through `crate::` paths, outside comments
/// and `#[cfg(test)]` modules. A folder module and its children count as one.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = read(&src.join("lib.rs"));
    let modules: BTreeSet<String> = declared_modules(&lib).into_iter().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let first = relative.components().next().map(|c| c.as_os_str().to_string_lossy().to_string());
        let Some(first) = first else { continue };
        let module = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&module) {
            continue;
        }
        let code = without_tests_and_comments(&read(&file));
        for (at, _) in code.match_indices("crate::") {
            let named: String =
                code[at + "crate::".len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if named != module && modules.contains(&named) {
                graph.entry(module.clone()).or_default().insert(named);
            }
        }
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The code of a file before its `#[cfg(test)]` module (always last, by convention here), with
/// comment lines dropped: a doc comment naming another module is not an import.
fn without_tests_and_comments(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    code.lines().filter(|line| !line.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// One circle of the graph, if there is any (depth-first, three colours).
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on_path| on_path == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, done, path) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|start| visit(start, graph, &mut done, &mut Vec::new()))
}
