//! The book (`docs/`, built with mdBook) cannot drift from the code: every page is reachable
//! from its table of contents, every relative link and image resolves (anchors included), every
//! flag `capo-rs run --help` prints is on the flags page, and every metric the provider declares
//! is on the metrics page. CI also builds the book with mdBook itself (`.ci/run`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;

const CAPO_RS: &str = env!("CARGO_BIN_EXE_capo-rs");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn docs() -> PathBuf {
    repo().join("docs")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(docs())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages
}

/// The text outside fenced code blocks, where links are links.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The `[text](target)` and `![alt](target)` targets of a page.
fn link_targets(markdown: &str) -> Vec<String> {
    let link = Regex::new(r"!?\[[^\]]*\]\(([^)\s]+)\)").unwrap();
    let code = Regex::new(r"`[^`]*`").unwrap();
    let prose = prose(markdown);
    let prose = code.replace_all(&prose, "");
    link.captures_iter(&prose)
        .map(|c| c[1].to_owned())
        .collect()
}

/// mdBook's anchor for a heading: lower case, spaces to `-`, only letters, digits, `-`, `_`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every heading's anchor; a repeated one gets `-1`, `-2`, ... as mdBook numbers them.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    prose(markdown)
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|rest| {
            let id = anchor(rest.trim_start_matches('#'));
            let count = seen.entry(id.clone()).or_default();
            *count += 1;
            match *count {
                1 => id,
                n => format!("{id}-{}", n - 1),
            }
        })
        .collect()
}

/// What is wrong with `target`, linked from `page`; `None` if it resolves.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, fragment) = match target.split_once('#') {
        Some((file, fragment)) => (file, Some(fragment)),
        None => (target, None),
    };
    let resolved = if file.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap().join(file)
    };
    if !resolved.exists() {
        return Some(format!("{target}: no such file"));
    }
    let fragment = fragment?;
    let is_markdown = resolved.extension().is_some_and(|ext| ext == "md");
    if is_markdown && !anchors(&read(&resolved)).contains(fragment) {
        return Some(format!("{target}: no heading with that anchor"));
    }
    None
}

#[test]
fn every_page_is_in_the_table_of_contents_and_every_entry_exists() {
    let summary = read(&docs().join("SUMMARY.md"));
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    for target in &listed {
        assert!(
            docs().join(target).exists(),
            "SUMMARY.md lists {target}, which is missing"
        );
    }
    let orphans: Vec<String> = pages()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name))
        .collect();
    assert!(orphans.is_empty(), "pages no reader can reach: {orphans:?}");
}

#[test]
fn every_relative_link_and_image_in_the_book_and_readme_resolves() {
    let mut files = pages();
    files.push(repo().join("README.md"));
    let mut broken_links = Vec::new();
    for page in &files {
        for target in link_targets(&read(page)) {
            if let Some(why) = broken(page, &target) {
                broken_links.push(format!("{}: {why}", page.display()));
            }
        }
    }
    assert!(broken_links.is_empty(), "{broken_links:#?}");
}

#[test]
fn the_readme_is_short_and_opens_with_the_two_commands() {
    let readme = read(&repo().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < 150,
        "the README has {lines} lines; the book takes the rest"
    );
    let first_screen: String = readme.lines().take(24).collect::<Vec<_>>().join("\n");
    assert!(first_screen.contains("cargo run --release -- demo"));
    assert!(first_screen.contains("cargo test --workspace"));
}

#[test]
fn every_flag_of_capo_rs_run_is_on_the_flags_page() {
    let output = std::process::Command::new(CAPO_RS)
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    let flag = Regex::new(r"(?m)^\s+(?:-\w, )?(--[a-z0-9-]+)").unwrap();
    let flags: BTreeSet<&str> = flag
        .captures_iter(&help)
        .map(|c| c.get(1).unwrap().as_str())
        .filter(|f| *f != "--help")
        .collect();
    assert!(flags.len() > 30, "the help was read: {flags:?}");
    let page = read(&docs().join("flags.md"));
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| {
            !Regex::new(&format!(r"`{}[ `=\[]", regex::escape(f)))
                .unwrap()
                .is_match(&page)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "flags not on docs/flags.md: {missing:?}"
    );
}

/// The metric names declared in the provider's source: its families all start with one of
/// these prefixes (ours, and the ones controller-runtime and client-go dashboards expect).
fn declared_metrics() -> BTreeSet<String> {
    let name =
        Regex::new(r#""((?:capo|controller_runtime|workqueue|leader_election)_[a-z0-9_]+)""#)
            .unwrap();
    let mut names = BTreeSet::new();
    let mut dirs = vec![repo().join("crates/capo-provider/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                names.extend(name.captures_iter(&read(&path)).map(|c| c[1].to_owned()));
            }
        }
    }
    names
}

#[test]
fn every_metric_the_provider_declares_is_on_the_metrics_page() {
    let names = declared_metrics();
    assert!(names.contains("capo_lb_member_state"), "{names:?}");
    let page = read(&docs().join("metrics.md"));
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !page.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics not on docs/metrics.md: {missing:?}"
    );
}

#[test]
fn the_link_checker_sees_a_broken_link_and_a_missing_anchor() {
    let page = docs().join("SUMMARY.md");
    assert!(broken(&page, "no-such-page.md").is_some());
    assert!(broken(&page, "flags.md#no-such-heading").is_some());
    assert!(broken(&page, "flags.md#flags").is_none());
    assert_eq!(
        anchor(" The `run` command: flags "),
        "the-run-command-flags"
    );
}

/// Every `name` that `pattern` captures in `source` (a repository file) is on `page`, in
/// backquotes.
fn missing_from_page(source: &str, pattern: &str, page: &str) -> Vec<String> {
    let names: BTreeSet<String> = Regex::new(pattern)
        .unwrap()
        .captures_iter(&read(&repo().join(source)))
        .map(|c| c[1].to_owned())
        .collect();
    assert!(!names.is_empty(), "{pattern} found nothing in {source}");
    let page = read(&docs().join(page));
    names
        .into_iter()
        .filter(|name| !page.contains(&format!("`{name}`")))
        .collect()
}

#[test]
fn every_alert_has_a_runbook_entry_and_every_clusterctl_variable_is_listed() {
    let alerts = missing_from_page(
        "deploy/prometheus/capo-rs.rules.yaml",
        r"alert:\s*(\w+)",
        "alerts.md",
    );
    assert!(
        alerts.is_empty(),
        "alerts without a runbook entry: {alerts:?}"
    );
    let variables = missing_from_page(
        "deploy/clusterctl/infrastructure-components.yaml",
        r"\$\{(CAPO_RS_\w+)",
        "installation.md",
    );
    assert!(
        variables.is_empty(),
        "variables not on docs/installation.md: {variables:?}"
    );
}

/// The README's figures are the figures page's: each value in its table's capo-rs and CAPO
/// columns (but "not run") appears on `docs/figures.md`, where each figure has its command and
/// commit, so the two cannot disagree.
#[test]
fn the_readmes_figures_are_the_figures_pages() {
    let readme = read(&repo().join("README.md"));
    let figures = read(&docs().join("figures.md"));
    let table = readme
        .split("## Figures")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has a Figures section");
    let measured: Vec<&str> = table
        .lines()
        .filter(|line| line.starts_with("| ") && !line.starts_with("| figure"))
        .flat_map(|line| line.split('|').skip(2).take(2).map(str::trim))
        .filter(|value| *value != "not run")
        .collect();
    assert!(measured.len() >= 5, "the README's figures: {measured:?}");
    let missing: Vec<&&str> = measured
        .iter()
        .filter(|value| !figures.contains(**value))
        .collect();
    assert!(
        missing.is_empty(),
        "README figures not on docs/figures.md (change both together): {missing:?}"
    );
}
