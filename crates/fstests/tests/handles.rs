//! File handles (name_to_handle_at, open_by_handle_at: NFS export and fstests' generic/426,
//! 467, 477) through a real mount in every mode. A handle holds the FUSE node id and the
//! inode's generation; after a remount the kernel knows no inode, so opening a handle asks
//! cairn for the node by number (LOOKUP of `.`, FUSE_EXPORT_SUPPORT) and, for a directory,
//! for its parent (LOOKUP of `..`) to reconnect it to the tree. What must hold:
//! - a handle opens the same file after a remount, and a directory's handle opens it at its
//!   path (its `..` chain was followed to the root);
//! - a handle of a removed file is ESTALE, also once its inode number names a new file;
//! - a forged handle (a number never used, a wrong generation) is ESTALE, never a file.
//!
//! The umbrella layer's numbers live in memory only (a remount numbers files afresh), so it
//! offers no handles at all. Validated against the host (CAIRN_TEST_HOST_ONLY=1).

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cairn_fstests::sys::{self, FileHandle};
use cairn_fstests::{Target, expect_err, expect_ok, host_only, ino, pattern, say};
use libc::ESTALE;

/// Opens `h` on `t`'s file system (`flags` as open(2)).
fn open(t: &Target, h: &FileHandle, flags: i32) -> std::io::Result<File> {
    let m = File::open(t.root()).unwrap();
    sys::open_by_handle(m.as_fd(), h, flags).map(File::from)
}

/// The path the kernel gives an open descriptor (its dentry's path).
fn path_of(f: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
}

/// A FUSE handle's node id and generation (fs/fuse/inode.c `fuse_encode_fh`: node id high
/// word, low word, generation, each a native u32).
fn fuse_fields(h: &FileHandle) -> (u64, u32) {
    let w = |i: usize| u32::from_ne_bytes(h.bytes[i * 4..i * 4 + 4].try_into().unwrap());
    ((u64::from(w(0)) << 32) | u64::from(w(1)), w(2))
}

fn with_fuse_fields(h: &FileHandle, node: u64, generation: u32) -> FileHandle {
    h.forged(|b| {
        b[0..4].copy_from_slice(&((node >> 32) as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&(node as u32).to_ne_bytes());
        b[8..12].copy_from_slice(&generation.to_ne_bytes());
    })
}

struct Tree {
    file: PathBuf,
    data: Vec<u8>,
    deep: PathBuf,
    gone: PathBuf,
}

fn make_tree(d: &Path) -> Tree {
    let file = d.join("f");
    let data = pattern(426, 10_000);
    fs::write(&file, &data).unwrap();
    let deep = d.join("a/b/c");
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("inside"), b"x").unwrap();
    let gone = d.join("a/gone");
    fs::write(&gone, b"soon removed").unwrap();
    Tree {
        file,
        data,
        deep,
        gone,
    }
}

#[test]
fn handles_open_the_same_file_after_a_remount_and_stale_ones_fail() {
    for mut t in Target::all() {
        say!("=== handles on {}", t.name());
        let d = t.path("handles");
        fs::create_dir(&d).unwrap();
        let tree = make_tree(&d);
        let hf = expect_ok(sys::name_to_handle(&tree.file, false), "handle of a file");
        let hdir = expect_ok(sys::name_to_handle(&tree.deep, false), "handle of a dir");
        let hgone = expect_ok(sys::name_to_handle(&tree.gone, false), "handle of a file");
        let gone_ino = ino(&tree.gone);
        let file_ino = ino(&tree.file);
        fs::remove_file(&tree.gone).unwrap();

        // The kernel forgets every inode; each handle is now looked up by number.
        t.remount();
        let mut f = expect_ok(
            open(&t, &hf, libc::O_RDONLY),
            "open_by_handle after remount",
        );
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert!(got == tree.data, "the handle opened another file's data");
        assert_eq!(f.metadata().unwrap().ino(), file_ino);
        drop(f);
        let dir = expect_ok(
            open(&t, &hdir, libc::O_RDONLY | libc::O_DIRECTORY),
            "open_by_handle of a directory after remount",
        );
        // Reconnected through `..` (c, b, a, handles, the root): the kernel names it by
        // its full path, not as a disconnected dentry.
        assert_eq!(path_of(&dir), tree.deep, "directory handle's path");
        drop(dir);
        expect_err(
            open(&t, &hgone, libc::O_RDONLY),
            ESTALE,
            "handle of a removed file",
        );

        if t.is_cairn() {
            let (node, generation) = fuse_fields(&hf);
            for (forged, what) in [
                (
                    with_fuse_fields(&hf, node, generation.wrapping_add(1)),
                    "another generation",
                ),
                (
                    with_fuse_fields(&hf, 1 << 40, generation),
                    "a number beyond the table",
                ),
                (with_fuse_fields(&hf, 999_999, 0), "a free number"),
            ] {
                expect_err(open(&t, &forged, libc::O_RDONLY), ESTALE, what);
            }
        }

        // New files take the removed file's number sooner or later (ffs reuses a freed
        // slot of its group; lfs the lowest free number): its old handle stays stale.
        let reused = (0..64).find_map(|i| {
            let p = d.join(format!("a/new{i}"));
            fs::write(&p, b"new").unwrap();
            (ino(&p) == gone_ino).then_some(p)
        });
        say!("number {gone_ino} reused: {reused:?}");
        if let Some(p) = &reused {
            assert_ne!(sys::name_to_handle(p, false).unwrap(), hgone);
        }
        t.remount();
        expect_err(
            open(&t, &hgone, libc::O_RDONLY),
            ESTALE,
            "handle of a removed file whose number was reused",
        );
        t.assert_fsck_clean_and_remount("handles");
    }
}

/// A connectable handle (AT_HANDLE_CONNECTABLE) also names the parent directory: opening
/// it reconnects the file to its directory (generic/467).
#[test]
fn connectable_handles_reconnect_to_their_directory() {
    for mut t in Target::all_once() {
        say!("=== connectable handles on {}", t.name());
        let d = t.path("connectable");
        fs::create_dir(&d).unwrap();
        let tree = make_tree(&d);
        let f = tree.deep.join("inside");
        let h = match sys::name_to_handle(&f, true) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && host_only() => {
                say!("the host kernel has no connectable handles");
                return;
            }
            r => expect_ok(r, "connectable handle"),
        };
        t.remount();
        let o = expect_ok(open(&t, &h, libc::O_RDONLY), "open a connectable handle");
        assert_eq!(path_of(&o), f, "a connectable handle's path");
        drop(o);
        t.assert_fsck_clean_and_remount("connectable");
    }
}

/// The umbrella layer's numbers live in memory only, so it offers no file handles
/// (FUSE_NO_EXPORT_SUPPORT): name_to_handle_at is EOPNOTSUPP, as on a file system without
/// export support, rather than a handle that goes stale whenever the kernel drops the inode.
#[test]
fn the_umbrella_offers_no_handles() {
    if host_only() {
        return;
    }
    let t = Target::umbrella_sized("512M");
    let d = t.path("handles");
    fs::create_dir(&d).unwrap();
    let tree = make_tree(&d);
    expect_err(
        sys::name_to_handle(&tree.file, false),
        libc::EOPNOTSUPP,
        "umbrella name_to_handle_at",
    );
}
