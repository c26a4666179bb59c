//! The metric names a PromQL expression reads (for the alerts and the dashboard: every one
//! must be a name Envoy or weir-bridge exports, tests/tests/alerts.rs).
//!
//! Not a PromQL parser: a tokenizer that knows where names cannot be. Strings, durations
//! (`[5m]`, `offset 1h`), numbers and Grafana variables (`$plugin`, `${x}`,
//! `$__rate_interval`) are skipped; an identifier followed by `(`, `by` or `without` is a
//! function or an aggregation; the parenthesised list after `by`, `without`, `on`, `ignoring`,
//! `group_left` and `group_right` holds label names; keywords (`and`, `or`, `bool`, …) are
//! operators. Every other identifier is a metric name, and the `{…}` after it its matchers.
//! A selector without a name (`{__name__=~"…"}`) names its metrics by a regex.

/// How a selector names its metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricName {
    Exact(String),
    /// The value of a `__name__=~"…"` matcher (anchored, as Prometheus anchors it).
    Regex(String),
}

/// One vector selector: its name and the label names its matchers use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub name: MetricName,
    pub labels: Vec<String>,
}

const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// What an expression reads: its selectors and the labels it groups or matches by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// In order.
    pub selectors: Vec<Selector>,
    /// The labels of every `by (…)`, `without (…)`, `on (…)`, `ignoring (…)`,
    /// `group_left (…)` and `group_right (…)`, in order.
    pub grouping: Vec<String>,
}

/// The selectors of `expr`, in order; an error for what it cannot read (an unclosed string
/// or brace).
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    read(expr).map(|q| q.selectors)
}

/// Reads `expr`; an error for what it cannot read (an unclosed string or brace).
pub fn read(expr: &str) -> Result<Query, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i)?;
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = find(&chars, i, '}')? + 1;
            } else {
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
        } else if c == '[' {
            i = find(&chars, i, ']')? + 1;
        } else if c.is_ascii_digit() || (c == '.' && next_is_digit(&chars, i)) {
            // A number (1e3, 0x1f, 1.5) or a duration (5m, 1h30m).
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c == '{' {
            let (labels, name_regex, end) = matchers(&chars, i)?;
            let name = name_regex.map(MetricName::Regex).ok_or_else(|| {
                format!("a selector without a metric name or __name__ regex in {expr:?}")
            })?;
            out.push(Selector { name, labels });
            i = end;
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_space(&chars, i);
            let lower = word.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) {
                if chars.get(next) == Some(&'(') {
                    let close = find(&chars, next, ')')?;
                    let list: String = chars[next + 1..close].iter().collect();
                    grouping.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(String::from),
                    );
                    i = close + 1;
                }
            } else if KEYWORDS.contains(&lower.as_str())
                || chars.get(next) == Some(&'(')
                || next_word_is(&chars, next, &["by", "without"])
            {
                // An operator, a function call, or an aggregation (`sum (…)`, `sum by (…) (…)`).
            } else {
                let mut labels = Vec::new();
                if chars.get(next) == Some(&'{') {
                    let (l, name_regex, end) = matchers(&chars, next)?;
                    if name_regex.is_some() {
                        return Err(format!("{word} also has a __name__ matcher in {expr:?}"));
                    }
                    labels = l;
                    i = end;
                }
                out.push(Selector {
                    name: MetricName::Exact(word),
                    labels,
                });
            }
        } else {
            i += 1;
        }
    }
    Ok(Query {
        selectors: out,
        grouping,
    })
}

fn next_word_is(chars: &[char], at: usize, words: &[&str]) -> bool {
    let end = (at..chars.len())
        .find(|&j| !is_ident(chars[j]))
        .unwrap_or(chars.len());
    let word: String = chars[at..end].iter().collect();
    words.contains(&word.to_ascii_lowercase().as_str())
}

fn next_is_digit(chars: &[char], i: usize) -> bool {
    chars.get(i + 1).is_some_and(char::is_ascii_digit)
}

fn skip_space(chars: &[char], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// The index after the string opening at `i`.
fn skip_string(chars: &[char], i: usize) -> Result<usize, String> {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if quote != '`' => j += 2,
            c if c == quote => return Ok(j + 1),
            _ => j += 1,
        }
    }
    Err("an unclosed string".to_string())
}

fn find(chars: &[char], from: usize, close: char) -> Result<usize, String> {
    let mut j = from;
    while j < chars.len() {
        if chars[j] == '"' || chars[j] == '\'' || chars[j] == '`' {
            j = skip_string(chars, j)?;
            continue;
        }
        if chars[j] == close {
            return Ok(j);
        }
        j += 1;
    }
    Err(format!("no closing {close:?}"))
}

/// Reads `{name op "value", …}` from the `{` at `i`: the label names other than
/// `__name__`, the `__name__` regex if any, and the index after the `}`.
fn matchers(chars: &[char], i: usize) -> Result<(Vec<String>, Option<String>, usize), String> {
    let mut labels = Vec::new();
    let mut name_regex = None;
    let mut j = i + 1;
    loop {
        j = skip_space(chars, j);
        match chars.get(j) {
            None => return Err("no closing '}'".to_string()),
            Some('}') => return Ok((labels, name_regex, j + 1)),
            Some(',') => {
                j += 1;
                continue;
            }
            _ => {}
        }
        let start = j;
        while chars.get(j).is_some_and(|c| is_ident(*c)) {
            j += 1;
        }
        let label: String = chars[start..j].iter().collect();
        if label.is_empty() {
            return Err(format!("a matcher without a label name at {start}"));
        }
        j = skip_space(chars, j);
        let op_start = j;
        while chars.get(j).is_some_and(|c| matches!(c, '=' | '!' | '~')) {
            j += 1;
        }
        let op: String = chars[op_start..j].iter().collect();
        j = skip_space(chars, j);
        if !matches!(chars.get(j), Some('"' | '\'' | '`')) {
            return Err(format!("matcher {label} has no quoted value"));
        }
        let end = skip_string(chars, j)?;
        let value: String = chars[j + 1..end - 1].iter().collect();
        j = end;
        if label == "__name__" {
            name_regex = Some(match op.as_str() {
                "=" => regex_escape(&value),
                "=~" => value,
                _ => return Err(format!("__name__{op} is not a name this check reads")),
            });
        } else {
            labels.push(label);
        }
    }
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        selectors(expr)
            .unwrap()
            .into_iter()
            .map(|s| match s.name {
                MetricName::Exact(n) => n,
                MetricName::Regex(r) => format!("~{r}"),
            })
            .collect()
    }

    #[test]
    fn functions_keywords_label_lists_durations_and_variables_are_not_names() {
        assert_eq!(
            names(
                r#"histogram_quantile(0.99, sum by (weir_plugin, le) (rate(weir_bridge_latency_us_bucket{weir_plugin=~"$plugin"}[$__rate_interval]))) > 40000"#
            ),
            ["weir_bridge_latency_us_bucket"]
        );
        assert_eq!(
            names(
                "sum by (a) (rate(x[5m])) > 5 * sum by (a) (rate(x[1h] offset 5m)) and on (a) y >= 1e3 or vector(0) unless z offset 1h30m"
            ),
            ["x", "x", "y", "z"]
        );
        assert_eq!(
            names(
                r#"a / ignoring (le) group_left (b) c{d="by (x) sum(", e!~'f'} + ${v} - $w * .5"#
            ),
            ["a", "c"]
        );
        assert_eq!(
            names(r#"label_values(weir_rule_allowed{weir_plugin=~"$plugin"}, weir_rule)"#),
            ["weir_rule_allowed", "weir_rule"],
            "label_values' second argument reads as a name: the caller drops it"
        );
    }

    #[test]
    fn matchers_give_label_names_and_name_regexes() {
        assert_eq!(
            selectors(r#"increase({__name__=~"envoy_wasm_.+_vm_reload", job="e"}[10m])"#).unwrap(),
            [Selector {
                name: MetricName::Regex("envoy_wasm_.+_vm_reload".into()),
                labels: vec!["job".into()],
            }]
        );
        assert_eq!(
            selectors(r#"m{code=~"5..",job!="x"}"#).unwrap(),
            [Selector {
                name: MetricName::Exact("m".into()),
                labels: vec!["code".into(), "job".into()],
            }]
        );
        assert_eq!(
            selectors(r#"{__name__="a.b"}"#).unwrap()[0].name,
            MetricName::Regex(r"a\.b".into())
        );
    }

    #[test]
    fn grouping_labels_are_read() {
        assert_eq!(
            read("sum by (a, b) (x) / ignoring (le) group_left (c) y + sum without(d)(z)")
                .unwrap()
                .grouping,
            ["a", "b", "le", "c", "d"]
        );
    }

    #[test]
    fn unreadable_expressions_are_errors() {
        for bad in [
            r#"m{a="x"#,
            r#"m{a=x}"#,
            r#"{a="x"}"#,
            r#"m{__name__="n"}"#,
            "\"open",
        ] {
            assert!(selectors(bad).is_err(), "{bad}");
        }
    }
}
