#!/bin/sh
# /init of the interop guest (busybox). Copied into the initramfs by build-guest.sh.
#
# Kernel command line parameters read here (set by vm.py):
#   xw.cmd=<base64>    shell command to run (required)
#   xw.siw=default|crc which siw.ko to load (siw.ko or siw-crc.ko; default: default)
#   xw.ip=A.B.C.D/NN   guest address on eth0 (default 10.77.0.2/24)
# Output contract (parsed by vm.py): the line "XWARP-GUEST-EXIT rc=<N>" after the command,
# or "XWARP-GUEST-SETUP-FAILED <reason>" if the guest could not be prepared.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /dev/shm

fail() {
    echo "XWARP-GUEST-SETUP-FAILED $*"
    poweroff -f
    sleep 10
}

arg() { # arg NAME: value of NAME=... on the kernel command line
    for w in $(cat /proc/cmdline); do
        case "$w" in "$1="*) echo "${w#*=}"; return 0 ;; esac
    done
    return 1
}

SIW=$(arg xw.siw || echo default)
IP=$(arg xw.ip || echo 10.77.0.2/24)
CMD_B64=$(arg xw.cmd) || fail "no xw.cmd on the kernel command line"
CMD=$(echo "$CMD_B64" | base64 -d) || fail "xw.cmd is not base64"

case "$SIW" in
default) SIWKO=/lib/modules/siw.ko ;;
crc) SIWKO=/lib/modules/siw-crc.ko ;;
*) fail "unknown xw.siw=$SIW" ;;
esac

# Load modules in the order computed by build-guest.sh (modprobe --show-depends).
for m in $(cat /lib/modules/order); do
    if [ "$m" = siw ]; then ko=$SIWKO; else ko=/lib/modules/$m.ko; fi
    out=$(insmod "$ko" 2>&1) || {
        case "$out" in
        *"File exists"*) ;;
        *) case "$m" in
            crc32c_intel | crc32c-intel) echo "xw-init: warning: insmod $m: $out" ;;  # optional accelerator
            *) fail "insmod $m: $out" ;;
            esac ;;
        esac
    }
done
echo "xw-init: modules loaded (siw variant: $SIW)"

ip link set lo up
ip link set eth0 up || fail "no eth0"
ip addr add "$IP" dev eth0 || fail "cannot address eth0"
rdma link add siw0 type siw netdev eth0 || fail "rdma link add siw0 failed"
echo "xw-init: eth0 $IP, siw0 on eth0"
echo "XWARP-GUEST-READY"

echo "xw-init: running: $CMD"
sh -c "$CMD"
rc=$?
echo "XWARP-GUEST-EXIT rc=$rc"
poweroff -f
sleep 10
