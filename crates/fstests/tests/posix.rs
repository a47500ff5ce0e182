//! POSIX behaviour suite, run through a real mount: every operation with its errno cases
//! (permissions as unprivileged users are `permissions.rs`'s), rename edge cases, link counts, and which timestamps
//! each operation changes. Every case asserts exact errnos; the expected values are Linux's
//! (the suite is validated against a host ext4/tmpfs directory with CAIRN_TEST_HOST_ONLY=1).
//!
//! Documented latitude: FALLOC_FL_PUNCH_HOLE may answer EOPNOTSUPP; a write at 2^40 (1 TiB)
//! may answer EFBIG when the format's maximum file size is below it (it must then be above
//! 2^36), every other case is exact.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_fstests::user::as_user;
use cairn_fstests::{
    Errnoish, Target, expect_err, expect_ok, ino, lstat, os, pattern, say, sys, times,
};
use nix::fcntl::{AT_FDCWD, FallocateFlags, RenameFlags, renameat2};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, mknod, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, chown};

use libc::{
    EBADF, EEXIST, EFBIG, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENODATA, ENOENT, ENOSPC, ENOTDIR,
    ENOTEMPTY, EOPNOTSUPP, EPERM, ERANGE,
};

/// Runs `f` on every target, each in a fresh directory `case` under the target's root.
fn each(case: &str, f: impl Fn(&Target, &Path)) {
    for t in Target::all() {
        say!("=== {case} on {}", t.name());
        let d = t.path(case);
        fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: mkdir {case}: {e}", t.name()));
        f(&t, &d);
    }
}

fn write_file(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode()
}

fn nlink(p: &Path) -> u64 {
    fs::symlink_metadata(p).unwrap().nlink()
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn names(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    v.sort();
    v
}

/// Sleeps past the timestamp granularity of the kernel clock (jiffies) so changes show.
fn tick() {
    std::thread::sleep(Duration::from_millis(30));
}

fn rename2(a: &Path, b: &Path, flags: RenameFlags) -> nix::Result<()> {
    renameat2(AT_FDCWD, a, AT_FDCWD, b, flags)
}

// ---------------------------------------------------------------------------------------------
// lookup / stat

#[test]
fn lookup_and_stat() {
    each("lookup", |_t, d| {
        let f = d.join("file");
        write_file(&f, b"hello");
        let m = expect_ok(lstat(&f), "lstat file");
        assert!(
            m.is_file() && m.size() == 5 && m.nlink() == 1,
            "stat of a 5-byte file: {m:?}"
        );
        assert_eq!(m.uid(), 0);
        assert_eq!(m.gid(), 0);
        assert!(m.blksize() >= 512, "st_blksize {}", m.blksize());
        expect_err(lstat(&d.join("missing")), ENOENT, "stat of a missing name");
        expect_err(
            lstat(&d.join("file/x")),
            ENOTDIR,
            "stat through a regular file",
        );
        expect_err(
            lstat(&d.join("missing/x")),
            ENOENT,
            "stat under a missing directory",
        );
        let m = expect_ok(lstat(d), "lstat dir");
        assert!(
            m.is_dir() && m.nlink() == 2,
            "new directory: dir with nlink 2, got {m:?}"
        );
        std::os::unix::fs::symlink("file", d.join("ln")).unwrap();
        assert!(lstat(&d.join("ln")).unwrap().file_type().is_symlink());
        assert_eq!(
            fs::metadata(d.join("ln")).unwrap().ino(),
            ino(&f),
            "stat follows the symlink"
        );
        assert_eq!(ino(&d.join("./file")), ino(&f), "./ resolves");
        assert_eq!(ino(&d.join("../lookup/file")), ino(&f), "../ resolves");
    });
}

// ---------------------------------------------------------------------------------------------
// chmod / chown / utimensat

#[test]
fn chmod_chown_utimens() {
    each("attrs", |_t, d| {
        let f = d.join("f");
        write_file(&f, b"x");
        chmod(&f, 0o640);
        assert_eq!(mode(&f) & 0o7777, 0o640);
        chmod(&f, 0o4755);
        assert_eq!(mode(&f) & 0o7777, 0o4755, "root may set setuid");
        chmod(&f, 0o1777);
        assert_eq!(
            mode(&f) & 0o7777,
            0o1777,
            "sticky bit on a file kept for root"
        );
        expect_err(
            fs::set_permissions(d.join("nope"), fs::Permissions::from_mode(0o600)),
            ENOENT,
            "chmod missing",
        );

        expect_ok(
            chown(&f, Some(Uid::from_raw(1234)), Some(Gid::from_raw(5678))),
            "chown",
        );
        let m = lstat(&f).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678));
        expect_ok(chown(&f, None, Some(Gid::from_raw(42))), "chown -1:42");
        let m = lstat(&f).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 42), "uid -1 keeps the owner");
        expect_err(
            chown(&d.join("nope"), Some(Uid::from_raw(1)), None),
            ENOENT,
            "chown missing",
        );

        // chown of an executable clears setuid and setgid (Linux, even for root).
        let x = d.join("x");
        write_file(&x, b"#!/bin/sh\n");
        chmod(&x, 0o6755);
        expect_ok(
            chown(&x, Some(Uid::from_raw(1000)), None),
            "chown setuid file",
        );
        assert_eq!(
            mode(&x) & 0o7777,
            0o755,
            "chown clears S_ISUID|S_ISGID on an executable"
        );

        // lchown changes the link, not its target.
        let l = d.join("l");
        std::os::unix::fs::symlink("f", &l).unwrap();
        expect_ok(
            std::os::unix::fs::lchown(&l, Some(77), Some(88)),
            "lchown symlink",
        );
        let (ml, mf) = (lstat(&l).unwrap(), lstat(&f).unwrap());
        assert_eq!((ml.uid(), ml.gid()), (77, 88));
        assert_eq!(mf.uid(), 1234, "target untouched by lchown");

        // utimensat: explicit nanosecond times, UTIME_OMIT, UTIME_NOW.
        let at = TimeSpec::new(1_000_000_000, 123_456_789);
        let mt = TimeSpec::new(1_500_000_000, 987_654_321);
        expect_ok(
            utimensat(AT_FDCWD, &f, &at, &mt, UtimensatFlags::FollowSymlink),
            "utimensat",
        );
        let (a, m, _) = times(&f);
        assert_eq!(a, 1_000_000_000_123_456_789, "atime set with ns precision");
        assert_eq!(m, 1_500_000_000_987_654_321, "mtime set with ns precision");
        let mt2 = TimeSpec::new(1_600_000_000, 5);
        expect_ok(
            utimensat(
                AT_FDCWD,
                &f,
                &TimeSpec::UTIME_OMIT,
                &mt2,
                UtimensatFlags::FollowSymlink,
            ),
            "omit",
        );
        let (a2, m2, _) = times(&f);
        assert_eq!(a2, a, "UTIME_OMIT leaves atime");
        assert_eq!(m2, 1_600_000_000_000_000_005);
        let before = now_ns();
        expect_ok(
            utimensat(
                AT_FDCWD,
                &f,
                &TimeSpec::UTIME_NOW,
                &TimeSpec::UTIME_OMIT,
                UtimensatFlags::FollowSymlink,
            ),
            "now",
        );
        let (a3, m3, _) = times(&f);
        assert_eq!(m3, m2, "UTIME_OMIT leaves mtime");
        assert!(
            a3 >= before - 20_000_000 && a3 <= now_ns() + 20_000_000,
            "UTIME_NOW sets atime to now"
        );
        expect_err(
            utimensat(
                AT_FDCWD,
                &d.join("nope"),
                &at,
                &mt,
                UtimensatFlags::FollowSymlink,
            ),
            ENOENT,
            "utimensat missing",
        );
        // Times before 1970 survive.
        let neg = TimeSpec::new(-86_400, 0);
        expect_ok(
            utimensat(AT_FDCWD, &f, &neg, &neg, UtimensatFlags::FollowSymlink),
            "pre-1970",
        );
        assert_eq!(
            times(&f).1,
            -86_400_000_000_000,
            "negative mtime round-trips"
        );
    });
}

fn now_ns() -> i128 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    d.as_nanos() as i128
}

// ---------------------------------------------------------------------------------------------
// truncate / ftruncate / sparse files

#[test]
fn truncate_and_sparse() {
    each("trunc", |_t, d| {
        let f = d.join("f");
        let data = pattern(1, 10_000);
        write_file(&f, &data);
        expect_ok(nix::unistd::truncate(&f, 100_000), "truncate grow");
        let got = fs::read(&f).unwrap();
        assert_eq!(got.len(), 100_000);
        assert_eq!(&got[..10_000], &data[..]);
        assert!(
            got[10_000..].iter().all(|&b| b == 0),
            "grown area reads as zeros"
        );
        expect_ok(nix::unistd::truncate(&f, 3_000), "truncate shrink");
        assert_eq!(fs::read(&f).unwrap(), &data[..3_000]);
        // Regrow: the bytes cut off must not come back (stale data in a partial block).
        expect_ok(nix::unistd::truncate(&f, 10_000), "truncate regrow");
        let got = fs::read(&f).unwrap();
        assert_eq!(&got[..3_000], &data[..3_000]);
        assert!(
            got[3_000..].iter().all(|&b| b == 0),
            "regrown area reads zeros, not old data"
        );
        expect_ok(nix::unistd::truncate(&f, 0), "truncate to 0");
        assert_eq!(lstat(&f).unwrap().size(), 0);

        let fh = OpenOptions::new().read(true).write(true).open(&f).unwrap();
        expect_ok(fh.set_len(5_000), "ftruncate grow");
        assert_eq!(fh.metadata().unwrap().size(), 5_000);
        expect_ok(fh.set_len(1), "ftruncate shrink");
        assert_eq!(lstat(&f).unwrap().size(), 1);
        let ro = File::open(&f).unwrap();
        expect_err(
            nix::unistd::ftruncate(ro.as_fd(), 10),
            EINVAL,
            "ftruncate on a read-only fd",
        );
        expect_err(nix::unistd::truncate(d, 0), EISDIR, "truncate a directory");
        expect_err(
            nix::unistd::truncate(&f, -1),
            EINVAL,
            "truncate to a negative size",
        );
        expect_err(
            nix::unistd::truncate(&d.join("nope"), 0),
            ENOENT,
            "truncate missing",
        );
        expect_err(
            nix::unistd::truncate(&f, 1 << 62),
            EFBIG,
            "truncate to 2^62",
        );

        // A sparse file: holes read as zeros and take no space.
        let s = d.join("sparse");
        let fh = File::create(&s).unwrap();
        fh.write_all_at(b"tail", 10 << 20).unwrap();
        fh.write_all_at(b"head", 0).unwrap();
        fh.sync_all().unwrap();
        let got = fs::read(&s).unwrap();
        assert_eq!(got.len(), (10 << 20) + 4);
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[got.len() - 4..], b"tail");
        assert!(
            got[4..got.len() - 4].iter().all(|&b| b == 0),
            "holes read as zeros"
        );
        let blocks = lstat(&s).unwrap().blocks();
        assert!(
            blocks * 512 < (1 << 20),
            "a 10 MiB file with two written blocks is sparse: st_blocks={blocks}"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// create / open flags

#[test]
fn open_flags() {
    each("open", |_t, d| {
        let f = d.join("f");
        let mut fh = expect_ok(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&f),
            "O_CREAT|O_EXCL new",
        );
        fh.write_all(b"0123456789").unwrap();
        drop(fh);
        assert_eq!(mode(&f) & 0o7777, 0o600, "create mode");
        expect_err(
            OpenOptions::new().write(true).create_new(true).open(&f),
            EEXIST,
            "O_EXCL on existing file",
        );
        std::os::unix::fs::symlink("dangling-target", d.join("dl")).unwrap();
        expect_err(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(d.join("dl")),
            EEXIST,
            "O_EXCL on a dangling symlink",
        );
        assert!(
            lstat(&d.join("dangling-target")).is_err(),
            "O_EXCL must not follow the symlink"
        );
        // O_CREAT without O_EXCL through a dangling symlink creates the target.
        expect_ok(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(d.join("dl")),
            "O_CREAT via link",
        );
        assert!(lstat(&d.join("dangling-target")).is_ok());

        expect_ok(
            OpenOptions::new().write(true).truncate(true).open(&f),
            "O_TRUNC",
        );
        assert_eq!(lstat(&f).unwrap().size(), 0, "O_TRUNC empties the file");
        write_file(&f, b"abc");
        let mut fh = OpenOptions::new().append(true).open(&f).unwrap();
        fh.seek(SeekFrom::Start(0)).unwrap();
        fh.write_all(b"def").unwrap();
        drop(fh);
        let fh = OpenOptions::new().append(true).open(&f).unwrap();
        // pwrite on O_APPEND writes at the end too (Linux).
        fh.write_at(b"ghi", 0).unwrap();
        drop(fh);
        assert_eq!(
            fs::read(&f).unwrap(),
            b"abcdefghi",
            "O_APPEND writes at end of file"
        );

        expect_err(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(&f),
            ENOTDIR,
            "O_DIRECTORY on a file",
        );
        expect_ok(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(d),
            "O_DIRECTORY on dir",
        );
        expect_err(
            OpenOptions::new().write(true).open(d),
            EISDIR,
            "open a directory for writing",
        );
        expect_err(
            File::open(d.join("nope")),
            ENOENT,
            "open missing without O_CREAT",
        );
        expect_err(
            File::create(d.join("nope/x")),
            ENOENT,
            "O_CREAT under a missing directory",
        );
        expect_err(
            File::create(d.join("f/x")),
            ENOTDIR,
            "O_CREAT under a regular file",
        );
        std::os::unix::fs::symlink("f", d.join("lf")).unwrap();
        expect_err(
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(d.join("lf")),
            ELOOP,
            "O_NOFOLLOW on a symlink",
        );
        let mut ro = File::open(&f).unwrap();
        expect_err(ro.write(b"x"), EBADF, "write on a read-only fd");
        let mut wo = OpenOptions::new().write(true).open(&f).unwrap();
        expect_err(wo.read(&mut [0u8; 4]), EBADF, "read on a write-only fd");
        // Create-mode honoured: 0400 file can still be written through the creating fd.
        let mut fh = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(d.join("ro"))
            .unwrap();
        expect_ok(
            fh.write_all(b"still writable"),
            "write via the fd that created a 0400 file",
        );
        drop(fh);
        assert_eq!(fs::read(d.join("ro")).unwrap(), b"still writable");
    });
}

// ---------------------------------------------------------------------------------------------
// large offsets

#[test]
fn large_offsets() {
    each("big", |_t, d| {
        let f = d.join("f");
        let fh = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&f)
            .unwrap();
        let off = 1u64 << 36;
        expect_ok(fh.write_all_at(b"far away", off), "write at 2^36 (64 GiB)");
        assert_eq!(fh.metadata().unwrap().size(), off + 8);
        let mut b = [0u8; 8];
        fh.read_exact_at(&mut b, off).unwrap();
        assert_eq!(&b, b"far away");
        let mut z = vec![1u8; 8192];
        fh.read_exact_at(&mut z, off - 8192).unwrap();
        assert!(z.iter().all(|&x| x == 0), "hole before 2^36 reads zeros");
        assert_eq!(
            expect_ok(fh.read_at(&mut b, off + 1000), "read past EOF"),
            0,
            "read past EOF returns 0"
        );

        let tib = 1u64 << 40;
        match fh.write_all_at(b"terabyte", tib).errno_result() {
            Ok(()) => {
                say!("write at 2^40 accepted");
                fh.read_exact_at(&mut b, tib).unwrap();
                assert_eq!(&b, b"terabyte");
                assert_eq!(fh.metadata().unwrap().size(), tib + 8);
                let mut z = vec![1u8; 4096];
                fh.read_exact_at(&mut z, tib - 4096).unwrap();
                assert!(z.iter().all(|&x| x == 0));
            }
            Err(e) => {
                assert_eq!(
                    e,
                    EFBIG,
                    "write at 2^40: expected success or EFBIG, got {}",
                    cairn_fstests::errno_name(e)
                );
                say!("write at 2^40 -> EFBIG (maximum file size below 1 TiB)");
                assert_eq!(
                    fh.metadata().unwrap().size(),
                    off + 8,
                    "a refused write leaves the size alone"
                );
            }
        }
        expect_err(
            fh.write_at(b"x", 1 << 62),
            EFBIG,
            "write at 2^62 (beyond the maximum file size)",
        );
        expect_err(fh.set_len(1 << 62), EFBIG, "ftruncate to 2^62");
        let mut fh2 = &fh;
        assert_eq!(
            fh2.seek(SeekFrom::End(0)).unwrap(),
            fh.metadata().unwrap().size()
        );
        // Shrinking a huge sparse file frees it and leaves a readable small file.
        fh.set_len(3).unwrap();
        let mut s = Vec::new();
        File::open(&f).unwrap().read_to_end(&mut s).unwrap();
        assert_eq!(s, b"\0\0\0");
    });
}

// ---------------------------------------------------------------------------------------------
// mkdir / rmdir / unlink

#[test]
fn mkdir_rmdir_unlink() {
    each("dirs", |_t, d| {
        let a = d.join("a");
        expect_ok(fs::create_dir(&a), "mkdir");
        assert_eq!(nlink(&a), 2, "new dir nlink");
        assert_eq!(nlink(d), 3, "parent nlink +1 per subdirectory");
        expect_err(fs::create_dir(&a), EEXIST, "mkdir existing dir");
        write_file(&d.join("f"), b"");
        expect_err(fs::create_dir(d.join("f")), EEXIST, "mkdir over a file");
        expect_err(
            fs::create_dir(d.join("nope/x")),
            ENOENT,
            "mkdir under missing",
        );
        expect_err(fs::create_dir(d.join("f/x")), ENOTDIR, "mkdir under a file");
        expect_ok(
            fs::create_dir(d.join("trail/")),
            "mkdir with a trailing slash",
        );
        fs::create_dir(a.join("sub")).unwrap();
        assert_eq!(nlink(&a), 3);
        expect_err(fs::remove_dir(&a), ENOTEMPTY, "rmdir non-empty");
        expect_err(fs::remove_dir(a.join(".")), EINVAL, "rmdir .");
        expect_err(fs::remove_dir(a.join("sub/..")), ENOTEMPTY, "rmdir ..");
        expect_err(fs::remove_dir(d.join("f")), ENOTDIR, "rmdir a file");
        expect_err(fs::remove_dir(d.join("nope")), ENOENT, "rmdir missing");
        expect_ok(fs::remove_dir(a.join("sub")), "rmdir empty");
        assert_eq!(nlink(&a), 2, "parent nlink -1 after rmdir");
        // A directory emptied of files is removable.
        write_file(&a.join("g"), b"x");
        expect_err(fs::remove_dir(&a), ENOTEMPTY, "rmdir with a file inside");
        fs::remove_file(a.join("g")).unwrap();
        expect_ok(fs::remove_dir(&a), "rmdir after emptying");
        assert_eq!(nlink(d), 3, "nlink after removing a (trail remains)");
        expect_err(lstat(&a), ENOENT, "removed dir is gone");

        // unlink
        fs::create_dir(d.join("dd")).unwrap();
        expect_err(fs::remove_file(d.join("dd")), EISDIR, "unlink a directory");
        expect_err(fs::remove_file(d.join("nope")), ENOENT, "unlink missing");
        expect_err(
            fs::remove_file(d.join("f/x")),
            ENOTDIR,
            "unlink under a file",
        );
        let f = d.join("open-then-unlinked");
        write_file(&f, b"still here");
        let fh = OpenOptions::new().read(true).write(true).open(&f).unwrap();
        expect_ok(fs::remove_file(&f), "unlink an open file");
        expect_err(lstat(&f), ENOENT, "unlinked name gone");
        let mut s = String::new();
        (&fh).read_to_string(&mut s).unwrap();
        assert_eq!(s, "still here", "an unlinked open file stays readable");
        fh.write_all_at(b"more", 100).unwrap();
        assert_eq!(
            fh.metadata().unwrap().nlink(),
            0,
            "unlinked open file has nlink 0"
        );
        assert_eq!(fh.metadata().unwrap().size(), 104);
    });
}

// ---------------------------------------------------------------------------------------------
// rename

#[test]
fn rename_cases() {
    each("ren", |_t, d| {
        let (p1, p2) = (d.join("p1"), d.join("p2"));
        fs::create_dir(&p1).unwrap();
        fs::create_dir(&p2).unwrap();

        // Over an existing file: the target now names the source inode.
        write_file(&p1.join("a"), b"A");
        write_file(&p1.join("b"), b"B");
        let ia = ino(&p1.join("a"));
        expect_ok(fs::rename(p1.join("a"), p1.join("b")), "rename over a file");
        assert_eq!(ino(&p1.join("b")), ia);
        assert_eq!(fs::read(p1.join("b")).unwrap(), b"A");
        expect_err(lstat(&p1.join("a")), ENOENT, "old name gone");

        // Directory over an empty directory.
        fs::create_dir(p1.join("da")).unwrap();
        fs::create_dir(p1.join("db")).unwrap();
        write_file(&p1.join("da/inside"), b"");
        expect_ok(
            fs::rename(p1.join("da"), p1.join("db")),
            "rename dir over empty dir",
        );
        assert!(lstat(&p1.join("db/inside")).is_ok());
        assert_eq!(nlink(&p1), 3, "p1 has one subdir left");

        // Directory over a non-empty directory; file over dir; dir over file.
        fs::create_dir(p1.join("dc")).unwrap();
        expect_err(
            fs::rename(p1.join("dc"), p1.join("db")),
            ENOTEMPTY,
            "rename dir over non-empty dir",
        );
        expect_err(
            fs::rename(p1.join("b"), p1.join("dc")),
            EISDIR,
            "rename file over dir",
        );
        expect_err(
            fs::rename(p1.join("dc"), p1.join("b")),
            ENOTDIR,
            "rename dir over file",
        );
        expect_err(
            fs::rename(p1.join("nope"), p1.join("x")),
            ENOENT,
            "rename missing",
        );
        expect_err(
            fs::rename(p1.join("b"), p1.join("nope/x")),
            ENOENT,
            "rename into missing dir",
        );

        // Across directories: '..' and link counts follow.
        let (n1, n2) = (nlink(&p1), nlink(&p2));
        expect_ok(
            fs::rename(p1.join("dc"), p2.join("dc")),
            "rename dir across parents",
        );
        assert_eq!(nlink(&p1), n1 - 1, "old parent loses the '..' link");
        assert_eq!(nlink(&p2), n2 + 1, "new parent gains the '..' link");
        assert_eq!(
            ino(&p2.join("dc/..")),
            ino(&p2),
            "'..' points at the new parent"
        );
        let dotdot = dirent_ino(&p2.join("dc"), b"..");
        assert_eq!(
            dotdot,
            ino(&p2),
            "readdir '..' of the moved dir names the new parent"
        );
        // A directory over an empty directory in another parent: the new parent keeps its
        // count (one subdir replaced by another), the old parent loses one.
        fs::create_dir(p1.join("mover")).unwrap();
        fs::create_dir(p2.join("empty")).unwrap();
        let (n1, n2) = (nlink(&p1), nlink(&p2));
        expect_ok(
            fs::rename(p1.join("mover"), p2.join("empty")),
            "rename dir over an empty dir across parents",
        );
        assert_eq!(
            nlink(&p1),
            n1 - 1,
            "old parent loses a link (dir over empty dir across parents)"
        );
        assert_eq!(
            nlink(&p2),
            n2,
            "new parent's link count unchanged (dir over empty dir across parents)"
        );
        assert_eq!(ino(&p2.join("empty/..")), ino(&p2));
        fs::remove_dir(p2.join("empty")).unwrap();
        assert_eq!(nlink(&p2), n2 - 1);
        expect_ok(
            fs::rename(p1.join("b"), p2.join("b")),
            "rename file across parents",
        );
        assert_eq!(fs::read(p2.join("b")).unwrap(), b"A");

        // Into its own subtree.
        fs::create_dir_all(p2.join("dc/x/y")).unwrap();
        expect_err(
            fs::rename(p2.join("dc"), p2.join("dc/x/y/z")),
            EINVAL,
            "rename dir into its own subtree",
        );
        expect_err(
            fs::rename(p2.join("dc"), p2.join("dc/z")),
            EINVAL,
            "rename dir into itself",
        );

        // Same file: a no-op, for one name and for two hard links of one inode.
        expect_ok(fs::rename(p2.join("b"), p2.join("b")), "rename onto itself");
        assert!(lstat(&p2.join("b")).is_ok());
        fs::hard_link(p2.join("b"), p2.join("b2")).unwrap();
        expect_ok(
            fs::rename(p2.join("b"), p2.join("b2")),
            "rename onto a hard link of itself",
        );
        assert!(
            lstat(&p2.join("b")).is_ok() && lstat(&p2.join("b2")).is_ok(),
            "both names remain"
        );
        assert_eq!(nlink(&p2.join("b")), 2);

        // Replacing the last name of a file frees it; a file replaced by rename keeps its
        // other links.
        write_file(&p2.join("victim"), b"v");
        fs::hard_link(p2.join("victim"), p2.join("victim2")).unwrap();
        write_file(&p2.join("src"), b"s");
        fs::rename(p2.join("src"), p2.join("victim")).unwrap();
        assert_eq!(
            nlink(&p2.join("victim2")),
            1,
            "replaced inode loses one link"
        );
        assert_eq!(fs::read(p2.join("victim2")).unwrap(), b"v");

        // RENAME_NOREPLACE
        write_file(&p2.join("n1"), b"1");
        write_file(&p2.join("n2"), b"2");
        expect_err(
            rename2(
                &p2.join("n1"),
                &p2.join("n2"),
                RenameFlags::RENAME_NOREPLACE,
            ),
            EEXIST,
            "NOREPLACE",
        );
        assert_eq!(
            fs::read(p2.join("n2")).unwrap(),
            b"2",
            "NOREPLACE left the target"
        );
        expect_ok(
            rename2(
                &p2.join("n1"),
                &p2.join("n3"),
                RenameFlags::RENAME_NOREPLACE,
            ),
            "NOREPLACE new name",
        );

        // RENAME_EXCHANGE file<->file and file<->dir across parents.
        expect_ok(
            rename2(&p2.join("n2"), &p2.join("n3"), RenameFlags::RENAME_EXCHANGE),
            "EXCHANGE files",
        );
        assert_eq!(fs::read(p2.join("n2")).unwrap(), b"1");
        assert_eq!(fs::read(p2.join("n3")).unwrap(), b"2");
        let (q1, q2) = (d.join("q1"), d.join("q2"));
        fs::create_dir(&q1).unwrap();
        fs::create_dir(&q2).unwrap();
        fs::create_dir(q1.join("dir")).unwrap();
        write_file(&q2.join("file"), b"F");
        let (idir, ifile) = (ino(&q1.join("dir")), ino(&q2.join("file")));
        expect_ok(
            rename2(
                &q1.join("dir"),
                &q2.join("file"),
                RenameFlags::RENAME_EXCHANGE,
            ),
            "EXCHANGE dir<->file",
        );
        assert_eq!(ino(&q2.join("file")), idir, "q2/file is now the directory");
        assert_eq!(ino(&q1.join("dir")), ifile, "q1/dir is now the file");
        assert_eq!(nlink(&q1), 2, "q1 lost its subdir");
        assert_eq!(nlink(&q2), 3, "q2 gained a subdir");
        assert_eq!(
            ino(&q2.join("file/..")),
            ino(&q2),
            "exchanged dir's '..' follows"
        );
        assert_eq!(dirent_ino(&q2.join("file"), b".."), ino(&q2));
        expect_err(
            rename2(
                &q1.join("dir"),
                &q2.join("missing"),
                RenameFlags::RENAME_EXCHANGE,
            ),
            ENOENT,
            "EXCHANGE with a missing target",
        );
        expect_err(
            rename2(
                &q1.join("dir"),
                &q2.join("x"),
                RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_NOREPLACE,
            ),
            EINVAL,
            "EXCHANGE|NOREPLACE",
        );
    });
}

/// renameat2(RENAME_WHITEOUT) through the kernel: the old name is a whiteout (a character
/// device 0/0, no permission bits, the caller's, one link) and the moved file keeps its
/// link count and contents; over a target, with NOREPLACE, a directory across parents (the
/// parents' link counts as in a rename, its `..` follows); EXCHANGE with it is EINVAL and a
/// caller without CAP_MKNOD gets EPERM. A host file system without whiteouts is skipped.
#[test]
fn rename_whiteout() {
    use std::os::unix::fs::FileTypeExt;
    each("rename_whiteout", |t, d| {
        let wo = RenameFlags::RENAME_WHITEOUT;
        let p = |n: &str| d.join(n);
        let is_whiteout = |n: &str| {
            let m = lstat(&p(n)).unwrap();
            m.file_type().is_char_device()
                && (m.rdev(), m.mode() & 0o7777, m.nlink(), m.uid(), m.size()) == (0, 0, 1, 0, 0)
        };
        write_file(&p("a"), b"A");
        let ia = ino(&p("a"));
        match rename2(&p("a"), &p("b"), wo) {
            Err(nix::errno::Errno::EINVAL) if !t.is_cairn() => {
                say!("{}: no whiteouts here, skipped", t.name());
                return;
            }
            r => expect_ok(r, "WHITEOUT"),
        }
        assert!(is_whiteout("a"), "{}: a is a whiteout", t.name());
        assert_eq!(ino(&p("b")), ia);
        assert_eq!(nlink(&p("b")), 1);
        assert_eq!(fs::read(p("b")).unwrap(), b"A");
        // Over a target.
        write_file(&p("c"), b"C");
        expect_ok(rename2(&p("b"), &p("c"), wo), "WHITEOUT over a target");
        assert_eq!(fs::read(p("c")).unwrap(), b"A");
        assert!(is_whiteout("b"));
        // With NOREPLACE.
        let nrwo = wo | RenameFlags::RENAME_NOREPLACE;
        expect_err(
            rename2(&p("c"), &p("b"), nrwo),
            EEXIST,
            "NOREPLACE|WHITEOUT",
        );
        expect_ok(
            rename2(&p("c"), &p("e"), nrwo),
            "NOREPLACE|WHITEOUT new name",
        );
        assert!(is_whiteout("c"));
        expect_err(
            rename2(&p("e"), &p("a"), wo | RenameFlags::RENAME_EXCHANGE),
            EINVAL,
            "EXCHANGE|WHITEOUT",
        );
        assert_eq!(ino(&p("e")), ia);
        // A directory across parents.
        fs::create_dir_all(p("p/sub")).unwrap();
        fs::create_dir(p("q")).unwrap();
        let isub = ino(&p("p/sub"));
        expect_ok(
            rename2(&p("p/sub"), &p("q/sub"), wo),
            "WHITEOUT of a directory",
        );
        assert!(is_whiteout("p/sub"));
        assert_eq!((nlink(&p("p")), nlink(&p("q"))), (2, 3));
        assert_eq!(ino(&p("q/sub")), isub);
        assert_eq!(dirent_ino(&p("q/sub"), b".."), ino(&p("q")));
        // Without CAP_MKNOD.
        write_file(&p("u"), b"U");
        chmod(d, 0o777);
        let dd = d.to_path_buf();
        as_user(UB, UB, &[UB], "rename with a whiteout", move |c| {
            c.err(
                rename2(&dd.join("u"), &dd.join("u2"), RenameFlags::RENAME_WHITEOUT),
                EPERM,
                "WHITEOUT without CAP_MKNOD",
            );
            c.check(lstat(&dd.join("u")).is_ok(), "the source kept its name");
        });
    });
}

/// The inode number readdir reports for `name` in `dir`.
fn dirent_ino(dir: &Path, name: &[u8]) -> u64 {
    let fh = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .unwrap();
    loop {
        let ents = sys::getdents64(fh.as_fd(), 4096).unwrap();
        if ents.is_empty() {
            panic!(
                "{} has no entry {:?}",
                dir.display(),
                String::from_utf8_lossy(name)
            );
        }
        if let Some(e) = ents.iter().find(|e| e.name == name) {
            return e.ino;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// link / symlink / readlink / mknod

#[test]
fn hard_links() {
    each("link", |_t, d| {
        let f = d.join("f");
        write_file(&f, b"shared");
        expect_ok(fs::hard_link(&f, d.join("g")), "link");
        assert_eq!(nlink(&f), 2);
        assert_eq!(ino(&f), ino(&d.join("g")));
        fs::create_dir(d.join("sub")).unwrap();
        expect_ok(fs::hard_link(&f, d.join("sub/h")), "link into a subdir");
        assert_eq!(nlink(&f), 3);
        expect_err(
            fs::hard_link(d.join("sub"), d.join("dl")),
            EPERM,
            "link to a directory",
        );
        expect_err(
            fs::hard_link(&f, d.join("g")),
            EEXIST,
            "link onto an existing name",
        );
        expect_err(
            fs::hard_link(d.join("nope"), d.join("x")),
            ENOENT,
            "link of a missing file",
        );
        expect_err(
            fs::hard_link(&f, d.join("nope/x")),
            ENOENT,
            "link into a missing dir",
        );
        fs::write(d.join("g"), b"changed").unwrap();
        assert_eq!(
            fs::read(d.join("sub/h")).unwrap(),
            b"changed",
            "links share contents"
        );
        fs::remove_file(&f).unwrap();
        assert_eq!(nlink(&d.join("g")), 2);
        fs::remove_file(d.join("sub/h")).unwrap();
        assert_eq!(nlink(&d.join("g")), 1);
        assert_eq!(fs::read(d.join("g")).unwrap(), b"changed");
    });
}

#[test]
fn symlinks() {
    each("sym", |_t, d| {
        let l = d.join("short");
        expect_ok(std::os::unix::fs::symlink("target", &l), "symlink");
        assert_eq!(fs::read_link(&l).unwrap().as_os_str().as_bytes(), b"target");
        let m = lstat(&l).unwrap();
        assert_eq!(m.size(), 6, "symlink size is the target length");
        assert_eq!(m.mode() & 0o777, 0o777);
        for len in [59usize, 60, 61, 200, 1000, 4095] {
            let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let p = d.join(format!("len{len}"));
            expect_ok(
                std::os::unix::fs::symlink(os(&target), &p),
                &format!("symlink with a {len}-byte target"),
            );
            assert_eq!(
                fs::read_link(&p).unwrap().as_os_str().as_bytes(),
                &target[..],
                "{len}-byte target"
            );
            assert_eq!(lstat(&p).unwrap().size(), len as u64);
        }
        let too_long = vec![b'x'; 4096];
        expect_err(
            std::os::unix::fs::symlink(os(&too_long), d.join("toolong")),
            ENAMETOOLONG,
            "4096-byte target",
        );
        write_file(&d.join("file"), b"");
        expect_err(
            std::os::unix::fs::symlink("x", d.join("file")),
            EEXIST,
            "symlink over existing",
        );
        expect_err(fs::read_link(d.join("file")), EINVAL, "readlink of a file");
        expect_err(fs::read_link(d.join("nope")), ENOENT, "readlink missing");
        std::os::unix::fs::symlink("loop2", d.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", d.join("loop2")).unwrap();
        expect_err(
            File::open(d.join("loop1")),
            ELOOP,
            "open through a symlink loop",
        );
        expect_err(
            fs::metadata(d.join("loop1")),
            ELOOP,
            "stat through a symlink loop",
        );
        std::os::unix::fs::symlink("nowhere", d.join("dangling")).unwrap();
        expect_err(
            fs::metadata(d.join("dangling")),
            ENOENT,
            "stat of a dangling symlink",
        );
        assert!(lstat(&d.join("dangling")).is_ok());
        std::os::unix::fs::symlink("file", d.join("tofile")).unwrap();
        fs::write(d.join("tofile"), b"via link").unwrap();
        assert_eq!(
            fs::read(d.join("file")).unwrap(),
            b"via link",
            "writes follow the link"
        );
        fs::remove_file(d.join("tofile")).unwrap();
        assert!(
            lstat(&d.join("file")).is_ok(),
            "unlinking the link leaves the target"
        );
    });
}

#[test]
fn mknod_special_files() {
    each("nodes", |_t, d| {
        let fifo = d.join("fifo");
        expect_ok(
            nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o640)),
            "mkfifo",
        );
        let m = lstat(&fifo).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()));
        assert_eq!(m.mode() & 0o777, 0o640);
        let sock = d.join("sock");
        let listener = expect_ok(
            std::os::unix::net::UnixListener::bind(&sock),
            "bind a unix socket",
        );
        assert!(std::os::unix::fs::FileTypeExt::is_socket(
            &lstat(&sock).unwrap().file_type()
        ));
        // The socket node works: connect through it.
        let c = std::os::unix::net::UnixStream::connect(&sock);
        assert!(c.is_ok(), "connect through the socket node: {c:?}");
        drop(listener);
        let chr = d.join("null");
        let dev = nix::sys::stat::makedev(1, 3);
        expect_ok(
            mknod(&chr, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), dev),
            "mknod char device",
        );
        let m = lstat(&chr).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &m.file_type()
        ));
        assert_eq!(m.rdev(), dev, "rdev of the char device");
        let blk = d.join("loop");
        let dev = nix::sys::stat::makedev(7, 200);
        expect_ok(
            mknod(&blk, SFlag::S_IFBLK, Mode::from_bits_truncate(0o600), dev),
            "mknod block device",
        );
        let m = lstat(&blk).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_block_device(
            &m.file_type()
        ));
        assert_eq!(m.rdev(), dev, "rdev of the block device");
        let big = d.join("bigdev");
        let dev = nix::sys::stat::makedev(259, 65_537);
        expect_ok(
            mknod(&big, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev),
            "mknod large major/minor",
        );
        assert_eq!(
            lstat(&big).unwrap().rdev(),
            dev,
            "rdev with a >255 major and >65535 minor"
        );
        expect_ok(
            mknod(
                &d.join("reg"),
                SFlag::S_IFREG,
                Mode::from_bits_truncate(0o600),
                0,
            ),
            "mknod regular",
        );
        assert!(lstat(&d.join("reg")).unwrap().is_file());
        expect_err(
            mknod(&fifo, SFlag::S_IFIFO, Mode::from_bits_truncate(0o600), 0),
            EEXIST,
            "mknod existing",
        );
        expect_err(
            mknod(
                &d.join("nope/x"),
                SFlag::S_IFIFO,
                Mode::from_bits_truncate(0o600),
                0,
            ),
            ENOENT,
            "mknod under missing",
        );
    });
}

// ---------------------------------------------------------------------------------------------
// readdir

#[test]
fn readdir_complete_and_stable() {
    each("rd", |_t, d| {
        let n = 300;
        let mut want: Vec<Vec<u8>> = Vec::new();
        for i in 0..n {
            let name = format!("entry-{i:04}");
            if i % 10 == 0 {
                fs::create_dir(d.join(&name)).unwrap();
            } else {
                write_file(&d.join(&name), b"");
            }
            want.push(name.into_bytes());
        }
        // Every entry exactly once, with '.' and '..' and right inode numbers and types.
        let fh = File::open(d).unwrap();
        let mut seen: Vec<sys::Dirent> = Vec::new();
        loop {
            let ents = sys::getdents64(fh.as_fd(), 4096).unwrap();
            if ents.is_empty() {
                break;
            }
            seen.extend(ents);
        }
        let mut got: Vec<Vec<u8>> = seen.iter().map(|e| e.name.clone()).collect();
        got.sort();
        let mut expect = want.clone();
        expect.push(b".".to_vec());
        expect.push(b"..".to_vec());
        expect.sort();
        assert_eq!(
            got, expect,
            "readdir returns every entry exactly once, plus . and .."
        );
        say!("readdir listed {} entries", got.len());
        let parent_ino = ino(d.parent().unwrap());
        for e in &seen {
            match e.name.as_slice() {
                b"." => assert_eq!(e.ino, ino(d), "'.' inode"),
                b".." => assert_eq!(e.ino, parent_ino, "'..' inode"),
                name => {
                    let p = d.join(os(name));
                    assert_eq!(e.ino, ino(&p), "d_ino of {}", p.display());
                    let want_type = if lstat(&p).unwrap().is_dir() {
                        libc::DT_DIR
                    } else {
                        libc::DT_REG
                    };
                    assert_eq!(e.dtype, want_type, "d_type of {}", p.display());
                }
            }
        }

        // Stability: names present throughout come back exactly once while other names are
        // created and removed between getdents calls.
        let s = d.join("stable");
        fs::create_dir(&s).unwrap();
        let pad = "p".repeat(60);
        let stable: Vec<String> = (0..400).map(|i| format!("s{i:04}-{pad}")).collect();
        for name in &stable {
            write_file(&s.join(name), b"");
        }
        let mut churn: Vec<String> = (0..100).map(|i| format!("c{i:04}-{pad}")).collect();
        for name in &churn {
            write_file(&s.join(name), b"");
        }
        let fh = File::open(&s).unwrap();
        let mut listed: Vec<Vec<u8>> = Vec::new();
        let mut next = 100;
        let mut calls = 0;
        loop {
            let ents = sys::getdents64(fh.as_fd(), 1024).unwrap();
            if ents.is_empty() {
                break;
            }
            calls += 1;
            listed.extend(ents.into_iter().map(|e| e.name));
            for _ in 0..5 {
                let gone = churn.remove(0);
                fs::remove_file(s.join(&gone)).unwrap();
                let new = format!("c{next:04}-{pad}");
                next += 1;
                write_file(&s.join(&new), b"");
                churn.push(new);
            }
        }
        say!("stable listing took {calls} getdents calls with churn in between");
        assert!(
            calls > 10,
            "the listing should need many calls (got {calls})"
        );
        let mut sorted = listed.clone();
        sorted.sort();
        let dups: Vec<_> = sorted
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| String::from_utf8_lossy(&w[0]).into_owned())
            .collect();
        assert!(
            dups.is_empty(),
            "names returned twice during churn: {dups:?}"
        );
        for name in &stable {
            assert!(
                sorted.binary_search(&name.as_bytes().to_vec()).is_ok(),
                "stable name {name} missing from the listing"
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// statfs

#[test]
fn statfs_sane_and_tracks_usage() {
    let targets = if cairn_fstests::host_only() {
        vec![Target::host_tmpfs("64M", Some(10_000))]
    } else {
        cairn_fstests::modes()
            .iter()
            .map(|m| Target::cairn_sized(m, "64M", &[]))
            .collect()
    };
    for t in targets {
        say!("=== statfs on {}", t.name());
        let s0 = t.statfs();
        say!(
            "bsize {} frsize {} blocks {} bfree {} bavail {} files {} ffree {} namemax {}",
            s0.block_size(),
            s0.fragment_size(),
            s0.blocks(),
            s0.blocks_free(),
            s0.blocks_available(),
            s0.files(),
            s0.files_free(),
            s0.name_max()
        );
        assert!(s0.block_size() >= 512 && s0.fragment_size() >= 512);
        let total = s0.blocks() * s0.fragment_size();
        assert!(
            (48 << 20..=64 << 20).contains(&total),
            "a 64 MiB file system reports {total} bytes"
        );
        assert!(s0.blocks_free() <= s0.blocks() && s0.blocks_available() <= s0.blocks_free());
        assert!(s0.files() > 0 && s0.files_free() <= s0.files());
        assert_eq!(s0.name_max(), 255);
        let d = t.path("usage");
        fs::create_dir(&d).unwrap();
        let data = pattern(7, 8 << 20);
        let f = File::create(d.join("big")).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        drop(f);
        for i in 0..100 {
            write_file(&d.join(format!("f{i}")), b"");
        }
        let s1 = t.statfs();
        let used = (s0.blocks_free() - s1.blocks_free()) * s1.fragment_size();
        assert!(
            used >= 8 << 20,
            "writing 8 MiB used only {used} bytes of free space"
        );
        assert!(
            s0.files_free() - s1.files_free() >= 100,
            "100 new files: ffree {} -> {}",
            s0.files_free(),
            s1.files_free()
        );
        fs::remove_dir_all(&d).unwrap();
        let s2 = t.statfs();
        say!(
            "bfree {} -> {} -> {}; ffree {} -> {} -> {}",
            s0.blocks_free(),
            s1.blocks_free(),
            s2.blocks_free(),
            s0.files_free(),
            s1.files_free(),
            s2.files_free()
        );
        assert!(
            s2.blocks_free() + freed_slack(&t, &s0, 16) >= s0.blocks_free(),
            "space comes back after deleting"
        );
        assert_eq!(
            s2.files_free(),
            s0.files_free(),
            "inodes come back after deleting"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// fsync / fdatasync / fsync on a directory

#[test]
fn fsync_variants() {
    each("sync", |_t, d| {
        let f = File::create(d.join("f")).unwrap();
        f.write_all_at(b"data", 0).unwrap();
        expect_ok(f.sync_all(), "fsync");
        expect_ok(f.sync_data(), "fdatasync");
        let ro = File::open(d.join("f")).unwrap();
        expect_ok(ro.sync_all(), "fsync on a read-only fd");
        let dir = File::open(d).unwrap();
        expect_ok(dir.sync_all(), "fsync on a directory");
        expect_ok(dir.sync_data(), "fdatasync on a directory");
        expect_ok(nix::unistd::syncfs(dir.as_fd()), "syncfs");
    });
}

// ---------------------------------------------------------------------------------------------
// extended attributes

#[test]
fn xattrs() {
    each("xattr", |_t, d| {
        let f = d.join("f");
        write_file(&f, b"");
        expect_ok(sys::setxattr(&f, "user.a", b"alpha", 0), "setxattr");
        assert_eq!(sys::getxattr(&f, "user.a").unwrap(), b"alpha");
        expect_ok(
            sys::setxattr(&f, "user.empty", b"", 0),
            "setxattr empty value",
        );
        assert_eq!(
            expect_ok(sys::getxattr_size(&f, "user.empty"), "probe empty"),
            0
        );
        let big = pattern(3, 1000);
        expect_ok(
            sys::setxattr(&f, "user.big", &big, 0),
            "setxattr 1000 bytes",
        );
        assert_eq!(sys::getxattr(&f, "user.big").unwrap(), big);
        assert_eq!(
            sys::listxattr(&f)
                .unwrap()
                .into_iter()
                .filter(|n| n.starts_with("user."))
                .collect::<Vec<_>>(),
            ["user.a", "user.big", "user.empty"]
        );
        expect_err(
            sys::setxattr(&f, "user.a", b"x", libc::XATTR_CREATE),
            EEXIST,
            "XATTR_CREATE on existing",
        );
        expect_err(
            sys::setxattr(&f, "user.zz", b"x", libc::XATTR_REPLACE),
            ENODATA,
            "XATTR_REPLACE on missing",
        );
        expect_ok(
            sys::setxattr(&f, "user.a", b"replaced value", libc::XATTR_REPLACE),
            "XATTR_REPLACE",
        );
        assert_eq!(sys::getxattr(&f, "user.a").unwrap(), b"replaced value");
        expect_ok(
            sys::setxattr(&f, "user.new", b"n", libc::XATTR_CREATE),
            "XATTR_CREATE new",
        );
        expect_err(
            sys::getxattr(&f, "user.missing"),
            ENODATA,
            "getxattr missing",
        );
        expect_err(
            sys::getxattr_size(&f, "user.missing"),
            ENODATA,
            "size probe of missing",
        );
        assert_eq!(
            expect_ok(sys::getxattr_size(&f, "user.a"), "size probe"),
            14
        );
        expect_err(
            sys::getxattr_buf(&f, "user.a", 4),
            ERANGE,
            "getxattr with a too-small buffer",
        );
        let list_len = sys::listxattr_buf(&f, 0).unwrap().len();
        expect_err(
            sys::listxattr_buf(&f, list_len - 1),
            ERANGE,
            "listxattr with a too-small buffer",
        );
        expect_ok(sys::removexattr(&f, "user.a"), "removexattr");
        expect_err(sys::getxattr(&f, "user.a"), ENODATA, "get after remove");
        expect_err(sys::removexattr(&f, "user.a"), ENODATA, "remove missing");
        expect_err(
            sys::setxattr(&f, "bogus.ns", b"x", 0),
            EOPNOTSUPP,
            "unknown namespace",
        );
        expect_err(
            sys::getxattr(&d.join("nope"), "user.a"),
            ENOENT,
            "getxattr on a missing file",
        );
        // Directories carry xattrs too; they survive rename.
        fs::create_dir(d.join("dir")).unwrap();
        expect_ok(
            sys::setxattr(&d.join("dir"), "user.d", b"on a dir", 0),
            "setxattr on a dir",
        );
        fs::rename(d.join("dir"), d.join("dir2")).unwrap();
        assert_eq!(
            sys::getxattr(&d.join("dir2"), "user.d").unwrap(),
            b"on a dir"
        );
        // Many attributes on one inode.
        let g = d.join("many");
        write_file(&g, b"");
        for i in 0..50 {
            expect_ok(
                sys::setxattr(
                    &g,
                    &format!("user.k{i:02}"),
                    format!("value {i}").as_bytes(),
                    0,
                ),
                "setxattr many",
            );
        }
        for i in 0..50 {
            assert_eq!(
                sys::getxattr(&g, &format!("user.k{i:02}")).unwrap(),
                format!("value {i}").as_bytes()
            );
        }
        assert_eq!(
            sys::listxattr(&g)
                .unwrap()
                .iter()
                .filter(|n| n.starts_with("user.k"))
                .count(),
            50
        );
    });
}

// ---------------------------------------------------------------------------------------------
// fallocate

#[test]
fn fallocate_modes() {
    each("falloc", |_t, d| {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.join("f"))
            .unwrap();
        expect_ok(
            nix::fcntl::fallocate(f.as_fd(), FallocateFlags::empty(), 0, 1 << 20),
            "fallocate mode 0",
        );
        let m = f.metadata().unwrap();
        assert_eq!(m.size(), 1 << 20, "mode 0 extends the size");
        assert!(
            m.blocks() * 512 >= 1 << 20,
            "mode 0 allocates: st_blocks={}",
            m.blocks()
        );
        let mut buf = Vec::new();
        (&f).read_to_end(&mut buf).unwrap();
        assert!(
            buf.len() == 1 << 20 && buf.iter().all(|&b| b == 0),
            "fallocated range reads as zeros"
        );
        expect_ok(
            nix::fcntl::fallocate(
                f.as_fd(),
                FallocateFlags::FALLOC_FL_KEEP_SIZE,
                1 << 20,
                1 << 20,
            ),
            "fallocate KEEP_SIZE",
        );
        assert_eq!(
            f.metadata().unwrap().size(),
            1 << 20,
            "KEEP_SIZE keeps the size"
        );
        f.write_all_at(&pattern(9, 64 << 10), 0).unwrap();
        match nix::fcntl::fallocate(
            f.as_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            16 << 10,
            16 << 10,
        )
        .errno_result()
        {
            Ok(()) => {
                let mut b = vec![1u8; 64 << 10];
                f.read_exact_at(&mut b, 0).unwrap();
                let p = pattern(9, 64 << 10);
                assert_eq!(
                    &b[..16 << 10],
                    &p[..16 << 10],
                    "data before the hole intact"
                );
                assert!(
                    b[16 << 10..32 << 10].iter().all(|&x| x == 0),
                    "punched range reads zeros"
                );
                assert_eq!(&b[32 << 10..], &p[32 << 10..], "data after the hole intact");
                assert_eq!(
                    f.metadata().unwrap().size(),
                    1 << 20,
                    "punching keeps the size"
                );
                say!("PUNCH_HOLE supported");
            }
            Err(e) => {
                assert_eq!(e, EOPNOTSUPP, "PUNCH_HOLE: expected success or EOPNOTSUPP");
                say!("PUNCH_HOLE -> EOPNOTSUPP (documented latitude)");
            }
        }
        expect_err(
            nix::fcntl::fallocate(f.as_fd(), FallocateFlags::empty(), 0, 0),
            EINVAL,
            "fallocate length 0",
        );
        expect_err(
            nix::fcntl::fallocate(f.as_fd(), FallocateFlags::empty(), -1, 10),
            EINVAL,
            "negative offset",
        );
        let ro = File::open(d.join("f")).unwrap();
        expect_err(
            nix::fcntl::fallocate(ro.as_fd(), FallocateFlags::empty(), 0, 10),
            EBADF,
            "fallocate read-only fd",
        );
        expect_err(
            nix::fcntl::fallocate(f.as_fd(), FallocateFlags::empty(), 1 << 62, 4096),
            EFBIG,
            "fallocate beyond the maximum file size",
        );
    });
}

// ---------------------------------------------------------------------------------------------
// names

#[test]
fn names_lengths_and_odd_bytes() {
    each("names", |_t, d| {
        let n255 = "n".repeat(255);
        let n256 = "n".repeat(256);
        expect_ok(File::create(d.join(&n255)), "create with a 255-byte name");
        assert!(lstat(&d.join(&n255)).is_ok());
        expect_err(
            File::create(d.join(&n256)),
            ENAMETOOLONG,
            "create with a 256-byte name",
        );
        expect_err(
            lstat(&d.join(&n256)),
            ENAMETOOLONG,
            "lookup of a 256-byte name",
        );
        expect_err(
            fs::create_dir(d.join(&n256)),
            ENAMETOOLONG,
            "mkdir with a 256-byte name",
        );
        expect_err(
            std::os::unix::fs::symlink("x", d.join(&n256)),
            ENAMETOOLONG,
            "symlink with a 256-byte name",
        );
        expect_err(
            fs::rename(d.join(&n255), d.join(&n256)),
            ENAMETOOLONG,
            "rename to a 256-byte name",
        );
        expect_err(
            fs::hard_link(d.join(&n255), d.join(&n256)),
            ENAMETOOLONG,
            "link to a 256-byte name",
        );
        let d255 = "d".repeat(255);
        expect_ok(fs::create_dir(d.join(&d255)), "mkdir with a 255-byte name");
        let u = "ü".repeat(127); // 254 bytes of UTF-8
        expect_ok(File::create(d.join(&u)), "254-byte UTF-8 name");

        let odd: Vec<&[u8]> = vec![
            b"\x01ctrl",
            b"\xffhigh\xfe",
            "ünïcødé €".as_bytes(),
            b"with space",
            b" leading and trailing ",
            b"new\nline",
            b"tab\there",
            b"-dash",
            b"...",
            b"a\\b",
            b"\x7f",
            "日本語のファイル名".as_bytes(),
        ];
        for (i, name) in odd.iter().enumerate() {
            let p = d.join(os(name));
            expect_ok(
                fs::write(&p, format!("content {i}")),
                &format!("create {:?}", String::from_utf8_lossy(name)),
            );
        }
        let listed = names(d);
        for (i, name) in odd.iter().enumerate() {
            assert!(
                listed.contains(&name.to_vec()),
                "{:?} round-trips through readdir",
                String::from_utf8_lossy(name)
            );
            assert_eq!(
                fs::read(d.join(os(name))).unwrap(),
                format!("content {i}").as_bytes()
            );
        }
        // Names differing only in case are distinct.
        write_file(&d.join("Case"), b"1");
        write_file(&d.join("case"), b"2");
        assert_ne!(ino(&d.join("Case")), ino(&d.join("case")));
    });
}

// ---------------------------------------------------------------------------------------------
// timestamps

struct Stamp {
    a: i128,
    m: i128,
    c: i128,
}

fn stamp(p: &Path) -> Stamp {
    let (a, m, c) = times(p);
    Stamp { a, m, c }
}

#[track_caller]
fn changed(before: &Stamp, after: &Stamp, what: &str, a: bool, m: bool, c: bool) {
    let check = |name: &str, b: i128, x: i128, want: bool| {
        if want {
            assert!(x > b, "{what}: {name} should change ({b} -> {x})");
        } else {
            assert_eq!(x, b, "{what}: {name} should not change");
        }
    };
    check("atime", before.a, after.a, a);
    check("mtime", before.m, after.m, m);
    check("ctime", before.c, after.c, c);
    say!("ok: {what} changes atime={a} mtime={m} ctime={c}");
}

#[test]
fn timestamps() {
    each("times", |_t, d| {
        let (p1, p2) = (d.join("p1"), d.join("p2"));
        fs::create_dir(&p1).unwrap();
        fs::create_dir(&p2).unwrap();
        tick();
        let t0 = now_ns();
        let b1 = stamp(&p1);
        tick();
        let f = p1.join("f");
        File::create(&f).unwrap();
        let s = stamp(&f);
        assert!(
            s.a >= t0 && s.m >= t0 && s.c >= t0,
            "create sets all three times to now"
        );
        assert!(
            s.a == s.m && s.m == s.c,
            "create sets atime = mtime = ctime"
        );
        changed(&b1, &stamp(&p1), "create (parent)", false, true, true);

        tick();
        let b = stamp(&f);
        OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .write_all(b"data")
            .unwrap();
        changed(&b, &stamp(&f), "write", false, true, true);

        tick();
        let b = stamp(&f);
        chmod(&f, 0o600);
        changed(&b, &stamp(&f), "chmod", false, false, true);

        tick();
        let b = stamp(&f);
        chown(&f, Some(Uid::from_raw(1)), None).unwrap();
        changed(&b, &stamp(&f), "chown", false, false, true);

        tick();
        let b = stamp(&f);
        nix::unistd::truncate(&f, 1).unwrap();
        changed(&b, &stamp(&f), "truncate", false, true, true);

        tick();
        let b = stamp(&f);
        sys::setxattr(&f, "user.t", b"v", 0).unwrap();
        changed(&b, &stamp(&f), "setxattr", false, false, true);

        tick();
        let b = stamp(&f);
        let mt = TimeSpec::new(1_000_000, 0);
        utimensat(
            AT_FDCWD,
            &f,
            &TimeSpec::UTIME_OMIT,
            &mt,
            UtimensatFlags::FollowSymlink,
        )
        .unwrap();
        let a = stamp(&f);
        assert_eq!(a.m, 1_000_000_000_000_000);
        assert!(
            a.c > b.c && a.a == b.a,
            "utimensat sets ctime to now and leaves an omitted atime"
        );

        tick();
        let (bf, bp1, bp2) = (stamp(&f), stamp(&p1), stamp(&p2));
        fs::rename(&f, p2.join("f")).unwrap();
        let f = p2.join("f");
        changed(&bf, &stamp(&f), "rename (moved inode)", false, false, true);
        changed(&bp1, &stamp(&p1), "rename (old parent)", false, true, true);
        changed(&bp2, &stamp(&p2), "rename (new parent)", false, true, true);

        tick();
        let (bf, bp1) = (stamp(&f), stamp(&p1));
        fs::hard_link(&f, p1.join("link")).unwrap();
        changed(&bf, &stamp(&f), "link (file)", false, false, true);
        changed(&bp1, &stamp(&p1), "link (dir)", false, true, true);

        tick();
        let (bf, bp1) = (stamp(&f), stamp(&p1));
        fs::remove_file(p1.join("link")).unwrap();
        changed(
            &bf,
            &stamp(&f),
            "unlink (file, via its other link)",
            false,
            false,
            true,
        );
        changed(&bp1, &stamp(&p1), "unlink (parent)", false, true, true);

        tick();
        let bp1 = stamp(&p1);
        fs::create_dir(p1.join("sub")).unwrap();
        changed(&bp1, &stamp(&p1), "mkdir (parent)", false, true, true);
        let s = stamp(&p1.join("sub"));
        assert!(s.a == s.m && s.m == s.c, "mkdir sets all three times equal");
        tick();
        let bp1 = stamp(&p1);
        fs::remove_dir(p1.join("sub")).unwrap();
        changed(&bp1, &stamp(&p1), "rmdir (parent)", false, true, true);

        tick();
        let bp1 = stamp(&p1);
        std::os::unix::fs::symlink("t", p1.join("sym")).unwrap();
        changed(&bp1, &stamp(&p1), "symlink (parent)", false, true, true);

        tick();
        let bf = stamp(&f);
        let mut s = String::new();
        File::open(&f).unwrap().read_to_string(&mut s).unwrap();
        let af = stamp(&f);
        assert!(
            af.m == bf.m && af.c == bf.c,
            "read changes neither mtime nor ctime"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// permissions as unprivileged users

const UA: u32 = 4242;
const UB: u32 = 4343;

/// A user who may write someone else's setuid/setgid file writes and truncates it, and the
/// bits are cleared as on ext4: setuid always, setgid only with group-execute. (Linux's FUSE
/// client asks for the clearing with a SETATTR of the mode sent as the writing user, which
/// the file system must accept from a non-owner.)
#[test]
fn non_owner_write_clears_setuid_and_setgid() {
    each("killpriv", |_t, d| {
        chmod(d, 0o777);
        let d = d.to_path_buf();
        let p = |n: &str| -> PathBuf { d.join(n) };
        for (name, m) in [
            ("ug-x", 0o6777),
            ("g-nox", 0o2666),
            ("u-trunc", 0o4666),
            ("ug-ftrunc", 0o6676),
            ("u-chmod", 0o4666),
        ] {
            write_file(&p(name), b"original");
            chown(&p(name), Some(Uid::from_raw(UA)), Some(Gid::from_raw(UA))).unwrap();
            chmod(&p(name), m);
            assert_eq!(mode(&p(name)) & 0o7777, m, "{name}: set up as root");
        }
        let dd = d.clone();
        // UB is in the files' group: Linux (6.x) also drops S_ISGID without group-execute
        // when the writer is outside the file's group, on local file systems, but its FUSE
        // client never asks for that; a group member keeps it everywhere.
        as_user(UB, UB, &[UB, UA], "setuid/setgid write", move |c| {
            let p = |n: &str| dd.join(n);
            let perm = |n: &str| match lstat(&p(n)) {
                Ok(m) => format!("{:o}", m.mode() & 0o7777),
                Err(e) => format!("stat failed: {e}"),
            };
            c.ok(
                OpenOptions::new()
                    .write(true)
                    .open(p("ug-x"))
                    .and_then(|mut f| f.write_all(b"X")),
                "write another user's 06777 file",
            );
            let m = perm("ug-x");
            c.check(
                m == "777",
                &format!("setuid and setgid (group-execute set) cleared by the write (mode {m})"),
            );
            c.ok(
                OpenOptions::new()
                    .write(true)
                    .open(p("g-nox"))
                    .and_then(|mut f| f.write_all(b"X")),
                "write another user's 02666 file",
            );
            let m = perm("g-nox");
            c.check(
                m == "2666",
                &format!("setgid without group-execute kept (mode {m})"),
            );
            c.ok(
                nix::unistd::truncate(&p("u-trunc"), 3),
                "truncate another user's 04666 file",
            );
            let m = perm("u-trunc");
            c.check(
                m == "666",
                &format!("setuid cleared by truncate (mode {m})"),
            );
            c.ok(
                OpenOptions::new()
                    .write(true)
                    .open(p("ug-ftrunc"))
                    .and_then(|f| f.set_len(2)),
                "ftruncate another user's 06676 file",
            );
            let m = perm("ug-ftrunc");
            c.check(
                m == "676",
                &format!("setuid and setgid cleared by ftruncate (mode {m})"),
            );
            c.err(
                fs::set_permissions(p("u-chmod"), fs::Permissions::from_mode(0o0666)),
                EPERM,
                "an explicit chmod clearing setuid of another user's file",
            );
        });
        assert_eq!(fs::read(p("ug-x")).unwrap(), b"Xriginal");
        assert_eq!(fs::read(p("g-nox")).unwrap(), b"Xriginal");
        assert_eq!(fs::read(p("u-trunc")).unwrap(), b"ori");
        assert_eq!(fs::read(p("ug-ftrunc")).unwrap(), b"or");
        assert_eq!(mode(&p("u-chmod")) & 0o7777, 0o4666);
        say!("ok: non-owner writes clear setuid/setgid as on ext4");
    });
}

/// A `security.capability` value: VFS_CAP_REVISION_2 with the effective bit, cap_setgid and
/// cap_setuid permitted.
const CAPS: [u8; 20] = [
    1, 0, 0, 2, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Any change of a file's data removes its capabilities, whoever makes it (root here, who
/// keeps setuid) — a write, an append, a truncation, an open with O_TRUNC — as on ext4
/// (`file_remove_privs`), so a modified program never keeps its privileges. cairn asks for
/// FUSE_HANDLE_KILLPRIV_V2, with which the kernel checks a file's security xattrs once and
/// then marks it S_NOSEC (no GETXATTR per write, below): each file gets capabilities twice,
/// the second time after the kernel has seen it without them, which must not outlive the new
/// setxattr.
#[test]
fn a_change_of_data_removes_capabilities_whoever_makes_it() {
    type Change = fn(&Path);
    let ways: [(&str, Change); 4] = [
        ("write", |p| {
            let f = OpenOptions::new().write(true).open(p).unwrap();
            f.write_all_at(b"y", 1).unwrap();
        }),
        ("append", |p| {
            let mut f = OpenOptions::new().append(true).open(p).unwrap();
            f.write_all(b"z").unwrap();
        }),
        ("truncate", |p| {
            let f = OpenOptions::new().write(true).open(p).unwrap();
            f.set_len(1).unwrap();
        }),
        ("o_trunc", |p| {
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(p)
                .unwrap();
        }),
    ];
    each("data-killcaps", |t, d| {
        for (name, change) in ways {
            let f = d.join(name);
            write_file(&f, b"xx");
            chmod(&f, 0o4755);
            for round in ["first", "second"] {
                if let Err(e) = sys::setxattr(&f, "security.capability", &CAPS, 0) {
                    say!("{}: no security.capability here ({e}): skipped", t.name());
                    return;
                }
                change(&f);
                assert_eq!(
                    sys::getxattr(&f, "security.capability")
                        .map(|_| ())
                        .map_err(|e| e.raw_os_error().unwrap_or(-1)),
                    Err(ENODATA),
                    "{}: the capabilities stayed after a {name} ({round} time)",
                    t.name()
                );
            }
            assert_eq!(
                mode(&f) & 0o7777,
                0o4755,
                "{}: root's {name} kept setuid",
                t.name()
            );
        }
    });
}

/// A write(2) costs one request: the kernel sends no GETXATTR of `security.capability` before
/// each (FUSE_HANDLE_KILLPRIV_V2 marks the mount SB_NOSEC; capabilities still go, above).
/// Counted by the daemon (`cairn stats`): at most one GETXATTR
/// for 64 writes, where a mount without it counts one per write.
#[test]
fn a_write_sends_no_getxattr_before_it() {
    each("write-requests", |t, d| {
        if !t.is_cairn() {
            return;
        }
        let getxattrs = || {
            let o = cairn_fstests::run(
                std::process::Command::new(cairn_fstests::cairn_bin())
                    .args(["stats", "--json"])
                    .arg(t.root()),
            );
            assert!(o.status.success(), "cairn stats: {o:?}");
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            v["fuse"]["requests"]["getxattr"].as_u64().unwrap_or(0)
        };
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(d.join("f"))
            .unwrap();
        let before = getxattrs();
        for i in 0..64u64 {
            f.write_all_at(&[7u8; 4096], i * 8192).unwrap();
        }
        let asked = getxattrs() - before;
        assert!(
            asked <= 1,
            "{}: 64 writes sent {asked} GETXATTR requests",
            t.name()
        );
    });
}

/// fallocate, punch and zero range by someone without CAP_FSETID clear setuid and setgid (with
/// group-execute) as a write does, and a file's capabilities go with any fallocate, whoever
/// makes it: the kernel removes `security.capability` itself, as the caller, who need not
/// own the file (generic/683-685, 688).
#[test]
fn non_owner_fallocate_clears_setuid_setgid_and_capabilities() {
    each("falloc-killpriv", |t, d| {
        chmod(d, 0o777);
        let d = d.to_path_buf();
        let modes = [
            ("alloc", FallocateFlags::empty()),
            ("keep", FallocateFlags::FALLOC_FL_KEEP_SIZE),
            (
                "punch",
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            ),
            ("zero", FallocateFlags::FALLOC_FL_ZERO_RANGE),
        ];
        for (name, _) in modes {
            let f = d.join(name);
            write_file(&f, &[7u8; 8192]);
            chown(&f, Some(Uid::from_raw(UA)), Some(Gid::from_raw(UA))).unwrap();
            chmod(&f, 0o6777);
        }
        let capped = d.join("capped");
        write_file(&capped, b"x");
        chmod(&capped, 0o777);
        let set = sys::setxattr(&capped, "security.capability", &CAPS, 0);
        if let Err(e) = &set {
            say!(
                "{}: no security.capability here ({e}): that part skipped",
                t.name()
            );
        }
        let caps = set.is_ok();
        let dd = d.clone();
        as_user(UB, UB, &[UB], "fallocate of others' files", move |c| {
            for (name, how) in modes {
                let r = OpenOptions::new()
                    .write(true)
                    .open(dd.join(name))
                    .map_err(|e| e.raw_os_error().unwrap_or(-1))
                    .and_then(|f| {
                        nix::fcntl::fallocate(f.as_fd(), how, 0, 4096).map_err(|e| e as i32)
                    });
                c.ok(
                    r,
                    &format!("fallocate ({name}) of another user's 06777 file"),
                );
            }
            if caps {
                let r = OpenOptions::new()
                    .write(true)
                    .open(&capped)
                    .map_err(|e| e.raw_os_error().unwrap_or(-1))
                    .and_then(|f| {
                        nix::fcntl::fallocate(f.as_fd(), FallocateFlags::empty(), 0, 65536)
                            .map_err(|e| e as i32)
                    });
                c.ok(r, "fallocate of root's file with capabilities");
            }
        });
        for (name, _) in modes {
            let m = mode(&d.join(name)) & 0o7777;
            assert_eq!(
                m,
                0o777,
                "{}: fallocate ({name}) by another user left mode {m:o}",
                t.name()
            );
        }
        if caps {
            assert_eq!(
                sys::getxattr(&d.join("capped"), "security.capability")
                    .map(|_| ())
                    .map_err(|e| e.raw_os_error().unwrap_or(-1)),
                Err(ENODATA),
                "{}: the capabilities stayed after a fallocate",
                t.name()
            );
            assert_eq!(mode(&d.join("capped")) & 0o7777, 0o777);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// running out of space and inodes

/// Writes 1 MiB chunks (each fsynced, so delayed allocation cannot hide the error) until the
/// file system refuses; returns the errno and the number of chunks written.
fn fill_blocks(dir: &Path) -> (i32, usize) {
    let chunk = pattern(11, 1 << 20);
    for i in 0..100_000 {
        let r = (|| -> std::io::Result<()> {
            let f = File::create(dir.join(format!("big{i:05}")))?;
            f.write_all_at(&chunk, 0)?;
            f.sync_all()
        })();
        if let Err(e) = r {
            return (e.raw_os_error().unwrap_or(-1), i);
        }
    }
    panic!("never ran out of space");
}

fn fill_inodes(dir: &Path) -> (i32, usize) {
    for i in 0..1_000_000 {
        if let Err(e) = File::create(dir.join(format!("i{i:07}"))) {
            return (e.raw_os_error().unwrap_or(-1), i);
        }
    }
    panic!("never ran out of inodes");
}

/// How far below its first free count a file system's statfs may stay once everything made
/// since is deleted: `ffs` returns every block but a few (`blocks`); a log-structured
/// format counts only room a cleaning pass can pay to collect, so the dead blocks of the
/// deletes' own log writes, and per segment a metadata block and its summaries, stay out
/// of the count until the cleaner runs: up to 1% of the disk.
fn freed_slack(t: &Target, s0: &nix::sys::statvfs::Statvfs, blocks: u64) -> u64 {
    let log_structured = t.mode().is_some_and(cairn_fstests::is_log_structured);
    if log_structured {
        blocks.max(s0.blocks() / 100)
    } else {
        blocks
    }
}

#[test]
fn enospc_blocks_and_inodes() {
    for mut t in Target::all_small("16M", Some(600)) {
        say!("=== ENOSPC on {}", t.name());
        let s0 = t.statfs();
        let d = t.path("fill");
        fs::create_dir(&d).unwrap();
        let (e, n) = fill_blocks(&d);
        say!("blocks: {} after {n} MiB", cairn_fstests::errno_name(e));
        assert_eq!(
            e,
            ENOSPC,
            "filling the blocks: expected ENOSPC got {}",
            cairn_fstests::errno_name(e)
        );
        assert!(n >= 8, "a 16 MiB file system took only {n} MiB");
        assert!(
            t.statfs().blocks_available() < 256,
            "statfs shows the space used up"
        );
        // Existing data is intact after the failure.
        let first = fs::read(d.join("big00000")).unwrap();
        assert_eq!(
            first,
            pattern(11, 1 << 20),
            "data written before ENOSPC is intact"
        );
        t.assert_fsck_clean_and_remount("running out of blocks");
        // Every chunk whose write and fsync returned success must have survived the remount
        // intact: an error hidden from fsync is data loss.
        for k in 0..n {
            let p = d.join(format!("big{k:05}"));
            let got = fs::read(&p).unwrap_or_default();
            assert!(
                got == pattern(11, 1 << 20),
                "{}: big{k:05} was written and fsynced before ENOSPC but reads back {} bytes, not its 1 MiB",
                t.name(),
                got.len()
            );
        }
        say!("all {n} fsynced chunks intact after remount");
        // Free the blocks, then run out of inodes.
        for i in 0..n + 1 {
            let _ = fs::remove_file(d.join(format!("big{i:05}")));
        }
        let id = t.path("inodes");
        fs::create_dir(&id).unwrap();
        let (e, k) = fill_inodes(&id);
        say!("inodes: {} after {k} files", cairn_fstests::errno_name(e));
        assert_eq!(
            e,
            ENOSPC,
            "filling the inodes: expected ENOSPC got {}",
            cairn_fstests::errno_name(e)
        );
        expect_err(
            fs::create_dir(id.join("one-more-dir")),
            ENOSPC,
            "mkdir with no inodes left",
        );
        expect_err(
            std::os::unix::fs::symlink("x", id.join("one-more-link")),
            ENOSPC,
            "symlink with no inodes left",
        );
        t.assert_fsck_clean_and_remount("running out of inodes");
        for i in 0..k {
            fs::remove_file(id.join(format!("i{i:07}"))).unwrap();
        }
        fs::remove_dir(&id).unwrap();
        fs::remove_dir(&d).unwrap();
        let s1 = t.statfs();
        say!(
            "after deleting: bfree {} (was {}), ffree {} (was {})",
            s1.blocks_free(),
            s0.blocks_free(),
            s1.files_free(),
            s0.files_free()
        );
        assert!(
            s1.blocks_free() + freed_slack(&t, &s0, 8) >= s0.blocks_free(),
            "deleting frees the blocks again"
        );
        assert_eq!(
            s1.files_free(),
            s0.files_free(),
            "deleting frees the inodes again"
        );
        let again = t.path("again");
        fs::create_dir(&again).unwrap();
        let f = File::create(again.join("f")).unwrap();
        expect_ok(
            f.write_all_at(&pattern(5, 4 << 20), 0),
            "write 4 MiB after freeing",
        );
        expect_ok(f.sync_all(), "fsync after freeing");
        drop(f);
        t.assert_fsck_clean_and_remount("freeing everything");
        assert_eq!(fs::read(again.join("f")).unwrap(), pattern(5, 4 << 20));
    }
}
