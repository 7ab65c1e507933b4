#!/usr/bin/env bash
# Build (or reuse) the kernel-siw guest for the interop suite.
#
# Output, all under interop/build/ (git-ignored):
#   vmlinux            Debian's stock kernel, decompressed (booted directly via PVH)
#   initramfs.cpio.gz  busybox + rdma-core tools + kernel modules + siw.ko + siw-crc.ko + /init
#   stamp              what the above was built from; a matching stamp means "reuse"
#
# Facts this follows: docs/testing.md §6.4. No Debian kernel ships siw, so
# siw.ko is built out of tree from linux-source against the matching linux-headers.
# Two variants: siw.ko (upstream defaults) and siw-crc.ko (mpa_crc_required = true,
# docs/siw.md §4.1) for the CRC-negotiation cases.
#
# Usage: interop/build-guest.sh [--force]     (run as root; apt-get is used)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

T0=$(date +%s.%N)
tlast=$T0
step() { # step NAME: print the time spent since the previous step
    local now
    now=$(date +%s.%N)
    printf '[build-guest] %-28s %6.1f s (total %6.1f s)\n' "$1" \
        "$(echo "$now - $tlast" | bc)" "$(echo "$now - $T0" | bc)"
    tlast=$now
}
die() { echo "[build-guest] ERROR: $*" >&2; exit 1; }
log() { echo "[build-guest] $*"; }

[[ $(id -u) -eq 0 ]] || die "must run as root (apt-get, depmod into the build root)"
export DEBIAN_FRONTEND=noninteractive

# ---------------------------------------------------------------- host packages
HOST_PKGS=(qemu-system-x86 rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
    busybox-static kmod tcpdump tshark iproute2 cpio xz-utils zstd bc make gcc)
APT_UPDATED=0
apt_update_once() {
    if [[ $APT_UPDATED -eq 0 ]]; then
        log "apt-get update"
        nice -n 10 apt-get update -q >/dev/null
        APT_UPDATED=1
    fi
}
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# The task asks for apt-get update first; skip it only when nothing is missing and the
# kernel metapackage can already be resolved from the current lists.
missing=()
for p in "${HOST_PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
if [[ ${#missing[@]} -gt 0 ]] || ! apt-cache depends linux-image-amd64 2>/dev/null | grep -q 'Depends: linux-image-'; then
    apt_update_once
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing: ${missing[*]}"
    nice -n 10 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
step "host packages"

# ---------------------------------------------------------------- kernel version
# Resolve the kernel from the linux-image-amd64 metapackage at run time (docs/testing.md §6.4.1).
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[[ -n "$KPKG" ]] || die "cannot resolve linux-image-amd64"
KVER=${KPKG#linux-image-}                                    # e.g. 6.1.0-57-amd64
DEBVER=$(apt-cache policy "$KPKG" | awk '/Candidate:/{print $2}')  # e.g. 6.1.192-3
[[ -n "$DEBVER" && "$DEBVER" != "(none)" ]] || die "no candidate for $KPKG"
MAJMIN=$(echo "$DEBVER" | sed -E 's/^([0-9]+\.[0-9]+).*/\1/')
SRCPKG="linux-source-$MAJMIN"
HDRPKG="linux-headers-$KVER"
log "kernel $KPKG $DEBVER (source $SRCPKG, headers $HDRPKG)"

# ---------------------------------------------------------------- stamp
tool_versions() {
    for p in rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest busybox-static iproute2; do
        dpkg-query -W -f='${Package}=${Version} ' "$p"
    done
}
STAMP_WANT="kernel=$KPKG=$DEBVER
tools=$(tool_versions)
scripts=$(cat "$HERE/build-guest.sh" "$HERE/guest-init.sh" | sha256sum | cut -d' ' -f1)"
if [[ $FORCE -eq 0 && -f "$BUILD/stamp" && -s "$BUILD/vmlinux" && -s "$BUILD/initramfs.cpio.gz" ]] &&
    [[ "$(cat "$BUILD/stamp")" == "$STAMP_WANT" ]]; then
    log "guest is up to date (stamp matches); reusing $BUILD"
    step "done (cached)"
    exit 0
fi
log "building guest (stamp missing or stale)"
rm -f "$BUILD/stamp"
mkdir -p "$BUILD/dl"

# ---------------------------------------------------------------- headers + downloads
if ! pkg_installed "$HDRPKG"; then
    apt_update_once
    log "installing $HDRPKG"
    nice -n 10 apt-get install -y -q --no-install-recommends "$HDRPKG" >/dev/null
fi
fetch_deb() { # fetch_deb PKG VERSION -> prints path of the .deb in build/dl
    local pkg=$1 ver=$2 f
    f=$(ls "$BUILD/dl/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    if [[ -z "$f" ]]; then
        (cd "$BUILD/dl" && nice -n 10 apt-get download -q -o APT::Sandbox::User=root "$pkg=$ver" >/dev/null) ||
            { apt_update_once; (cd "$BUILD/dl" && nice -n 10 apt-get download -q -o APT::Sandbox::User=root "$pkg=$ver" >/dev/null); }
        f=$(ls "$BUILD/dl/${pkg}_${ver//:/%3a}_"*.deb | head -1)
    fi
    echo "$f"
}
IMGDEB=$(fetch_deb "$KPKG" "$DEBVER")
SRCDEB=$(fetch_deb "$SRCPKG" "$DEBVER")
# Drop downloads of other versions (a kernel update leaves stale .debs behind).
for f in "$BUILD"/dl/*.deb; do
    [[ "$f" == "$IMGDEB" || "$f" == "$SRCDEB" ]] || rm -f "$f"
done
step "headers + downloads"

# ---------------------------------------------------------------- kernel image tree
# Extract (not install: no initramfs/grub hooks on the host) and create modules.dep.
KROOT="$BUILD/kroot"
rm -rf "$KROOT"
mkdir -p "$KROOT"
dpkg-deb -x "$IMGDEB" "$KROOT"
# Debian ships modules under /lib/modules (bookworm) or /usr/lib/modules (later).
MODDIR=$(ls -d "$KROOT"/lib/modules/"$KVER" "$KROOT"/usr/lib/modules/"$KVER" 2>/dev/null | head -1 || true)
[[ -n "$MODDIR" ]] || die "no modules dir for $KVER in $IMGDEB"
VMLINUZ="$KROOT/boot/vmlinuz-$KVER"
[[ -f "$VMLINUZ" ]] || die "no vmlinuz in $IMGDEB"
step "extract kernel image"

# ---------------------------------------------------------------- siw source
SRCDIR="$BUILD/src"
rm -rf "$SRCDIR"
mkdir -p "$SRCDIR"
dpkg-deb --fsys-tarfile "$SRCDEB" | tar -x -C "$SRCDIR" --wildcards './usr/src/linux-source-*.tar.*'
TARBALL=$(ls "$SRCDIR"/usr/src/linux-source-*.tar.* | head -1)
TOP=$(basename "$TARBALL" | sed -E 's/\.tar\..*//')           # linux-source-6.1
nice -n 10 tar -x -C "$SRCDIR" -f "$TARBALL" \
    "$TOP/drivers/infiniband/sw/siw" "$TOP/scripts/extract-vmlinux"
rm -rf "${SRCDIR:?}/usr"
SIWSRC="$SRCDIR/$TOP/drivers/infiniband/sw/siw"
[[ -f "$SIWSRC/siw_main.c" ]] || die "siw sources missing from $TARBALL"
step "extract siw source"

# ---------------------------------------------------------------- build siw.ko variants
KBUILD="/usr/src/linux-headers-$KVER"
[[ -d "$KBUILD" ]] || die "$KBUILD missing"
build_siw() { # build_siw DIR
    nice -n 10 make -s -C "$KBUILD" M="$1" CONFIG_RDMA_SIW=m modules >"$1/build.log" 2>&1 ||
        { cat "$1/build.log" >&2; die "siw build failed in $1"; }
    [[ -f "$1/siw.ko" ]] || die "no siw.ko in $1"
}
rm -rf "$BUILD/siw-default" "$BUILD/siw-crc"
cp -r "$SIWSRC" "$BUILD/siw-default"
cp -r "$SIWSRC" "$BUILD/siw-crc"
# Variant: require CRC as MPA initiator and responder (docs/siw.md §4.1, mpa_crc_required).
# The declaration is `const bool mpa_crc_required;` or `... = false;` depending on version.
sed -i -E 's/^(const bool mpa_crc_required)( = false)?;/\1 = true;/' "$BUILD/siw-crc/siw_main.c"
grep -q '^const bool mpa_crc_required = true;' "$BUILD/siw-crc/siw_main.c" ||
    die "could not flip mpa_crc_required in siw_main.c (declaration changed?)"
build_siw "$BUILD/siw-default" &
p1=$!
build_siw "$BUILD/siw-crc" &
p2=$!
wait $p1 || die "siw-default build failed"
wait $p2 || die "siw-crc build failed"
step "build siw.ko x2"

# ---------------------------------------------------------------- vmlinux
# Uses the kernel tree's own scripts/extract-vmlinux (finds the compressed payload in
# vmlinuz and decompresses it until an ELF comes out).
sh "$SRCDIR/$TOP/scripts/extract-vmlinux" "$VMLINUZ" >"$BUILD/vmlinux.tmp" ||
    die "extract-vmlinux failed"
head -c 4 "$BUILD/vmlinux.tmp" | grep -q 'ELF' || die "extracted vmlinux is not ELF"
mv "$BUILD/vmlinux.tmp" "$BUILD/vmlinux"
step "extract vmlinux"

# ---------------------------------------------------------------- module list
# Put siw into the tree so depmod/modprobe compute the load order for us
# (docs/testing.md §6.4.2 lists the expected result).
mkdir -p "$MODDIR/extra"
cp "$BUILD/siw-default/siw.ko" "$MODDIR/extra/siw.ko"
depmod -b "$KROOT" "$KVER"
# crc32c_generic / crc32c_intel are soft needs of siw (crypto "crc32c" is looked up by name,
# and the guest has no modprobe helper), so they are named explicitly.
WANT_MODS=(virtio_pci virtio_net crc32c_generic crc32c_intel libcrc32c siw ib_uverbs rdma_ucm)
ORDER=()
for m in "${WANT_MODS[@]}"; do
    while read -r kw path _; do
        [[ "$kw" == insmod ]] || continue
        name=$(basename "$path")
        name=${name%%.ko*}
        [[ " ${ORDER[*]-} " == *" $name "* ]] || ORDER+=("$name")
    done < <(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>/dev/null || die "modprobe cannot resolve $m")
done
log "module order: ${ORDER[*]}"
step "module order"

# ---------------------------------------------------------------- initramfs
IRD="$BUILD/initramfs"
rm -rf "$IRD"
mkdir -p "$IRD"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib/modules,usr/bin,usr/lib}
cp /bin/busybox "$IRD/bin/busybox"
for a in $("$IRD/bin/busybox" --list); do
    [[ -e "$IRD/bin/$a" ]] || ln -s busybox "$IRD/bin/$a"
done
# Kernel modules, decompressed if needed (busybox insmod takes plain .ko).
: >"$IRD/lib/modules/order"
for name in "${ORDER[@]}"; do
    if [[ "$name" == siw ]]; then
        echo siw >>"$IRD/lib/modules/order"   # variant chosen by /init
        continue
    fi
    src=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$name" | awk '$1=="insmod"{p=$2} END{print p}')
    case "$src" in
    *.ko) cp "$src" "$IRD/lib/modules/$name.ko" ;;
    *.ko.xz) xz -dc "$src" >"$IRD/lib/modules/$name.ko" ;;
    *.ko.zst) zstd -qdc "$src" >"$IRD/lib/modules/$name.ko" ;;
    *.ko.gz) gzip -dc "$src" >"$IRD/lib/modules/$name.ko" ;;
    *) die "unknown module file $src" ;;
    esac
    echo "$name" >>"$IRD/lib/modules/order"
done
cp "$BUILD/siw-default/siw.ko" "$IRD/lib/modules/siw.ko"
cp "$BUILD/siw-crc/siw.ko" "$IRD/lib/modules/siw-crc.ko"

# RDMA tools + their libraries (ldd), libgcc_s.so.1 (pthread_exit needs it; ldd does not
# list it), the siw verbs provider and its .driver file (docs/testing.md §6.4.2).
TOOLS=(rdma ibv_devices ibv_devinfo rping rdma_server rdma_client ucmatose)
for t in /usr/bin/ib_*_bw /usr/bin/ib_*_lat; do TOOLS+=("$(basename "$t")"); done
LIBDIR=/usr/lib/x86_64-linux-gnu
PROVIDER=$(ls "$LIBDIR"/libibverbs/libsiw-rdmav*.so | head -1)
[[ -f "$PROVIDER" ]] || die "siw verbs provider missing (ibverbs-providers)"
[[ -f /etc/libibverbs.d/siw.driver ]] || die "/etc/libibverbs.d/siw.driver missing"
copy_file() { # copy_file PATH: copy into the initramfs at the same (resolved) path
    local dst="$IRD$1"
    mkdir -p "$(dirname "$dst")"
    [[ -e "$dst" ]] || cp -L "$1" "$dst"
}
ELFS=()
for t in "${TOOLS[@]}"; do
    p=$(command -v "$t") || die "tool $t not found"
    copy_file "$p"
    ELFS+=("$p")
done
copy_file "$PROVIDER"
ELFS+=("$PROVIDER")
copy_file /etc/libibverbs.d/siw.driver
GCCS=$(ls "$LIBDIR"/libgcc_s.so.1 /lib/x86_64-linux-gnu/libgcc_s.so.1 2>/dev/null | head -1)
[[ -n "$GCCS" ]] || die "libgcc_s.so.1 missing"
copy_file "$GCCS"
for e in "${ELFS[@]}"; do
    while read -r lib; do
        [[ -n "$lib" ]] && copy_file "$lib"
    done < <(ldd "$e" | awk '/=> \//{print $3} /^\t\/lib/{print $1}')
done
# Debian is merged-/usr: make /lib/x86_64-linux-gnu and /usr/lib/... the same directory.
if [[ -d "$IRD/lib/x86_64-linux-gnu" ]]; then
    cp -a "$IRD/lib/x86_64-linux-gnu/." "$IRD/usr/lib/x86_64-linux-gnu/" 2>/dev/null || true
    rm -rf "$IRD/lib/x86_64-linux-gnu"
fi
mkdir -p "$IRD/usr/lib/x86_64-linux-gnu"
ln -s ../usr/lib/x86_64-linux-gnu "$IRD/lib/x86_64-linux-gnu"
if [[ -d "$IRD/lib64" ]]; then :; else mkdir -p "$IRD/lib64"; fi
[[ -e "$IRD/lib64/ld-linux-x86-64.so.2" ]] || cp -L /lib64/ld-linux-x86-64.so.2 "$IRD/lib64/"
# usr/bin and usr/sbin tools reachable from PATH
cp "$HERE/guest-init.sh" "$IRD/init"
chmod 755 "$IRD/init"
echo "$KVER" >"$IRD/etc/kernel-release"
(cd "$IRD" && find . -print0 | sort -z | cpio --null -o -H newc --quiet) | gzip -6 >"$BUILD/initramfs.cpio.gz.tmp"
mv "$BUILD/initramfs.cpio.gz.tmp" "$BUILD/initramfs.cpio.gz"
step "initramfs"

# Keep the cache lean: the kernel tree is only needed for the module list (done).
rm -rf "$KROOT" "$SRCDIR" "$IRD"
echo "$STAMP_WANT" >"$BUILD/stamp"
log "vmlinux $(du -h "$BUILD/vmlinux" | cut -f1), initramfs $(du -h "$BUILD/initramfs.cpio.gz" | cut -f1)"
step "done (built)"
