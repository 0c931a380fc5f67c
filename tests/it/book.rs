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
    // Each flavor's variables (not `$${...}`, which clusterctl passes on as `${...}`).
    let flavors = std::fs::read_dir(repo().join("deploy/clusterctl"))
        .expect("deploy/clusterctl")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            ["cluster-template", "clusterclass-", "image-template"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        });
    for flavor in flavors {
        let missing = missing_from_page(
            &format!("deploy/clusterctl/{flavor}"),
            r"(?m)(?:^|[^$])\$\{([A-Z][A-Z0-9_]*)",
            "flavors.md",
        );
        assert!(
            missing.is_empty(),
            "{flavor}'s variables not on docs/flavors.md: {missing:?}"
        );
    }
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

/// The pages a user reads to install, migrate, run and look things up: those of the book's
/// Getting started, Running it and Reference parts (`docs/SUMMARY.md`). Every command of their
/// `sh` blocks is run by a test, which takes it from the page ([`book_command`],
/// [`book_block`]), or says on the page that no test runs it (`# not run by a test: why`, on
/// its line or as its block's first line).
fn command_pages() -> Vec<String> {
    let summary = read(&docs().join("SUMMARY.md"));
    let link = Regex::new(r"\]\(([^)#]+\.md)\)").unwrap();
    let mut part = "";
    let mut pages = Vec::new();
    for line in summary.lines() {
        if let Some(title) = line.strip_prefix("# ") {
            part = title;
        } else if ["Getting started", "Running it", "Reference"].contains(&part)
            && let Some(page) = link.captures(line)
        {
            pages.push(page[1].to_owned());
        }
    }
    pages
}

const NOT_RUN: &str = "# not run by a test";

/// One `sh` block: its commands (continued lines joined, here-document bodies left out), each
/// with whether it is marked as not run.
#[derive(Debug)]
struct ShBlock {
    /// What a test runs: the block without the lines marked as not run.
    runnable: String,
    commands: Vec<(String, bool)>,
}

/// The `sh` blocks of a page, fences indented or not.
fn sh_blocks(markdown: &str) -> Vec<ShBlock> {
    let mut blocks = Vec::new();
    let mut open: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        let fence = line.trim_start();
        match open.as_mut() {
            None if fence == "```sh" => open = Some(Vec::new()),
            None => {}
            Some(_) if fence == "```" => {
                let lines = open.take().unwrap_or_default();
                let indent = line.len() - fence.len();
                let text: Vec<&str> = lines
                    .iter()
                    .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
                    .collect();
                let runnable: Vec<&str> = text
                    .iter()
                    .filter(|l| !marked_not_run(l))
                    .copied()
                    .collect();
                blocks.push(ShBlock {
                    commands: block_commands(&text),
                    runnable: runnable.join("\n") + "\n",
                });
            }
            Some(lines) => lines.push(line),
        }
    }
    blocks
}

/// Whether a line's trailing comment (after its first ` # `) says no test runs it.
fn marked_not_run(line: &str) -> bool {
    line.split_once(" # ")
        .is_some_and(|(_, comment)| comment.starts_with(&NOT_RUN[2..]))
}

/// A block's commands: `\`-continued lines joined with a space, here-document bodies and
/// comment lines left out, a trailing comment dropped unless it marks the line as not run.
fn block_commands(lines: &[&str]) -> Vec<(String, bool)> {
    let here_document = Regex::new(r#"<<-?\s*['"]?(\w+)['"]?"#).unwrap();
    let whole_block_not_run = lines.first().is_some_and(|l| l.starts_with(NOT_RUN));
    let mut commands = Vec::new();
    let mut pending = String::new();
    let mut terminator: Option<String> = None;
    for line in lines {
        if let Some(end) = &terminator {
            if line.trim() == end {
                terminator = None;
            }
            continue;
        }
        let trimmed = line.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(continued) = trimmed.strip_suffix('\\') {
            pending.push_str(continued.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let line = std::mem::take(&mut pending);
        if let Some(c) = here_document.captures(&line) {
            terminator = Some(c[1].to_owned());
        }
        let marked = marked_not_run(&line);
        let command = line.split_once(" # ").map_or(line.as_str(), |(c, _)| c);
        commands.push((command.trim_end().to_owned(), marked || whole_block_not_run));
    }
    commands
}

/// `command`, which a `sh` block of `docs/<page>` gives, split into its words: what a test
/// runs is what the book says (the test may add flags naming its own cluster and files).
pub(crate) fn book_command(page: &str, command: &str) -> Vec<String> {
    let blocks = sh_blocks(&read(&docs().join(page)));
    assert!(
        blocks
            .iter()
            .flat_map(|b| &b.commands)
            .any(|(c, _)| c == command),
        "docs/{page} has no `{command}` in a sh block"
    );
    command.split_whitespace().map(str::to_owned).collect()
}

/// The whole `sh` block of `docs/<page>` that holds `command`, for a test to run as a user
/// pastes it (less the lines the page marks as not run by a test).
pub(crate) fn book_block(page: &str, command: &str) -> String {
    let mut holding: Vec<ShBlock> = sh_blocks(&read(&docs().join(page)))
        .into_iter()
        .filter(|b| b.commands.iter().any(|(c, _)| c == command))
        .collect();
    assert_eq!(
        holding.len(),
        1,
        "docs/{page}: one sh block holds `{command}`, for the check to know which is run"
    );
    holding.remove(0).runnable
}

/// What the tests take from the book: `(page, command, whole block)` of every
/// `book_command("page", "command")` and `book_block(...)` call in `tests/it`.
fn commands_the_tests_run() -> Vec<(String, String, bool)> {
    let call = Regex::new(r#"book_(command|block)\(\s*"([^"]+)",\s*"((?:[^"\\]|\\.)*)"\s*,?\s*\)"#)
        .unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(repo().join("tests/it")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs")
            || path.file_name().is_some_and(|n| n == "book.rs")
        {
            continue;
        }
        let source = read(&path);
        for c in call.captures_iter(&source) {
            let command = c[3].replace("\\\"", "\"").replace("\\\\", "\\");
            found.push((c[2].to_owned(), command, &c[1] == "block"));
        }
    }
    found
}

#[test]
fn every_command_of_the_guides_is_run_by_a_test_or_says_it_is_not() {
    let run = commands_the_tests_run();
    assert!(
        run.len() >= 4,
        "the tests take commands from the book: {run:?}"
    );
    let mut unmarked = Vec::new();
    let pages = command_pages();
    for page in [
        "installation.md",
        "first-cluster.md",
        "troubleshooting.md",
        "cli.md",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} in {pages:?}");
    }
    for page in &pages {
        let page = page.as_str();
        let markdown = read(&docs().join(page));
        for other in ["```bash", "```shell", "```console"] {
            assert!(
                !markdown.contains(other),
                "docs/{page}: commands go in ```sh blocks, which the check reads ({other})"
            );
        }
        for block in sh_blocks(&markdown) {
            let whole_block_run = run.iter().any(|(p, command, whole)| {
                p == page && *whole && block.commands.iter().any(|(c, _)| c == command)
            });
            for (command, marked) in &block.commands {
                let run_alone = run
                    .iter()
                    .any(|(p, c, whole)| p == page && !whole && c == command);
                if !(whole_block_run || run_alone || *marked) {
                    unmarked.push(format!("{page}: {command}"));
                }
            }
        }
    }
    assert!(
        unmarked.is_empty(),
        "commands no test runs and the page does not mark `{NOT_RUN}`:\n{}",
        unmarked.join("\n")
    );
}

#[test]
fn a_sh_block_reads_as_its_commands() {
    let page = "Text\n\n   ```sh\n   # set up\n   mkdir -p a \\\n     b\n   cat > a/f <<'YAML'\n   x: 1\n   YAML\n   kubectl get x   # not run by a test: no kubelet\n   clusterctl init   # a comment\n   ```\n\n```sh\n# not run by a test: needs a cloud\nopenstack server list\n```\n";
    let blocks = sh_blocks(page);
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        blocks[0].commands,
        vec![
            ("mkdir -p a b".to_owned(), false),
            ("cat > a/f <<'YAML'".to_owned(), false),
            ("kubectl get x".to_owned(), true),
            ("clusterctl init".to_owned(), false),
        ]
    );
    assert_eq!(
        blocks[0].runnable,
        "# set up\nmkdir -p a \\\n  b\ncat > a/f <<'YAML'\nx: 1\nYAML\nclusterctl init   # a comment\n"
    );
    assert_eq!(
        blocks[1].commands,
        vec![("openstack server list".to_owned(), true)]
    );
}

/// Runs `block` (from [`book_block`] or [`book_command`]) with bash as a user pastes it: in
/// `dir`, with `env` (PATH, KUBECONFIG, HOME as the test sets them), `-e` and `pipefail` on.
/// Its standard output, or a panic with what it said.
pub(crate) async fn paste(block: &str, dir: &Path, env: &[(&str, String)]) -> String {
    let run = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(300), run)
        .await
        .unwrap_or_else(|_| panic!("the book's block ran over 5 minutes:\n{block}"))
        .expect("bash runs");
    assert!(
        output.status.success(),
        "the book's block failed ({}):\n{block}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The `yaml` block of `docs/<page>` that holds `containing`, as the page gives it.
pub(crate) fn book_yaml(page: &str, containing: &str) -> String {
    let markdown = read(&docs().join(page));
    let mut blocks = markdown.split("```yaml\n").skip(1);
    blocks
        .find_map(|rest| {
            let block = rest.split("```").next()?;
            block.contains(containing).then(|| block.to_owned())
        })
        .unwrap_or_else(|| panic!("docs/{page} has no yaml block with `{containing}`"))
}

/// A claim of the book (a paragraph, a list item, a table row) that says capo-rs does
/// something as CAPO does (issue 58: no claim without a test). "capo-rs" itself is not CAPO.
fn claims_capos_behaviour(claim: &str) -> bool {
    let sameness = Regex::new(
        r"(?i)\b(as CAPO|as in CAPO|like CAPO|same as CAPO|CAPO does the same|CAPO does too)\b",
    )
    .unwrap();
    let ours = Regex::new(r"(?i)capo-rs").unwrap();
    sameness.is_match(&ours.replace_all(&claim.replace('\n', " "), "ours"))
}

/// A page's claims: its paragraphs, each list item and table row on its own.
fn claims(prose: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for paragraph in prose.split("\n\n") {
        let mut current = String::new();
        for line in paragraph.lines() {
            let trimmed = line.trim_start();
            let starts_claim = trimmed.starts_with('|')
                || trimmed.starts_with("- ")
                || trimmed.starts_with("* ")
                || trimmed
                    .split_once(". ")
                    .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
            if starts_claim && !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            current.push_str(line);
            current.push('\n');
        }
        if !current.is_empty() {
            out.push(current);
        }
    }
    out
}

/// The tests a paragraph names, as `module::test`.
fn named_tests(paragraph: &str) -> Vec<(String, String)> {
    let named = Regex::new(r"`([a-z][a-z0-9_]*)::([a-z][a-z0-9_]*)`").unwrap();
    named
        .captures_iter(paragraph)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

/// Every Rust file of the tests and the crates, by its module's name (a `mod.rs` by its
/// directory's).
fn sources_by_module() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                let module = match stem.as_ref() {
                    "mod" => path
                        .parent()
                        .and_then(Path::file_name)
                        .map_or_else(|| stem.to_string(), |d| d.to_string_lossy().into_owned()),
                    _ => stem.to_string(),
                };
                out.push((module, read(&path)));
            }
        }
    }
    let mut out = Vec::new();
    for dir in ["tests/it", "crates", "src"] {
        walk(&repo().join(dir), &mut out);
    }
    out
}

#[test]
fn every_claim_of_capos_behaviour_names_a_test_that_exists() {
    let sources = sources_by_module();
    let exists = |module: &str, name: &str| {
        let word = Regex::new(&format!(r"\b{name}\b")).unwrap();
        sources
            .iter()
            .any(|(m, text)| m == module && word.is_match(text))
    };
    let mut unbacked = Vec::new();
    let mut unknown = Vec::new();
    for page in pages() {
        let file = page
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for claim in claims(&prose(&read(&page))) {
            if !claims_capos_behaviour(&claim) {
                continue;
            }
            let tests = named_tests(&claim);
            if tests.is_empty() {
                let start: String = claim.trim().chars().take(100).collect();
                unbacked.push(format!("{file}: {start}"));
            }
            for (module, name) in tests {
                if !exists(&module, &name) {
                    unknown.push(format!("{file}: {module}::{name}"));
                }
            }
        }
    }
    assert!(
        unbacked.is_empty(),
        "claims of CAPO's behaviour that name no test ({}):\n{}",
        unbacked.len(),
        unbacked.join("\n")
    );
    assert!(unknown.is_empty(), "tests named but not found: {unknown:?}");
}

#[test]
fn a_claim_of_capos_behaviour_is_seen_and_its_test_read() {
    let paragraph = "It retries, as CAPO does (test:\n`cloud::retries_stop_at_their_bound`).";
    assert!(claims_capos_behaviour(paragraph));
    assert_eq!(
        named_tests(paragraph),
        [("cloud".to_owned(), "retries_stop_at_their_bound".to_owned())]
    );
    assert!(!claims_capos_behaviour("capo-rs differs from CAPO here."));
    assert!(!claims_capos_behaviour(
        "the groups as capo-rs last saw them"
    ));
    let page = "Intro, as CAPO.\n\n- one, as CAPO\n  goes on\n- two\n\n| a | b |\n| c | d |\n";
    assert_eq!(
        claims(page),
        [
            "Intro, as CAPO.\n",
            "- one, as CAPO\n  goes on\n",
            "- two\n",
            "| a | b |\n",
            "| c | d |\n"
        ]
    );
}
