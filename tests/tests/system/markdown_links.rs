//! Every relative link in the repository's Markdown leads somewhere: the file
//! or directory it names exists, and its `#anchor` (in the same file or
//! another Markdown file) is the slug GitHub gives one of that file's headings.
//!
//! The Markdown here is read by a small parser of the part of CommonMark the
//! repository writes: ATX headings, inline links and images, reference
//! definitions, fenced code blocks and code spans (whose contents are never
//! links). Its rules are tested below on the cases that matter.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use skyport_tests::workspace;

/// Directories never searched for Markdown: build output, installed
/// packages, version control.
const SKIPPED: [&str; 3] = ["target", "node_modules", ".git"];

/// What one Markdown file holds for this check.
#[derive(Debug, Default, PartialEq, Eq)]
struct Document {
    /// The anchors of its headings, duplicates numbered as GitHub numbers them.
    anchors: BTreeSet<String>,
    /// The destination of every link and image, with its line.
    links: Vec<(usize, String)>,
}

/// The anchor GitHub gives a heading's text: lowercase, punctuation other
/// than `-` and `_` dropped, each space a `-`.
fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A heading's text as it renders: code spans' backticks dropped, a link's
/// text kept without its destination.
fn rendered(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        let (before, after) = rest.split_at(start);
        text.push_str(before);
        match after.find("](").zip(after.find(')')) {
            Some((middle, end)) if middle < end => {
                text.push_str(&after[1..middle]);
                rest = &after[end + 1..];
            }
            _ => {
                text.push('[');
                rest = &after[1..];
            }
        }
    }
    text.push_str(rest);
    text.replace('`', "")
}

/// The text of an ATX heading (up to three spaces, one to six `#`, a space),
/// its closing `#`s dropped.
fn heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let marks = line.trim_start_matches(' ');
    let level = marks.len() - marks.trim_start_matches('#').len();
    let text = &marks[level..];
    if indent > 3 || !(1..=6).contains(&level) || !(text.is_empty() || text.starts_with(' ')) {
        return None;
    }
    let text = text.trim();
    let unclosed = text.trim_end_matches('#');
    Some(if unclosed.is_empty() || unclosed.ends_with(' ') {
        unclosed.trim_end()
    } else {
        text
    })
}

/// The fence a line opens or closes: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let mark = trimmed.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let length = trimmed.len() - trimmed.trim_start_matches(mark).len();
    (length >= 3).then_some((mark, length))
}

/// `text` with its code spans (a run of backticks to the next run of the same
/// length) blanked out, keeping their line breaks; an unmatched run is left
/// as it is.
fn without_code_spans(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let after = &rest[start + run..];
        let closing = after.char_indices().map(|(i, _)| i).find(|&i| {
            after[i..].starts_with(&"`".repeat(run))
                && !after[i + run..].starts_with('`')
                && (i == 0 || !after[..i].ends_with('`'))
        });
        match closing {
            Some(end) => {
                out.push(' ');
                out.extend(after[..end].matches('\n'));
                rest = &after[end + run..];
            }
            None => {
                out.push_str(&rest[start..start + run]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The destinations of the inline links and images in `text` (`[…](dest)`,
/// `![…](dest "title")`), and of a reference definition (`[label]: dest`),
/// each with the number of line breaks before it.
fn destinations(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("](") {
        let line = text[..text.len() - rest.len() + start]
            .matches('\n')
            .count();
        let after = &rest[start + 2..];
        let mut depth = 0usize;
        let end = after
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(after.len(), |(i, _)| i);
        let inside = after[..end].trim();
        let destination = match inside.strip_prefix('<') {
            Some(angled) => angled.split('>').next().unwrap_or_default(),
            None => inside.split_whitespace().next().unwrap_or_default(),
        };
        found.push((line, destination.to_owned()));
        rest = &after[end..];
    }
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if let Some((label, destination)) = line.strip_prefix('[').and_then(|l| l.split_once("]:"))
            && !label.contains(']')
            && let Some(destination) = destination.split_whitespace().next()
        {
            let destination = destination.trim_start_matches('<').trim_end_matches('>');
            found.push((number, destination.to_owned()));
        }
    }
    found
}

/// Reads one Markdown file's headings and links, outside code.
fn parse(markdown: &str) -> Document {
    let mut document = Document::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut open_fence: Option<(char, usize)> = None;
    let mut paragraph: Vec<(usize, &str)> = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        let number = index + 1;
        if let Some((mark, length)) = open_fence {
            if fence(line).is_some_and(|(m, l)| m == mark && l >= length)
                && line.trim().trim_start_matches(mark).is_empty()
            {
                open_fence = None;
            }
            continue;
        }
        if let Some(opened) = fence(line) {
            flush(&mut paragraph, &mut document);
            open_fence = Some(opened);
        } else if let Some(text) = heading(line) {
            flush(&mut paragraph, &mut document);
            let base = slug(&rendered(text));
            let mut anchor = base.clone();
            while document.anchors.contains(&anchor) {
                let count = counts.entry(base.clone()).or_insert(0);
                *count += 1;
                anchor = format!("{base}-{count}");
            }
            document.anchors.insert(anchor);
            for (_, destination) in destinations(&without_code_spans(text)) {
                document.links.push((number, destination));
            }
        } else if line.trim().is_empty() {
            flush(&mut paragraph, &mut document);
        } else {
            paragraph.push((number, line));
        }
    }
    flush(&mut paragraph, &mut document);
    document
}

/// Records the links of a paragraph (its lines, numbered), each at its own
/// line, and empties it: a code span or a link may cross its line breaks.
fn flush(paragraph: &mut Vec<(usize, &str)>, document: &mut Document) {
    if let Some(&(first, _)) = paragraph.first() {
        let text: Vec<&str> = paragraph.iter().map(|&(_, line)| line).collect();
        for (offset, destination) in destinations(&without_code_spans(&text.join("\n"))) {
            document.links.push((first + offset, destination));
        }
    }
    paragraph.clear();
}

/// Every Markdown file under `root`, outside the [`SKIPPED`] directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut directories = vec![root.to_path_buf()];
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(&directory).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !SKIPPED.contains(&name.as_str()) {
                    directories.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Whether a destination leaves the repository (a scheme such as `https:`
/// or `mailto:`, or a protocol-relative `//host`).
fn is_external(destination: &str) -> bool {
    destination.starts_with("//")
        || destination.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
}

#[test]
fn every_relative_link_and_anchor_in_the_markdown_resolves() {
    let root = workspace();
    let files = markdown_files(&root);
    let documents: BTreeMap<PathBuf, Document> = files
        .iter()
        .map(|path| (path.clone(), parse(&std::fs::read_to_string(path).unwrap())))
        .collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, document) in &documents {
        let shown = path.strip_prefix(&root).unwrap().display();
        for (line, destination) in &document.links {
            if destination.is_empty() || is_external(destination) {
                continue;
            }
            checked += 1;
            let (file, anchor) = match destination.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (destination.as_str(), None),
            };
            let target = if file.is_empty() {
                path.clone()
            } else if let Some(from_root) = file.strip_prefix('/') {
                root.join(from_root)
            } else {
                path.parent().unwrap().join(file)
            };
            if !target.exists() {
                problems.push(format!("{shown}:{line}: `{destination}`: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let target = target.canonicalize().unwrap();
            if let Some(headings) = documents
                .iter()
                .find(|(p, _)| p.canonicalize().is_ok_and(|p| p == target))
                .map(|(_, d)| &d.anchors)
                && !headings.contains(anchor)
            {
                problems.push(format!(
                    "{shown}:{line}: `{destination}`: no heading has the anchor `{anchor}`"
                ));
            }
        }
    }
    assert!(
        files.len() > 1 && checked > 0,
        "found {} files, {checked} links",
        files.len()
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_follow_githubs_slugs_and_number_duplicates() {
    let document = parse(
        "# Skyport\n## Live tests (a real Event Hubs namespace)\n### `max_in_flight` & co.\n\
         ## A — b\n## [Linked](x.md) heading ##\n## Try it\n## Try it\n## Try it\n\
         #hashtag\n    # indented code\n",
    );
    let anchors: Vec<&str> = document.anchors.iter().map(String::as_str).collect();
    assert_eq!(
        anchors,
        [
            "a--b",
            "linked-heading",
            "live-tests-a-real-event-hubs-namespace",
            "max_in_flight--co",
            "skyport",
            "try-it",
            "try-it-1",
            "try-it-2",
        ]
    );
}

#[test]
fn links_in_code_are_not_links_and_every_other_form_is() {
    let document = parse(
        "See [one](a.md#x) and ![two](img/b.png \"title\")\nand [three\nwrapped](<c d.md>).\n\n\
         `[not](code.md)` and ``[nor](this.md)``\n\n```rust\nlet [x](y.md) = z;\n```\n\n\
         [ref]: e.md#y\n[four](f.md (g)) and [five](https://example.com)\n",
    );
    let links: Vec<(usize, &str)> = document
        .links
        .iter()
        .map(|(line, destination)| (*line, destination.as_str()))
        .collect();
    assert_eq!(
        links,
        [
            (1, "a.md#x"),
            (1, "img/b.png"),
            (3, "c d.md"),
            (12, "f.md"),
            (12, "https://example.com"),
            (11, "e.md#y"),
        ]
    );
    assert!(is_external("https://example.com") && is_external("mailto:a@b"));
    assert!(!is_external("docs/configuration.md#profile") && !is_external("#try-it"));
}
