#!/usr/bin/env bash
# Builds the real-VMX initramfs: Debian's `perf` (package linux-perf) with the shared libraries
# it links, a static /init (initramfs/init.c) that runs `perf record -e instructions:pp` and
# `perf report --stdio` on a static workload (initramfs/workload.c), as an uncompressed newc
# cpio. Boot it with the same vmlinux: vmm run --kernel vmlinux --initrd <cpio> (no
# vpmu_selftest.fmt=, so the kernel self-test stays out of the way). It cannot run on the
# development host, whose guest user space cannot make system calls (README.md).
#
# Usage: perf-initramfs.sh OUTPUT.cpio
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:?usage: perf-initramfs.sh OUTPUT.cpio}"

die() { echo "error: $*" >&2; exit 1; }

need=()
command -v perf >/dev/null || need+=(linux-perf)
command -v cpio >/dev/null || need+=(cpio)
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
    echo "perf-initramfs: apt-get install ${need[*]}"
    apt-get update -qq || die "'apt-get update' failed; install ${need[*]} by hand"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
        || die "'apt-get install ${need[*]}' failed; install them by hand"
fi
perf_bin="$(readlink -f "$(command -v perf)")"
[ "$(head -c 4 "$perf_bin" | tail -c 3)" = ELF ] \
    || die "$perf_bin is not an ELF binary (a wrapper script?); point PATH at the real perf"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,usr/bin,proc,sys,dev,tmp}
gcc -static -O2 -Wall -o "$stage/init" "$HERE/initramfs/init.c"
# -g: perf report resolves the workload's symbols from the binary in the image.
gcc -static -O2 -g -Wall -o "$stage/bin/vpmu-workload" "$HERE/initramfs/workload.c"
cp "$perf_bin" "$stage/usr/bin/perf"

# perf's shared libraries and the dynamic loader, at the paths ldd reports.
ldd "$perf_bin" | awk '/=> \//{print $3} /^\t\/.*ld-linux/{print $1}' | sort -u | while read -r lib; do
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
done
[ -e /lib64/ld-linux-x86-64.so.2 ] && { mkdir -p "$stage/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$stage/lib64/"; }

(cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet) >"$out"
echo "perf-initramfs: $out ($(du -h "$out" | cut -f1), perf $("$perf_bin" --version 2>/dev/null | awk '{print $3}'))"
