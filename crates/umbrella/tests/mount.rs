//! The policy layer through a real FUSE mount over branch directories (in-process: the
//! layer is served by `cairn_fuse::spawn`). Needs root and /dev/fuse, like the core's
//! mount tests.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Rig, wait_until};

const TWO_TIER: &str = r#"
[umbrella]
default = ["fast", "slow"]
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
name = "large files to slow"
size = "> 8K"
branches = ["slow", "fast"]
[[rule]]
name = "videos"
suffix = ".avi"
branches = ["slow"]
"#;

fn names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn placement_lazy_dirs_and_merged_readdir() {
    let r = Rig::new(&["fast", "slow"], TWO_TIER);
    fs::create_dir_all(r.m("a/b")).unwrap();
    fs::write(r.m("a/b/small.txt"), b"hi").unwrap();
    fs::write(r.m("a/b/movie.avi"), b"frames").unwrap();
    r.settle();
    // The directory was created where the rules put it, and lazily on the other branch
    // when the video needed it.
    assert!(r.on("fast", "a/b/small.txt"));
    assert!(r.on("slow", "a/b/movie.avi"));
    assert!(!r.on("fast", "a/b/movie.avi"));
    assert!(r.on("fast", "a/b") && r.on("slow", "a/b"));
    // One listing, no duplicates, the hidden metadata directory never shows.
    assert_eq!(names(&r.m("a/b")), ["movie.avi", "small.txt"]);
    assert_eq!(names(&r.m("a")), ["b"]);
    assert!(!names(&r.m("")).contains(&".umbrella".to_string()));
    assert!(fs::metadata(r.m(".umbrella")).is_err());
    // Inode numbers are stable and the directory's link count counts subdirectories.
    let i1 = fs::metadata(r.m("a/b/small.txt")).unwrap().ino();
    assert_eq!(fs::metadata(r.m("a/b/small.txt")).unwrap().ino(), i1);
    assert_eq!(fs::metadata(r.m("a")).unwrap().nlink(), 3);
    // Contents round trip.
    assert_eq!(fs::read(r.m("a/b/movie.avi")).unwrap(), b"frames");
    // rmdir of a directory with copies on both branches removes all copies.
    fs::remove_file(r.m("a/b/small.txt")).unwrap();
    fs::remove_file(r.m("a/b/movie.avi")).unwrap();
    fs::remove_dir(r.m("a/b")).unwrap();
    assert!(!r.on("fast", "a/b") && !r.on("slow", "a/b"));
}

#[test]
fn migration_on_close_growth_shrink_chmod_rename() {
    let cfg = format!(
        "{TWO_TIER}\n[[rule]]\nname = \"read-only\"\naccess = \"read-only\"\nbranches = [\"slow\"]\n[[rule]]\nname = \"archive\"\nnamespace = [{{ match = \"/archive/*\", branches = [\"slow\"] }}]\n"
    );
    let r = Rig::new(&["fast", "slow"], &cfg);
    let data = vec![7u8; 20_000];
    // Growth: starts small on fast, grows past 8K, moves on close.
    {
        let mut f = fs::File::create(r.m("grow")).unwrap();
        f.write_all(&data[..100]).unwrap();
        assert!(r.on("fast", "grow"));
        f.write_all(&data[100..]).unwrap();
        // Still open: not moved yet.
        assert!(r.on("fast", "grow"));
    }
    r.settle();
    assert!(
        r.on("slow", "grow") && !r.on("fast", "grow"),
        "moved to slow after the last close"
    );
    assert_eq!(fs::read(r.m("grow")).unwrap(), data);
    let ino = fs::metadata(r.m("grow")).unwrap().ino();
    // Shrink: truncate below the threshold, moves back.
    fs::OpenOptions::new()
        .write(true)
        .open(r.m("grow"))
        .unwrap()
        .set_len(10)
        .unwrap();
    r.settle();
    assert!(r.on("fast", "grow") && !r.on("slow", "grow"));
    assert_eq!(fs::read(r.m("grow")).unwrap(), &data[..10]);
    assert_eq!(
        fs::metadata(r.m("grow")).unwrap().ino(),
        ino,
        "our inode number survives migration"
    );
    // chmod to read-only: the read-only rule (listed after the size rules, so a small file)
    fs::write(r.m("doc"), b"text").unwrap();
    r.settle();
    assert!(r.on("fast", "doc"));
    fs::set_permissions(r.m("doc"), fs::Permissions::from_mode(0o444)).unwrap();
    r.settle();
    assert!(r.on("slow", "doc"), "chmod a-w moved it");
    assert_eq!(
        fs::metadata(r.b("slow", "doc")).unwrap().mode() & 0o777,
        0o444
    );
    // Rename into a path with another rule.
    fs::write(r.m("note"), b"n").unwrap();
    fs::create_dir(r.m("archive")).unwrap();
    r.settle();
    assert!(r.on("fast", "note"));
    fs::rename(r.m("note"), r.m("archive/note")).unwrap();
    r.settle();
    assert!(r.on("slow", "archive/note") && !r.on("fast", "archive/note"));
    assert_eq!(fs::read(r.m("archive/note")).unwrap(), b"n");
    let st = r.cmd("status", &[]);
    assert!(st["migrations"]["done"].as_u64().unwrap() >= 4, "{st}");
    // `where` names the branch and the rule.
    let w = r.cmd("where", &[&cairn_umbrella::hex(b"/archive/note")]);
    assert_eq!(w["branch"], "slow", "{w}");
    assert!(w["rule"].as_str().unwrap().contains("archive"), "{w}");
}

#[test]
fn hard_links_never_exdev_and_migrate_together() {
    let r = Rig::new(&["fast", "slow"], TWO_TIER);
    fs::create_dir(r.m("d1")).unwrap();
    fs::write(r.m("d1/v.avi"), b"x").unwrap();
    r.settle();
    assert!(r.on("slow", "d1/v.avi"));
    // d2 exists on fast only; the link goes on slow, creating d2 there.
    fs::create_dir(r.m("d2")).unwrap();
    fs::write(r.m("d2/other"), b"o").unwrap();
    assert!(!r.on("slow", "d2"));
    fs::hard_link(r.m("d1/v.avi"), r.m("d2/link")).unwrap();
    assert!(r.on("slow", "d2/link"));
    assert_eq!(fs::metadata(r.m("d2/link")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(r.m("d2/link")).unwrap().ino(),
        fs::metadata(r.m("d1/v.avi")).unwrap().ino()
    );
    // A linked small file that grows moves with all its names.
    fs::write(r.m("d2/small"), b"s").unwrap();
    fs::hard_link(r.m("d2/small"), r.m("d1/small2")).unwrap();
    r.settle();
    assert!(r.on("fast", "d1/small2"));
    fs::OpenOptions::new()
        .append(true)
        .open(r.m("d2/small"))
        .unwrap()
        .write_all(&[1u8; 10_000])
        .unwrap();
    r.settle();
    assert!(
        r.on("slow", "d2/small") && r.on("slow", "d1/small2"),
        "both names moved"
    );
    assert!(!r.on("fast", "d2/small") && !r.on("fast", "d1/small2"));
    let a = fs::metadata(r.b("slow", "d2/small")).unwrap();
    let b = fs::metadata(r.b("slow", "d1/small2")).unwrap();
    assert_eq!(
        (a.ino(), a.nlink()),
        (b.ino(), 2),
        "still one file with two names"
    );
}

#[test]
fn hysteresis_keeps_a_file_near_the_threshold_in_place() {
    let cfg = r#"
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
size = "> 8K"
size_margin = "1K"
branches = ["slow"]
"#;
    let r = Rig::new(&["fast", "slow"], cfg);
    let f = r.m("f");
    fs::write(&f, vec![1u8; 7680]).unwrap();
    r.settle();
    assert!(r.on("fast", "f"));
    for _ in 0..3 {
        fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .unwrap()
            .write_all(&[2u8; 1024])
            .unwrap();
        r.settle();
        assert!(r.on("fast", "f"), "8.5 KiB stays on fast");
        fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(7680)
            .unwrap();
        r.settle();
        assert!(r.on("fast", "f"));
    }
    fs::OpenOptions::new()
        .append(true)
        .open(&f)
        .unwrap()
        .write_all(&[2u8; 3000])
        .unwrap();
    r.settle();
    assert!(r.on("slow", "f"), "past threshold + margin it moves");
    assert_eq!(r.cmd("status", &[])["migrations"]["done"], 1);
}

#[test]
fn overflow_and_forbidden_overflow() {
    let cfg = r#"
[[branch]]
name = "small"
path = "small"
[[branch]]
name = "big"
path = "big"
[[rule]]
name = "secret: never elsewhere"
suffix = ".secret"
branches = ["small"]
[[rule]]
name = "everything else: small first"
branches = ["small", "big"]
"#;
    let r = Rig::with_tmpfs(&[("small", Some("1M")), ("big", None)], cfg);
    // A file that outgrows the small branch while being written moves, invisibly.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    {
        let mut f = fs::File::create(r.m("blob")).unwrap();
        assert!(r.on("small", "blob"));
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    assert!(r.on("big", "blob") && !r.on("small", "blob"));
    assert_eq!(fs::read(r.m("blob")).unwrap(), data);
    assert!(
        r.cmd("status", &[])["migrations"]["overflows"]
            .as_u64()
            .unwrap()
            >= 1
    );
    // Forbidden overflow: ENOSPC, never a write elsewhere.
    let mut f = fs::File::create(r.m("x.secret")).unwrap();
    let e = f.write_all(&data).and_then(|()| f.sync_all()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    assert!(!r.on("big", "x.secret"));
    // Creating when the preferred branch is full lands on the next one.
    let mut g = fs::File::create(r.m("filler")).unwrap();
    let _ = g.write_all(&vec![0u8; 2 << 20]);
    drop(g);
    r.settle();
    fs::remove_file(r.m("x.secret")).unwrap();
    fs::write(r.m("later"), b"l").unwrap();
    assert!(r.on("small", "later") || r.on("big", "later"));
}

#[test]
fn enforce_moves_aged_files_and_reload_changes_rules() {
    let cfg = r#"
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
name = "cold"
mtime = "> 30d"
branches = ["slow"]
"#;
    let mut r = Rig::new(&["fast", "slow"], cfg);
    for k in 0..5 {
        fs::write(r.m(&format!("f{k}")), b"data").unwrap();
    }
    r.settle();
    // Two of them age by 40 days (time passes without anybody closing them: set on the
    // branch directly). Only the enforcer notices.
    let old = filetime(40);
    for k in 0..2 {
        set_mtime(&r.b("fast", &format!("f{k}")), old);
    }
    r.settle();
    assert!(r.on("fast", "f0"));
    let j = r.cmd("enforce", &[]);
    assert_eq!(j["started"], true);
    wait_until("enforce finishes", || {
        r.cmd("enforce-status", &[])["finished"] == true
    });
    let s = r.cmd("enforce-status", &[]);
    assert_eq!(s["moved"], 2, "{s}");
    assert_eq!(s["total"], 5, "{s}");
    assert!(r.on("slow", "f0") && r.on("slow", "f1") && r.on("fast", "f2"));
    // Reload with a bad file keeps the old rules.
    r.write_config(
        "[[branch]]\nname = \"fast\"\npath = \"fast\"\n[[rule]]\nbranches = [\"nope\"]\n",
    );
    let e = r.cmd("reload", &[]);
    assert!(e["error"].as_str().unwrap().contains("u.toml:5"), "{e}");
    // A good reload: everything to slow.
    r.write_config("[umbrella]\ndefault = [\"slow\"]\n[[branch]]\nname = \"fast\"\npath = \"fast\"\n[[branch]]\nname = \"slow\"\npath = \"slow\"\n");
    assert_eq!(r.cmd("reload", &[])["ok"], true);
    fs::write(r.m("new"), b"n").unwrap();
    assert!(r.on("slow", "new"));
    // Index persistence: a clean unmount saves it, the next mount loads it.
    r.unmount();
    assert!(r.b("fast", ".umbrella/clean").exists());
    r.mount();
    assert!(
        !r.b("fast", ".umbrella/clean").exists(),
        "the marker is gone while mounted"
    );
    assert_eq!(names(&r.m("")), ["f0", "f1", "f2", "f3", "f4", "new"]);
}

fn filetime(days_ago: u64) -> std::time::SystemTime {
    std::time::SystemTime::now() - Duration::from_secs(days_ago * 86400)
}

fn set_mtime(p: &Path, t: std::time::SystemTime) {
    let f = fs::File::options().write(true).open(p).unwrap();
    f.set_modified(t).unwrap();
}

#[test]
fn branch_remove_add_and_error_semantics() {
    for mode in ["or", "and"] {
        let cfg = format!(
            "[umbrella]\nerrors = \"{mode}\"\n[[branch]]\nname = \"a\"\npath = \"a\"\n[[branch]]\nname = \"b\"\npath = \"b\"\n[[rule]]\nname = \"to b\"\nsuffix = \".b\"\nbranches = [\"b\"]\n"
        );
        let r = Rig::new(&["a", "b"], &cfg);
        fs::write(r.m("one.a"), b"1").unwrap();
        fs::write(r.m("two.b"), b"2").unwrap();
        assert_eq!(names(&r.m("")), ["one.a", "two.b"]);
        // Administrative removal: the branch's files leave the union, its rule goes
        // inactive (new .b files go to the default).
        let v = r.cmd("branch-remove", &["b"]);
        assert_eq!(v["ok"], true, "{v}");
        assert!(
            v["inactive_rules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x == "to b"),
            "{v}"
        );
        std::thread::sleep(Duration::from_millis(1100)); // kernel entry cache
        assert_eq!(names(&r.m("")), ["one.a"]);
        fs::write(r.m("three.b"), b"3").unwrap();
        assert!(r.on("a", "three.b"));
        // Re-adding brings them back and reactivates the rule; enforce moves three.b home.
        let bpath = cairn_umbrella::hex(r.b("b", "").as_os_str().as_encoded_bytes());
        let v = r.cmd("branch-add", &["b", &bpath]);
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(names(&r.m("")), ["one.a", "three.b", "two.b"]);
        r.cmd("enforce", &[]);
        wait_until("enforce", || {
            r.cmd("enforce-status", &[])["finished"] == true
        });
        assert!(r.on("b", "three.b") && !r.on("a", "three.b"));
        // A branch that disappears: `or` fails merged listings, `and` shows the rest.
        let away = r.dir.path().join("b-away");
        fs::rename(r.b("b", ""), &away).unwrap();
        wait_until("failure detected", || {
            r.cmd("branch-list", &[])["branches"][1]["state"] == "failed"
        });
        std::thread::sleep(Duration::from_millis(1100));
        let listed: std::io::Result<Vec<fs::DirEntry>> =
            fs::read_dir(r.m("")).and_then(|d| d.collect());
        if mode == "or" {
            assert_eq!(listed.unwrap_err().raw_os_error(), Some(libc::EIO));
        } else {
            assert_eq!(names(&r.m("")), ["one.a"]);
        }
        fs::rename(&away, r.b("b", "")).unwrap();
        wait_until("branch back", || {
            r.cmd("branch-list", &[])["branches"][1]["state"] == "active"
        });
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(names(&r.m("")), ["one.a", "three.b", "two.b"]);
    }
}

#[test]
fn nothing_escapes_the_branches() {
    let r = Rig::new(&["fast", "slow"], TWO_TIER);
    // A symlink planted inside a branch pointing outside: the layer never follows it.
    let outside = r.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::create_dir(r.m("d")).unwrap();
    r.settle();
    fs::remove_dir(r.b("fast", "d")).unwrap();
    std::os::unix::fs::symlink(&outside, r.b("fast", "d")).unwrap();
    let e = fs::write(r.m("d/evil"), b"x");
    assert!(e.is_err(), "create through a branch-side symlink must fail");
    assert!(
        fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing written outside"
    );
    // Symlinks made through the mount are links, not followed by the layer.
    std::os::unix::fs::symlink("/etc/passwd", r.m("l")).unwrap();
    assert_eq!(fs::read_link(r.m("l")).unwrap(), Path::new("/etc/passwd"));
    assert!(
        fs::symlink_metadata(r.b("fast", "l"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

const ONE_BRANCH_AND_OVERFLOW: &str = r#"
[umbrella]
default = ["a"]
[[branch]]
name = "a"
path = "a"
[[branch]]
name = "b"
path = "b"
[[rule]]
name = "spill"
suffix = ".spill"
branches = ["a", "b"]
"#;

/// Writes and reads 4 MiB through the mount; returns the READ and WRITE requests the
/// daemon served meanwhile.
fn big_file_roundtrip(r: &Rig, rel: &str, branch: &str) -> (u64, u64) {
    let counts = r.mount.as_ref().unwrap().counts();
    let before = (
        counts.get(cairn_fuse::Op::Read),
        counts.get(cairn_fuse::Op::Write),
    );
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    {
        let mut f = fs::File::create(r.m(rel)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    // The bytes are in the branch file, and read back right through a fresh open.
    assert_eq!(fs::read(r.b(branch, rel)).unwrap(), data);
    // Drop the page cache so the read really reaches the file system below.
    Command::new("sh")
        .args(["-c", "echo 1 > /proc/sys/vm/drop_caches"])
        .status()
        .unwrap();
    assert_eq!(fs::read(r.m(rel)).unwrap(), data);
    // A second open for writing while another open is live shares the same mode.
    {
        let keep = fs::File::open(r.m(rel)).unwrap();
        let mut w = fs::OpenOptions::new().append(true).open(r.m(rel)).unwrap();
        w.write_all(b"tail").unwrap();
        drop(keep);
    }
    assert_eq!(
        fs::metadata(r.b(branch, rel)).unwrap().len(),
        data.len() as u64 + 4
    );
    (
        counts.get(cairn_fuse::Op::Read) - before.0,
        counts.get(cairn_fuse::Op::Write) - before.1,
    )
}

#[test]
fn passthrough_and_its_fallbacks() {
    let mut r = Rig::new(&["a", "b"], ONE_BRANCH_AND_OVERFLOW);
    // A file that cannot overflow: the kernel reads and writes the branch file itself.
    let (reads, writes) = big_file_roundtrip(&r, "direct", "a");
    assert_eq!(
        (reads, writes),
        (0, 0),
        "passthrough open served by the daemon"
    );
    // Its rule may overflow: the writes must come here so ENOSPC can move the file.
    let (reads, writes) = big_file_roundtrip(&r, "x.spill", "a");
    assert!(reads > 0 && writes > 0, "overflowable file passed through");
    r.settle();
    // passthrough=no: the ordinary path, same bytes.
    r.unmount();
    r.mount_with(false);
    let (reads, writes) = big_file_roundtrip(&r, "plain", "a");
    assert!(
        reads > 0 && writes > 0,
        "passthrough=no still passed through"
    );
    assert_eq!(fs::read(r.m("direct")).unwrap().len(), (4 << 20) + 4);
    r.unmount();
}

/// `passthrough_headroom`: a file whose rule lets it overflow is passed through while its
/// branch has that much room beyond `min_free` at open; below it, its writes come through
/// the layer again and overflow as before.
#[test]
fn passthrough_headroom_passes_overflowable_files_through_while_there_is_room() {
    let cfg = r#"
[umbrella]
passthrough_headroom = "6M"
[[branch]]
name = "small"
path = "small"
[[branch]]
name = "big"
path = "big"
[[rule]]
name = "small first"
branches = ["small", "big"]
"#;
    let mut r = Rig::with_tmpfs(&[("small", Some("16M")), ("big", None)], cfg);
    // 16 MiB free, 6 MiB of headroom: passed through although the rule may overflow.
    let (reads, writes) = big_file_roundtrip(&r, "roomy", "small");
    assert_eq!(
        (reads, writes),
        (0, 0),
        "a file opened with the headroom free was not passed through"
    );
    // Fill the branch to below the headroom (about 4 MiB left): the next file's writes come
    // here, and when it outgrows the branch it moves instead of failing.
    fs::write(r.b("small", "filler"), vec![0u8; 8 << 20]).unwrap();
    let counts = r.mount.as_ref().unwrap().counts();
    let before = counts.get(cairn_fuse::Op::Write);
    let data: Vec<u8> = (0..6_000_000u32).map(|i| (i % 253) as u8).collect();
    {
        let mut f = fs::File::create(r.m("grows")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        counts.get(cairn_fuse::Op::Write) > before,
        "passed through with less than the headroom free"
    );
    assert!(r.on("big", "grows") && !r.on("small", "grows"));
    assert_eq!(fs::read(r.m("grows")).unwrap(), data);
    // Without the option (the default), the same first file is never passed through.
    fs::remove_file(r.m("grows")).unwrap();
    fs::remove_file(r.b("small", "filler")).unwrap();
    fs::remove_file(r.m("roomy")).unwrap();
    r.unmount();
    r.write_config(&cfg.replace("passthrough_headroom = \"6M\"", ""));
    r.mount();
    let (reads, writes) = big_file_roundtrip(&r, "roomy", "small");
    assert!(
        reads > 0 && writes > 0,
        "an overflowable file passed through without passthrough_headroom"
    );
}

/// The trade `passthrough_headroom` makes, as the program sees it: a passed-through file
/// whose branch fills while it is open gets ENOSPC from its write — an error it is told,
/// not a write that vanishes — and what it wrote before stays in the file.
#[test]
fn a_passed_through_file_whose_branch_fills_gets_enospc_and_keeps_its_data() {
    let cfg = r#"
[umbrella]
passthrough_headroom = "6M"
[[branch]]
name = "small"
path = "small"
[[branch]]
name = "big"
path = "big"
[[rule]]
name = "small first"
branches = ["small", "big"]
"#;
    let r = Rig::with_tmpfs(&[("small", Some("16M")), ("big", None)], cfg);
    let counts = r.mount.as_ref().unwrap().counts();
    let before = counts.get(cairn_fuse::Op::Write);
    let head: Vec<u8> = (0..1_000_000u32).map(|i| (i % 249) as u8).collect();
    let mut f = fs::File::create(r.m("open")).unwrap();
    f.write_all(&head).unwrap();
    // Someone else fills the branch behind the layer while the file stays open.
    let filler = fs::write(r.b("small", "filler"), vec![0u8; 15 << 20]);
    assert!(filler.is_ok() || filler.unwrap_err().raw_os_error() == Some(libc::ENOSPC));
    let e = f
        .write_all(&vec![1u8; 4 << 20])
        .and_then(|()| f.sync_all())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(
        counts.get(cairn_fuse::Op::Write),
        before,
        "the file was not passed through"
    );
    drop(f);
    let got = fs::read(r.m("open")).unwrap();
    assert!(got.len() >= head.len() && got[..head.len()] == head[..]);
    assert!(r.on("small", "open") && !r.on("big", "open"));
}

/// A directory renamed over (or removed) while open: fstat of its descriptor still
/// answers, with no links (generic/035), and a directory that is still there answers as
/// before.
#[test]
fn fstat_of_an_open_directory_renamed_over() {
    let r = Rig::new(&["fast", "slow"], TWO_TIER);
    fs::create_dir(r.m("d1")).unwrap();
    fs::create_dir(r.m("d2")).unwrap();
    fs::create_dir(r.m("d3")).unwrap();
    let open = fs::File::open(r.m("d2")).unwrap();
    let kept = fs::File::open(r.m("d3")).unwrap();
    fs::rename(r.m("d1"), r.m("d2")).unwrap();
    let m = open
        .metadata()
        .expect("fstat of the directory renamed over");
    assert!(m.is_dir());
    assert_eq!(m.nlink(), 0);
    fs::remove_dir(r.m("d3")).unwrap();
    assert_eq!(kept.metadata().expect("fstat after rmdir").nlink(), 0);
    assert_eq!(fs::metadata(r.m("d2")).unwrap().nlink(), 2);
}

/// A file's birth time is its branch's, never after its access or modification time: a
/// change to the inode (a chown, a link) moves its change time, which the layer once
/// reported as the birth time (fstests generic/423 on a fifo, a device, a symlink).
#[test]
fn birth_times_are_the_branches_own() {
    let r = Rig::new(&["fast", "slow"], TWO_TIER);
    fs::write(r.m("file"), b"x").unwrap();
    let fifo = r.m("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    for p in [r.m("file"), fifo] {
        // The change time moves past the others.
        std::thread::sleep(Duration::from_millis(20));
        std::os::unix::fs::lchown(&p, Some(1), Some(1)).unwrap();
        let m = fs::symlink_metadata(&p).unwrap();
        let born = m.created().expect("statx gives a birth time");
        assert!(
            born <= m.modified().unwrap() && born <= m.accessed().unwrap(),
            "{}: born {:?} after modified {:?} / accessed {:?}",
            p.display(),
            born,
            m.modified().unwrap(),
            m.accessed().unwrap()
        );
        let branch = fs::symlink_metadata(r.b("fast", p.file_name().unwrap().to_str().unwrap()));
        if let Ok(Ok(b)) = branch.map(|b| b.created()) {
            assert_eq!(born, b, "{}: the branch's birth time", p.display());
        }
    }
}
