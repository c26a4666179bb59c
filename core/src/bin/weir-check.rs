//! `weir-check check-config FILE`: the filter's own configuration compiler, offline.
//!
//! Runs the parser and compiler that `on_configure` runs, so a file that fails here
//! prints the same error the filter would log, and the filter refuses it. A file that
//! passes can still be refused by the filter for what only the running Envoy knows:
//! the environment variable named by `bridge.secret_env` (checked in the Wasm VM's
//! environment, not here: the checker prints a reminder), or shared data that cannot be
//! allocated.
//!
//! Warnings (on stderr, `warning: FIELD: …`) name what loads but is likely wrong: a
//! `bridge.timeout` shorter than what weir-bridge needs with its default Redis timeout.
//!
//! Exit status: 0 valid (with or without warnings), 1 invalid (or unreadable), 2 bad usage.

use std::io::{Read, Write};
use std::process::ExitCode;
use weir_core::config::{self, Config};

const USAGE: &str = "\
usage: weir-check check-config FILE
       weir-check --help
       weir-check --version

Checks a weir plugin configuration (the JSON given to the filter as its
`configuration`) and prints a summary of its rules. FILE may be - for stdin.

Warnings go to stderr and do not change the exit status.

exit status: 0 valid, 1 invalid or unreadable, 2 bad usage
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--help" | "-h" | "help"] => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        // The workspace version (Cargo.toml's [workspace.package]), as `weir-bridge --version`
        // prints it: a release's parts must agree on it (tests/tests/release.rs).
        ["--version" | "-V"] => {
            println!("weir-check {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        ["check-config", file] => check_config(file),
        _ => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check_config(file: &str) -> ExitCode {
    let json = match read(file) {
        Ok(json) => json,
        Err(err) => {
            eprintln!("error: cannot read {file}: {err}");
            return ExitCode::from(1);
        }
    };
    match config::parse(&json) {
        Ok(config) => {
            // A closed stdout (`| head`) is not a reason to panic.
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{}", summary(&config));
            if let Some(warning) = config.bridge.as_ref().and_then(|b| b.timeout_warning()) {
                eprintln!("warning: {warning}");
            }
            if let Some(name) = config.bridge.as_ref().and_then(|b| b.secret_env.as_ref()) {
                let _ = writeln!(
                    out,
                    "note: bridge.secret_env: the filter reads {name:?} from the Wasm VM's \
                     environment (vm_config.environment_variables) and refuses the \
                     configuration if it is not set there; that is not checked here"
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(1)
        }
    }
}

fn read(file: &str) -> std::io::Result<Vec<u8>> {
    if file == "-" {
        let mut json = Vec::new();
        std::io::stdin().read_to_end(&mut json)?;
        Ok(json)
    } else {
        std::fs::read(file)
    }
}

/// `ok: 2 rules: per-user (gcra, local), login (fixed_window, local, shadow)`.
fn summary(config: &Config) -> String {
    let rules: Vec<String> = config
        .rules
        .iter()
        .map(|rule| {
            let scope = if rule.is_global() { "global" } else { "local" };
            let shadow = if rule.shadow { ", shadow" } else { "" };
            format!("{} ({}, {scope}{shadow})", rule.name, rule.algorithm_name())
        })
        .collect();
    let noun = if rules.len() == 1 { "rule" } else { "rules" };
    format!("ok: {} {noun}: {}", rules.len(), rules.join(", "))
}
