# Sourced by scripts/fstests/inside.sh for MODE=umbrella: the policy layer over two local
# branches, "fast" and "slow", each a tmpfs of its own (inside the run's mount namespace),
# with one placement rule (files over 1 MiB go to the slow branch first) so the suite's
# files live on both and move between them.
#
# The suite sees FSTYP=fuse, FUSE_SUBTYP=.umbrella; TEST_DEV and SCRATCH_DEV are
# configuration files. Its "mkfs" (FUSE_MKFS_PROG) makes both branches anew, empty, of half
# the size asked each (default 2 GiB each). No checker: the branches are tmpfs.

umbrella_mkfs_script() {
    cat <<'EOF'
#!/bin/bash
# fstests' FUSE_MKFS_PROG for the umbrella layer: [--size BYTES] [--block-size B] CONFIG
set -euo pipefail
size=$((4 << 30))
while [ $# -gt 1 ]; do
    case $1 in
        --size) size=$2; shift 2 ;;
        --block-size) shift 2 ;;
        *) shift ;;
    esac
done
config=$1
dir=${config%.toml}
for b in fast slow; do
    mkdir -p "$dir/$b"
    while mountpoint -q "$dir/$b"; do umount -l "$dir/$b"; done
    # FSTESTS_UMBRELLA_BRANCH_OPTS: more tmpfs options (`strictatime`: the layer can give
    # no stricter access-time rule than its branches', so generic/003's strictatime part
    # needs it; the default relatime branches keep passthrough for relatime mounts).
    mount -t tmpfs -o "size=$((size / 2)),mode=0755${FSTESTS_UMBRELLA_BRANCH_OPTS:+,$FSTESTS_UMBRELLA_BRANCH_OPTS}" "umbrella-$b" "$dir/$b"
done
cat >"$config" <<EOC
[umbrella]
default = ["fast", "slow"]

[[branch]]
name = "fast"
path = "$dir/fast"
[[branch]]
name = "slow"
path = "$dir/slow"

[[rule]]
name = "large files"
size = "> 1M"
branches = ["slow", "fast"]
EOC
EOF
}

umbrella_setup() {
    local u=$work/umbrella sbin
    sbin=$(readlink -f /sbin)
    mkdir -p "$u"
    umbrella_mkfs_script >"$work/bin/mkfs.umbrella"
    chmod +x "$work/bin/mkfs.umbrella"
    # mount -t fuse.umbrella CONFIG DIR -o OPTS and its umount: cairn's own helpers
    # (`cairn install-helper`: dev and suid as a disk file system is, remount in place, a
    # second mount point served by the same daemon).
    "$CAIRN_BIN" install-helper --link --prefix "$sbin" >/dev/null
    test_dev=$u/test.toml
    scratch_dev=$u/scratch.toml
    "$work/bin/mkfs.umbrella" "$test_dev"
    "$work/bin/mkfs.umbrella" "$scratch_dev"
    cat >"$work/local.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.umbrella
export TEST_DEV=$test_dev
export TEST_DIR=$work/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$work/scratch
export FUSE_MKFS_PROG=$work/bin/mkfs.umbrella
EOF
}
