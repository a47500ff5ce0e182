//! `umount MNT && mount MNT` must just work: a plain umount(2) of a FUSE mount returns as
//! soon as the kernel lets go of it, while the daemon is still writing back what it holds.
//! Whatever comes next — a mount of the same image at the same or another mount point,
//! through `cairn mount` or `mount -t fuse.cairn`, a `cairn fsck` or `cairn mkfs` of the
//! image — waits (bounded) for that final flush instead of refusing, and two daemons never
//! serve one image.
//!
//! Each round makes the old daemon's flush long on purpose (async mode, a cache larger than
//! the data, 96 MiB written) and checks that the old daemon was still alive when the next
//! command started: a round where it was not would not test the race, and fails.
//!
//! Needs root and /dev/fuse.

use std::fs;
use std::path::Path;
use std::process::Command;

use cairn_fstests::{Workdir, cairn_bin, pattern, say};

const FILES: usize = 6;
const FILE_BYTES: usize = 16 << 20;

/// A work directory with an image `img` (256 MiB) and mount points `mnt`, `mnt2`, `mnt3`.
struct Bench {
    w: Workdir,
}

impl std::ops::Deref for Bench {
    type Target = Workdir;
    fn deref(&self) -> &Workdir {
        &self.w
    }
}

impl Bench {
    fn new() -> Bench {
        let w = Workdir::new();
        for m in ["mnt", "mnt2", "mnt3"] {
            w.mkdir(m);
        }
        w.ok(&["mkfs", "img", "--size", "256M"]);
        Bench { w }
    }

    /// Writes the round's files through `mnt` (closed, so handed to the daemon) in 128 KiB
    /// writes: below the engine's streaming size, so they stay dirty in the daemon's cache
    /// and its final flush has all of them to write.
    fn fill(&self, mnt: &str, round: u64) {
        use std::io::Write;
        for i in 0..FILES {
            let seed = round * 100 + i as u64;
            let mut f = fs::File::create(self.p(mnt).join(format!("f{i}"))).unwrap();
            for chunk in pattern(seed, FILE_BYTES).chunks(128 << 10) {
                f.write_all(chunk).unwrap();
            }
        }
    }

    fn verify(&self, mnt: &str, round: u64) {
        for i in 0..FILES {
            let seed = round * 100 + i as u64;
            let got = fs::read(self.p(mnt).join(format!("f{i}"))).unwrap();
            assert!(
                got == pattern(seed, FILE_BYTES),
                "round {round}: f{i} differs after the remount"
            );
        }
    }

    /// umount(2) with no helper and no waiting, as `umount -i` or any program does; returns
    /// the old daemon's pid, checked to be still running (still flushing).
    fn plain_umount(&self, mnt: &str) -> u32 {
        let pid = self.daemon(mnt);
        nix::mount::umount2(&self.p(mnt), nix::mount::MntFlags::empty()).unwrap();
        assert!(
            cairn_bench::sys::pid_alive(pid),
            "the old daemon (pid {pid}) had already exited when umount(2) returned: this round \
             does not exercise the race (make its final flush longer)"
        );
        pid
    }
}

fn holders_of(image: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(image).unwrap();
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&id) && !l.contains("->"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

#[test]
fn the_next_mount_fsck_or_mkfs_waits_for_the_old_daemons_final_flush() {
    let b = Bench::new();
    let opts = "mode=async,cache=512M,syncer=300";
    // Same mount point, `cairn mount`.
    b.ok(&["mount", "-o", opts, "img", "mnt"]);
    b.fill("mnt", 1);
    let old = b.plain_umount("mnt");
    b.ok(&["mount", "-o", opts, "img", "mnt"]);
    let new = b.daemon("mnt");
    assert!(
        !cairn_bench::sys::pid_alive(old),
        "two daemons: the old one (pid {old}) still runs beside pid {new}"
    );
    assert_eq!(
        holders_of(&b.p("img")),
        vec![new],
        "one daemon holds the image"
    );
    b.verify("mnt", 1);
    say!("same mount point: the new mount waited for pid {old}");

    // Another mount point.
    b.fill("mnt", 2);
    b.plain_umount("mnt");
    b.ok(&["mount", "-o", opts, "img", "mnt2"]);
    b.verify("mnt2", 2);
    say!("another mount point: waited");

    // fsck right after the umount.
    b.fill("mnt2", 3);
    b.plain_umount("mnt2");
    let o = b.cairn(&["fsck", "img"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "fsck right after umount: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    b.ok(&["mount", "-o", opts, "img", "mnt"]);
    b.verify("mnt", 3);

    // mkfs right after the umount (of a file system it then replaces).
    b.fill("mnt", 4);
    b.plain_umount("mnt");
    b.ok(&["mkfs", "-F", "img", "--size", "64M"]);
    b.ok(&["mount", "img", "mnt"]);
    assert!(fs::read_dir(b.p("mnt")).unwrap().all(|e| {
        let n = e.unwrap().file_name();
        n == "lost+found"
    }));
    b.ok(&["umount", "mnt"]);
}

/// A daemon that still serves its mount is refused at once (no waiting for a live mount).
#[test]
fn a_mount_point_still_served_is_refused_at_once() {
    let b = Bench::new();
    b.ok(&["mount", "img", "mnt"]);
    let t = std::time::Instant::now();
    let o = b.cairn(&["mount", "img", "mnt"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already served"), "{err}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "refused after {:?}",
        t.elapsed()
    );
    b.ok(&["umount", "mnt"]);
}

/// `mount -t fuse.cairn` (fstests' way) after `umount -i` (no helper, no waiting), inside a
/// private mount namespace whose /sbin is an overlay: the helpers installed there vanish
/// with it.
#[test]
fn mount_dash_t_fuse_cairn_right_after_a_plain_umount() {
    let b = Bench::new();
    let sbin = fs::canonicalize("/sbin").unwrap();
    let had = Path::new("/sbin/mount.fuse.cairn").exists();
    let script = format!(
        r#"set -e
mkdir -p ov && mount -t tmpfs none ov && mkdir ov/up ov/work
mount -t overlay overlay -o lowerdir={sbin},upperdir=ov/up,workdir=ov/work {sbin}
"$CAIRN" install-helper --lib-dir lib >/dev/null
test "$(readlink /sbin/mount.fuse.cairn)" = "$PWD/lib/cairn"
for round in 1 2 3; do
    mount -t fuse.cairn -o mode=async,cache=512M,syncer=300 img mnt
    for i in 1 2 3 4 5 6; do head -c 16M /dev/urandom > mnt/f$i; done
    md5sum mnt/f* | sed 's/mnt/X/' > sums.$round
    umount -i mnt
    mount -t fuse.cairn -o mode=async img mnt
    md5sum mnt/f* | sed 's/mnt/X/' | cmp - sums.$round
    umount mnt
done
"#,
        sbin = sbin.display()
    );
    // `slave`, not `private`: a private copy of the namespace would hold every other test's
    // FUSE mount alive after its unmount, and those daemons could not end until this one did.
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "slave", "sh", "-c", &script])
        .env("CAIRN", cairn_bin())
        .env("CAIRN_RUNTIME_DIR", b.runtime())
        .current_dir(b.p(""))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        Path::new("/sbin/mount.fuse.cairn").exists(),
        had,
        "the machine's /sbin was changed"
    );
}

/// A second mount point of a mounted image (fstests' generic/732) is served by the same
/// daemon, as a kernel file system mounted twice shares one superblock: renames through one
/// mount point are seen through the other at once, unmounting either leaves the other
/// serving, and the last unmount waits for the final flush. Another mode is refused.
#[test]
fn a_second_mount_point_is_served_by_the_same_daemon() {
    let b = Bench::new();
    for first_out in [true, false] {
        b.ok(&["mount", "-o", "mode=softdep", "img", "mnt"]);
        b.ok(&["mount", "-o", "mode=softdep", "img", "mnt2"]);
        assert_eq!(b.daemon("mnt"), b.daemon("mnt2"), "one daemon serves both");
        let o = b.cairn(&["mount", "-o", "mode=async", "img", "mnt3"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("mode=softdep"), "{err}");
        let o = b.cairn(&["mount", "-o", "mode=softdep", "img", "mnt2"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("already served"),
            "{err}"
        );
        // generic/732's moves, with the kernel caches of both mount points in play.
        let (m1, m2) = (b.p("mnt"), b.p("mnt2"));
        let _ = fs::remove_dir_all(m1.join("A"));
        let _ = fs::remove_dir_all(m1.join("B"));
        fs::create_dir(m1.join("A")).unwrap();
        fs::create_dir(m1.join("B")).unwrap();
        fs::write(m1.join("A/f"), b"moved").unwrap();
        fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
        assert_eq!(fs::read(m2.join("B/f")).unwrap(), b"moved");
        fs::rename(m2.join("B/f"), m2.join("A/f")).unwrap();
        assert_eq!(fs::read(m1.join("A/f")).unwrap(), b"moved");
        fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
        assert!(!m2.join("A/f").exists());
        let (first, second) = if first_out {
            ("mnt", "mnt2")
        } else {
            ("mnt2", "mnt")
        };
        let pid = b.daemon(first);
        b.ok(&["umount", first]);
        assert!(cairn_bench::sys::pid_alive(pid), "the daemon serves on");
        assert_eq!(fs::read(b.p(second).join("B/f")).unwrap(), b"moved");
        b.ok(&["umount", second]);
        assert!(!cairn_bench::sys::pid_alive(pid), "the last unmount waited");
        let o = b.cairn(&["fsck", "img"]);
        assert_eq!(o.status.code(), Some(0), "{o:?}");
    }
}

/// Mount points of `mountinfo` under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut v: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(&dir))
        .map(|p| p.strip_prefix(dir.to_str().unwrap()).unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// A second mount point is a mount of its own, as a second mount of a device is: it shares
/// no propagation with the first. generic/409–411 mount the scratch device at a directory
/// of its own shared mount, then mount more under each; a bind mount of the shared first
/// mount would be its peer, and every mount under either would appear under both.
#[test]
fn a_second_mount_point_does_not_share_the_first_ones_propagation() {
    use nix::mount::{MsFlags, mount};
    let b = Bench::new();
    let none: Option<&str> = None;
    b.ok(&["mount", "-o", "mode=softdep", "img", "mnt"]);
    let m = b.p("mnt");
    mount(none, &m, none, MsFlags::MS_SHARED, none).unwrap();
    fs::create_dir_all(m.join("a")).unwrap();
    fs::create_dir_all(m.join("b")).unwrap();
    b.ok(&["mount", "-o", "mode=softdep", "img", "mnt/a"]);
    // A mount under the first mount point, then one under the second.
    mount(
        Some("tmpfs"),
        &m.join("b"),
        Some("tmpfs"),
        MsFlags::empty(),
        none,
    )
    .unwrap();
    fs::create_dir_all(m.join("a/b")).unwrap();
    b.ok(&["mount", "-o", "mode=softdep", "img", "mnt/a/b"]);
    assert_eq!(
        mounts_under(&m),
        ["", "/a", "/a/b", "/b"],
        "the mounts under the first mount point"
    );
    for p in ["mnt/a/b", "mnt/b", "mnt/a", "mnt"] {
        let p = b.p(p);
        if let Err(e) = nix::mount::umount(&p) {
            panic!("umount {}: {e}", p.display());
        }
    }
}

/// `mount -o remount,ro MNT` (fstests' generic/294): the mount turns read-only in place and
/// back, keeping its other flags, with the same daemon.
#[test]
fn remount_changes_the_flags_in_place() {
    let b = Bench::new();
    b.ok(&["mount", "img", "mnt"]);
    let pid = b.daemon("mnt");
    fs::write(b.p("mnt/f"), b"1").unwrap();
    b.ok(&["mount", "-o", "remount,ro", "img", "mnt"]);
    let e = fs::write(b.p("mnt/g"), b"2").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let opts = |b: &Bench| {
        let mp = b.p("mnt").canonicalize().unwrap();
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(4) == mp.to_str())
            .unwrap()
            .split(' ')
            .nth(5)
            .unwrap()
            .to_string()
    };
    assert!(opts(&b).contains("nosuid"), "{}", opts(&b));
    b.ok(&["mount", "-o", "remount,rw", "img", "mnt"]);
    fs::write(b.p("mnt/g"), b"2").unwrap();
    assert_eq!(b.daemon("mnt"), pid, "the same daemon serves on");
    assert_eq!(fs::read(b.p("mnt/f")).unwrap(), b"1");
    b.ok(&["umount", "mnt"]);
}
