//! A short, bounded pass of the fuzz targets' properties (`fuzz/checks.rs`) on the stable
//! toolchain, so that CI holds them on every run: each target's seeds (`fuzz/seeds`), then
//! mutations of them, deterministic from a fixed seed, for a bounded number of executions and
//! time. It has no coverage feedback: the long, coverage-guided runs are libFuzzer's
//! (`fuzz/run.sh`, nightly). A broken property fails the test with the input in hex.

#[path = "../../fuzz/checks.rs"]
mod checks;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

/// Mutated inputs tried per target at most.
const EXECUTIONS: usize = 20_000;
/// Time per target at most (an unoptimized test build runs the slow targets at a few hundred
/// executions a second).
const BUDGET: Duration = Duration::from_secs(3);

/// Bytes that change a JSON or YAML document's shape.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"18446744073709551616",
    b"\\u0000",
    b"\n",
    b"- ",
    b"&a ",
    b"*a",
    b"!!binary ",
];

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().filter_map(|f| std::fs::read(f).ok()).collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// One to four edits of a seed: bit flips, random or shape-changing bytes put in, ranges
/// dropped or repeated, a splice with another seed.
fn mutate(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut input = seeds[rng.usize(..seeds.len())].clone();
    for _ in 0..rng.usize(1..=4) {
        let at = rng.usize(..=input.len());
        match rng.u8(..6) {
            0 if !input.is_empty() => {
                let i = rng.usize(..input.len());
                input[i] ^= 1 << rng.u8(..8);
            }
            1 => input.insert(at, rng.u8(..)),
            2 => {
                let token = TOKENS[rng.usize(..TOKENS.len())];
                input.splice(at..at, token.iter().copied());
            }
            3 => {
                let end = (at + rng.usize(..64)).min(input.len());
                input.drain(at..end);
            }
            4 => {
                let end = (at + rng.usize(..64)).min(input.len());
                let copy = input[at..end].to_vec();
                input.splice(at..at, copy);
            }
            _ => {
                let other = &seeds[rng.usize(..seeds.len())];
                let from = rng.usize(..=other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
        }
    }
    input
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `check` on every seed, whatever the time (the first run also builds what a check
/// keeps, such as the validators' programs: 5.7 s on a loaded machine, more than the whole
/// budget), then on mutations, within [`EXECUTIONS`] and [`BUDGET`].
fn pass(target: &str, check: fn(&[u8])) {
    let seeds = seeds(target);
    for seed in &seeds {
        check_one(target, check, seed);
    }
    let mut rng = fastrand::Rng::with_seed(0x5eed_0055);
    let started = Instant::now();
    let mut mutations = 0;
    while mutations < EXECUTIONS && started.elapsed() <= BUDGET {
        check_one(target, check, &mutate(&mut rng, &seeds));
        mutations += 1;
    }
    eprintln!(
        "fuzz pass {target}: {} seeds, then {mutations} mutations in {:.1}s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(mutations > 0, "{target}: no mutation was tried");
}

fn check_one(target: &str, check: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| check(input))).is_err() {
        panic!(
            "fuzz property {target} broken by input (hex) {}",
            hex(input)
        );
    }
}

#[test]
fn any_conversion_review_body_is_answered_with_a_conversion_review() {
    pass("conversion_review", checks::conversion_review);
}

#[test]
fn what_converts_one_way_converts_back() {
    pass("conversion_round_trip", checks::conversion_round_trip);
}

#[test]
fn any_admission_review_body_is_answered_for_every_validated_resource() {
    pass("admission_review", checks::admission_review);
}

#[test]
fn any_clouds_yaml_is_resolved_or_refused_and_never_echoed() {
    pass("clouds_yaml", checks::clouds_yaml);
}

#[test]
fn any_cloud_answer_is_classified_and_decoded_without_a_panic() {
    pass("cloud_answers", checks::cloud_answers);
}

#[test]
fn a_broken_property_fails_the_pass_with_its_input() {
    let broken = catch_unwind(|| {
        pass("clouds_yaml", |input| {
            assert!(input.len() < 8, "a seed is longer");
        })
    });
    let said = broken.expect_err("the pass fails");
    let said = said.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(said.contains("broken by input (hex)"), "{said}");
}
