//! The `weir-check` binary: `check-config` on the core's config fixtures (core/tests/config/),
//! a good one and a bad one, from a file and from stdin; the usage it prints.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fixture of the core's config tests: `kind` is `good` or `bad`.
fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/config")
        .join(kind)
        .join(format!("{name}.json"))
}

fn weir_check(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir-check"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default()).unwrap();
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn cli_accepts_a_good_file() {
    let path = fixture("good", "algorithm_gcra");
    let (code, stdout, stderr) = weir_check(&["check-config", path.to_str().unwrap()], None);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        "ok: 2 rules: gcra-burst (gcra, local), gcra-no-burst (gcra, local)\n"
    );
}

/// A rule whose limit each request gives is named as such.
#[test]
fn cli_names_a_limit_from_the_request() {
    let path = fixture("good", "limit_from_request");
    let (code, stdout, stderr) = weir_check(&["check-config", path.to_str().unwrap()], None);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        "ok: 2 rules: per-tenant (gcra, local, limit from the request), \
         per-tenant-global (token_bucket, global, limit from the request)\n"
    );
}

/// A rule whose keys share its limit is named as such.
#[test]
fn cli_names_a_shared_limit() {
    let path = fixture("good", "share");
    let (code, stdout, stderr) = weir_check(&["check-config", path.to_str().unwrap()], None);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        "ok: 2 rules: per-org (fixed_window, local, shared by up to 200 keys), \
         team-tokens (fixed_window, global, shared by up to 100 keys)\n"
    );
}

#[test]
fn cli_rejects_a_bad_file_with_its_message() {
    let path = fixture("bad", "duration_unknown_unit");
    let expected = std::fs::read_to_string(path.with_extension("expected")).unwrap();
    let (code, stdout, stderr) = weir_check(&["check-config", path.to_str().unwrap()], None);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert_eq!(stderr, format!("error: {expected}"));
}

/// A `bridge.timeout` shorter than the bridge's default Redis timeout plus the call's
/// margin loads, with a warning naming the field, the value and what to do.
#[test]
fn cli_warns_about_a_bridge_timeout_the_bridge_outlasts() {
    let path = fixture("good", "global_rules");
    let (code, stdout, stderr) = weir_check(&["check-config", path.to_str().unwrap()], None);
    assert_eq!(code, 0, "a warning is not an error");
    assert!(stdout.starts_with("ok: 4 rules: "), "{stdout}");
    assert_eq!(
        stderr,
        "warning: bridge.timeout: \"25ms\" is shorter than 50ms, what a weir-bridge with its \
         default Redis timeout (40ms) needs with 10ms for the call itself: the filter gives \
         up on calls the bridge is still waiting on, and units Redis grants after that are \
         lost. Raise bridge.timeout to 50ms or more, or run the bridge with --redis-timeout \
         at most 15ms\n"
    );
    // At the bound, and by default, nothing to say.
    for bridge in [
        r#"{"cluster": "weir_bridge", "timeout": "50ms"}"#,
        r#"{"cluster": "weir_bridge"}"#,
    ] {
        let json = format!(
            r#"{{"bridge": {bridge}, "rules": [{{"name": "g", "scope": "global",
            "limit": {{"algorithm": "fixed_window", "limit": 10, "window": "1s"}}}}]}}"#
        );
        let (code, _, stderr) = weir_check(&["check-config", "-"], Some(json.as_bytes()));
        assert_eq!((code, stderr.as_str()), (0, ""), "{bridge}");
    }
}

#[test]
fn cli_reads_stdin() {
    let json = std::fs::read(fixture("good", "shadow")).unwrap();
    let (code, stdout, _) = weir_check(&["check-config", "-"], Some(&json));
    assert_eq!(
        (code, stdout.as_str()),
        (0, "ok: 1 rule: trial (sliding_window, local, shadow)\n")
    );
    let (code, _, stderr) = weir_check(&["check-config", "-"], Some(b"{"));
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: invalid JSON at line 1 column 1: EOF while parsing an object\n"
        )
    );
}

#[test]
fn cli_usage() {
    let (code, stdout, _) = weir_check(&["--help"], None);
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with("usage: weir-check check-config FILE"),
        "{stdout}"
    );
    for args in [
        &[][..],
        &["check"],
        &["check-config"],
        &["check-config", "a", "b"],
    ] {
        let (code, stdout, stderr) = weir_check(args, None);
        assert_eq!((code, stdout.as_str()), (2, ""), "{args:?}");
        assert!(stderr.starts_with("usage:"), "{args:?}: {stderr}");
    }
    let (code, _, stderr) = weir_check(&["check-config", "/nonexistent/weir.json"], None);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: cannot read /nonexistent/weir.json: "),
        "{stderr}"
    );
}
