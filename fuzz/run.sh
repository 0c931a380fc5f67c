#!/usr/bin/env bash
# run.sh [SECONDS] - runs every fuzz target for SECONDS (default 60) each and prints its
# executions. Inputs start from fuzz/seeds/<target> (answers recorded in tests/fixtures); what
# libFuzzer finds grows fuzz/corpus/<target>. A crash fails the run and leaves its input in
# fuzz/artifacts/<target>/: make it a regression test, then fix it.
# Needs cargo-fuzz and a nightly toolchain (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz --version 0.13.2
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo +nightly fuzz build -O 2>&1 | tail -n 3
for target in conversion_review conversion_round_trip admission_review clouds_yaml cloud_answers; do
  mkdir -p "corpus/$target"
  if ! out=$(cargo +nightly fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 2>&1); then
    echo "$out" | tail -n 40
    echo "fuzz target $target crashed"
    exit 1
  fi
  runs=$(echo "$out" | sed -n 's/^stat::number_of_executed_units: *//p' | tail -n 1)
  echo "$target: ${runs:-?} executions in ${seconds}s, corpus $(ls "corpus/$target" | wc -l) inputs"
done
