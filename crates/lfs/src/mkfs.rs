//! Creating an LFS image: the superblock, a zeroed second checkpoint region, and a first
//! checkpoint whose log holds the root directory, written by the engine's own checkpoint
//! path (so mkfs and mount cannot disagree about the format).

use std::path::Path;
use std::sync::Arc;

use cairn_blockdev::{BlockDevice, image};
use cairn_vfs::{Errno, FsError, Result};

use crate::engine::{Node, ROOT_INO, State, now};
use crate::format::checkpoint::{self, Checkpoint};
use crate::format::inode::Inode;
use crate::format::summary::MAX_ENTRIES;
use crate::format::superblock::{self, Superblock};
use crate::format::tables::{self, ImapEntry, UsageEntry};
use crate::format::{BLOCK_SIZE, dirlog};

/// What `cairn mkfs --format lfs` may be asked.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    pub size: Option<u64>,
    /// Bytes per segment (default 512 KiB; 32 KiB to 4 MiB, a multiple of 4 KiB).
    pub segment_size: u64,
    /// Inode numbers (default one per 16 KiB).
    pub inodes: Option<u64>,
    pub label: String,
    pub force: bool,
    pub sparse: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            size: None,
            segment_size: 512 << 10,
            inodes: None,
            label: String::new(),
            force: false,
            sparse: false,
        }
    }
}

fn refused(e: Errno, msg: String) -> FsError {
    FsError::Refused(e, msg)
}

/// The geometry for a device of `blocks` blocks.
pub fn geometry(blocks: u64, opts: &MkfsOptions) -> Result<Superblock> {
    let bs = BLOCK_SIZE as u64;
    if !opts.segment_size.is_multiple_of(bs) || !(32 << 10..=4 << 20).contains(&opts.segment_size) {
        return Err(refused(
            Errno::EINVAL,
            format!(
                "segment size {} (a multiple of 4 KiB from 32 KiB to 4 MiB)",
                opts.segment_size
            ),
        ));
    }
    let seg_blocks = (opts.segment_size / bs) as u32;
    let max_inodes = opts
        .inodes
        .unwrap_or(blocks * bs / (16 << 10))
        .clamp(64, 1 << 24) as u32;
    let imap_blocks = tables::imap_blocks_for(max_inodes);
    // The usage table shrinks with the space the checkpoint regions take: settle it.
    let mut segments = (blocks / seg_blocks as u64).min(u32::MAX as u64) as u32;
    for _ in 0..4 {
        let usage_blocks = tables::usage_blocks_for(segments);
        let cp_blocks = checkpoint::region_blocks(imap_blocks, usage_blocks);
        let first = 1 + 2 * cp_blocks as u64;
        segments = (blocks.saturating_sub(first) / seg_blocks as u64) as u32;
    }
    let usage_blocks = tables::usage_blocks_for(segments);
    let cp_blocks = checkpoint::region_blocks(imap_blocks, usage_blocks);
    // The whole usage table is written in one partial segment at each checkpoint.
    if usage_blocks as usize > MAX_ENTRIES.min(seg_blocks as usize - 1) {
        return Err(refused(
            Errno::EINVAL,
            format!(
                "{segments} segments: too many for {seg_blocks}-block segments (use larger segments)"
            ),
        ));
    }
    let sb = Superblock {
        version: superblock::VERSION,
        total_blocks: blocks,
        segment_blocks: seg_blocks,
        segments,
        first_segment: 1 + 2 * cp_blocks as u64,
        cp_blocks,
        max_inodes,
        imap_blocks,
        usage_blocks,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        label: opts.label.clone(),
    };
    // Room for the log to work in: the reserve, the head, and some data.
    if segments < 8 {
        return Err(refused(
            Errno::EINVAL,
            format!(
                "size {} bytes holds {segments} segments of {} KiB; at least 8 are needed",
                blocks * bs,
                opts.segment_size >> 10
            ),
        ));
    }
    sb.validate(blocks)
        .map_err(|e| refused(Errno::EINVAL, e.0))?;
    Ok(sb)
}

/// Creates a file system on an image file (created or resized to `size`) or a device,
/// opened and checked as every format's mkfs opens its target
/// (`cairn_blockdev::image::make`: the refusals and their order are there; the size check
/// and what an existing image holds are this format's).
pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<()> {
    let target = image::Target {
        size: opts.size,
        block_size: BLOCK_SIZE as u32,
        force: opts.force,
        sparse: opts.sparse,
    };
    image::make(
        path,
        &target,
        |s| geometry(s / BLOCK_SIZE as u64, opts).map(|_| ()),
        existing_contents,
        |dev| mkfs_device(Arc::new(dev), opts),
    )
    .map_err(|e| e.into_error(|n, m| refused(Errno(n), m), FsError::Io))
}

fn existing_contents(head: &[u8]) -> Option<String> {
    if superblock::has_magic(head) {
        return Some("a cairn lfs file system".into());
    }
    cairn_blockdev::contents::describe(head)
}

/// Writes a new file system on `dev`.
pub fn mkfs_device(dev: Arc<dyn BlockDevice>, opts: &MkfsOptions) -> Result<()> {
    let sb = geometry(dev.num_blocks(), opts)?;
    // No checkpoint region of an earlier file system may survive to be chosen.
    let zeros = vec![0u8; 2 * sb.cp_blocks as usize * BLOCK_SIZE];
    dev.write_blocks(1, &zeros)?;
    // A stale summary of an earlier file system must not continue this log: start the
    // serials from the clock, not from 1.
    let serial = crate::log::now_ns() >> 8;
    let cp = Checkpoint {
        serial: 0,
        time_ns: 0,
        log_seg: 0,
        log_off: 0,
        log_serial: serial,
        next_ino: ROOT_INO as u32 + 1,
        imap_addrs: vec![0; sb.imap_blocks as usize],
        usage_addrs: vec![0; sb.usage_blocks as usize],
        orphans: Vec::new(),
    };
    let imap = vec![ImapEntry::default(); sb.max_inodes as usize];
    let usage = vec![UsageEntry::default(); sb.segments as usize];
    let mut st = State::new(
        sb.clone(),
        dev.clone(),
        imap,
        cp.imap_addrs.clone(),
        usage,
        cp.usage_addrs.clone(),
        &cp,
        1,
        false,
        &crate::engine::MountOptions::default(),
    );
    st.pick_next_segment()?;
    for i in 0..sb.imap_blocks {
        st.imap.mark_block_dirty(i);
    }
    let t = now();
    let root = Inode {
        ino: ROOT_INO,
        version: 1,
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
        size: BLOCK_SIZE as u64,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        ..Default::default()
    };
    st.nodes.insert(ROOT_INO, Box::new(Node::fresh(root)));
    let mut b = vec![0u8; BLOCK_SIZE];
    cairn_dir::block::init_first(&mut b, ROOT_INO, ROOT_INO);
    st.write_file_block(ROOT_INO, 0, b);
    st.dirty.log_record(dirlog::Record {
        op: dirlog::Op::Create,
        rename_half: false,
        nlink: 2,
        dir: ROOT_INO,
        ino: ROOT_INO,
        name: b".".to_vec(),
    });
    st.checkpoint()?;
    // The superblock last: an image is an LFS image only once its checkpoint is durable.
    dev.write_blocks(0, &sb.encode())?;
    dev.flush()?;
    Ok(())
}
