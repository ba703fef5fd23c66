#!/usr/bin/env bash
# Builds the extension profile-guided (PGO), as `make build` and `make wheel` run it.
#
#   tools/build_extension.sh develop   the extension, with the test hooks, into $VIRTUAL_ENV
#   tools/build_extension.sh wheel DIR the abi3 wheel (no test hooks) into DIR
#
# `develop` builds the extension three steps at a time:
#   1. instrumented (rustc -Cprofile-generate, in target/pgo/instrumented), installed;
#   2. run on tools/pgo_train.py's traffic, which records how often each path runs;
#   3. built again with that profile (-Cprofile-use, merged by llvm-profdata
#      into target/pgo/encoder_cache.profdata), installed.
# `wheel` builds with the profile `develop` left. llvm-profdata comes with
# rustup's llvm-tools component, added when missing. Without it the extension
# is built plainly, with a warning: it works the same, more slowly.
# Output goes to target/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${VIRTUAL_ENV:?set VIRTUAL_ENV to the environment to build into}"
MATURIN="$VIRTUAL_ENV/bin/maturin"
PGO="$PWD/target/pgo"
PROFILE="$PGO/encoder_cache.profdata"
LOG=target/build.log
DEVELOP=(develop --release --extras test --features python,test-hooks)

mkdir -p target
fail() { cat "$LOG"; echo "build failed: $1 (log above, in $LOG)" >&2; exit 1; }

# llvm-profdata of the LLVM that rustc uses, or nothing.
profdata_tool() {
    local tool
    tool="$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/llvm-profdata"
    if [ ! -x "$tool" ] && command -v rustup >/dev/null; then
        rustup component add llvm-tools >> "$LOG" 2>&1 || true
    fi
    [ -x "$tool" ] && echo "$tool"
    return 0
}

develop() {
    : > "$LOG"
    local tool
    tool="$(profdata_tool)"
    if [ -z "$tool" ]; then
        echo "warning: llvm-profdata not found (rustup's llvm-tools component); building without the profile," >&2
        echo "         which works the same but is slower than BENCHMARKS.md measures" >&2
        rm -f "$PROFILE"
        "$MATURIN" "${DEVELOP[@]}" >> "$LOG" 2>&1 || fail "maturin develop"
        return
    fi
    echo "  1/3 instrumented build"
    CARGO_TARGET_DIR="$PGO/instrumented" RUSTFLAGS="-Cprofile-generate=$PGO/build-scripts" \
        "$MATURIN" "${DEVELOP[@]}" >> "$LOG" 2>&1 || fail "the instrumented build"
    echo "  2/3 training run (tools/pgo_train.py)"
    rm -rf "$PGO/raw"
    LLVM_PROFILE_FILE="$PGO/raw/train-%p-%m.profraw" "$VIRTUAL_ENV/bin/python" tools/pgo_train.py >> "$LOG" 2>&1 \
        || fail "the training run"
    "$tool" merge -o "$PROFILE" "$PGO/raw" >> "$LOG" 2>&1 || fail "llvm-profdata merge"
    echo "  3/3 build with the profile"
    RUSTFLAGS="-Cprofile-use=$PROFILE" "$MATURIN" "${DEVELOP[@]}" >> "$LOG" 2>&1 || fail "the profile-guided build"
}

wheel() {
    local out=$1
    rm -rf "$out"
    if [ -f "$PROFILE" ]; then
        RUSTFLAGS="-Cprofile-use=$PROFILE" "$MATURIN" build --release --out "$out" >> "$LOG" 2>&1 || fail "maturin build"
    else
        "$MATURIN" build --release --out "$out" >> "$LOG" 2>&1 || fail "maturin build"
    fi
}

case "${1:-}" in
    develop) develop ;;
    wheel) wheel "${2:?usage: $0 wheel DIR}" ;;
    *) echo "usage: $0 develop | wheel DIR" >&2; exit 2 ;;
esac
