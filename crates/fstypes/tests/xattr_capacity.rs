//! How many extended attributes an inode holds, in every mode of every format, through the
//! `FileSystem` contract on a memory device: fstests generic/020's 1000 attributes and its
//! 64 KiB value (what the suite assumes of a FUSE file system), kept across a remount and
//! clean for the format's fsck; and a randomized run against a reference map (seed printed;
//! `CAIRN_SEED=N` repeats one).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, MemDevice};
use cairn_fstypes::{DeviceMount, MkfsArgs, Mode};
use cairn_vfs::{Ctx, Errno, FileSystem};
use rand::{Rng, SeedableRng};

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A mounted file system of one mode on a memory device that outlives remounts.
struct Rig {
    mode: Mode,
    dev: Arc<MemDevice>,
    fs: Arc<dyn FileSystem>,
}

impl Rig {
    fn new(mode: Mode) -> Rig {
        let dev = Arc::new(MemDevice::new(4096, 16384));
        (mode.fs.device.mkfs)(dev.clone() as Arc<dyn BlockDevice>, &MkfsArgs::default())
            .expect("mkfs");
        let fs = Self::mount_dev(mode, &dev);
        Rig { mode, dev, fs }
    }

    fn mount_dev(mode: Mode, dev: &Arc<MemDevice>) -> Arc<dyn FileSystem> {
        let opts = vec![("mode".to_string(), Some(mode.name().to_string()))];
        (mode.fs.device.mount)(
            dev.clone() as Arc<dyn BlockDevice>,
            &opts,
            DeviceMount {
                read_only: false,
                background: false,
            },
        )
        .unwrap_or_else(|e| panic!("{}: mount: {e}", mode.name()))
    }

    fn remount(&mut self) {
        self.fs.destroy().expect("unmount");
        self.fs = Self::mount_dev(self.mode, &self.dev);
    }

    /// Unmounts and runs the format's check: nothing may be found.
    fn check(&mut self) {
        self.fs.destroy().expect("unmount");
        let r = (self.mode.fs.device.check)(self.dev.clone() as Arc<dyn BlockDevice>)
            .expect("check runs");
        assert!(
            r.findings.is_empty(),
            "{}: fsck found {:?}",
            self.mode.name(),
            r.findings
        );
        self.fs = Self::mount_dev(self.mode, &self.dev);
    }

    fn file(&self, name: &str) -> u64 {
        let c = Ctx::root();
        let (a, fh) = self
            .fs
            .create(
                &c,
                self.fs.root_ino(),
                n(name),
                libc::S_IFREG | 0o644,
                0,
                libc::O_RDWR,
            )
            .unwrap();
        self.fs.release(a.ino, fh).unwrap();
        a.ino
    }

    /// Every attribute of `ino`, read back one by one from its list.
    fn all(&self, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let c = Ctx::root();
        let list = self.fs.listxattr(&c, ino).unwrap();
        list.split(|&b| b == 0)
            .filter(|k| !k.is_empty())
            .map(|k| {
                let name = OsStr::new(std::str::from_utf8(k).unwrap());
                (k.to_vec(), self.fs.getxattr(&c, ino, name).unwrap())
            })
            .collect()
    }
}

fn each_mode(f: impl Fn(Rig)) {
    for m in cairn_fstypes::modes() {
        println!("=== {}", m.name());
        f(Rig::new(m));
    }
}

/// What: fstests generic/020 on every mode — 1000 attributes `user.attribute_N` =
/// `value_N` set, listed, kept across a remount and clean for fsck, removed again; then
/// one value of 64 KiB (the kernel's largest), likewise; and past what an inode holds,
/// ENOSPC with nothing changed.
/// Why: the suite assumes a FUSE file system holds that many (`_attr_get_max`); an inode
/// whose attributes live in one block held about 110.
#[test]
fn a_thousand_attributes_and_a_64k_value_in_every_mode() {
    each_mode(|mut r| {
        let name = r.mode.name();
        let c = Ctx::root();
        let f = r.file("f");
        r.fs.setxattr(&c, f, n("user.snrub"), b"fish2\n", 0)
            .unwrap();
        let mut want = BTreeMap::new();
        want.insert(b"user.snrub".to_vec(), b"fish2\n".to_vec());
        for i in 0..1000 {
            let (k, v) = (format!("user.attribute_{i}"), format!("value_{i}"));
            r.fs.setxattr(&c, f, n(&k), v.as_bytes(), 0)
                .unwrap_or_else(|e| panic!("{name}: attribute {i}: {e}"));
            want.insert(k.into_bytes(), v.into_bytes());
        }
        assert_eq!(r.all(f), want, "{name}");
        r.remount();
        assert_eq!(r.all(f), want, "{name}: after remount");
        r.check();
        for i in 0..1000 {
            r.fs.removexattr(&c, f, n(&format!("user.attribute_{i}")))
                .unwrap_or_else(|e| panic!("{name}: remove {i}: {e}"));
        }
        want.retain(|k, _| k == b"user.snrub");
        assert_eq!(r.all(f), want, "{name}");
        let long = vec![0u8; 65536];
        r.fs.setxattr(&c, f, n("user.long_attr"), &long, 0)
            .unwrap_or_else(|e| panic!("{name}: 64 KiB value: {e}"));
        want.insert(b"user.long_attr".to_vec(), long.clone());
        r.remount();
        assert_eq!(r.all(f), want, "{name}: 64 KiB value after remount");
        // More than an inode holds: refused, nothing changed.
        let too_much = (0..4)
            .map(|i| {
                r.fs.setxattr(&c, f, n(&format!("user.big{i}")), &long, 0)
                    .err()
                    .map(|e| e.errno())
            })
            .find(|e| e.is_some())
            .flatten();
        assert_eq!(too_much, Some(Errno::ENOSPC), "{name}");
        let mut after = r.all(f);
        after.retain(|k, _| !k.starts_with(b"user.big"));
        assert_eq!(after, want, "{name}: a refused set changed nothing else");
        r.check();
        // All gone: the inode owns no attribute block again.
        for k in r.all(f).keys() {
            r.fs.removexattr(&c, f, n(std::str::from_utf8(k).unwrap()))
                .unwrap();
        }
        assert!(r.all(f).is_empty(), "{name}");
        // (A log-structured format counts its blocks when it writes them: after the check's
        // unmount.)
        r.check();
        assert_eq!(r.fs.getattr(f).unwrap().blocks, 0, "{name}");
        r.fs.destroy().unwrap();
    });
}

/// What: random sets (new and replacing, values from empty to 64 KiB), removals and
/// remounts on two files, against a reference map; the lists equal after every remount and
/// at the end, and fsck finds nothing.
/// Why: the list grows past one block and shrinks back under it many times, in every
/// mode, and the two files' chains are allocated among each other's.
#[test]
fn random_attributes_against_a_reference() {
    let seed = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("CAIRN_SEED={seed}");
    each_mode(|mut r| {
        let name = r.mode.name();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let c = Ctx::root();
        let files = [r.file("a"), r.file("b")];
        let mut want: [BTreeMap<Vec<u8>, Vec<u8>>; 2] = Default::default();
        for step in 0..600 {
            let i = rng.random_range(0..2);
            let f = files[i];
            let k = format!("user.k{}", rng.random_range(0..200));
            match rng.random_range(0..10) {
                0..=5 => {
                    let len = match rng.random_range(0..20) {
                        0 => rng.random_range(4096..65537),
                        1..=3 => rng.random_range(256..4096),
                        _ => rng.random_range(0..64),
                    };
                    let v: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    match r.fs.setxattr(&c, f, n(&k), &v, 0) {
                        Ok(()) => {
                            want[i].insert(k.into_bytes(), v);
                        }
                        Err(e) => assert_eq!(
                            e.errno(),
                            Errno::ENOSPC,
                            "{name} seed {seed} step {step}: set {k}"
                        ),
                    }
                }
                6..=8 => {
                    let r2 = r.fs.removexattr(&c, f, n(&k));
                    match want[i].remove(k.as_bytes()) {
                        Some(_) => r2.unwrap(),
                        None => assert_eq!(r2.unwrap_err().errno(), Errno::ENODATA),
                    }
                }
                _ => {
                    r.remount();
                    for (j, &f) in files.iter().enumerate() {
                        assert_eq!(r.all(f), want[j], "{name} seed {seed} step {step}");
                    }
                }
            }
        }
        r.check();
        for (j, &f) in files.iter().enumerate() {
            assert_eq!(r.all(f), want[j], "{name} seed {seed} at the end");
        }
        r.fs.destroy().unwrap();
    });
}
