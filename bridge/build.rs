//! Embeds every Lua script of `lua/` (each prefixed by the shared prelude `common.lua`)
//! as a table keyed by file name, so that an algorithm's script is found by the name its
//! core spec gives (`AlgorithmSpec::script`) and adding an algorithm needs no edit here.

// A build script reports failure by panicking.
#![allow(clippy::panic)]

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_stem()?.to_str()?.to_string();
            (path.extension()? == "lua" && name != "common").then_some(name)
        })
        .collect();
    names.sort();
    let mut table = String::from(
        "/// `(file name without .lua, prelude + script)` for every script in `lua/`.\n\
         pub static LUA_SCRIPTS: &[(&str, &str)] = &[\n",
    );
    for name in &names {
        let _ = writeln!(
            table,
            "    ({name:?}, concat!(include_str!({common:?}), \"\\n\", include_str!({file:?}))),",
            common = dir.join("common.lua").display().to_string(),
            file = dir.join(format!("{name}.lua")).display().to_string(),
        );
    }
    table.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap_or_default()).join("lua_scripts.rs");
    std::fs::write(&out, table).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
