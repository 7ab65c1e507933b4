#!/usr/bin/env bash
# The whole xwarp test suite, as CI runs it (.ci/run calls exactly this script).
# Run as root on a fresh Debian machine: it installs what it needs (idempotently), then runs
# formatting and lint checks, every unit/integration/property test (root tests included:
# network namespaces, veth, AF_XDP), the wire-level tshark checks and a short fuzz pass.
# Unprivileged runs work too; tests that need root then print a loud SKIPPED line.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n=== %s\n' "$*"; }

# --- system packages -------------------------------------------------------------------------
APT_PACKAGES=(tshark iproute2 ethtool procps curl netcat-openbsd socat python3 ca-certificates)
if [ "$(id -u)" = 0 ]; then
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
else
    echo "!!! not root: system packages not installed; root-only tests will be SKIPPED loudly" >&2
fi

command -v cargo >/dev/null || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }

# --- static checks ---------------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# --- tests -----------------------------------------------------------------------------------
log "cargo test (workspace)"
# Root tests create namespaces and attach XDP programs: run test binaries one test at a time
# only where they ask for it (they serialise themselves); everything else runs in parallel.
cargo test --workspace --release --no-fail-fast

log "fuzz harness (short pass over every target)"
cargo run --release -q -p xwarp-fuzz -- --all --seconds "${XWARP_FUZZ_SECONDS:-10}"

log "kernel-siw interop suite (VM)"
./interop/run.sh

log "done"
