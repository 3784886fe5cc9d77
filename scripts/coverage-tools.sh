#!/usr/bin/env bash
# Coverage tools for scripts/test.sh. Source it:
#   source scripts/coverage-tools.sh
# It installs what is missing and exports what cargo-llvm-cov needs:
#   - Debian's llvm-22 (apt-get): llvm-cov and llvm-profdata of the LLVM major
#     rustc 1.95 is built on (LLVM 22). Older ones cannot read its profiles
#     (llvm-14: "unsupported instrumentation profile format version"), and
#     rustup's llvm-tools component cannot be downloaded here.
#   - cargo-llvm-cov, pinned (cargo install --locked; builds on rustc 1.95).
# Exports LLVM_COV and LLVM_PROFDATA pointing at the llvm-22 tools.

le_cov_main() {
    local llvm=/usr/lib/llvm-22/bin
    local pin=0.9.1

    if [ ! -x "$llvm/llvm-cov" ] || [ ! -x "$llvm/llvm-profdata" ]; then
        echo "coverage-tools.sh: installing llvm-22" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y llvm-22 >/dev/null \
            || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y llvm-22 >/dev/null; } \
            || { echo "coverage-tools.sh: cannot install llvm-22" >&2; return 1; }
    fi

    if [ "$(cargo llvm-cov --version 2>/dev/null)" != "cargo-llvm-cov $pin" ]; then
        echo "coverage-tools.sh: installing cargo-llvm-cov $pin" >&2
        env -u CARGO_TARGET_DIR cargo install --quiet --locked --version "$pin" cargo-llvm-cov \
            || { echo "coverage-tools.sh: cannot install cargo-llvm-cov $pin" >&2; return 1; }
    fi

    export LLVM_COV="$llvm/llvm-cov"
    export LLVM_PROFDATA="$llvm/llvm-profdata"
}

le_cov_main || { echo "coverage-tools.sh: coverage tools setup failed" >&2; return 1 2>/dev/null || exit 1; }
