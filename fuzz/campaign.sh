#!/usr/bin/env bash
# Coverage-guided fuzz campaign over every xwarp fuzz target (cargo-fuzz / libFuzzer).
#
#   fuzz/campaign.sh [--runs N] [TARGET...]      campaign: N executions per target (10^7)
#   fuzz/campaign.sh --smoke [SECONDS] [TARGET...]  CI smoke pass: SECONDS per target (5)
#
# Options: --max-seconds T (stop a target after T seconds even short of N runs),
# --seed S (default: a fresh random seed per target, always printed so a failure
# replays with --seed), --jobs J (targets run side by side, default 1).
# Environment: FUZZ_SANITIZER (none|address, default none: the code under test has no
# unsafe on these paths and ASan halves the speed), FUZZ_WORK (work corpus, crashes and
# logs; default $CARGO_TARGET_DIR/fuzz-work or target/fuzz-work).
#
# The seed corpus is fuzz/corpus/<target>/ (copied into the work corpus, which keeps what
# a campaign finds across runs; the repository's corpus is never written). For each target
# the script prints executions, libFuzzer's coverage (cov: edges, ft: features), the new
# corpus entries of this run and any crash, with the input's path and hex and the command
# that replays it. Exit status 1 if any target crashed.
#
# Needs a nightly toolchain (the repository pins stable; `cargo +nightly` overrides it);
# without one it prints SKIPPED and exits 0. Installs cargo-fuzz when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS=(mpa_frame mpa_negotiator fpdu rdmap_rx conn mpa_pending tcp_frames)
runs=10000000
smoke=""
seed=""
jobs=1
maxsec=""
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --smoke)
            smoke=5
            if [ $# -gt 1 ] && [[ "$2" =~ ^[0-9]+$ ]]; then smoke="$2"; shift; fi
            shift ;;
        --seed) seed="$2"; shift 2 ;;
        --max-seconds) maxsec="$2"; shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED: fuzz campaign needs a nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

sanitizer="${FUZZ_SANITIZER:-none}"
tdir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
work="${FUZZ_WORK:-${CARGO_TARGET_DIR:-$PWD/target}/fuzz-work}"
mkdir -p "$work"
triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bindir="$tdir/$triple/release"

echo "building fuzz targets (nightly, sanitizer $sanitizer, overflow checks + debug assertions)"
# cargo fuzz build takes one target or all: build all when several are asked for.
one=()
[ ${#targets[@]} -eq 1 ] && one=("${targets[0]}")
cargo +nightly fuzz build --fuzz-dir fuzz/libfuzzer -s "$sanitizer" --target-dir "$tdir" \
    "${one[@]}" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }

dict_for() {
    case "$1" in
        mpa_frame|mpa_negotiator|conn|mpa_pending) echo "-dict=fuzz/dict/mpa.dict" ;;
        fpdu|rdmap_rx) echo "-dict=fuzz/dict/ddp.dict" ;;
        *) echo "" ;;
    esac
}

run_one() {
    local t="$1" s="$2" corp="$work/corpus/$t" art="$work/artifacts/$t" log="$work/$t.log"
    mkdir -p "$corp" "$art"
    cp -n fuzz/corpus/"$t"/* "$corp"/ 2>/dev/null || true
    local before
    before=$(find "$corp" -type f | wc -l)
    local limit=(-runs="$runs")
    [ -n "$maxsec" ] && limit+=(-max_total_time="$maxsec")
    [ -n "$smoke" ] && limit=(-max_total_time="$smoke")
    local rc=0
    # shellcheck disable=SC2046
    "$bindir/$t" "${limit[@]}" -seed="$s" -print_final_stats=1 -max_len=4096 -timeout=20 \
        -rss_limit_mb=2048 -artifact_prefix="$art/" $(dict_for "$t") "$corp" >"$log" 2>&1 || rc=$?
    local after
    after=$(find "$corp" -type f | wc -l)
    local execs cov ft
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    local crash="-"
    if [ "$rc" -ne 0 ]; then
        crash=$(find "$art" -type f -newer "$work/build.log" | head -1)
        crash="${crash:-exit $rc}"
    fi
    printf '%-15s %12s %7s %7s %6s->%-6s %6s  seed %-11s %s\n' "$t" "${execs:-?}" "${cov:-?}" \
        "${ft:-?}" "$before" "$after" "+$((after - before))" "$s" "$crash" >"$work/$t.row"
    if [ "$rc" -ne 0 ]; then
        {
            echo "CRASH in $t (seed $s): $crash"
            grep -m1 -A3 'panicked at' "$log" || tail -20 "$log"
            [ -f "$crash" ] && echo "input (hex): $(od -An -tx1 -v "$crash" | tr -d ' \n' | head -c 2000)"
            echo "replay: $bindir/$t $crash   (or: cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer $t $crash)"
        } >"$work/$t.crash"
        return 1
    fi
}

failed=0
pids=()
for t in "${targets[@]}"; do
    s="${seed:-$(( (RANDOM << 15 | RANDOM) % 2147483647 + 1 ))}"
    echo "fuzz $t: seed $s"
    rm -f "$work/$t.row" "$work/$t.crash"
    run_one "$t" "$s" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
done
for p in "${pids[@]}"; do wait "$p" || true; done

mode="campaign, $runs runs per target"
[ -n "$smoke" ] && mode="smoke, $smoke s per target"
echo
echo "fuzz results ($mode; logs in $work)"
printf '%-15s %12s %7s %7s %14s %6s  %-16s %s\n' target execs cov ft "corpus" new seed crash
for t in "${targets[@]}"; do
    cat "$work/$t.row" 2>/dev/null || printf '%-15s (no result)\n' "$t"
    if [ -f "$work/$t.crash" ]; then failed=1; fi
done
for t in "${targets[@]}"; do
    [ -f "$work/$t.crash" ] && { echo; cat "$work/$t.crash"; }
done
exit "$failed"
