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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_vfs::Result;

use crate::engine::{Lfs, MountOptions, ROOT_INO, owned_blocks};
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
    for &a in st.imap_addrs.iter().chain(&st.usage_addrs) {
        count(a, BLOCK_SIZE as u64, &mut live);
    }
    let mut kinds: BTreeMap<u64, u32> = BTreeMap::new();
    let mut nlinks: BTreeMap<u64, u32> = BTreeMap::new();
    for ino in 1..st.sb.max_inodes as u64 {
        let e = st.imap[ino as usize];
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
    for (&ino, &n) in &nlinks {
        match refs.get(&ino) {
            None => bad(
                true,
                format!("inode {ino}: in no directory (link count {n})"),
            ),
            Some(&c) if c != n => bad(
                false,
                format!("inode {ino}: link count {n}, {c} references"),
            ),
            _ => {}
        }
    }
    Ok(r)
}
