//! The facts a strategy is told: what changed, in FreeBSD's families (`softdep.h`). Each
//! names the structure that changed and the buffer the change is in, so a strategy can order
//! the writes (sync), ignore them (async), attach dependencies to the buffers (soft
//! updates) or log them (a journal: every fact here is one log record's worth).

use cairn_bufcache::BufRef;

/// An inode number.
pub type Ino = u64;
/// A block address.
pub type Blk = u64;

/// What a call is. The engine brackets every call that changes metadata with
/// `begin_op(kind)` and `end_op`, and declares every fact in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Create,
    Mknod,
    Mkdir,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    /// rename(2) with RENAME_EXCHANGE: both names stay, each re-pointed.
    Exchange,
    Setattr,
    /// open(2) with O_TRUNC.
    Truncate,
    Write,
    Fallocate,
    SetXattr,
    RemoveXattr,
    /// read(2): the access time only.
    Read,
    /// The last close of an unlinked file frees it.
    Release,
    /// An unlinked inode is freed when the kernel forgets it, or at unmount.
    Reclaim,
    /// Work a strategy asked of the engine outside any application call (`Engine::release`,
    /// `Engine::apply_link_drop`, from its worker).
    Background,
}

impl OpKind {
    /// Whether the call is a durability point for a mode that promises metadata durable
    /// on return: every metadata call is, except an access-time update, the freeing of an
    /// inode nobody names and a strategy's background work (nothing any application was
    /// promised).
    pub fn durable(self) -> bool {
        !matches!(self, OpKind::Read | OpKind::Reclaim | OpKind::Background)
    }
}

/// What kind of block a pointer names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Data,
    Indirect,
    Directory,
    /// A slow symlink's target block.
    Symlink,
    Xattr,
}

impl BlockKind {
    /// A block whose contents the engine initialized before declaring the pointer to it
    /// (everything but file data): it must reach disk before the pointer (rule 1).
    pub fn is_metadata(self) -> bool {
        self != BlockKind::Data
    }
}

/// Which pointer of the inode (FreeBSD: allocdirect's `ad_offset`; `allocext` for the
/// extended-attribute block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InodePtr {
    Direct(u8),
    /// The root of the single (1), double (2) or triple (3) indirect tree.
    Indirect(u8),
    Xattr,
}

/// An inode was allocated: its bit set in `bitmap`, its group's summary in `desc`
/// (FreeBSD: `softdep_setup_inomapdep`). The inode's first encoding follows as an
/// `update_inodeblock`; rule 1: bitmap, then inode, then any entry naming it.
pub struct InoMapDep<'a> {
    pub ino: Ino,
    pub is_dir: bool,
    pub bitmap: &'a BufRef,
    pub desc: &'a BufRef,
}

/// A block was allocated to inode `ino`: its bit set in `bitmap`, the summary in `desc`
/// (`softdep_setup_blkmapdep`). The pointer to it follows as an `AllocDirect` or
/// `AllocIndir`.
pub struct BlkMapDep<'a> {
    pub blk: Blk,
    pub ino: Ino,
    pub bitmap: &'a BufRef,
    pub desc: &'a BufRef,
}

/// A pointer in the inode now names a new block (`softdep_setup_allocdirect`). The
/// pointer is in the in-core inode; the inode block learns it at the next
/// `update_inodeblock`. For metadata kinds, `new_buf` holds the new block, already
/// initialized; for data it is `None` (the data reaches the cache or the device after the
/// fact; the block number finds it).
pub struct AllocDirect<'a> {
    pub ino: Ino,
    pub ptr: InodePtr,
    /// Logical block in the file (0 for the xattr block).
    pub lbn: u64,
    pub new_blk: Blk,
    /// The block the pointer named before (0: none; cairn never reallocates in place).
    pub old_blk: Blk,
    /// Bytes of the new and the old block in use (cairn has no fragments: the block size
    /// and 0), kept so fragments would need no new interface. For the xattr pointer: the
    /// bytes of all the list's blocks (a chain's), the new list's and the old one's.
    pub new_size: u32,
    pub old_size: u32,
    pub kind: BlockKind,
    pub new_buf: Option<&'a BufRef>,
    /// New blocks the new block leads to (the rest of an extended-attribute chain, each
    /// naming the next): initialized like `new_buf`, and each (its contents and its bitmap)
    /// must reach disk before the pointer, as `new_buf` must. Empty for every other kind.
    pub chain: &'a [BufRef],
}

/// A pointer in indirect block `indir` (slot `slot`, already written into the buffer) now
/// names a new block (`softdep_setup_allocindir_page` / `_meta`).
pub struct AllocIndir<'a> {
    pub ino: Ino,
    pub indir: &'a BufRef,
    pub slot: u32,
    pub lbn: u64,
    pub new_blk: Blk,
    pub old_blk: Blk,
    pub kind: BlockKind,
    pub new_buf: Option<&'a BufRef>,
}

/// Data blocks `first..first + count`, each allocated to inode `ino` by the call in
/// progress and declared by its `AllocDirect` or `AllocIndir` already, hold their initial
/// contents — zeros — durably: the engine zeroed them on the device with a zero-range
/// request and then flushed, where it would otherwise have made a buffer of zeros per block
/// (fallocate of a large range). In FreeBSD's terms this is the new blocks' own write
/// completing (what sets an allocdirect's or allocindir's COMPLETE,
/// `handle_allocdirect_partdone`): rule 1's "the block's contents before the pointer to
/// it" holds for these blocks from now on, and their pointers wait only for what else they
/// wait for (the bitmap). The pointers cannot have reached disk before this fact: they are
/// in buffers no write pass takes while the call is in progress, or behind the call's own
/// barrier.
pub struct DataZeroed {
    pub ino: Ino,
    pub first: Blk,
    pub count: u64,
}

/// A new entry `name → ino` is in `buf` at byte `offset` of directory `dir`
/// (`softdep_setup_directory_add`).
pub struct DirAdd<'a> {
    pub dir: Ino,
    pub buf: &'a BufRef,
    pub offset: u32,
    pub ino: Ino,
    pub name: &'a [u8],
    pub dtype: u8,
    /// The inode was allocated by this call (rule 1: it must be on disk first).
    pub new_inode: bool,
    /// mkdir: the new directory's first block (`.` and `..`), FreeBSD's MKDIR_BODY; its
    /// parent's raised link count is MKDIR_PARENT (a `LinkChange` with `LinkWhy::DotDot`).
    pub mkdir_body: Option<&'a BufRef>,
}

/// The entry `name → ino` at `offset` of directory `dir` was removed from `buf`
/// (`softdep_setup_remove`). Rule 2: on disk before the link count it accounted for drops.
pub struct DirRemove<'a> {
    pub dir: Ino,
    pub buf: &'a BufRef,
    pub offset: u32,
    pub ino: Ino,
    pub name: &'a [u8],
    /// A directory was removed: it loses its name and its `.`, the parent its `..`.
    pub rmdir: bool,
}

/// An existing entry now names another inode (`softdep_setup_directory_change`): rename
/// over an existing name, exchange, or the `..` of a directory moved to another parent.
pub struct DirChange<'a> {
    pub dir: Ino,
    pub buf: &'a BufRef,
    pub offset: u32,
    pub old_ino: Ino,
    pub new_ino: Ino,
    pub dtype: u8,
    /// The type the entry recorded before the change.
    pub old_dtype: u8,
    pub name: &'a [u8],
    /// The entry named a directory that loses it for good (a directory renamed over an
    /// empty one): it loses its name and its `.`, the directory its `..`.
    pub old_is_dir: bool,
    /// This is a moved directory's `..`.
    pub dotdot: bool,
    /// A rename's old name, now naming the whiteout (`new_ino`) the call allocated
    /// (RENAME_WHITEOUT): like a `DirAdd` with `new_inode`, the whiteout's inode must be on
    /// disk first (rule 1), and like the old name's `DirRemove` in a rename, the new name
    /// must be there first too (rule 3). The moved inode (`old_ino`) drops by 1, a
    /// directory included (it keeps its `.`; its `..` changes by its own fact).
    pub whiteout: bool,
}

/// Why a link count was raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkWhy {
    /// link(2): a new name will follow.
    Link,
    /// rename: the moved inode holds an extra count while it has two names.
    RenameHold,
    /// A directory's `..` will name this one (mkdir's parent, a directory moved into it).
    DotDot,
    /// The count was lowered (the references went first).
    Drop,
}

/// Inode `ino`'s on-disk link count changed from `before` to `after`, encoded in
/// `inode_buf` (`softdep_change_linkcnt`). A raise must reach disk before the reference it
/// allows; a drop after the removal that caused it (a count higher than the references is
/// a leak, never a loss).
pub struct LinkChange<'a> {
    pub ino: Ino,
    pub inode_buf: &'a BufRef,
    pub before: u32,
    pub after: u32,
    pub why: LinkWhy,
}

/// Whether the link-count drops a removal causes may be applied to the on-disk counts now.
///
/// The drops each removal causes (what a strategy answering `Deferred` must later hand to
/// `Engine::apply_link_drop`): a `DirRemove` drops its inode by 1 (`rmdir`: by 2, and its
/// directory by 1 for the `..` that went); a `DirChange` drops its old inode by 1
/// (`old_is_dir`: by 2, and its directory by 1), and a `..` change (`dotdot`) drops the old
/// parent by 1 — except in an exchange (`OpKind::Exchange`), whose two entry changes trade
/// inodes and drop nothing (only its `..` changes do). The effective counts (what stat
/// shows) drop at once either way.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Apply {
    /// The engine lowers the on-disk count at the end of the call.
    Now,
    /// The strategy lowers it later, when the removal is on disk (soft updates'
    /// `handle_workitem_remove`); until then only the effective count drops.
    Deferred,
}

/// Block pointers of inode `ino` were cleared (truncate, hole punch, removal of the xattr
/// block, or the whole file when it is freed) and the inode re-encoded into `inode_buf`
/// (`softdep_setup_freeblocks`). `holders` are the indirect blocks whose pointers were
/// cleared. The blocks in `freed` are still marked used: the strategy releases them with
/// `Tx::release` once no pointer to them can be on disk (rule 2).
pub struct FreeBlocks<'a> {
    pub ino: Ino,
    pub inode_buf: &'a BufRef,
    /// The first logical block freed.
    pub from_lbn: u64,
    pub freed: &'a [Blk],
    pub holders: &'a [BufRef],
    /// The inode itself is being freed (a `FreeFile` follows).
    pub whole_file: bool,
}

/// Inode `ino` was freed: its zeroed encoding (generation kept) is in the inode buffer
/// of the `FreeBlocks` just declared (`softdep_freefile`). Its bit is still set: the
/// strategy releases it with `Tx::release` once nothing on disk can name it.
pub struct FreeFile {
    pub ino: Ino,
    pub generation: u32,
    pub is_dir: bool,
}

/// Attributes of `ino` changed (chmod, chown, times, size, flags), encoded in
/// `inode_buf`; `extra` are the xattr blocks when they were rewritten.
pub struct AttrChange<'a> {
    pub ino: Ino,
    pub inode_buf: &'a BufRef,
    pub extra: &'a [BufRef],
    /// The mode changed with the access ACL (set, or rewritten by chmod): see [`AclMode`].
    pub acl_mode: Option<AclMode>,
}

/// The mode of an inode changed together with its access ACL, which is now in the new
/// block `xattr_blk` (its `AllocDirect` of the xattr pointer was declared in the same call,
/// the old block's `FreeBlocks` follows). The mode and the pointer are in one inode
/// encoding; a mode that writes the inode block whole keeps them together for free, but
/// one that rolls the pointer back while the new block is not on disk (soft updates) must
/// roll the mode back to `old_mode` with it: a new mode without its ACL may grant the
/// owning group what only named users were given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclMode {
    pub old_mode: u32,
    pub xattr_blk: Blk,
}

/// What a strategy releases to the allocator: bits of blocks or of an inode, cleared once
/// the strategy knows nothing on disk still points to them (the allocator callback of
/// FreeBSD's `handle_workitem_freeblocks` / `handle_workitem_freefile`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    Blocks(Vec<Blk>),
    Inode { ino: Ino, is_dir: bool },
}
