#!/usr/bin/env bash
# Lists the libibverbs/librdmacm symbols (with their symbol versions) that Debian 12's
# rdma-core and perftest programs import, as the Markdown table of ibverbs/README.md.
# Usage: ibverbs/scripts/abi-inventory.sh [PROGRAM...]   (default: the programs of issue 12)
# Needs binutils (nm) and the packages rdmacm-utils, ibverbs-utils, perftest.
set -euo pipefail
programs=("$@")
if [ "${#programs[@]}" -eq 0 ]; then
    programs=(rping ucmatose udaddy rdma_server rdma_client ibv_devices ibv_devinfo
        ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_send_lat)
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for p in "${programs[@]}"; do
    path=$(command -v "$p" || true)
    if [ -z "$path" ]; then
        echo "abi-inventory: $p is not installed" >&2
        exit 1
    fi
    # Undefined dynamic symbols look like "U ibv_open_device@IBVERBS_1.1".
    nm -D --undefined-only --with-symbol-versions "$path" |
        awk -v prog="$p" '$1 == "U" || $1 == "w" { n = split($2, a, "@"); sym = a[1]; ver = (n > 1 ? a[n] : "-");
            if (sym ~ /^(ibv_|rdma_|IBV_|_ibv_|__ibv_)/) print sym "\t" ver "\t" prog }' >>"$tmp"
done
echo "| symbol | version | imported by |"
echo "|---|---|---|"
sort -u "$tmp" | awk -F'\t' '
    { key = $1 "\t" $2; if (!(key in progs)) { order[++n] = key; progs[key] = $3 } else progs[key] = progs[key] ", " $3 }
    END { for (i = 1; i <= n; i++) { split(order[i], k, "\t"); printf "| `%s` | %s | %s |\n", k[1], k[2], progs[order[i]] } }'
