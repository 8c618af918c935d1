//! The layers hold: a module uses only the layers below its own.
//!
//! `api/` (what users call) sits on `runtime/` (one collective's life),
//! which sits on `algo/` (schedules), `transport/` (moving bytes) and
//! `device/` (one device's owner). The test reads every source file under
//! `src/` and fails, naming the file and the line, when a module names a
//! layer it may not: nothing below `api/` may name `api`, `algo/` (the
//! schedules, written against step traits) does not name `runtime`,
//! `transport/` names only `device/`, and `device/` nothing above it.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The top-level modules a line of code names through `crate::`
/// (`crate::api::x`, `crate::{api::x, device}`), comments left out.
fn named_modules(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level names, up to its closing brace.
            let mut depth = 0usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(head(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || c != '{' {
                    item.push(c);
                }
            }
            out.push(head(&item));
        } else {
            out.push(head(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// The modules of `layer` a line names (`crate::runtime::hop::x`,
/// `crate::runtime::{hop, health::Y}`, `super::hop`), comments left out.
fn named_in(layer: &str, line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    for prefix in [format!("crate::{layer}::"), "super::".to_string()] {
        let mut rest = code;
        while let Some(i) = rest.find(&prefix) {
            rest = &rest[i + prefix.len()..];
            match rest.strip_prefix('{') {
                Some(group) => {
                    let inner = group.split('}').next().unwrap_or("");
                    out.extend(inner.split(',').map(head));
                }
                None => out.push(head(rest)),
            }
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

/// A cycle among the modules of `edges` (module, the modules it names),
/// as the path that closes it.
fn cycle(edges: &std::collections::BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        edges: &std::collections::BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

/// Each module of `dir` (a layer's folder: a file, or a folder of files
/// taken as one module) and the modules of the same layer it names,
/// before its unit tests.
fn module_graph(dir: &Path, layer: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut edges: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let is_module = |d: &str| dir.join(format!("{d}.rs")).exists() || dir.join(d).is_dir();
    for file in sources(dir) {
        let rel = file.strip_prefix(dir).unwrap_or(&file);
        let mut parts = rel.components();
        let first = parts
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        let nested = parts.next().is_some();
        if first == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let deps = edges.entry(first.clone()).or_default();
        deps.extend(
            text.lines()
                .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
                // Inside a folder, `super::` is the folder's own module.
                .flat_map(|l| {
                    if nested {
                        named_in(layer, &l.replace("super::", "self::"))
                    } else {
                        named_in(layer, l)
                    }
                })
                .filter(|d| *d != first && is_module(d)),
        );
        deps.sort();
        deps.dedup();
    }
    edges
}

/// The first path segment of `s`.
fn head(s: &str) -> String {
    s.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The lines of `file` (under `src/`) that name a layer its own may not
/// use, as `path:line: text`.
fn violations(src: &Path, file: &Path, text: &str) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let layer = rel
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or("");
    let forbidden: &[&str] = match layer {
        "runtime" => &["api", "graph", "bench"],
        "algo" => &["api", "graph", "bench", "runtime"],
        "transport" => &["api", "graph", "bench", "runtime", "algo"],
        "device" => &["api", "graph", "bench", "runtime", "algo", "transport"],
        _ => &[],
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // Unit tests inside a module may reach anywhere.
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        for m in named_modules(line) {
            if forbidden.contains(&m.as_str()) {
                out.push(format!(
                    "{}:{}: {layer}/ names {m}: {}",
                    rel.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    out
}

#[test]
fn no_module_names_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for file in sources(&src) {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        bad.extend(violations(&src, &file, &text));
    }
    assert!(bad.is_empty(), "layers crossed:\n{}", bad.join("\n"));
}

#[test]
fn the_check_sees_an_import_from_api_in_every_lower_layer() {
    let src = Path::new("/src");
    for layer in ["runtime", "algo", "transport", "device"] {
        let file = src.join(layer).join("x.rs");
        for text in [
            "use crate::api::tensor::Tensor;",
            "use crate::{api::work::Work, error::Result};",
            "    let t: crate::api::Thing = todo();",
        ] {
            let v = violations(src, &file, text);
            assert_eq!(v.len(), 1, "{layer}: {text}: {v:?}");
        }
        // Comments and the layer's own names are not imports.
        for text in [
            "// see crate::api::comm",
            "use crate::error::Result;",
            "/// [`Work`](crate::Work)",
        ] {
            assert!(violations(src, &file, text).is_empty(), "{layer}: {text}");
        }
    }
    // api/ may use everything below it.
    let file = src.join("api").join("x.rs");
    assert!(violations(src, &file, "use crate::runtime::plan::Plan;").is_empty());
}

#[test]
fn no_two_modules_of_the_runtime_name_each_other_even_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = module_graph(&src.join("runtime"), "runtime");
    assert!(edges.len() > 10, "the runtime's modules: {edges:?}");
    if let Some(c) = cycle(&edges) {
        panic!("runtime/ has a cycle: {}", c.join(" -> "));
    }
}

#[test]
fn the_cycle_check_finds_a_cycle_through_three_modules() {
    let edge = |a: &str, b: &[&str]| (a.to_string(), b.iter().map(|s| s.to_string()).collect());
    let edges = [
        edge("a", &["b"]),
        edge("b", &["c"]),
        edge("c", &["a"]),
        edge("d", &[]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let edges = [edge("a", &["b"]), edge("b", &["c"]), edge("c", &[])]
        .into_iter()
        .collect();
    assert_eq!(cycle(&edges), None);
    assert_eq!(
        named_in(
            "runtime",
            "use crate::runtime::{hop, health::Health}; // crate::runtime::x"
        ),
        vec!["hop".to_string(), "health".to_string()]
    );
}

#[test]
fn a_folder_is_one_module_of_the_cycle_check() {
    let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("f")).expect("a temporary folder");
    let write = |path: &str, text: &str| std::fs::write(dir.join(path), text).expect("a file");
    write("a.rs", "use crate::runtime::f::g::G;\n");
    write("f/mod.rs", "pub(crate) mod g;\n");
    write("f/g.rs", "use super::h::H;\nuse crate::runtime::a::A;\n");
    write("f/h.rs", "pub(crate) struct H;\n");
    let edges = module_graph(&dir, "runtime");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(edges.get("f"), Some(&vec!["a".to_string()]), "{edges:?}");
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "f".into(), "a".into()])
    );
}
