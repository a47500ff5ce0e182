//! The consistency check of an LFS image (`cairn fsck` on an LFS image): mounts it in
//! memory, read-only (roll-forward included, nothing written), then checks every rule the
//! engine keeps:
//!
//! - every inode the inode map names decodes, and every block it owns lies in the log and
//!   is owned once;
//! - the usage table's live bytes per segment equal what the inode map, the inodes and the
//!   table blocks account for (004 §3.6);
//! - the directory tree from the root: entries name live inodes, `..` names the parent;
//! - link counts equal the references found; an inode no directory names is a leak.
//!
//! [`repair_device`] (`cairn fsck -y`) fixes what a crash can leave without corruption and
//! refuses, changing nothing, what it cannot.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_vfs::{FileSystem, Result};

use crate::engine::{Lfs, MountOptions, ROOT_INO, owned_blocks, read_xattr_chain};
use crate::format::BLOCK_SIZE;

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// A leak (space or an inode nothing references) rather than a corruption.
    pub leak: bool,
    pub message: String,
}

/// What the check found and counted.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub findings: Vec<Finding>,
    pub inodes: u64,
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub specials: u64,
    pub live_blocks: u64,
    pub segments: u32,
    pub clean_segments: u32,
    pub rolled_forward_partials: u64,
    pub total_blocks: u64,
    /// Inodes unlinked while open when the system stopped, which the next read-write mount
    /// frees (the checkpoint's orphan list and roll-forward name them): not leaks.
    pub pending_orphans: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Checks the image at `path` (a shared lock: refused while a read-write mount holds it).
pub fn check_path(path: &std::path::Path) -> Result<CheckReport> {
    let dev = cairn_blockdev::FileDevice::open(path, BLOCK_SIZE as u32, true)?;
    check_device(Arc::new(dev))
}

pub fn check_device(dev: Arc<dyn BlockDevice>) -> Result<CheckReport> {
    let opts = MountOptions {
        read_only: true,
        syncer: false,
        ..Default::default()
    };
    let fs = Lfs::mount_device(dev, &opts)?;
    let mut st = fs.st.lock();
    Ok(audit(&mut st)?.report)
}

/// What [`audit`] found, with what a repair needs: the live bytes each segment should have,
/// and each inode's link count against the references the tree holds.
struct Audit {
    report: CheckReport,
    /// Live bytes per segment, as the inode map, the inodes and the tables account for them.
    live: Vec<u64>,
    /// Link count on disk and references found, per inode in use.
    links: BTreeMap<u64, (u32, u32)>,
    /// A finding no repair here fixes (anything but the usage table, a link count and an
    /// unnamed inode with no links).
    unrepairable: usize,
}

fn audit(st: &mut crate::engine::State) -> Result<Audit> {
    let mut unrepairable = 0usize;
    let mut r = CheckReport {
        segments: st.sb.segments,
        clean_segments: st.clean_segments(),
        rolled_forward_partials: st.stats.rolled_forward_partials,
        total_blocks: st.sb.total_blocks,
        ..Default::default()
    };
    let mut bad = |leak: bool, message: String| r.findings.push(Finding { leak, message });
    let mut live: Vec<u64> = vec![0; st.sb.segments as usize];
    let mut owner: HashMap<u64, u64> = HashMap::new();
    let sb = st.sb.clone();
    let count = |addr: u64, bytes: u64, live: &mut Vec<u64>| {
        if let Some(s) = sb.seg_of(addr) {
            live[s as usize] += bytes;
        }
    };
    for &a in st.imap.block_addrs().iter().chain(st.usage.block_addrs()) {
        count(a, BLOCK_SIZE as u64, &mut live);
    }
    let mut kinds: BTreeMap<u64, u32> = BTreeMap::new();
    let mut nlinks: BTreeMap<u64, u32> = BTreeMap::new();
    for ino in 1..st.sb.max_inodes as u64 {
        let e = st.imap.get(ino).unwrap_or_default();
        if e.addr == 0 {
            continue;
        }
        count(e.addr, 256, &mut live);
        let inode = match st.read_inode(ino) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(err) => {
                bad(false, format!("inode {ino}: {err}"));
                continue;
            }
        };
        if inode.version != e.version {
            bad(
                false,
                format!(
                    "inode {ino}: version {} but the inode map says {}",
                    inode.version, e.version
                ),
            );
        }
        r.inodes += 1;
        kinds.insert(ino, inode.mode & libc::S_IFMT);
        nlinks.insert(ino, inode.nlink);
        match inode.mode & libc::S_IFMT {
            libc::S_IFDIR => r.dirs += 1,
            libc::S_IFREG => r.files += 1,
            libc::S_IFLNK => r.symlinks += 1,
            _ => r.specials += 1,
        }
        match owned_blocks(&inode, |a| st.read_block(a)) {
            Ok(blocks) => {
                if blocks.len() as u64 != inode.blocks {
                    bad(
                        false,
                        format!(
                            "inode {ino}: owns {} blocks, says {}",
                            blocks.len(),
                            inode.blocks
                        ),
                    );
                }
                for a in blocks {
                    if !st.sb.in_log(a) {
                        bad(false, format!("inode {ino}: block {a} outside the log"));
                        continue;
                    }
                    if let Some(o) = owner.insert(a, ino) {
                        bad(false, format!("block {a} owned by inodes {o} and {ino}"));
                    }
                    count(a, BLOCK_SIZE as u64, &mut live);
                    r.live_blocks += 1;
                }
            }
            Err(err) => bad(false, format!("inode {ino}: block map: {err}")),
        }
        let unknown = inode.flags & !cairn_vfs::fileattr::SUPPORTED;
        if unknown != 0 {
            bad(
                false,
                format!("inode {ino}: unknown inode flags {unknown:#x}"),
            );
        }
        if inode.xattr != 0 {
            match read_xattr_chain(inode.xattr, |a| st.read_block(a)).map(|c| c.0) {
                Ok(x) => {
                    let a = cairn_vfs::acl::audit(inode.mode, |k| x.get(k.xattr()).map(|v| &v[..]));
                    for p in a.problems {
                        bad(false, format!("inode {ino}: {p}"));
                    }
                }
                Err(err) => bad(false, format!("inode {ino}: extended attributes: {err}")),
            }
        }
    }
    for (s, &want) in live.iter().enumerate() {
        let have = st.usage[s].live_bytes as u64;
        if have != want {
            bad(
                have > want,
                format!(
                    "segment {s}: usage table says {have} live bytes, the inodes account for {want}"
                ),
            );
        }
    }
    // The tree: references per inode, `..` of each directory.
    let mut refs: BTreeMap<u64, u32> = BTreeMap::new();
    let mut stack = vec![(ROOT_INO, ROOT_INO)];
    let mut seen = std::collections::HashSet::new();
    refs.insert(ROOT_INO, 1);
    while let Some((dir, parent)) = stack.pop() {
        if !seen.insert(dir) {
            bad(false, format!("directory {dir} reached twice"));
            continue;
        }
        let idx = match st.dir_index(dir) {
            Ok(i) => i,
            Err(e) => {
                bad(false, format!("directory {dir}: {e}"));
                continue;
            }
        };
        let dotdot = idx.dotdot.ino;
        let names: Vec<(Vec<u8>, u64)> =
            idx.names.iter().map(|(n, s)| (n.to_vec(), s.ino)).collect();
        if dotdot != parent {
            bad(
                false,
                format!("directory {dir}: '..' is {dotdot}, its parent is {parent}"),
            );
        }
        *refs.entry(dir).or_default() += 1; // its own '.'
        *refs.entry(parent).or_default() += (dir != ROOT_INO) as u32; // its '..'
        for (name, ino) in names {
            let Some(&k) = kinds.get(&ino) else {
                bad(
                    false,
                    format!(
                        "directory {dir}: '{}' names free inode {ino}",
                        String::from_utf8_lossy(&name)
                    ),
                );
                continue;
            };
            *refs.entry(ino).or_default() += 1;
            if k == libc::S_IFDIR {
                stack.push((ino, dir));
            }
        }
    }
    // Everything found so far but the usage table's counts is beyond the repair.
    unrepairable += r
        .findings
        .iter()
        .filter(|f| !f.message.starts_with("segment "))
        .count();
    let mut links = BTreeMap::new();
    for (&ino, &n) in &nlinks {
        let c = refs.get(&ino).copied().unwrap_or(0);
        links.insert(ino, (n, c));
        match refs.get(&ino) {
            // Unlinked while open: the mount after the crash frees it (`State::orphans`).
            None if n == 0 && st.orphans.contains(&ino) => r.pending_orphans += 1,
            None => {
                // An inode with links no directory holds would need lost+found.
                unrepairable += (n > 0) as usize;
                r.findings.push(Finding {
                    leak: true,
                    message: format!("inode {ino}: in no directory (link count {n})"),
                });
            }
            Some(&c) if c != n => r.findings.push(Finding {
                leak: false,
                message: format!("inode {ino}: link count {n}, {c} references"),
            }),
            _ => {}
        }
    }
    Ok(Audit {
        report: r,
        live,
        links,
        unrepairable,
    })
}

/// What `cairn fsck -y` did to an LFS image.
#[derive(Clone, Debug, Default)]
pub struct RepairReport {
    /// The findings before the repair (the image as the last crash left it, rolled forward).
    pub before: CheckReport,
    /// The findings after it (empty when everything was fixed).
    pub after: CheckReport,
    /// Whether anything was written (roll-forward made durable, fixes checkpointed).
    pub wrote: bool,
    /// Why the repair changed nothing beyond the roll-forward, if it did not.
    pub refused: Option<String>,
}

/// `cairn fsck -y` on an LFS image (an exclusive lock: refused while anything holds it).
pub fn repair_path(path: &std::path::Path) -> Result<RepairReport> {
    let dev = cairn_blockdev::FileDevice::open(path, BLOCK_SIZE as u32, false)?;
    repair_device(Arc::new(dev))
}

/// Repairs what an LFS image can lose without corruption: a read-write mount makes the
/// roll-forward durable (its checkpoint); then the usage table takes the live bytes the
/// inodes account for, link counts take the references the tree holds, and inodes with no
/// link and no name (unlinked while open when the system stopped) are freed; a checkpoint
/// makes it durable. Anything else — an entry naming a free inode, a block owned twice, an
/// inode that does not decode, an inode with links but no name (it would need lost+found)
/// — is reported and left: the image is not changed beyond the roll-forward. An image of
/// an older format version (which mounts read-only only) is upgraded: rolled forward as
/// its version checks its log, unmounted (a checkpoint), its superblock rewritten.
pub fn repair_device(dev: Arc<dyn BlockDevice>) -> Result<RepairReport> {
    let opts = MountOptions {
        syncer: false,
        ..Default::default()
    };
    // What the image holds as the crash left it (rolled forward in memory only): the
    // findings the report lists, fixed or not.
    let mut out = RepairReport {
        before: check_device(dev.clone())?,
        ..Default::default()
    };
    // The read-write mount rolls forward for good, freeing the inodes it found unlinked.
    let fs = Lfs::mount_upgrading(dev.clone(), &opts)?;
    let older = fs.st.lock().sb.version < crate::format::superblock::VERSION;
    let r = {
        let mut st = fs.st.lock();
        let a = audit(&mut st)?;
        out.wrote = out.before.rolled_forward_partials > 0;
        if a.report.findings.is_empty() {
            None
        } else if a.unrepairable > 0 {
            out.refused = Some(format!(
                "{} finding(s) beyond what lfs repairs (the usage table, link counts, unnamed inodes with no link): the image is left as it is",
                a.unrepairable
            ));
            None
        } else {
            Some(fix(&mut st, &a))
        }
    };
    if let Some(r) = r {
        r?;
        out.wrote = true;
    }
    let upgrade = older && out.refused.is_none();
    if out.wrote || upgrade {
        fs.destroy()?;
    }
    drop(fs);
    if upgrade {
        out.wrote |= Lfs::upgrade_device(&dev)?;
    }
    out.after = check_device(dev)?;
    Ok(out)
}

/// Applies the repairs [`repair_device`] allows, then checkpoints.
fn fix(st: &mut crate::engine::State, a: &Audit) -> Result<()> {
    for (&ino, &(n, c)) in &a.links {
        if c == 0 {
            // No name and (the audit refused otherwise) no link: unlinked while open.
            st.node(ino)?.inode.nlink = 0;
            st.maybe_free(ino)?;
        } else if n != c {
            st.node(ino)?.inode.nlink = c;
            st.mark_dirty(ino);
        }
    }
    // The frees above moved live bytes; the table is recounted after them.
    st.flush()?;
    let fresh = audit(st)?;
    for (s, &want) in fresh.live.iter().enumerate() {
        st.usage.update(s, |u| u.live_bytes = want as u32);
    }
    st.checkpoint()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use cairn_blockdev::MemDevice;
    use cairn_vfs::Ctx;

    use super::*;
    use crate::engine::tests::mount;
    use crate::format::tables;

    /// The engine tests' image, at 2048 blocks.
    fn image() -> Arc<MemDevice> {
        crate::engine::tests::image(2048)
    }

    fn file(fs: &Lfs, name: &str) -> u64 {
        let c = Ctx::root();
        let (a, fh) = fs
            .create(&c, ROOT_INO, OsStr::new(name), 0o644, 0, libc::O_RDWR)
            .unwrap();
        fs.write(a.ino, fh, 0, &[7u8; 10_000]).unwrap();
        fs.release(a.ino, fh).unwrap();
        a.ino
    }

    /// The image as a crash right now would leave it (the mount is never unmounted).
    fn crashed(dev: &Arc<MemDevice>) -> Arc<MemDevice> {
        Arc::new(MemDevice::from_bytes(BLOCK_SIZE as u32, dev.to_bytes()))
    }

    fn check(dev: &Arc<MemDevice>) -> CheckReport {
        check_device(dev.clone() as Arc<dyn BlockDevice>).unwrap()
    }

    /// Creates "open" in the root with 20,000 bytes and keeps it open (never released).
    fn create_open(fs: &Lfs) -> cairn_vfs::Attr {
        let (a, fh) = fs
            .create(
                &Ctx::root(),
                ROOT_INO,
                OsStr::new("open"),
                0o644,
                0,
                libc::O_RDWR,
            )
            .unwrap();
        fs.write(a.ino, fh, 0, &[1u8; 20_000]).unwrap();
        a
    }

    /// An ACL the engine would never store (planted under it), and flags nobody sets, are
    /// findings; a well-formed ACL whose mode agrees is not.
    #[test]
    fn malformed_acls_and_unknown_flags_are_findings() {
        let dev = image();
        let fs = mount(&dev);
        let c = Ctx::root();
        let good = file(&fs, "good");
        let a =
            cairn_vfs::acl::encode_raw(&[(1, 6, u32::MAX), (4, 4, u32::MAX), (0x20, 4, u32::MAX)]);
        fs.setxattr(&c, good, OsStr::new("system.posix_acl_default"), &a, 0)
            .unwrap_err();
        let bad = file(&fs, "bad");
        let flagged = file(&fs, "flagged");
        {
            let mut st = fs.st.lock();
            let n = st.node(bad).unwrap();
            n.xattrs
                .get_or_insert_default()
                .insert(b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0, 9]);
            n.xattr_dirty = true;
            st.mark_meta_dirty(bad);
            st.node(flagged).unwrap().inode.flags = 0x4000_0000;
            st.mark_dirty(flagged);
        }
        fs.destroy().unwrap();
        drop(fs);
        let r = check(&dev);
        let msgs: Vec<&str> = r.findings.iter().map(|f| f.message.as_str()).collect();
        assert!(
            msgs.iter()
                .any(|m| m.contains(&format!("inode {bad}")) && m.contains("posix_acl_access")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains(&format!("inode {flagged}")) && m.contains("flags")),
            "{msgs:?}"
        );
        assert!(
            !msgs.iter().any(|m| m.contains(&format!("inode {good}"))),
            "{msgs:?}"
        );
    }

    /// A file unlinked while open, its unlink flushed, then a crash: the check finds an
    /// inode in no directory with no link that roll-forward names as an orphan — pending,
    /// not a leak: the repair (a read-write mount first) frees it and its blocks.
    #[test]
    fn repair_frees_an_inode_unlinked_while_open() {
        let dev = image();
        let fs = mount(&dev);
        let c = Ctx::root();
        create_open(&fs);
        fs.unlink(&c, ROOT_INO, OsStr::new("open")).unwrap();
        fs.fsync(ROOT_INO, 0, false).unwrap();
        let img = crashed(&dev);
        drop(fs);
        let r = check(&img);
        assert!(r.is_clean() && r.pending_orphans == 1, "{r:?}");
        let rep = repair_device(img.clone() as Arc<dyn BlockDevice>).unwrap();
        assert!(rep.refused.is_none() && rep.wrote, "{rep:?}");
        let r = check(&img);
        assert!(r.is_clean() && r.pending_orphans == 0, "{r:?}");
    }

    /// The same crash, then a read-write mount: roll-forward sees the inode written with no
    /// link and the mount frees it (its checkpoint records it), so the image checks clean.
    #[test]
    fn a_read_write_mount_frees_what_roll_forward_finds_unlinked() {
        let dev = image();
        let fs = mount(&dev);
        let c = Ctx::root();
        let a = create_open(&fs);
        fs.checkpoint().unwrap();
        fs.unlink(&c, ROOT_INO, OsStr::new("open")).unwrap();
        fs.fsync(ROOT_INO, 0, false).unwrap();
        let img = crashed(&dev);
        drop(fs);
        assert_eq!(check(&img).pending_orphans, 1);
        let fs = mount(&img);
        assert!(fs.getattr(a.ino).is_err(), "the orphan is gone");
        fs.destroy().unwrap();
        drop(fs);
        assert!(check(&img).is_clean(), "{:?}", check(&img).findings);
    }

    /// A file unlinked while open and then captured by a checkpoint with nothing after it:
    /// roll-forward has nothing to find, so only the checkpoint's orphan list tells the
    /// next read-write mount to free it.
    #[test]
    fn a_read_write_mount_frees_the_orphans_a_checkpoint_lists() {
        let dev = image();
        let fs = mount(&dev);
        let c = Ctx::root();
        let a = create_open(&fs);
        fs.unlink(&c, ROOT_INO, OsStr::new("open")).unwrap();
        fs.checkpoint().unwrap();
        let img = crashed(&dev);
        drop(fs);
        let r = check(&img);
        assert!(
            r.is_clean() && r.pending_orphans == 1,
            "listed, so not a leak: {r:?}"
        );
        let fs = mount(&img);
        assert_eq!(
            fs.lfs_stats().rolled_forward_partials,
            0,
            "nothing to roll forward"
        );
        assert!(fs.getattr(a.ino).is_err(), "the orphan is gone");
        drop(fs);
        // Freed durably: a crash right after the mount keeps it freed.
        let r = check(&img);
        assert!(r.is_clean() && r.pending_orphans == 0, "{r:?}");
    }

    /// A usage table and a link count that disagree with the inodes are set from them.
    #[test]
    fn repair_recounts_the_usage_table_and_link_counts() {
        let dev = image();
        let fs = mount(&dev);
        let ino = file(&fs, "f");
        {
            let mut st = fs.st.lock();
            let seg = st.log.seg as usize;
            st.usage.update(seg, |u| u.live_bytes += 8192);
            st.node(ino).unwrap().inode.nlink = 3;
            st.mark_dirty(ino);
            st.checkpoint().unwrap();
        }
        fs.destroy().unwrap();
        drop(fs);
        let r = check(&dev);
        assert!(
            r.findings
                .iter()
                .any(|f| f.message.contains("usage table says"))
                && r.findings
                    .iter()
                    .any(|f| f.message.contains("link count 3, 1 references")),
            "{:?}",
            r.findings
        );
        let rep = repair_device(dev.clone() as Arc<dyn BlockDevice>).unwrap();
        assert!(rep.refused.is_none(), "{rep:?}");
        assert!(check(&dev).is_clean(), "{:?}", check(&dev).findings);
        let fs = mount(&dev);
        assert_eq!(fs.getattr(ino).unwrap().nlink, 1);
    }

    /// An entry naming a free inode is beyond the repair: reported, the image unchanged.
    #[test]
    fn repair_refuses_corruption_and_changes_nothing() {
        let dev = image();
        let fs = mount(&dev);
        let ino = file(&fs, "f");
        {
            let mut st = fs.st.lock();
            st.checkpoint().unwrap();
            let e = st.imap.get(ino).unwrap();
            st.imap.set(ino, tables::ImapEntry { addr: 0, ..e });
            st.checkpoint().unwrap();
        }
        fs.destroy().unwrap();
        drop(fs);
        let before = dev.to_bytes();
        let rep = repair_device(dev.clone() as Arc<dyn BlockDevice>).unwrap();
        let why = rep.refused.clone().unwrap_or_else(|| panic!("{rep:?}"));
        assert!(why.contains("left as it is"), "{why}");
        assert!(!rep.wrote);
        assert!(
            dev.to_bytes() == before,
            "a refused repair wrote to the image"
        );
        assert!(!check(&dev).is_clean());
    }
}
