//! Golden images: small images made by earlier builds of cairn, committed under
//! `testdata/images/` with the commands that made them (its README). Every image a cairn
//! once wrote must keep mounting — or be refused by name, in one line that names the way
//! out — after any change to a format.
//!
//! `testdata/images/manifest` has one line per image:
//!
//! ```text
//! IMAGE  FORMAT  READ-ONLY  READ-WRITE  TREE  [OPTIONS]
//! ```
//!
//! `OPTIONS` (none when absent): the mount options every mount of the image takes, as
//! `-o` gives them (`mode=journal,log=dev:{dir}/NAME`: `{dir}` is where the test copied
//! the images, and a file named after `{dir}/` is copied there too).
//!
//! `READ-ONLY` and `READ-WRITE` say what a mount of the image does: `mounts`, or
//! `refused:TEXT` (the mount fails with one line containing TEXT, `_` standing for a space). `TREE` lists what the
//! image holds, one name a line (`path kind perm nlink size detail`: the contents' CRC32C
//! for a file, the target for a symlink), as a read-only mount shows it. For each image,
//! on a copy: the registry's probe names its format; a read-only mount shows the tree
//! (or is refused as the manifest says); the format's check (`cairn fsck`) finds it clean;
//! a read-write mount shows the tree, takes a new file and leaves the image clean — after
//! the format's repair (`cairn fsck -y`, the way out a refusal names) when the manifest
//! says a read-write mount is refused. Adding an image is a file and a line; a new tree
//! file is written by `CAIRN_BLESS=1 cargo test -p cairn-fstypes --test golden_images`.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_fsck::CheckOptions;
use cairn_vfs::{Ctx, FileKind, FileSystem, Ino};

fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/images")
}

/// What the manifest says a mount does.
#[derive(Debug)]
enum Expect {
    Mounts,
    Refused(String),
}

impl Expect {
    fn parse(s: &str) -> Expect {
        match s.strip_prefix("refused:") {
            Some(t) => Expect::Refused(t.replace('_', " ")),
            None => {
                assert_eq!(
                    s, "mounts",
                    "manifest: '{s}' is neither mounts nor refused:TEXT"
                );
                Expect::Mounts
            }
        }
    }
}

struct Entry {
    image: String,
    format: String,
    ro: Expect,
    rw: Expect,
    tree: String,
    options: String,
}

impl Entry {
    /// The mount options, `{dir}` replaced by `dir`.
    fn options(&self, dir: &Path) -> Vec<(String, Option<String>)> {
        let o = self.options.replace("{dir}", &dir.display().to_string());
        o.split(',')
            .filter(|kv| !kv.is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (kv.to_string(), None),
            })
            .collect()
    }

    /// The other files its options name (`{dir}/NAME`): a journal's log device.
    fn companions(&self) -> Vec<String> {
        self.options
            .split(',')
            .filter_map(|kv| kv.split_once("{dir}/"))
            .map(|(_, name)| name.to_string())
            .collect()
    }
}

fn manifest() -> Vec<Entry> {
    let text = std::fs::read_to_string(images_dir().join("manifest")).expect("manifest");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(
                f.len() == 5 || f.len() == 6,
                "manifest line '{l}': want 5 or 6 fields"
            );
            Entry {
                image: f[0].into(),
                format: f[1].into(),
                ro: Expect::parse(f[2]),
                rw: Expect::parse(f[3]),
                tree: f[4].into(),
                options: f.get(5).map_or(String::new(), |o| o.to_string()),
            }
        })
        .collect()
}

/// Every name under the root: path → `kind perm nlink size detail`.
fn walk(fs: &dyn FileSystem) -> BTreeMap<String, String> {
    let ctx = Ctx::root();
    let mut out = BTreeMap::new();
    let mut todo: Vec<(Ino, String)> = vec![(fs.root_ino(), String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let fh = fs.opendir(&ctx, dir).expect("opendir");
        let mut names: Vec<Vec<u8>> = Vec::new();
        let mut off = 0;
        loop {
            let mut got = 0;
            fs.readdir(dir, fh, off, false, &mut |e| {
                let n = e.name.as_bytes();
                if n != b"." && n != b".." {
                    names.push(n.to_vec());
                }
                off = e.next_offset;
                got += 1;
                true
            })
            .expect("readdir");
            if got == 0 {
                break;
            }
        }
        let _ = fs.releasedir(dir, fh);
        for n in names {
            let a = fs.lookup(&ctx, dir, OsStr::from_bytes(&n)).expect("lookup");
            let path = format!("{prefix}{}", String::from_utf8_lossy(&n));
            let (kind, detail) = match a.kind {
                FileKind::Directory => {
                    todo.push((a.ino, format!("{path}/")));
                    ("d", "-".to_string())
                }
                FileKind::RegularFile => {
                    let fh = fs.open(&ctx, a.ino, libc::O_RDONLY).expect("open");
                    let mut data = Vec::new();
                    let mut buf = Vec::new();
                    while (data.len() as u64) < a.size {
                        fs.read(a.ino, fh, data.len() as u64, 1 << 20, &mut buf)
                            .expect("read");
                        if buf.is_empty() {
                            break;
                        }
                        data.extend_from_slice(&buf);
                    }
                    let _ = fs.release(a.ino, fh);
                    assert_eq!(data.len() as u64, a.size, "{path}: short read");
                    ("f", format!("crc32c:{:08x}", crc32c::crc32c(&data)))
                }
                FileKind::Symlink => (
                    "l",
                    String::from_utf8_lossy(&fs.readlink(a.ino).expect("readlink")).into_owned(),
                ),
                _ => ("s", "-".to_string()),
            };
            let mut line = format!("{kind} {:o} {} {} {detail}", a.perm, a.nlink, a.size);
            // Extended attributes, when there are any: their count and one checksum of
            // every name and value (an inode's list in one block or a chain).
            if kind != "l" {
                let list = fs.listxattr(&ctx, a.ino).expect("listxattr");
                let mut names: Vec<&[u8]> =
                    list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
                names.sort();
                if !names.is_empty() {
                    let mut all = Vec::new();
                    for n in &names {
                        let v = fs
                            .getxattr(&ctx, a.ino, OsStr::from_bytes(n))
                            .expect("getxattr");
                        all.extend_from_slice(n);
                        all.push(0);
                        all.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        all.extend_from_slice(&v);
                    }
                    line += &format!(
                        " xattrs:{}:crc32c:{:08x}",
                        names.len(),
                        crc32c::crc32c(&all)
                    );
                }
            }
            out.insert(path, line);
        }
    }
    out
}

fn render(tree: &BTreeMap<String, String>) -> String {
    tree.iter().map(|(p, d)| format!("{p} {d}\n")).collect()
}

/// A mount of `img` as the manifest expects; `Some` when it mounted.
fn mount(
    t: &cairn_fstypes::FsType,
    img: &Path,
    opts: &cairn_fstypes::Options,
    read_only: bool,
    want: &Expect,
    what: &str,
) -> Option<Arc<dyn FileSystem>> {
    let r = (t.mount)(img, opts, read_only);
    match (r, want) {
        (Ok(fs), Expect::Mounts) => Some(fs),
        (Ok(fs), Expect::Refused(text)) => {
            let _ = fs.destroy();
            panic!("{what}: mounted, the manifest says refused ({text})")
        }
        (Err(e), Expect::Mounts) => panic!("{what}: refused: {e}"),
        (Err(e), Expect::Refused(text)) => {
            let msg = e.to_string();
            assert!(msg.contains(text.as_str()), "{what}: refused with '{msg}'");
            assert_eq!(
                msg.lines().count(),
                1,
                "{what}: refusal in more than one line"
            );
            None
        }
    }
}

fn unmount(fs: Arc<dyn FileSystem>) {
    fs.destroy().expect("unmount");
    drop(fs);
}

fn assert_clean(t: &cairn_fstypes::FsType, img: &Path, what: &str) {
    let r = (t.check)(img, CheckOptions::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(r.is_clean(), "{what}: {:?}", r.findings);
}

#[test]
fn every_golden_image_mounts_checks_and_reads() {
    let entries = manifest();
    assert!(!entries.is_empty(), "an empty manifest");
    let bless = std::env::var_os("CAIRN_BLESS").is_some();
    let tmp = tempfile::tempdir().unwrap();
    for e in entries {
        let img = tmp.path().join(&e.image);
        std::fs::copy(images_dir().join(&e.image), &img).expect("copy the image");
        for c in e.companions() {
            std::fs::copy(images_dir().join(&c), tmp.path().join(&c)).expect("copy a companion");
        }
        let opts = e.options(tmp.path());
        let t = cairn_fstypes::probe_path(&img).unwrap_or_else(|x| panic!("{}: {x}", e.image));
        assert_eq!(t.name, e.format, "{}: probed as {}", e.image, t.name);
        let tree_path = images_dir().join(&e.tree);
        let what = |s: &str| format!("{} ({s})", e.image);
        let ro = mount(t, &img, &opts, true, &e.ro, &what("read-only mount"));
        let Some(fs) = ro else { continue };
        let tree = walk(fs.as_ref());
        unmount(fs);
        if bless {
            std::fs::write(&tree_path, render(&tree)).unwrap();
        }
        let want = std::fs::read_to_string(&tree_path).expect("tree file");
        assert_eq!(
            render(&tree),
            want,
            "{}: the read-only mount's tree",
            e.image
        );
        assert_clean(t, &img, &what("check"));
        let fs = match mount(t, &img, &opts, false, &e.rw, &what("read-write mount")) {
            Some(fs) => fs,
            None => {
                // The way out the refusal names: the format's repair (`cairn fsck -y`).
                let y = CheckOptions {
                    repair: true,
                    ..Default::default()
                };
                let r = (t.check)(&img, y).unwrap_or_else(|x| panic!("{}: -y: {x}", e.image));
                assert!(r.exit_code() <= 1, "{}: -y: {:?}", e.image, r.findings);
                (t.mount)(&img, &opts, false)
                    .unwrap_or_else(|x| panic!("{}: after -y, refused: {x}", e.image))
            }
        };
        assert_eq!(render(&walk(fs.as_ref())), want, "{}: read-write", e.image);
        let c = Ctx::root();
        let (a, fh) = fs
            .create(
                &c,
                fs.root_ino(),
                OsStr::new("written-by-this-build"),
                libc::S_IFREG | 0o644,
                0o022,
                libc::O_RDWR,
            )
            .unwrap_or_else(|x| panic!("{}: create: {x}", e.image));
        fs.write(a.ino, fh, 0, b"golden").unwrap();
        fs.release(a.ino, fh).unwrap();
        unmount(fs);
        assert_clean(t, &img, &what("check after a read-write mount"));
        let fs = (t.mount)(&img, &opts, true).unwrap();
        let mut after = walk(fs.as_ref());
        unmount(fs);
        assert!(
            after.remove("written-by-this-build").is_some(),
            "{}",
            e.image
        );
        assert_eq!(
            render(&after),
            want,
            "{}: after a read-write mount",
            e.image
        );
    }
}
