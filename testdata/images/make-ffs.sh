#!/bin/sh
# Makes the FFS golden images (README.md): run in an empty directory with `cairn` on PATH
# and CAIRN_RUNTIME_DIR set to a directory of one's own.
set -eu

tree() {  # the tree every golden image holds (as the LFS ones)
    mkdir "$1/dir"
    printf 'hello, cairn\n' > "$1/dir/hello.txt"
    seq 1 12000 > "$1/numbers.txt"
    ln -s dir/hello.txt "$1/link"
    ln "$1/numbers.txt" "$1/dir/numbers.hardlink"
    : > "$1/empty"
    printf 'gone\n' > "$1/deleted" && rm "$1/deleted"
    chmod 600 "$1/dir/hello.txt"
    mkdir "$1/dir/sub"
    printf 'x%.0s' $(seq 1 5000) > "$1/dir/sub/x5000"
}

after_checkpoint() {  # calls made durable by fsync, then the daemon dies
    mkdir "$1/after-crash"
    seq 1 3000 > "$1/after-crash/rolled.txt"
    mv "$1/dir/sub/x5000" "$1/after-crash/x5000"
    rm "$1/empty"
    python3 -c 'import os, sys
for p in ["after-crash/rolled.txt", "after-crash/x5000", "after-crash", ".", "dir/sub"]:
    fd = os.open(os.path.join(sys.argv[1], p), os.O_RDONLY); os.fsync(fd); os.close(fd)' "$1"
    kill -9 "$(head -n1 "$CAIRN_RUNTIME_DIR"/*-mnt.pid)"
    umount -l "$1"
}

mkdir -p mnt

# No log area, mounted in the default mode (sync), unmounted cleanly.
cairn mkfs --size 1M --journal-size 0 -L golden ffs-v1-clean.img
cairn mount ffs-v1-clean.img mnt
tree mnt
cairn umount mnt

# A log area (`log=file`), mode journal, stopped without unmounting: records to replay.
cairn mkfs --size 2M --journal-size 512K -L golden ffs-v1-journal-crashed.img
cairn mount -o mode=journal,syncer=86400 ffs-v1-journal-crashed.img mnt
tree mnt
after_checkpoint mnt

# The journal's log on a device of its own (`log=dev:PATH`), stopped without unmounting.
cairn mkfs --size 1M --journal-size 0 -L golden ffs-v1-logdev-crashed.img
cairn wal mkfs --size 512K ffs-v1-logdev-crashed.log
cairn mount -o "mode=journal,syncer=86400,log=dev:$PWD/ffs-v1-logdev-crashed.log" ffs-v1-logdev-crashed.img mnt
tree mnt
after_checkpoint mnt
