#!/usr/bin/env bash
# The siw interop suite: build (or reuse) the kernel-siw guest, run every case, print a table.
#
# Usage: interop/run.sh [CASE ...]     CASE = a file name under interop/cases/ without .py
# Exit: 0 if every case passed (or the suite was SKIPPED for a missing capability), 1 otherwise.
# Last line: "N passed, N failed" (", N skipped" when skipped).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RESULTS="$HERE/build/results"
CASE_TIMEOUT=${INTEROP_CASE_TIMEOUT:-300}   # hard bound per case (s); cases bound themselves too

if [[ $# -gt 0 ]]; then
    CASES=("$@")
else
    CASES=()
    for f in "$HERE"/cases/*.py; do
        n=$(basename "$f" .py)
        [[ "$n" == common ]] || CASES+=("$n")
    done
fi

skip() {
    echo "SKIPPED: siw interop suite: $* -- ${#CASES[@]} case(s) not run"
    echo "0 passed, 0 failed, ${#CASES[@]} skipped"
    exit 0
}
# Skip loudly, and only when a capability is truly absent.
[[ $(id -u) -eq 0 ]] || skip "not root (needs network namespaces, tap devices and apt-get)"
[[ -c /dev/net/tun ]] || skip "/dev/net/tun is absent (no tap devices)"

child=""
on_signal() {
    echo "run.sh: interrupted, stopping ${child:-nothing}" >&2
    [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null && wait "$child"
    exit 130
}
trap on_signal INT TERM

t_suite=$(date +%s.%N)
echo "== build guest"
t0=$(date +%s.%N)
"$HERE/build-guest.sh" &
child=$!
wait $child
brc=$?
child=""
build_s=$(echo "$(date +%s.%N) - $t0" | bc)
if [[ $brc -ne 0 ]]; then
    echo "FAIL build-guest.sh (rc=$brc) -- no case can run"
    echo "0 passed, ${#CASES[@]} failed"
    exit 1
fi
python3 "$HERE/vm.py" --cleanup

# Every xwarp-tools binary the cases run, built once here so that no case spends its
# CASE_TIMEOUT compiling (`cargo test --workspace` builds them with the whole workspace's
# features, so a case's own `cargo build -p xwarp-tools --bin ...` would rebuild crates).
# The cases still call cargo (then a no-op) so that each also runs alone.
echo "== build xwarp-tools binaries"
t0=$(date +%s.%N)
(cd "$HERE/.." && cargo build --release -q -p xwarp-tools --bins) &
child=$!
wait $child
trc=$?
child=""
echo "   built in $(echo "$(date +%s.%N) - $t0" | bc) s (rc=$trc)"

mkdir -p "$RESULTS"
passed=0
failed=0
rows=()
for n in "${CASES[@]}"; do
    f="$HERE/cases/$n.py"
    echo "== case $n"
    t0=$(date +%s.%N)
    if [[ ! -f "$f" ]]; then
        rc=127
        echo "no such case: $f"
    else
        timeout --signal=TERM --kill-after=15 "$CASE_TIMEOUT" \
            python3 "$f" --out "$RESULTS" >"$RESULTS/$n.log" 2>&1 &
        child=$!
        wait $child
        rc=$?
        child=""
        cat "$RESULTS/$n.log"
    fi
    dt=$(echo "$(date +%s.%N) - $t0" | bc)
    if [[ $rc -eq 0 ]] && grep -q "^PASS $n" "$RESULTS/$n.log"; then
        passed=$((passed + 1))
        rows+=("$(printf '%-28s %-5s %7.1f s' "$n" PASS "$dt")")
    else
        failed=$((failed + 1))
        why="rc=$rc"
        [[ $rc -eq 124 ]] && why="timeout after ${CASE_TIMEOUT} s"
        rows+=("$(printf '%-28s %-5s %7.1f s  (%s, log %s)' "$n" FAIL "$dt" "$why" "$RESULTS/$n.log")")
    fi
done
python3 "$HERE/vm.py" --cleanup

total_s=$(echo "$(date +%s.%N) - $t_suite" | bc)
echo
echo "== siw interop suite (guest build/reuse $(printf '%.1f' "$build_s") s, total $(printf '%.1f' "$total_s") s)"
printf '%-28s %-5s %9s\n' CASE RESULT TIME
for r in "${rows[@]}"; do echo "$r"; done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
