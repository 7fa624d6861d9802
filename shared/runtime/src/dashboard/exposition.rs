//! Reads back the samples of the exposition text [`crate::metrics::Metrics::render`]
//! writes: `name{label="value",…} number` lines; descriptors, `# EOF` and
//! anything else are passed over.

use std::collections::BTreeMap;

use serde::Serialize;

/// One sample: its labels and its value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    /// A non-finite value (never written by our series) is sent as `null`.
    pub value: f64,
}

/// The samples of `text` with their names, in order. A line that is not a
/// well-formed sample is left out.
pub fn parse(text: &str) -> impl Iterator<Item = (String, Sample)> + '_ {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(sample)
}

fn sample(line: &str) -> Option<(String, Sample)> {
    let name_end = line.find(['{', ' '])?;
    let (name, rest) = line.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => labels(inner)?,
        None => (BTreeMap::new(), rest),
    };
    // A timestamp or an exemplar may follow the value; the value is the first field.
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.to_owned(), Sample { labels, value }))
}

/// The labels at the start of `text` (just after the `{`), and what follows the `}`.
fn labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches(',');
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (key, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.to_owned(), value);
        text = &rest[end + 1..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn one(line: &str) -> Option<(String, Sample)> {
        parse(line).next()
    }

    #[test]
    fn samples_with_and_without_labels_are_read_and_descriptors_are_not() {
        let text = "# HELP skyport_x_total Things.\n# TYPE skyport_x counter\n\
                    skyport_x_total{route=\"/api/deliveryrequests/{id}\",method=\"GET\",status=\"200\"} 12\n\
                    skyport_worker_window 64\n\
                    skyport_h_bucket{le=\"+Inf\"} 3\n\
                    skyport_h_sum 0.25\n# EOF\n";
        let samples: Vec<_> = parse(text).collect();
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[0].0, "skyport_x_total");
        assert_eq!(samples[0].1.labels["route"], "/api/deliveryrequests/{id}");
        assert_eq!(samples[0].1.labels["status"], "200");
        assert_eq!(samples[0].1.value, 12.0);
        assert!(samples[1].1.labels.is_empty());
        assert_eq!(samples[1].1.value, 64.0);
        assert_eq!(samples[2].1.labels["le"], "+Inf");
        assert_eq!(samples[3].1.value, 0.25);
    }

    #[test]
    fn escaped_label_values_are_unescaped() {
        let (_, sample) = one(r#"m{a="say \"hi\"\\n",b="x\ny"} 1"#).unwrap();
        assert_eq!(sample.labels["a"], "say \"hi\"\\n");
        assert_eq!(sample.labels["b"], "x\ny");
    }

    #[test]
    fn a_timestamp_after_the_value_is_passed_over() {
        let (_, sample) = one("m 2.5 1700000000").unwrap();
        assert_eq!(sample.value, 2.5);
    }

    #[test]
    fn malformed_lines_are_left_out() {
        for line in [
            "",
            "m{a=\"1\"",
            "m{a=1} 2",
            "m not-a-number",
            "{a=\"1\"} 2",
            "m",
        ] {
            assert_eq!(one(line), None, "{line:?}");
        }
    }
}
