//! POSIX ACLs and inode flags through the layer (issue 21 item 3): kept on the branches,
//! enforced by the kernel (FUSE_POSIX_ACL) and by the layer's own checks, inherited from a
//! default ACL whichever branch a new file lands on, and carried — ACLs, restricting and
//! other flags — by a migration between branches and by a remount. The branches are
//! directories of the host's file system (ext4 or tmpfs here: both keep ACLs and flags).
//! A mount over a branch that cannot keep ACLs refuses them instead of storing rights no
//! one enforces. Needs root and /dev/fuse.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use cairn_fstests::sys;
use cairn_fstests::user::as_user;
use common::{Rig, wait_until};
use libc::EACCES;

/// A named user the ACLs grant, and one they do not.
const UA: u32 = 4252;
const UB: u32 = 4353;
const NONE: u32 = u32::MAX;
const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;
const ACCESS: &str = "system.posix_acl_access";
const DEFAULT: &str = "system.posix_acl_default";

/// Files over 4K and `*.far` names go to `far`; the rest stays on `near`.
const CONFIG: &str = r#"
[umbrella]
default = ["near", "far"]
[[branch]]
name = "near"
path = "near"
[[branch]]
name = "far"
path = "far"
[[rule]]
name = "large"
size = "> 4K"
branches = ["far", "near"]
[[rule]]
name = "far names"
suffix = ".far"
branches = ["far"]
"#;

/// u::rw-, u:UA:rw-, g::---, m::rw-, o::---.
fn named_rw() -> Vec<u8> {
    sys::acl(&[
        (1, 6, NONE),
        (2, 6, UA),
        (4, 0, NONE),
        (0x10, 6, NONE),
        (0x20, 0, NONE),
    ])
}

/// u::rwx, u:UA:rwx, g::---, m::rwx, o::---: a default ACL that lets UA in.
fn named_rwx() -> Vec<u8> {
    sys::acl(&[
        (1, 7, NONE),
        (2, 7, UA),
        (4, 0, NONE),
        (0x10, 7, NONE),
        (0x20, 0, NONE),
    ])
}

fn flags(p: &Path) -> u32 {
    let f = File::open(p).unwrap();
    sys::get_flags(f.as_fd()).unwrap() & (IMMUTABLE | APPEND | NODUMP)
}

fn chattr(p: &Path, set: u32) {
    let f = File::open(p).unwrap();
    let old = sys::get_flags(f.as_fd()).unwrap();
    sys::set_flags(f.as_fd(), (old & !(IMMUTABLE | APPEND | NODUMP)) | set).unwrap();
}

/// UA may read and write `p` (through its named entry), UB may not.
fn enforced(p: &Path, what: &str) {
    let q = p.to_path_buf();
    as_user(UA, UA, &[UA], what, move |c| {
        c.ok(fs::read(&q), "read through the named entry");
        c.ok(OpenOptions::new().append(true).open(&q), "write through it");
    });
    let q = p.to_path_buf();
    as_user(UB, UB, &[UB], what, move |c| {
        c.err(fs::read(&q), EACCES, "no entry, other ---");
    });
}

#[test]
fn an_acl_is_enforced_and_moves_with_its_file() {
    let mut r = Rig::new(&["near", "far"], CONFIG);
    fs::set_permissions(r.m(""), fs::Permissions::from_mode(0o755)).unwrap();
    let f = r.m("doc");
    fs::write(&f, b"small").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    sys::setxattr(&f, ACCESS, &named_rw(), 0).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o660, "mask in g");
    r.settle();
    assert!(r.on("near", "doc"));
    enforced(&f, "on near");
    // Growth past 4K moves it to `far` at its last close: the ACL goes with it.
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(&[1u8; 8192])
        .unwrap();
    r.settle();
    assert!(r.on("far", "doc") && !r.on("near", "doc"), "moved");
    assert_eq!(
        sys::getxattr(&r.b("far", "doc"), ACCESS).unwrap(),
        named_rw(),
        "the copy on far has the ACL"
    );
    assert_eq!(sys::getxattr(&f, ACCESS).unwrap(), named_rw());
    enforced(&f, "on far");
    // And a remount.
    r.unmount();
    r.mount();
    assert_eq!(
        sys::getxattr(&f, ACCESS).unwrap(),
        named_rw(),
        "after remount"
    );
    enforced(&f, "after remount");
    // A file without an ACL answers ENODATA (the kernel's checks ask for it).
    fs::write(r.m("plain"), b"p").unwrap();
    assert_eq!(
        sys::getxattr(&r.m("plain"), ACCESS).map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENODATA))
    );
}

#[test]
fn a_default_acl_is_inherited_on_every_branch_and_opens_the_directory() {
    let r = Rig::new(&["near", "far"], CONFIG);
    let d = r.m("shared");
    fs::create_dir(&d).unwrap();
    // Root's directory, closed to everyone but through the ACLs: only UA may create in it.
    fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
    sys::setxattr(&d, ACCESS, &named_rwx(), 0).unwrap();
    sys::setxattr(&d, DEFAULT, &named_rwx(), 0).unwrap();
    r.settle();
    assert!(r.on("near", "shared") && !r.on("far", "shared"));
    let dd = d.clone();
    as_user(
        UA,
        UA,
        &[UA],
        "named user in an ACL'd directory",
        move |c| {
            // The layer checks the parent's ACL itself, not only its mode (0770 now, root's).
            c.ok(fs::write(dd.join("mine"), b"m"), "create on near");
            c.ok(fs::write(dd.join("x.far"), b"f"), "create on far");
            c.ok(fs::create_dir(dd.join("sub")), "mkdir");
            c.ok(fs::remove_file(dd.join("mine")), "unlink");
        },
    );
    // `x.far` needed the directory on `far`: its copy was made with the ACLs, so the new
    // file inherited the default ACL there, the umask (022 in as_user) not applied.
    assert!(r.on("far", "shared/x.far"));
    assert_eq!(
        sys::getxattr(&r.b("far", "shared"), DEFAULT).unwrap(),
        named_rwx(),
        "the lazily made copy has the default ACL"
    );
    assert_eq!(
        fs::metadata(r.m("shared/x.far")).unwrap().mode() & 0o777,
        0o660,
        "0666 masked by the inherited ACL, no umask"
    );
    assert!(sys::getxattr(&r.m("shared/x.far"), ACCESS).is_ok());
    assert_eq!(
        fs::metadata(r.m("shared/sub")).unwrap().mode() & 0o777,
        0o770
    );
    assert_eq!(
        sys::getxattr(&r.m("shared/sub"), DEFAULT).unwrap(),
        named_rwx()
    );
    let p = r.m("shared/x.far");
    as_user(UB, UB, &[UB], "outsider", move |c| {
        c.err(fs::read(&p), EACCES, "not in the ACL");
    });
}

#[test]
fn inode_flags_move_with_their_file() {
    let mut r = Rig::new(&["near", "far"], CONFIG);
    // Append-only and nodump: the file grows by appends only, moves at its close.
    let f = r.m("log");
    fs::write(&f, b"start\n").unwrap();
    chattr(&f, APPEND | NODUMP);
    assert_eq!(flags(&f), APPEND | NODUMP);
    assert!(
        OpenOptions::new().write(true).open(&f).is_err(),
        "not without O_APPEND"
    );
    OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(&[b'x'; 8192])
        .unwrap();
    r.settle();
    assert!(
        r.on("far", "log") && !r.on("near", "log"),
        "the append-only file moved"
    );
    assert_eq!(flags(&f), APPEND | NODUMP, "flags kept by the move");
    assert_eq!(
        flags(&r.b("far", "log")),
        APPEND | NODUMP,
        "on the copy itself"
    );
    assert!(fs::remove_file(&f).is_err(), "still append-only");
    // Immutable: moved by the enforcer after the rules change (nothing else can touch it).
    let g = r.m("frozen");
    fs::write(&g, b"ice").unwrap();
    r.settle();
    assert!(r.on("near", "frozen"));
    chattr(&g, IMMUTABLE);
    r.write_config(&format!(
        "{CONFIG}\n[[rule]]\nname = \"frozen\"\nname_glob = \"frozen\"\nbranches = [\"far\"]\n"
    ));
    assert_eq!(r.cmd("reload", &[])["ok"], true);
    r.cmd("enforce", &[]);
    wait_until("enforce finishes", || {
        r.cmd("enforce-status", &[])["finished"] == true
    });
    assert!(r.on("far", "frozen") && !r.on("near", "frozen"), "moved");
    assert_eq!(flags(&g), IMMUTABLE);
    assert!(fs::write(&g, b"melt").is_err(), "still immutable");
    assert_eq!(fs::read(&g).unwrap(), b"ice");
    r.unmount();
    r.mount();
    assert_eq!(flags(&g), IMMUTABLE, "after remount");
    assert_eq!(flags(&f), APPEND | NODUMP);
    chattr(&g, 0);
    chattr(&f, 0);
}

/// A file open for writing when it becomes immutable takes no more writes, truncations,
/// allocations or copies through that descriptor (the branch checks the flag at open only);
/// append-only, only appends (generic/553). The branches are tmpfs, which checks the flags
/// at open only (ext4 would refuse the immutable half itself).
#[test]
fn restricting_flags_bind_descriptors_opened_before() {
    let r = Rig::with_tmpfs(&[("near", Some("64M")), ("far", Some("64M"))], CONFIG);
    let f = r.m("held");
    let src = r.m("src");
    fs::write(&src, [b's'; 4096]).unwrap();
    let mut w = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&f)
        .unwrap();
    w.write_all(b"before").unwrap();
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    let from = File::open(&src).unwrap();
    let eperm = |r: std::io::Result<()>, what: &str| {
        assert_eq!(
            r.map_err(|e| e.raw_os_error()),
            Err(Some(libc::EPERM)),
            "{what}"
        );
    };
    let copy = |to: &File| {
        let mut at = 0;
        nix::fcntl::copy_file_range(&from, None, to, Some(&mut at), 1024)
            .map(drop)
            .map_err(std::io::Error::from)
    };
    chattr(&f, IMMUTABLE);
    eperm(w.write_all(b"x"), "write");
    eperm(a.write_all(b"x"), "append");
    eperm(w.set_len(1), "ftruncate");
    let alloc = nix::fcntl::fallocate(&w, nix::fcntl::FallocateFlags::empty(), 0, 8192);
    eperm(alloc.map_err(std::io::Error::from), "fallocate");
    eperm(copy(&w), "copy_file_range");
    assert_eq!(
        fs::read(&f).unwrap(),
        b"before",
        "nothing reached the branch"
    );
    chattr(&f, APPEND);
    eperm(w.write_all(b"x"), "a write that is not an append");
    eperm(w.set_len(1), "ftruncate of an append-only file");
    a.write_all(b"+after").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"before+after");
    chattr(&f, 0);
    w.write_all(b"!").unwrap();
}

/// ramfs keeps no extended attributes at all (EOPNOTSUPP): a stand-in for any branch file
/// system without ACLs.
fn ramfs(p: &Path) {
    fs::create_dir_all(p).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(p)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount ramfs");
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_branch_without_acls_makes_a_mount_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let far = dir.path().join("far");
    ramfs(&far);
    fs::create_dir(dir.path().join("near")).unwrap();
    let mut r = Rig::at(dir, vec![far], CONFIG);
    // Stored on `near` it would be enforced by no one: refused everywhere.
    fs::write(r.m("a"), b"a").unwrap();
    assert_eq!(
        sys::setxattr(&r.m("a"), ACCESS, &named_rw(), 0).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EOPNOTSUPP))
    );
    r.unmount();
}

#[test]
fn a_branch_without_acls_cannot_join_a_mount_that_keeps_them() {
    let r = Rig::new(&["near", "far"], CONFIG);
    let extra = r.dir.path().join("ram");
    ramfs(&extra);
    let _u = Unmount(extra.clone());
    let v = r.cmd(
        "branch-add",
        &[
            "ram",
            &cairn_umbrella::hex(extra.as_os_str().as_encoded_bytes()),
        ],
    );
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("POSIX ACLs")),
        "{v}"
    );
}

/// rmdir of a non-empty directory inside an immutable or append-only one is EPERM, not
/// ENOTEMPTY: the kernel's `may_delete` refuses before it looks at the victim's entries
/// (generic/079).
#[test]
fn rmdir_in_a_restricted_directory_is_eperm_before_enotempty() {
    let r = Rig::new(&["near", "far"], CONFIG);
    for (d, flag) in [("frozen.d", IMMUTABLE), ("log.d", APPEND)] {
        fs::create_dir_all(r.m(&format!("{d}/dir"))).unwrap();
        fs::write(r.m(&format!("{d}/dir/f")), b"x").unwrap();
        chattr(&r.m(d), flag);
        let e = fs::remove_dir(r.m(&format!("{d}/dir"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{d}: {e}");
        chattr(&r.m(d), 0);
        let e = fs::remove_dir(r.m(&format!("{d}/dir"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{d}: {e}");
    }
    // The victim's own flag too.
    fs::create_dir_all(r.m("v/dir")).unwrap();
    fs::write(r.m("v/dir/f"), b"x").unwrap();
    chattr(&r.m("v/dir"), IMMUTABLE);
    let e = fs::remove_dir(r.m("v/dir")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    chattr(&r.m("v/dir"), 0);
}
