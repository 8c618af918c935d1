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

/// A file's module path under `src/` (`runtime/heal/span.rs` is
/// `runtime::heal::span`, a folder's `mod.rs` the folder, `lib.rs` the
/// root), and whether it is a folder's (or the root's) own file.
fn module_of(rel: &Path) -> (Vec<String>, bool) {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    match parts.last().map(String::as_str) {
        Some("mod") => {
            parts.pop();
            (parts, true)
        }
        Some("lib") if parts.len() == 1 => (Vec::new(), true),
        _ => (parts, false),
    }
}

/// The paths a use tree names, from `s[*i..]`: `a::b::{c, d::{e, f}}`
/// gives `a::b::c`, `a::b::d::e`, `a::b::d::f`.
fn use_tree(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    let ws = |i: &mut usize| {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    ws(i);
    if s.get(*i) == Some(&b'{') {
        *i += 1;
        let mut out = Vec::new();
        loop {
            out.extend(use_tree(s, i));
            ws(i);
            match s.get(*i) {
                Some(b',') => *i += 1,
                Some(b'}') => {
                    *i += 1;
                    break;
                }
                _ => break,
            }
            ws(i);
            if s.get(*i) == Some(&b'}') {
                *i += 1;
                break;
            }
        }
        return out;
    }
    let start = *i;
    while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
        *i += 1;
    }
    let ident = String::from_utf8_lossy(&s[start..*i]).to_string();
    if ident.is_empty() {
        return vec![Vec::new()];
    }
    if s.get(*i..*i + 2) == Some(b"::".as_slice()) {
        *i += 2;
        return use_tree(s, i)
            .into_iter()
            .map(|mut rest| {
                rest.insert(0, ident.clone());
                rest
            })
            .collect();
    }
    vec![vec![ident]]
}

/// Every module path `code` names through `crate::`, `super::` or
/// `self::`, made absolute for the module `here` (whose own file is a
/// folder's when `folder`).
fn named_paths(code: &str, here: &[String]) -> Vec<Vec<String>> {
    let s = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_');
        let rest = &s[i..];
        let (base, skip): (Vec<String>, usize) = if boundary && rest.starts_with(b"crate::") {
            (Vec::new(), "crate::".len())
        } else if boundary && rest.starts_with(b"super::") {
            let mut up = here.to_vec();
            let mut skip = 0;
            while s[i + skip..].starts_with(b"super::") {
                up.pop();
                skip += "super::".len();
            }
            (up, skip)
        } else if boundary && rest.starts_with(b"self::") {
            (here.to_vec(), "self::".len())
        } else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        for tail in use_tree(s, &mut j) {
            let mut full = base.clone();
            full.extend(tail.into_iter().filter(|t| t != "self"));
            out.push(full);
        }
        i = j.max(i + 1);
    }
    out
}

/// Each source file's module and the modules of other files it names
/// (before its unit tests). A folder is one module seen from outside it:
/// naming the folder (its own file) names every file in it. A folder's
/// own file naming what is inside the folder is no edge: the folder is
/// made of those.
fn file_graph(src: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let files: Vec<(PathBuf, Vec<String>, bool)> = sources(src)
        .into_iter()
        .filter(|f| f.strip_prefix(src).is_ok_and(|r| r != Path::new("main.rs")))
        .map(|f| {
            let (m, folder) = module_of(f.strip_prefix(src).unwrap_or(&f));
            (f, m, folder)
        })
        .collect();
    let modules: std::collections::BTreeSet<Vec<String>> =
        files.iter().map(|(_, m, _)| m.clone()).collect();
    let resolve = |path: &[String]| -> Option<Vec<String>> {
        (0..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| modules.contains(p))
    };
    let mut edges = std::collections::BTreeMap::new();
    for (file, here, folder) in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let code: String = text
            .lines()
            .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let mut deps: Vec<String> = named_paths(&code, here)
            .iter()
            .filter_map(|p| resolve(p))
            .filter(|t| t != here && !(*folder && t.starts_with(here)))
            .flat_map(|t| {
                // From outside a folder, the folder and all it holds.
                let outside = !here.starts_with(&t);
                modules
                    .iter()
                    .filter(|m| **m == t || (outside && m.starts_with(&t)))
                    .map(|m| m.join("::"))
                    .collect::<Vec<_>>()
            })
            .collect();
        deps.sort();
        deps.dedup();
        edges.insert(here.join("::"), deps);
    }
    edges
}

#[test]
fn no_two_files_name_each_other_even_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = file_graph(&src);
    assert!(edges.len() > 50, "the crate's files: {}", edges.len());
    // The graph is read, not empty: the communicator queues on the
    // progress thread.
    assert!(
        edges["api::comm"].contains(&"runtime::progress".to_string()),
        "{:?}",
        edges["api::comm"]
    );
    if let Some(c) = cycle(&edges) {
        panic!("files that name each other: {}", c.join(" -> "));
    }
}

#[test]
fn the_file_check_reads_use_trees_over_lines_and_relative_paths() {
    let here: Vec<String> = vec!["runtime".into(), "heal".into(), "span".into()];
    let code = "use crate::runtime::{\n    hop::{Link, Packet},\n    plan::Plan,\n};\nuse super::Heal;\nuse self::inner::X;\nfn f() { mycrate::x(); super::super::cost::y(); }";
    let got = named_paths(code, &here);
    let has = |p: &str| got.iter().any(|g| g.join("::") == p);
    assert!(
        has("runtime::hop::Link") && has("runtime::hop::Packet"),
        "{got:?}"
    );
    assert!(
        has("runtime::plan::Plan") && has("runtime::heal::Heal"),
        "{got:?}"
    );
    assert!(
        has("runtime::heal::span::inner::X") && has("runtime::cost::y"),
        "{got:?}"
    );
    assert!(
        !got.iter().any(|g| g.first().is_some_and(|s| s == "x")),
        "{got:?}"
    );
    // Two files naming each other, through a folder's file: a cycle; a
    // folder's own file naming its parts: none.
    let dir = std::env::temp_dir().join(format!("layers-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("api/tune")).expect("a temporary folder");
    let write = |path: &str, text: &str| std::fs::write(dir.join(path), text).expect("a file");
    write("lib.rs", "mod api;\nuse crate::api::world::World;\n");
    write(
        "api/mod.rs",
        "pub(crate) mod world;\npub(crate) mod tune;\n",
    );
    write(
        "api/tune/mod.rs",
        "pub(crate) mod timing;\nuse self::timing::T;\n",
    );
    write("api/tune/timing.rs", "use super::super::world::World;\n");
    write("api/world.rs", "use crate::api::tune::{\n    Tuned,\n};\n");
    let edges = file_graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(edges["api::tune"], Vec::<String>::new(), "{edges:?}");
    assert_eq!(edges[""], Vec::<String>::new(), "{edges:?}");
    let c = cycle(&edges).expect("world -> tune -> ... -> world");
    assert!(c.contains(&"api::world".to_string()), "{c:?}");
}
