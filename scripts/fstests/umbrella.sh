# Sourced by scripts/fstests/inside.sh for MODE=umbrella: the policy layer over two local
# branches, "fast" and "slow", with one placement rule (files over 1 MiB go to the slow
# branch first) so the suite's files live on both and move between them.
#
# The branches are tmpfs (FSTESTS_UMBRELLA_BRANCH_FS=tmpfs, the default) or ext4 on a loop
# device each (=ext4). A branch decides what the layer can offer, and each kind passes what
# the other cannot: tmpfs has no zero, collapse or insert range (generic/008, 685 not run);
# ext4 keeps about 110 attributes per file where the suite expects a FUSE file system to
# keep 1,000 (generic/020 fails). tmpfs counts a file's xattrs against its inode space
# (nr_inodes times 1 KiB), so its branches get as many inodes as ext4 makes for their size
# (one per 16 KiB): without that bound generic/449's loop of one setfattr per 1 KiB
# attribute runs until the machine's memory is gone instead of ending when the branch is
# full. ext4 with `-m 0`: no blocks kept for root, whom the suite runs as — the layer's df
# and its ENOSPC then agree.

# The suite sees FSTYP=fuse, FUSE_SUBTYP=.umbrella; TEST_DEV and SCRATCH_DEV are
# configuration files. Its "mkfs" (FUSE_MKFS_PROG) makes both branches anew, empty, of half
# the size asked each (default 2 GiB each). No checker for the layer itself.

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
# FSTESTS_UMBRELLA_BRANCH_OPTS: more mount options for the branches (`strictatime`: the
# layer can give no stricter access-time rule than its branches', so generic/003's
# strictatime part needs it; the default relatime branches keep passthrough for relatime
# mounts).
opts=${FSTESTS_UMBRELLA_BRANCH_OPTS:+,$FSTESTS_UMBRELLA_BRANCH_OPTS}
for b in fast slow; do
    mkdir -p "$dir/$b"
    while mountpoint -q "$dir/$b"; do umount -l "$dir/$b"; done
    case ${FSTESTS_UMBRELLA_BRANCH_FS:-tmpfs} in
        tmpfs)
            mount -t tmpfs -o "size=$((size / 2)),nr_inodes=$((size / 2 / 16384)),mode=0755$opts" \
                "umbrella-$b" "$dir/$b" ;;
        ext4)
            # A fresh image and loop device each time; the last one's device is let go
            # (run.sh detaches whatever loop device is left on the run's files at its end).
            img=$dir/$b.img
            for l in $(losetup -j "$img" -n -O NAME); do losetup -d "$l" 2>/dev/null || true; done
            rm -f "$img"
            truncate -s $((size / 2)) "$img"
            mkfs.ext4 -q -F -m 0 -E lazy_itable_init=0,lazy_journal_init=0 "$img"
            dev=$(losetup -f --show "$img")
            mount -t ext4 -o "rw$opts" "$dev" "$dir/$b"
            # The suite expects a new file system's root empty, as the kernel's FUSE
            # mount of a fresh tmpfs pair was; a branch needs no lost+found of its own
            # (e2fsck makes one when it needs it).
            rmdir "$dir/$b/lost+found"
            chmod 0755 "$dir/$b" ;;
        *) echo "mkfs.umbrella: FSTESTS_UMBRELLA_BRANCH_FS is tmpfs or ext4, not '$FSTESTS_UMBRELLA_BRANCH_FS'" >&2
           exit 1 ;;
    esac
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
