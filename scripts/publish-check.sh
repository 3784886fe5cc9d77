#!/usr/bin/env bash
# Can both packages be published, and is what they declare true? (issue 35,
# item 4; docs/testing.md). Run from anywhere; scripts/test.sh runs it.
#   1. `cargo package --list` of the library and of the tool holds only
#      paths of an allow-list below (and the files each must have).
#   2. `cargo doc --no-deps` with warnings as errors (broken intra-doc links
#      among them) for every feature the docs can be built with, alone, and
#      all of them (what docs.rs builds), and for the tool.
#   3. The declared `rust-version` (see the comment on it in Cargo.toml):
#      clippy's `incompatible_msrv` lint, and scripts/msrv-deps.py over the
#      locked dependency graphs.
#   4. `cargo publish --workspace --dry-run`: both packages packed and each
#      built from its package alone, the tool against the packed library
#      (cargo puts it in a local registry overlaid on crates.io), so the tool
#      is checked before the library is on crates.io. Needs crates.io's index.
# Builds go to a target directory of their own (target/publish, or
# $LE_PUBLISH_TARGET_DIR), with no RUSTFLAGS or coverage settings from the
# caller: instrumented builds would be wasted here and would not be what
# users build.
set -euo pipefail
cd "$(dirname "$0")/.."

# What `cargo llvm-cov show-env` (scripts/test.sh) or a caller may have set.
unset RUSTFLAGS RUSTDOCFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_ENCODED_RUSTDOCFLAGS \
    CARGO_BUILD_RUSTFLAGS CARGO_BUILD_RUSTDOCFLAGS RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER \
    CARGO_BUILD_RUSTC_WRAPPER CARGO_INCREMENTAL LLVM_PROFILE_FILE
for var in $(compgen -e); do
    case "$var" in CARGO_LLVM_COV* | __CARGO_LLVM_COV*) unset "$var" ;; esac
done
export CARGO_TARGET_DIR="${LE_PUBLISH_TARGET_DIR:-$PWD/target/publish}"

start=$SECONDS
step() { echo "-- publish-check: $1 (t+$((SECONDS - start)) s)"; }

# 1. The packages' files. Anything else (tests/, scripts/, a stray file)
# fails here: widen the allow-list only for a file users should get.
lib_allowed='^(\.cargo_vcs_info\.json|Cargo\.toml|Cargo\.toml\.orig|Cargo\.lock|LICENSE|README\.md|CHANGELOG\.md|BENCHMARKS\.md|src/[a-z0-9_/]+\.rs|docs/[a-z0-9-]+\.md|examples/[a-z0-9_]+(/[a-z0-9_]+)*\.rs)$'
lib_required='Cargo.toml src/lib.rs README.md LICENSE CHANGELOG.md'
cli_allowed='^(\.cargo_vcs_info\.json|Cargo\.toml|Cargo\.toml\.orig|Cargo\.lock|LICENSE|cli\.md|src/[a-z0-9_/]+\.rs)$'
cli_required='Cargo.toml src/main.rs LICENSE cli.md'
check_list() { # package, allowed regex, required files
    local list bad f err="$CARGO_TARGET_DIR/package-list.err"
    if ! list="$(cargo package --list --allow-dirty --locked -p "$1" 2>"$err")"; then
        cat "$err" >&2
        return 1
    fi
    bad="$(grep -Ev "$2" <<<"$list" || true)"
    if [ -n "$bad" ]; then
        echo "publish-check: $1's package holds files outside its allow-list:" >&2
        echo "$bad" >&2
        return 1
    fi
    for f in $3; do
        grep -qx "$f" <<<"$list" || { echo "publish-check: $1's package lacks $f" >&2; return 1; }
    done
    echo "$1: $(wc -l <<<"$list") files, all allowed"
}
step "package lists"
mkdir -p "$CARGO_TARGET_DIR"
check_list leaderelection "$lib_allowed" "$lib_required"
check_list leaderelection-cli "$cli_allowed" "$cli_required"

# 2. Documentation, warnings as errors.
step "cargo doc"
for features in "" postgres mysql storetest metrics; do
    echo "cargo doc -p leaderelection, features: ${features:-none}"
    RUSTDOCFLAGS="-D warnings" cargo doc --quiet --locked --no-deps -p leaderelection \
        --no-default-features ${features:+--features "$features"}
done
echo "cargo doc -p leaderelection --all-features (as docs.rs)"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --locked --no-deps -p leaderelection --all-features
echo "cargo doc -p leaderelection-cli"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --locked --no-deps -p leaderelection-cli

# 3. rust-version.
step "rust-version: clippy incompatible_msrv"
cargo clippy --quiet --locked -p leaderelection -p leaderelection-cli --all-features \
    --lib --bins --examples -- -A clippy::all -D clippy::incompatible_msrv
step "rust-version: dependencies (scripts/msrv-deps.py)"
python3 scripts/msrv-deps.py

# 4. The dry-run publish. --allow-dirty: what is checked is the tree as it
# is, committed or not. The "ignoring test ..." warnings (tests/ is left out
# on purpose, see Cargo.toml) are counted, not printed.
step "cargo publish --workspace --dry-run"
log="$CARGO_TARGET_DIR/publish-dry-run.log"
if ! cargo publish --workspace --dry-run --allow-dirty --locked >"$log" 2>&1; then
    cat "$log" >&2
    echo "publish-check: cargo publish --dry-run failed" >&2
    exit 1
fi
grep -Ev '^\s*(Compiling|Checking|Downloaded|Downloading) |ignoring test `' "$log" || true
echo "($(grep -c 'ignoring test `' "$log" || true) 'ignoring test' warnings: tests/ is not packaged; full log $log)"

step "done"
