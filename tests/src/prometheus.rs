//! A reader for the Prometheus text exposition format (what Envoy's `/stats/prometheus`
//! and weir-bridge's `/metrics` answer): `# TYPE` lines, samples with labels whose values
//! may hold escaped quotes, backslashes and newlines, and values including `+Inf`/`NaN`.

use std::collections::BTreeMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: the samples in order, and each family's declared type.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    /// The samples named `name` whose labels include every pair of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The value of the one sample named `name` with `labels`; panics when there is not
    /// exactly one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self.find(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "samples of {name} with {labels:?}: {found:?}"
        );
        found[0].value
    }
}

/// Parses the whole text; the error names the line.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut words = rest.split_whitespace();
            if words.next() == Some("TYPE") {
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(format!("line {}: bad TYPE line {line:?}", i + 1));
                };
                out.types.insert(name.to_string(), kind.to_string());
            }
            continue;
        }
        let sample = parse_sample(line).map_err(|e| format!("line {}: {e}: {line:?}", i + 1))?;
        out.samples.push(sample);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    let mut fields = rest.split_whitespace();
    let value = fields.next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().map_err(|_| format!("bad value {v:?}"))?,
    };
    // An optional timestamp may follow; nothing else.
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if fields.next().is_some() {
        return Err("text after the value".to_string());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `name="value",…}` and returns the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("a label without =")?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad label name {key:?}"));
        }
        let mut chars = s[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label {key} is not quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (at, c) in chars {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(eq + 1 + at + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("label {key} has no closing quote"))?;
        if labels.insert(key.to_string(), value).is_some() {
            return Err(format!("label {key} twice"));
        }
        s = &s[end..];
        s = s.trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("labels not separated by ','".to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_types_labels_and_escapes() {
        let text = "# HELP x a help line\n# TYPE weir_rule_allowed counter\n\
            weir_rule_allowed{weir_plugin=\"weir\",weir_rule=\"per-user\"} 3\n\
            weir_rule_allowed{weir_rule=\"a \\\"quoted\\\" \\\\ name\\n\"} 1 1700000000000\n\
            envoy_cluster_upstream_rq_time_bucket{le=\"+Inf\"} 7\n\
            plain 0.5\n";
        let e = parse(text).unwrap();
        assert_eq!(e.types["weir_rule_allowed"], "counter");
        assert_eq!(
            e.value("weir_rule_allowed", &[("weir_rule", "per-user")]),
            3.0
        );
        assert_eq!(
            e.value(
                "weir_rule_allowed",
                &[("weir_rule", "a \"quoted\" \\ name\n")]
            ),
            1.0
        );
        assert_eq!(
            e.value("envoy_cluster_upstream_rq_time_bucket", &[("le", "+Inf")]),
            7.0
        );
        assert_eq!(e.value("plain", &[]), 0.5);
        assert_eq!(e.find("weir_rule_allowed", &[]).count(), 2);
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for bad in [
            "x{a=\"1\" 2",
            "x{a=1} 2",
            "x{a=\"1\"b=\"2\"} 3",
            "1x 2",
            "x",
            "x abc",
            "x{a=\"1\",a=\"2\"} 3",
        ] {
            let err = parse(&format!("ok 1\n{bad}\n")).unwrap_err();
            assert!(err.starts_with("line 2:"), "{bad}: {err}");
        }
    }
}
