#!/usr/bin/env bash
# A GlusterFS volume on this machine's loopback, for the umbrella layer's tests and
# benchmarks: glusterd, a *distributed* volume over two bricks (files hashed to one brick
# or the other, as on a real cluster), mounted with the FUSE client.
#
#   scripts/distfs/gluster.sh install            # Debian glusterfs-server + client
#   scripts/distfs/gluster.sh start [MOUNTPOINT] # glusterd, volume, mount; prints the mount
#   scripts/distfs/gluster.sh pids               # "glusterd PID", "brick PID" x2, "client PID"
#   scripts/distfs/gluster.sh restart-bricks     # start the bricks again after a kill
#   scripts/distfs/gluster.sh stop               # unmount, stop the volume and glusterd
#   scripts/distfs/gluster.sh cleanup            # stop, delete the volume and its bricks
#
# State lives under $CAIRN_DISTFS_DIR (default /var/tmp/cairn-distfs/gluster): bricks,
# mount point, glusterd's pid and log. glusterd itself keeps its volume list in
# /var/lib/glusterd, which `cleanup` leaves without our volume. The volume's
# network.ping-timeout is 5 s (default 42), so a stopped brick is given up by the client
# in seconds, not minutes. Exit 2 from `start` means GlusterFS is not installed.
set -euo pipefail

DIR=${CAIRN_DISTFS_DIR:-/var/tmp/cairn-distfs}/gluster
VOL=${CAIRN_GLUSTER_VOLUME:-cairnvol}
HOST=$(hostname)
log() { printf 'gluster: %s\n' "$*" >&2; }
g() { gluster --mode=script "$@"; }

installed() { command -v glusterd >/dev/null 2>&1 && command -v gluster >/dev/null 2>&1; }

install() {
    if installed; then log "installed ($(glusterd --version | head -1))"; return; fi
    export DEBIAN_FRONTEND=noninteractive
    local t0=$SECONDS
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends glusterfs-server glusterfs-client >/dev/null
    log "installed in $((SECONDS - t0)) s"
}

# The glusterd this script started (a glusterd the system runs is used, never stopped).
glusterd_pid() {
    local p
    p=$(cat "$DIR/glusterd.pid" 2>/dev/null || true)
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then echo "$p"; fi
}

start() {
    installed || { log "not installed (scripts/distfs/gluster.sh install)"; exit 2; }
    local mnt=${1:-$DIR/mnt}
    mkdir -p "$DIR/brick1" "$DIR/brick2" "$mnt"
    if ! g peer status >/dev/null 2>&1; then
        glusterd --log-file="$DIR/glusterd.log" -p "$DIR/glusterd.pid"
    fi
    local t0=$SECONDS
    until g peer status >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -lt 30 ] || { log "glusterd did not answer in 30 s"; exit 1; }
        sleep 0.2
    done
    if ! g volume info "$VOL" >/dev/null 2>&1; then
        # Bricks on the root file system need `force`; one host, so no replication.
        g volume create "$VOL" "$HOST:$DIR/brick1" "$HOST:$DIR/brick2" force >/dev/null
        g volume set "$VOL" network.ping-timeout 5 >/dev/null
    fi
    if ! g volume status "$VOL" >/dev/null 2>&1; then
        g volume start "$VOL" force >/dev/null
    fi
    if ! mountpoint -q "$mnt"; then
        t0=$SECONDS
        until mount -t glusterfs "$HOST:/$VOL" "$mnt" 2>/dev/null && mountpoint -q "$mnt"; do
            [ $((SECONDS - t0)) -lt 30 ] || { log "the volume did not mount in 30 s"; exit 1; }
            sleep 0.3
        done
    fi
    echo "$mnt" > "$DIR/mountpoint"
    echo "$mnt"
}

pids() {
    echo "glusterd $(glusterd_pid)"
    for b in brick1 brick2; do
        echo "brick $(pgrep -f "glusterfsd.*--brick-name $DIR/$b( |\$)" | head -1)"
    done
    local mnt
    mnt=$(cat "$DIR/mountpoint" 2>/dev/null || echo "$DIR/mnt")
    echo "client $(pgrep -f "glusterfs --process-name fuse.*$VOL $mnt\$" | head -1)"
}

stop() {
    local mnt
    mnt=$(cat "$DIR/mountpoint" 2>/dev/null || echo "$DIR/mnt")
    # A stopped (SIGSTOP) process of ours must run to exit.
    for p in $(pids | awk '{print $2}'); do kill -CONT "$p" 2>/dev/null || true; done
    if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
    if installed; then
        g volume stop "$VOL" force >/dev/null 2>&1 || true
    fi
    # Our bricks and our glusterd, each by its pid.
    for p in $(pids | awk '/^brick [0-9]/ {print $2}'); do kill "$p" 2>/dev/null || true; done
    local p; p=$(glusterd_pid)
    if [ -n "$p" ]; then kill "$p" 2>/dev/null || true; fi
    local t0=$SECONDS
    while [ -n "$(glusterd_pid)" ] && [ $((SECONDS - t0)) -lt 10 ]; do sleep 0.1; done
}

cleanup() {
    if installed && ! g peer status >/dev/null 2>&1; then
        glusterd --log-file="$DIR/glusterd.log" -p "$DIR/glusterd.pid" 2>/dev/null || true
        local t0=$SECONDS
        until g peer status >/dev/null 2>&1 || [ $((SECONDS - t0)) -ge 10 ]; do sleep 0.2; done
    fi
    stop_vol_then_delete
    stop
    rm -rf --one-file-system "$DIR"
}

stop_vol_then_delete() {
    installed || return 0
    local mnt
    mnt=$(cat "$DIR/mountpoint" 2>/dev/null || echo "$DIR/mnt")
    if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
    g volume stop "$VOL" force >/dev/null 2>&1 || true
    g volume delete "$VOL" >/dev/null 2>&1 || true
}

# glusterd notices a brick's death a moment after it; until then `start force` does
# nothing. So: ask again until both brick processes run.
restart_bricks() {
    local t0=$SECONDS
    until [ "$(pids | awk '/^brick [0-9]/' | wc -l)" -eq 2 ]; do
        [ $((SECONDS - t0)) -lt 30 ] || { log "the bricks did not start in 30 s"; exit 1; }
        g volume start "$VOL" force >/dev/null 2>&1 || true
        sleep 0.5
    done
}

case "${1:-}" in
    install) install ;;
    restart-bricks) restart_bricks ;;
    start) shift; start "$@" ;;
    pids) pids ;;
    stop) stop ;;
    cleanup) cleanup ;;
    *) echo "usage: $0 install|start [MOUNTPOINT]|pids|restart-bricks|stop|cleanup" >&2; exit 1 ;;
esac
