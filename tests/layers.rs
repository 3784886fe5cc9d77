//! The library's modules read top-down: no two of them import each other,
//! directly or around a circle (issue 35, item 3). The state machine is at
//! the bottom, the stores beside it, the drivers above.
//!
//! The check reads `src/` as text: every path through `crate::` or
//! `super::` outside comments and test modules is an edge from the file's
//! module to the module it names. A module and its own submodules may name
//! each other (`mod conn;` one way, `super::deadline_after` the other);
//! siblings and unrelated modules may not form a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module a file under `src/` defines: `store`, `postgres`,
/// `postgres::conn`; `None` for the crate root and for test-only files.
fn module_of(rel: &str) -> Option<String> {
    let rel = rel.strip_suffix(".rs")?;
    let parts: Vec<&str> = rel.split('/').collect();
    let last = *parts.last()?;
    if rel == "lib" || last.ends_with("tests") || last == "handoff_loom" {
        return None;
    }
    let parts = if last == "mod" { &parts[..parts.len() - 1] } else { &parts[..] };
    Some(parts.join("::"))
}

/// The code of a file that builds into the library: comment lines and a
/// trailing test module (`#[cfg(test)]` then `mod … {` at column 0) cut.
fn library_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if *line == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|n| n.starts_with("mod ") && n.ends_with('{')) {
            break;
        }
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The modules a piece of code names through `crate::` and `super::`
/// paths, as written (`a::b::Item`), one level of braces expanded.
fn named_paths(code: &str, module: &str) -> Vec<String> {
    // `super::` in `a/b.rs` (module `a::b`) names `a`; in `a/mod.rs` or
    // `a.rs` (module `a`), the crate root.
    let parent = module.rsplit_once("::").map(|(p, _)| p.to_string()).unwrap_or_default();
    let mut found = Vec::new();
    for (anchor, base) in [("crate::", String::new()), ("super::", parent)] {
        let mut rest = code;
        while let Some(at) = rest.find(anchor) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + anchor.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `$crate::`, `foo::super::`
            }
            let prefix = |p: &str| if base.is_empty() { p.to_string() } else { format!("{base}::{p}") };
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                for item in inner.split(',') {
                    let path: String =
                        item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                    if !path.is_empty() {
                        found.push(prefix(&path));
                    }
                }
            } else {
                let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                found.push(prefix(path.trim_end_matches(':')));
            }
        }
    }
    found
}

/// The longest known module a path starts with.
fn resolve(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|m| modules.contains(m))
}

fn related(a: &str, b: &str) -> bool {
    a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// Every edge between two modules of `files` (path under `src/`, text),
/// a module and its own ancestors or descendants left out.
fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<String> = files.iter().filter_map(|(rel, _)| module_of(rel)).collect();
    let mut g = Graph::new();
    for (rel, text) in files {
        let Some(from) = module_of(rel) else { continue };
        let targets = g.entry(from.clone()).or_default();
        for path in named_paths(&library_code(text), &from) {
            if let Some(to) = resolve(&path, &modules) {
                if to != from && !related(&from, &to) {
                    targets.insert(to);
                }
            }
        }
    }
    g
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        w.on.insert(v);
        for u in w.g.get(v).into_iter().flatten() {
            let u = u.as_str();
            if !w.index.contains_key(u) {
                visit(w, u);
                let lu = w.low[u];
                let lv = w.low.get_mut(v).unwrap();
                *lv = (*lv).min(lu);
            } else if w.on.contains(u) {
                let iu = w.index[u];
                let lv = w.low.get_mut(v).unwrap();
                *lv = (*lv).min(iu);
            }
        }
        if w.low[v] == w.index[v] {
            let mut part = Vec::new();
            while let Some(u) = w.stack.pop() {
                w.on.remove(u);
                part.push(u.to_string());
                if u == v {
                    break;
                }
            }
            if part.len() > 1 {
                part.sort();
                w.out.push(part);
            }
        }
    }
    let mut w = Walk {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.out
}

fn library_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
                files.push((rel, fs::read_to_string(&path).expect("read a source file")));
            }
        }
    }
    files
}

#[test]
fn no_two_modules_import_each_other() {
    let g = graph(&library_sources());
    // The scan sees the imports it must: a check that reads nothing would
    // find no circle either.
    assert!(g["elector"].contains("machine"), "elector's imports were not read: {:?}", g["elector"]);
    assert!(g["postgres::conn"].contains("postgres::tls"), "postgres::conn's imports were not read");
    let found = circles(&g);
    assert!(found.is_empty(), "modules that import each other, directly or around a circle: {found:?}");
}

#[test]
fn a_circle_is_caught() {
    // The negative control: the same scan over three files that import
    // around a circle, and over a module importing its sibling through
    // `super::` while the sibling imports it back.
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = [
        file("a.rs", "use crate::b::B;\n"),
        file("b.rs", "// use crate::a::A; (a comment names nothing)\nuse crate::c::{C, D};\n"),
        file("c.rs", "pub struct C;\nfn f() { crate::a::g() }\n#[cfg(test)]\nmod tests {\n    use crate::z::Z;\n}\n"),
        file("d/mod.rs", "mod x;\nmod y;\nuse self::x::X;\n"),
        file("d/x.rs", "use super::y::Y;\nuse super::Shared;\n"),
        file("d/y.rs", "use super::{x, Shared};\n"),
        file("z.rs", "use crate::a::A;\n"),
    ];
    let g = graph(&files);
    assert!(!g["c"].contains("z"), "a test module's import counted: {:?}", g["c"]);
    assert!(!g["b"].contains("a"), "a comment counted");
    assert_eq!(circles(&g), vec![vec!["a".to_string(), "b".into(), "c".into()], vec!["d::x".into(), "d::y".into()]]);
}
