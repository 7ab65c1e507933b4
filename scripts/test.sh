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
# Every Debian 12 package this script, the tests and the interop suite call, installed before
# cargo runs (the tests also install a missing tool themselves, one by one, as a fallback).
# No crate links a C library (the only -sys crates are linux-raw-sys and windows-sys), so no
# pkg-config or -dev package beyond libc's is needed.
APT_PACKAGES=(
    # Rust's linker driver (cc) and libc's crt files and headers; the shim tests compile C
    # programs (tests/preload/*.c) with gcc.
    gcc libc6-dev
    # Root tests: namespaces and veth pairs (ip), TX checksum offload (ethtool), kill/sysctl.
    iproute2 ethtool procps
    # Kernel peers and tools the network tests run (tests/xdp_tcp.rs, tests/preload_programs.rs).
    python3 curl ca-certificates netcat-openbsd socat redis-server redis-tools nginx-light wrk
    iperf3
    # The shim's compatibility matrix (tools/tests/shim_matrix.rs): memcached with its
    # conformance suite and load generator (memccapable, memcaslap), and more servers with
    # other event loops and threading models.
    memcached libmemcached-tools lighttpd haproxy nodejs
    # Wire-level checks (tests/wire_tshark.rs, poll-driver's pcap test, interop captures).
    tshark
    # interop/run.sh and interop/build-guest.sh (which installs the same list itself when run
    # alone, plus the linux-headers package of the guest's kernel).
    qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest libibverbs-dev librdmacm-dev
    busybox-static kmod tcpdump cpio xz-utils zstd bc make
)
missing=()
if command -v dpkg-query >/dev/null; then
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
else
    echo "!!! no dpkg-query: not a Debian system; make sure these are installed: ${APT_PACKAGES[*]}" >&2
fi
if [ "${#missing[@]}" -eq 0 ]; then
    :
elif [ "$(id -u)" = 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "!!! not root: not installing ${missing[*]}" >&2
    echo "!!! root-only tests will be SKIPPED loudly; others may fail without these tools" >&2
fi

# --- Rust toolchain --------------------------------------------------------------------------
# rust-toolchain.toml pins the toolchain (with rustfmt and clippy); rustup installs it on the
# first cargo command in this tree. This script installs neither rustup nor Rust.
if ! command -v cargo >/dev/null; then
    cat >&2 <<'MSG'
!!! cargo not found. Install rustup, the Rust project's toolchain installer (Debian 12 has no package for it),
!!! put ~/.cargo/bin on PATH and rerun: the first cargo command in this repository then
!!! installs the toolchain that rust-toolchain.toml pins, rustfmt and clippy included.
MSG
    exit 1
fi
log "toolchain: $(cargo --version), $(rustc --version)"

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

log "fuzz smoke pass (cargo-fuzz, every target, a printed random seed each)"
# The seed corpus also replays on stable in `cargo test -p xwarp-fuzz` above. A failure
# prints the seed, the input (hex) and the command that replays it.
if cargo +nightly --version >/dev/null 2>&1; then
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
    fuzz/campaign.sh --smoke "${XWARP_FUZZ_SECONDS:-5}"
else
    echo "SKIPPED: fuzz smoke pass: no nightly toolchain (rustup toolchain install nightly)"
fi

log "kernel-siw interop suite (VM)"
./interop/run.sh

log "done"
