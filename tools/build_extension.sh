#!/usr/bin/env bash
# Builds the extension profile-guided (PGO), as `make build` and `make wheel` run it.
#
#   tools/build_extension.sh develop     the extension, with the test hooks, into $VIRTUAL_ENV
#   tools/build_extension.sh wheel DIR   the abi3 wheel (no test hooks) into DIR
#
# Each is built three steps at a time:
#   1. instrumented (rustc -Cprofile-generate, in target/pgo/instrumented-*);
#   2. run on tools/pgo_train.py's traffic, which records how often each path runs;
#   3. built again with that profile (-Cprofile-use; merged by llvm-profdata
#      into target/pgo/develop.profdata or wheel.profdata), failing if the
#      profile has no data for some of the build's functions.
# The two get a profile each: a build's functions are named after its cargo
# features, so a profile fits only the features it was recorded with.
# llvm-profdata comes with rustup's llvm-tools component, added when missing.
# Without it the extension is built plainly, with a warning: it works the
# same, more slowly. The wheel builds in target/wheel, the instrumented
# builds each in a directory of their own, so that neither build undoes the
# other's. Output goes to target/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${VIRTUAL_ENV:?set VIRTUAL_ENV to the environment to build into}"
MATURIN="$VIRTUAL_ENV/bin/maturin"
PYTHON="$VIRTUAL_ENV/bin/python"
PGO="$PWD/target/pgo"
LOG=target/build.log
DEVELOP=(develop --release --extras test --features python,test-hooks)
# The wheel, built in a target directory of its own.
WHEEL=(env CARGO_TARGET_DIR=target/wheel "$MATURIN" build --release)
# Instrumented builds into a target directory of their own: $1 names it.
instrumented() { env CARGO_TARGET_DIR="$PGO/instrumented-$1" RUSTFLAGS="-Cprofile-generate=$PGO/build-scripts" "${@:2}"; }

mkdir -p target
fail() { cat "$LOG"; echo "build failed: $1 (log above, in $LOG)" >&2; exit 1; }

# The RUSTFLAGS of a build with profile $1. LLVM names each function it finds no data for.
profiled() { echo "-Cprofile-use=$1 -Cllvm-args=-pgo-warn-missing-function"; }

# Runs a build with profile $1 (the rest: the command), then fails if LLVM found
# functions the profile has no data for: a profile recorded on another build
# (other cargo features, another rustc) fits none of the crate's functions,
# and the build would silently run at the plain build's speed.
with_profile() {
    local profile=$1 what=$2 log="$PGO/profiled.log" missing
    shift 2
    RUSTFLAGS="$(profiled "$profile")" "$@" > "$log" 2>&1 || { cat "$log" >> "$LOG"; fail "$what"; }
    cat "$log" >> "$LOG"
    missing=$(grep -c "no profile data available for function" "$log" || true)
    [ "$missing" -eq 0 ] || fail "$what: the profile has no data for $missing functions; was it recorded on this build?"
}

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

plain() {
    echo "warning: llvm-profdata not found (rustup's llvm-tools component); building without the profile," >&2
    echo "         which works the same but is slower than BENCHMARKS.md measures" >&2
}

# Runs the training on the package found first on PYTHONPATH (or installed),
# whose instrumented extension is $3, and merges its profile into $2. Skipped
# when that extension and the training script are the ones the profile was
# recorded with: rustc takes the profile file as an input of every crate, so
# rewriting it would rebuild them all.
train() {
    local tool=$1 profile=$2 key
    key="$(cat "$3" tools/pgo_train.py | sha256sum)"
    if [ -f "$profile" ] && [ "$(cat "$profile.key" 2>/dev/null)" = "$key" ]; then
        echo "  2/3 training run: the profile of this instrumented build is kept"
        return
    fi
    echo "  2/3 training run (tools/pgo_train.py)"
    rm -rf "$PGO/raw" "$profile.key"
    LLVM_PROFILE_FILE="$PGO/raw/train-%p-%m.profraw" "$PYTHON" tools/pgo_train.py >> "$LOG" 2>&1 \
        || fail "the training run"
    "$tool" merge -o "$profile" "$PGO/raw" >> "$LOG" 2>&1 || fail "llvm-profdata merge"
    echo "$key" > "$profile.key"
}

develop() {
    : > "$LOG"
    local tool
    tool="$(profdata_tool)"
    if [ -z "$tool" ]; then
        plain
        "$MATURIN" "${DEVELOP[@]}" >> "$LOG" 2>&1 || fail "maturin develop"
        return
    fi
    echo "  1/3 instrumented build"
    instrumented develop "$MATURIN" "${DEVELOP[@]}" >> "$LOG" 2>&1 || fail "the instrumented build"
    train "$tool" "$PGO/develop.profdata" python/encoder_cache/_core.abi3.so
    echo "  3/3 build with the profile"
    with_profile "$PGO/develop.profdata" "the profile-guided build" "$MATURIN" "${DEVELOP[@]}"
}

wheel() {
    local out=$1 tool unpacked="$PGO/wheel-instrumented"
    rm -rf "$out"
    tool="$(profdata_tool)"
    if [ -z "$tool" ]; then
        plain
        "${WHEEL[@]}" --out "$out" >> "$LOG" 2>&1 || fail "maturin build"
        return
    fi
    echo "  1/3 instrumented wheel"
    rm -rf "$unpacked"
    instrumented wheel "$MATURIN" build --release --out "$unpacked" >> "$LOG" 2>&1 || fail "the instrumented wheel"
    "$PYTHON" -m zipfile -e "$unpacked"/*.whl "$unpacked/site" || fail "unpacking the instrumented wheel"
    PYTHONPATH="$unpacked/site" train "$tool" "$PGO/wheel.profdata" "$unpacked/site/encoder_cache/_core.abi3.so"
    echo "  3/3 wheel with the profile"
    with_profile "$PGO/wheel.profdata" "the profile-guided wheel" "${WHEEL[@]}" --out "$out"
}

case "${1:-}" in
    develop) develop ;;
    wheel) wheel "${2:?usage: $0 wheel DIR}" ;;
    *) echo "usage: $0 develop | wheel DIR" >&2; exit 2 ;;
esac
