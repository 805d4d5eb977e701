#!/usr/bin/env bash
# Builds the guest kernel (uncompressed vmlinux with a PVH entry) from Debian's
# linux-source-6.12, with the config fragment, patches and vPMU self-test of this directory.
#
# Usage: build.sh            build (or incrementally rebuild) $OUT/vmlinux
#        build.sh initramfs  also build $OUT/perf-initramfs.cpio (real-VMX path, see README)
#
# OUT defaults to <repo>/target/linux-guest (gitignored). Nothing here is committed: the source
# comes from apt at build time. A rebuild reuses the extracted tree and the object files: the
# tree is re-extracted only when the linux-source package version changes, patches are swapped
# by reverse-applying the previous set, and files are copied only when their content changed so
# make sees unchanged timestamps.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${LINUX_GUEST_OUT:-$ROOT/target/linux-guest}"
PKG=linux-source-6.12
TARBALL=/usr/src/$PKG.tar.xz
SRC="$OUT/$PKG"
JOBS="${JOBS:-$(nproc)}"

die() { echo "error: $*" >&2; exit 1; }
log() { echo "linux-guest: $*"; }

# apt-get with a readable failure; the package lists are refreshed once per run when needed.
APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null || die "apt-get not found: install $* by hand (a Debian 12 host is expected)"
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        apt-get update -qq || die "'apt-get update' failed (no network or not root?); cannot fetch $*"
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
        || die "'apt-get install $*' failed; install these packages by hand and re-run"
}

# Build tools tinyconfig + fragment needs: the compiler and make, bc (timeconst), flex and bison
# (kconfig), libelf (objtool, used for the ORC unwinder), xz (the source tarball).
need=()
for tool in gcc:gcc make:make bc:bc flex:flex bison:bison xz:xz-utils; do
    command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
[ -e /usr/include/gelf.h ] || need+=(libelf-dev)
[ -r "$TARBALL" ] || need+=("$PKG")
[ ${#need[@]} = 0 ] || apt_install "${need[@]}"
[ -r "$TARBALL" ] || die "$TARBALL is missing after installing $PKG"

mkdir -p "$OUT"
version="$(dpkg-query -W -f='${Version}' "$PKG" 2>/dev/null || stat -c %Y "$TARBALL")"

# 1. Source tree: extracted once per package version.
if [ "$(cat "$OUT/source.stamp" 2>/dev/null)" != "$version" ]; then
    log "extracting $PKG $version (takes about a minute)"
    rm -rf "$SRC" "$OUT/applied" "$OUT/source.stamp"
    tar -C "$OUT" -xf "$TARBALL"
    [ -f "$SRC/Makefile" ] || die "$TARBALL did not contain $PKG/"
    echo "$version" >"$OUT/source.stamp"
fi

# 2. Patches: if the set differs from what is applied, reverse the old set (kept in applied/),
#    then apply the new one, so the tree never needs a re-extraction.
patches_now="$(cd "$HERE/patches" && cat ./*.patch | sha256sum)"
if [ "$(cat "$OUT/patches.stamp" 2>/dev/null)" != "$patches_now" ]; then
    if [ -d "$OUT/applied" ]; then
        for p in $(ls -r "$OUT/applied"/*.patch 2>/dev/null); do
            log "reverting $(basename "$p")"
            patch -d "$SRC" -p1 -R -s <"$p" || die "cannot revert $p; delete $OUT and rebuild"
        done
    fi
    rm -rf "$OUT/applied" "$OUT/patches.stamp"
    mkdir -p "$OUT/applied"
    for p in "$HERE"/patches/*.patch; do
        log "applying $(basename "$p")"
        patch -d "$SRC" -p1 -s --no-backup-if-mismatch <"$p" || die "$(basename "$p") does not apply to $PKG $version"
        cp "$p" "$OUT/applied/"
    done
    echo "$patches_now" >"$OUT/patches.stamp"
fi

# 3. The self-test initcall source (its Kconfig/Makefile hook is a patch).
copy_if_changed() { cmp -s "$1" "$2" || cp "$1" "$2"; }
copy_if_changed "$HERE/vpmu_selftest.c" "$SRC/arch/x86/events/vpmu_selftest.c"

# 4. Config: tinyconfig + fragment, regenerated only when the fragment or the tree changed.
cfg_now="$( (cat "$HERE/config.fragment"; echo "$version"; echo "$patches_now") | sha256sum)"
if [ "$(cat "$OUT/config.stamp" 2>/dev/null)" != "$cfg_now" ] || [ ! -f "$SRC/.config" ]; then
    log "configuring: tinyconfig + config.fragment"
    make -C "$SRC" -s tinyconfig >/dev/null
    (cd "$SRC" && ./scripts/kconfig/merge_config.sh -m .config "$HERE/config.fragment" >/dev/null)
    make -C "$SRC" -s olddefconfig >/dev/null
    # Every fragment line must survive olddefconfig; a dropped one means a missing dependency.
    missing=0
    while IFS= read -r line; do
        case "$line" in
            CONFIG_*=*)
                grep -qxF "$line" "$SRC/.config" || { echo "  fragment line not in .config: $line" >&2; missing=1; } ;;
            "# CONFIG_"*" is not set")
                sym="${line#\# }"; sym="${sym%% *}"
                if grep -q "^$sym=" "$SRC/.config"; then echo "  fragment disables $sym but it is still set" >&2; missing=1; fi ;;
        esac
    done <"$HERE/config.fragment"
    [ "$missing" = 0 ] || die "config.fragment does not apply cleanly (see above)"
    echo "$cfg_now" >"$OUT/config.stamp"
fi

# 5. Build. vmlinux carries the PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY) that vmm loads.
log "make vmlinux -j$JOBS"
start=$(date +%s)
make -C "$SRC" -s -j"$JOBS" vmlinux
copy_if_changed "$SRC/vmlinux" "$OUT/vmlinux"
copy_if_changed "$SRC/System.map" "$OUT/System.map"
log "$OUT/vmlinux ready ($(( $(date +%s) - start )) s in make)"

if [ "${1:-}" = initramfs ]; then
    "$HERE/perf-initramfs.sh" "$OUT/perf-initramfs.cpio"
fi
