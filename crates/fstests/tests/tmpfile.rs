//! open(2) with O_TMPFILE through a real mount in every mode and transport: an unnamed file
//! (fstat shows no link), named by `linkat` of its /proc/self/fd link with
//! AT_SYMLINK_FOLLOW and kept with its data across a remount; an O_EXCL tmpfile and a file
//! unlinked while open are never named again (ENOENT); a tmpfile closed without a name
//! leaves nothing behind (the file count is back, fsck is clean). Validated against the
//! host (CAIRN_TEST_HOST_ONLY=1). The umbrella layer refuses O_TMPFILE (EOPNOTSUPP;
//! docs/UMBRELLA.md says why).

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_fstests::{Target, expect_err, host_only, pattern, say};
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, open};
use nix::sys::stat::Mode;
use nix::unistd::linkat;

/// open(dir, O_TMPFILE | O_RDWR | extra, 0o600).
fn tmpfile(dir: &Path, extra: OFlag) -> std::io::Result<File> {
    let fd = open(
        dir,
        OFlag::O_TMPFILE | OFlag::O_RDWR | extra,
        Mode::from_bits_truncate(0o600),
    )?;
    Ok(File::from(fd))
}

/// The way programs without CAP_DAC_READ_SEARCH name an open file: linkat of its
/// /proc/self/fd link, followed.
fn flink(f: &File, to: &Path) -> std::io::Result<()> {
    let from = format!("/proc/self/fd/{}", f.as_raw_fd());
    linkat(
        AT_FDCWD,
        from.as_str(),
        AT_FDCWD,
        to,
        AtFlags::AT_SYMLINK_FOLLOW,
    )?;
    Ok(())
}

fn files_free(p: &Path) -> u64 {
    nix::sys::statvfs::statvfs(p).unwrap().files_free() as u64
}

/// The files free once the closes so far have reached the file system and its frees are
/// made: the kernel sends a release after close(2) has returned (io_uring's more so), and a
/// mode may make frees later (soft updates: once the inode's cleared image is on disk), so
/// the directory is fsynced (a sync of the whole file system for such a mode) and `want`
/// polled for, with a deadline.
fn settled_files_free(p: &Path, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        File::open(p).unwrap().sync_all().unwrap();
        let n = files_free(p);
        if n == want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The link count fstat(2) shows: the kernel's copy, which it fills from the reply to the
/// open (statx asking for the birth time would go to the file system instead).
fn nlink(f: &File) -> u64 {
    nix::sys::stat::fstat(f).unwrap().st_nlink
}

#[test]
fn tmpfiles_are_unnamed_linkable_once_and_freed_at_close() {
    for mut t in Target::all() {
        say!("=== tmpfile on {}", t.name());
        let d = t.path("tmp");
        fs::create_dir(&d).unwrap();
        let free0 = files_free(&d);
        let data = pattern(34, 200_000);
        // Named: written, linked, kept.
        let mut f =
            tmpfile(&d, OFlag::empty()).unwrap_or_else(|e| panic!("{}: O_TMPFILE: {e}", t.name()));
        assert_eq!(nlink(&f), 0, "{}: a tmpfile has no link", t.name());
        f.write_all(&data).unwrap();
        flink(&f, &d.join("named")).unwrap();
        assert_eq!(nlink(&f), 1, "{}: linked", t.name());
        // Named once, it is an ordinary file: another name is a hard link.
        flink(&f, &d.join("second")).unwrap();
        fs::remove_file(d.join("second")).unwrap();
        drop(f);
        // O_EXCL: never named.
        let x = tmpfile(&d, OFlag::O_EXCL).unwrap();
        assert_eq!(nlink(&x), 0, "{}: an O_EXCL tmpfile has no link", t.name());
        expect_err(
            flink(&x, &d.join("x")),
            libc::ENOENT,
            "link of an O_EXCL tmpfile",
        );
        // A file unlinked while open is not named again either.
        let o = File::create(d.join("o")).unwrap();
        fs::remove_file(d.join("o")).unwrap();
        expect_err(
            flink(&o, &d.join("o2")),
            libc::ENOENT,
            "link of an unlinked file",
        );
        drop((x, o));
        // Closed with no name: nothing left, only "named" counts against the files free.
        let mut g = tmpfile(&d, OFlag::empty()).unwrap();
        g.write_all(&data).unwrap();
        g.sync_all().unwrap();
        drop(g);
        assert_eq!(
            settled_files_free(&d, free0 - 1),
            free0 - 1,
            "{}: the closed files' inodes",
            t.name()
        );
        let mut names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["named"], "{}", t.name());
        t.assert_fsck_clean_and_remount("tmpfiles");
        let mut back = Vec::new();
        File::open(d.join("named"))
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        assert!(
            back == data,
            "{}: the linked tmpfile's data after a remount",
            t.name()
        );
        assert_eq!(fs::metadata(d.join("named")).unwrap().nlink(), 1);
    }
}

/// Every file of the umbrella layer lives at a name on a branch (docs/UMBRELLA.md):
/// O_TMPFILE is EOPNOTSUPP there, the answer programs fall back from.
#[test]
fn the_umbrella_refuses_tmpfiles() {
    if host_only() {
        return;
    }
    let t = Target::umbrella_sized("512M");
    let d = t.path("tmp");
    fs::create_dir(&d).unwrap();
    expect_err(
        tmpfile(&d, OFlag::empty()),
        libc::EOPNOTSUPP,
        "umbrella O_TMPFILE",
    );
}
