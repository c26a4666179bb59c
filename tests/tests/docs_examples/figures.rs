//! Figures quoted from the benchmarks: every number the prose marks as one of the committed
//! benchmark data's is that value.

use super::*;

/// A figure the prose quotes from the committed benchmark data, marked by an HTML comment
/// right after it (invisible in rendered Markdown):
///
/// `… 5.49<!-- bench: results.json scenarios[weir-local-half-limited].host_calls_per_request.median --> host calls …`
///
/// The marker names a file of `docs/bench/`, a path into its JSON and, optionally, what
/// is done to the value before it is compared: `per` (the figure is 1 / value: "1 request
/// in 243") or `/PATH` (value ÷ another value of the same file). The path is keys
/// separated by dots; `[3]` indexes a list, `[weir-local]` picks the list element that is
/// an object with a string field equal to `weir-local`, or a list whose first element is.
/// The figure is the last number on the line before the marker (thousands separators
/// allowed); the value, rounded to the figure's decimals, must print as the figure.
#[derive(Debug)]
struct QuotedFigure {
    /// `docs/operations.md:255`
    at: String,
    /// `5.49`, separators removed.
    figure: String,
    file: String,
    path: String,
    op: Option<String>,
}

/// Every `<!-- bench: … -->` marker of a Markdown text, with the figure before it.
fn quoted_figures(text: &str, file: &str) -> Vec<QuotedFigure> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        let mut before = String::new();
        while let Some(start) = rest.find("<!-- bench:") {
            before.push_str(&rest[..start]);
            let after = &rest[start + "<!-- bench:".len()..];
            let end = after
                .find("-->")
                .unwrap_or_else(|| panic!("{file}:{}: a bench marker is never closed", i + 1));
            let words: Vec<&str> = after[..end].split_whitespace().collect();
            let at = format!("{file}:{}", i + 1);
            let (file_name, path, op) = match words.as_slice() {
                [f, p] => (f, p, None),
                [f, p, o] => (f, p, Some(o.to_string())),
                _ => panic!("{at}: a bench marker is `<!-- bench: FILE PATH [per | /PATH] -->`"),
            };
            out.push(QuotedFigure {
                figure: last_number(&before)
                    .unwrap_or_else(|| panic!("{at}: no figure before the bench marker")),
                at,
                file: file_name.to_string(),
                path: path.to_string(),
                op,
            });
            rest = &after[end + 3..];
        }
    }
    out
}

/// The last number of `text` (`1,024`, `-3.7`, `0.0041`), thousands separators removed.
fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let end = chars.iter().rposition(char::is_ascii_digit)? + 1;
    let mut start = end;
    while start > 0 {
        let c = chars[start - 1];
        let digit_follows = chars.get(start).is_some_and(char::is_ascii_digit);
        let digit_precedes = start >= 2 && chars[start - 2].is_ascii_digit();
        if c.is_ascii_digit() || ((c == ',' || c == '.') && digit_follows && digit_precedes) {
            start -= 1;
        } else {
            break;
        }
    }
    if start > 0 && chars[start - 1] == '-' {
        start -= 1;
    }
    Some(chars[start..end].iter().filter(|c| **c != ',').collect())
}

/// The value at `path` in `json` (see [`QuotedFigure`]).
fn at_path<'a>(json: &'a Value, path: &str) -> Result<&'a Value, String> {
    let mut value = json;
    for segment in path.split('.') {
        let (name, selectors) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if !name.is_empty() {
            value = value
                .get(name)
                .ok_or_else(|| format!("no `{name}` (in `{segment}`)"))?;
        }
        for selector in selectors.split(']').filter(|s| !s.is_empty()) {
            let wanted = selector
                .strip_prefix('[')
                .ok_or_else(|| format!("bad selector `{selector}` in `{segment}`"))?;
            let items = value
                .as_array()
                .ok_or_else(|| format!("`{segment}`: [{wanted}] on something not a list"))?;
            value = match wanted.parse::<usize>() {
                Ok(i) => items.get(i),
                Err(_) => items.iter().find(|item| match item {
                    Value::Object(map) => map.values().any(|v| v.as_str() == Some(wanted)),
                    Value::Array(pair) => pair.first().and_then(Value::as_str) == Some(wanted),
                    _ => false,
                }),
            }
            .ok_or_else(|| format!("`{segment}`: no element [{wanted}]"))?;
        }
    }
    Ok(value)
}

/// What the marker says the figure must be, printed with the figure's decimals.
fn expected_figure(quote: &QuotedFigure, data: &Value) -> Result<String, String> {
    let number = |path: &str| {
        at_path(data, path)?
            .as_f64()
            .ok_or_else(|| format!("`{path}` is not a number"))
    };
    let value = number(&quote.path)?;
    let value = match quote.op.as_deref() {
        None => value,
        Some("per") => 1.0 / value,
        Some(op) => match op.strip_prefix('/') {
            Some(divisor) => value / number(divisor)?,
            None => return Err(format!("unknown operation `{op}` (per, /PATH)")),
        },
    };
    let decimals = quote.figure.split_once('.').map_or(0, |(_, d)| d.len());
    let printed = format!("{value:.decimals$}");
    // `-0` and `0` are the same figure.
    Ok(
        if printed
            .trim_start_matches('-')
            .chars()
            .all(|c| c == '0' || c == '.')
        {
            printed.trim_start_matches('-').to_string()
        } else {
            printed
        },
    )
}

/// Checks every marked figure of `files` against `docs/bench/`; returns how many.
fn check_quoted_figures(files: &[PathBuf]) -> Result<usize, Vec<String>> {
    let bench = repo_root().join("docs/bench");
    let mut data: std::collections::BTreeMap<String, Value> = Default::default();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for path in files {
        let text = std::fs::read_to_string(path).unwrap();
        for quote in quoted_figures(&text, &repo_relative(path)) {
            let json = data.entry(quote.file.clone()).or_insert_with(|| {
                let file = bench.join(&quote.file);
                let text = std::fs::read_to_string(&file)
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", quote.at, file.display()));
                serde_json::from_str(&text).unwrap()
            });
            match expected_figure(&quote, json) {
                Ok(expected) if expected == quote.figure => checked += 1,
                Ok(expected) => wrong.push(format!(
                    "{}: quotes {} but docs/bench/{} {} says {expected}",
                    quote.at, quote.figure, quote.file, quote.path
                )),
                Err(e) => wrong.push(format!(
                    "{}: docs/bench/{} {}: {e}",
                    quote.at, quote.file, quote.path
                )),
            }
        }
    }
    if wrong.is_empty() {
        Ok(checked)
    } else {
        Err(wrong)
    }
}

/// Figures the prose quotes from the benchmarks are the committed data's: change a figure,
/// or re-run the benchmark so that the data changes, and this fails until both agree.
/// (The generated pages, `docs/benchmarks*.md`, are checked in the bench crate: they must
/// be what `weir-bench` renders from the same JSON.)
#[test]
fn every_benchmark_figure_quoted_in_prose_is_in_the_committed_data() {
    let checked = check_quoted_figures(&doc_files()).unwrap_or_else(|wrong| {
        panic!(
            "figures that are not in the committed benchmark data:\n{}",
            wrong.join("\n")
        )
    });
    eprintln!("{checked} quoted benchmark figures match docs/bench/*.json");
    assert!(checked >= 20, "only {checked} marked benchmark figures");
}

#[test]
fn a_changed_figure_fails_the_check() {
    let dir = TestDir::new("docs-figures");
    let good = "weir-local made 4.01<!-- bench: results.json scenarios[weir-local].host_calls_per_request.median --> host calls, \
                1 bridge call in 628<!-- bench: results.json scenarios[weir-global-leases].bridge_calls_per_request.median per -->, \
                sent 5.0×<!-- bench: results.json accuracy.runs[global_exact].sent_rps /accuracy.runs[global_exact].rate --> the limit, \
                1,010<!-- bench: features.json results.delay[0].admitted --> admitted\n";
    let path = dir.write("good.md", good);
    assert_eq!(check_quoted_figures(&[path]), Ok(4));
    for (from, to) in [
        ("4.01", "4.02"),
        ("628", "52"),
        ("5.0×", "2.5×"),
        ("1,010", "1,011"),
    ] {
        let path = dir.write("bad.md", good.replacen(from, to, 1));
        let wrong = check_quoted_figures(&[path]).expect_err(to);
        assert_eq!(wrong.len(), 1, "{to}: {wrong:?}");
    }
    let path = dir.write("bad.md", good.replace("median -->", "mean -->"));
    assert!(check_quoted_figures(&[path]).is_err());
}

#[test]
fn numbers_before_markers_are_found_as_documented() {
    assert_eq!(last_number("made 1,024 requests").as_deref(), Some("1024"));
    assert_eq!(last_number("rest -3.7 µs").as_deref(), Some("-3.7"));
    assert_eq!(last_number("1 request in 243").as_deref(), Some("243"));
    assert_eq!(
        last_number("0.0041 per request (").as_deref(),
        Some("0.0041")
    );
    assert_eq!(last_number("12.7 %, and 9.").as_deref(), Some("9"));
    assert_eq!(last_number("none"), None);
}
