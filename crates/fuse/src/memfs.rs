//! A small in-memory [`FileSystem`]: the FUSE adapter's test double, and a way to exercise
//! the daemon machinery (`cairn mount --memory`) without an image.
//!
//! It follows the vfs contract where the adapter's behaviour depends on it (root inode 2,
//! readdir cookies, lookup counting, xattr and rename-flag errnos) and keeps the rest
//! simple: one lock, no size limits, storage freed as soon as the last name and the last
//! open handle are gone.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, Errno, FallocMode, Fh, FileKind, FileSystem, FsError, Ino,
    KernelCachePolicy, RenameFlags, Result, SetAttr, SetTime, StatFs,
};
use parking_lot::Mutex;

const ROOT: Ino = 2;
const NAME_MAX: usize = 255;
/// Cookies of `.` and `..`; real entries start after them.
const FIRST_COOKIE: u64 = 3;

fn err<T>(e: Errno) -> Result<T> {
    Err(FsError::Errno(e))
}

struct Dir {
    parent: Ino,
    /// cookie -> (name, ino). Cookies only grow, so a listing resumed at a cookie neither
    /// repeats nor skips entries that survived concurrent creates and unlinks.
    entries: BTreeMap<u64, (OsString, Ino)>,
    names: HashMap<OsString, u64>,
    next_cookie: u64,
}

impl Dir {
    fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            entries: BTreeMap::new(),
            names: HashMap::new(),
            next_cookie: FIRST_COOKIE,
        }
    }

    fn get(&self, name: &OsStr) -> Option<Ino> {
        self.names.get(name).map(|c| self.entries[c].1)
    }

    fn insert(&mut self, name: &OsStr, ino: Ino) {
        let c = self.next_cookie;
        self.next_cookie += 1;
        self.entries.insert(c, (name.to_owned(), ino));
        self.names.insert(name.to_owned(), c);
    }

    fn remove(&mut self, name: &OsStr) -> Option<Ino> {
        let c = self.names.remove(name)?;
        self.entries.remove(&c).map(|e| e.1)
    }
}

enum Data {
    File(Vec<u8>),
    Dir(Dir),
    Symlink(Vec<u8>),
    Special,
}

struct Node {
    attr: Attr,
    data: Data,
    xattrs: BTreeMap<OsString, Vec<u8>>,
    open: u32,
}

struct Handle {
    ino: Ino,
    flags: i32,
}

struct Inner {
    nodes: HashMap<Ino, Node>,
    handles: HashMap<Fh, Handle>,
    /// The kernel's lookup references per inode (lookups and readdirplus entries minus
    /// forgets): tests check that they balance.
    lookups: HashMap<Ino, u64>,
    next_ino: Ino,
    next_fh: Fh,
}

/// The in-memory file system.
pub struct MemFs {
    inner: Mutex<Inner>,
    policy: KernelCachePolicy,
    syncs: AtomicU64,
    destroys: AtomicU64,
    /// Test hook: a lookup of this name panics, to check the adapter survives it.
    panic_name: Mutex<Option<OsString>>,
    /// Test hook: every lookup sleeps this long (requests in flight on demand).
    lookup_delay: Mutex<Duration>,
    /// Lookups running right now.
    lookups_running: AtomicU64,
    /// `destroy` ran while a request was still inside the file system.
    destroyed_mid_request: AtomicBool,
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new(KernelCachePolicy {
            writeback_cache: cairn_vfs::WritebackCache::Default,
            entry_ttl: Duration::from_secs(1),
            attr_ttl: Duration::from_secs(1),
            negative_ttl: Duration::from_secs(1),
        })
    }
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn new_attr(ino: Ino, kind: FileKind, perm: u32, ctx: &Ctx, gid: u32) -> Attr {
    let t = now();
    Attr {
        ino,
        generation: 1,
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm: (perm & 0o7777) as u16,
        nlink: if kind == FileKind::Directory { 2 } else { 1 },
        uid: ctx.uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl MemFs {
    pub fn new(policy: KernelCachePolicy) -> MemFs {
        let root = Node {
            attr: new_attr(ROOT, FileKind::Directory, 0o755, &Ctx::root(), 0),
            data: Data::Dir(Dir::new(ROOT)),
            xattrs: BTreeMap::new(),
            open: 0,
        };
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, root);
        MemFs {
            inner: Mutex::new(Inner {
                nodes,
                handles: HashMap::new(),
                lookups: HashMap::new(),
                next_ino: ROOT + 1,
                next_fh: 1,
            }),
            policy,
            syncs: AtomicU64::new(0),
            destroys: AtomicU64::new(0),
            panic_name: Mutex::new(None),
            lookup_delay: Mutex::new(Duration::ZERO),
            lookups_running: AtomicU64::new(0),
            destroyed_mid_request: AtomicBool::new(false),
        }
    }

    /// How often `destroy` ran (the adapter must call it exactly once per mount).
    pub fn destroy_count(&self) -> u64 {
        self.destroys.load(Ordering::SeqCst)
    }

    /// The kernel's outstanding lookup references, per inode.
    pub fn lookup_counts(&self) -> HashMap<Ino, u64> {
        self.inner.lock().lookups.clone()
    }

    /// Makes every later lookup of `name` panic (a stand-in for a file-system bug).
    pub fn panic_on_lookup(&self, name: &str) {
        *self.panic_name.lock() = Some(name.into());
    }

    /// Makes every later lookup take `d` (a stand-in for a slow device), so a test can
    /// have requests in flight in the server when it unmounts or kills it.
    pub fn slow_lookups(&self, d: Duration) {
        *self.lookup_delay.lock() = d;
    }

    /// Whether the final flush ran while a (slow) lookup was still being served: the
    /// adapter must let every request finish first.
    pub fn destroyed_mid_request(&self) -> bool {
        self.destroyed_mid_request.load(Ordering::SeqCst)
    }

    /// Lookups being served at this moment.
    pub fn lookups_running(&self) -> u64 {
        self.lookups_running.load(Ordering::SeqCst)
    }

    /// Number of inodes alive (the root included).
    pub fn inode_count(&self) -> usize {
        self.inner.lock().nodes.len()
    }
}

impl Inner {
    fn node(&self, ino: Ino) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(FsError::Errno(Errno::ENOENT))
    }

    fn node_mut(&mut self, ino: Ino) -> Result<&mut Node> {
        self.nodes
            .get_mut(&ino)
            .ok_or(FsError::Errno(Errno::ENOENT))
    }

    fn dir(&self, ino: Ino) -> Result<&Dir> {
        match &self.node(ino)?.data {
            Data::Dir(d) => Ok(d),
            _ => err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut Dir> {
        match &mut self.node_mut(ino)?.data {
            Data::Dir(d) => Ok(d),
            _ => err(Errno::ENOTDIR),
        }
    }

    fn check(&self, ctx: &Ctx, ino: Ino, want: Access) -> Result<()> {
        let a = &self.node(ino)?.attr;
        ctx.check(a.kind.mode_bits() | a.perm as u32, a.uid, a.gid, want)
    }

    fn touch(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let t = now();
            n.attr.mtime = t;
            n.attr.ctime = t;
        }
    }

    fn looked_up(&mut self, ino: Ino) {
        *self.lookups.entry(ino).or_insert(0) += 1;
    }

    /// Checks that `name` may be created in `parent` and returns the new node's group
    /// (setgid directories pass theirs on).
    fn prepare_create(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<u32> {
        if name.len() > NAME_MAX {
            return err(Errno::ENAMETOOLONG);
        }
        let dir = self.dir(parent)?;
        self.check(ctx, parent, Access::WX)?;
        if name == "." || name == ".." || dir.get(name).is_some() {
            return err(Errno::EEXIST);
        }
        let pa = &self.node(parent)?.attr;
        Ok(if pa.perm & 0o2000 != 0 {
            pa.gid
        } else {
            ctx.gid
        })
    }

    fn add(&mut self, parent: Ino, name: &OsStr, mut attr: Attr, data: Data) -> Result<Attr> {
        let ino = self.next_ino;
        self.next_ino += 1;
        attr.ino = ino;
        let is_dir = matches!(data, Data::Dir(_));
        self.nodes.insert(
            ino,
            Node {
                attr,
                data,
                xattrs: BTreeMap::new(),
                open: 0,
            },
        );
        self.dir_mut(parent)?.insert(name, ino);
        if is_dir {
            self.node_mut(parent)?.attr.nlink += 1;
        }
        self.touch(parent);
        self.looked_up(ino);
        Ok(attr)
    }

    /// Frees an inode whose last name and last open handle are gone.
    fn maybe_free(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get(&ino) {
            let dead = match n.data {
                Data::Dir(_) => n.attr.nlink <= 1,
                _ => n.attr.nlink == 0,
            };
            if dead && n.open == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    fn sticky_ok(&self, ctx: &Ctx, dir: Ino, victim: Ino) -> Result<()> {
        let d = &self.node(dir)?.attr;
        let v = &self.node(victim)?.attr;
        if d.perm & 0o1000 != 0 && !ctx.is_root() && ctx.uid != d.uid && ctx.uid != v.uid {
            return err(Errno::EPERM);
        }
        Ok(())
    }

    fn is_ancestor(&self, a: Ino, mut b: Ino) -> bool {
        loop {
            if a == b {
                return true;
            }
            match self.dir(b) {
                Ok(d) if d.parent != b => b = d.parent,
                _ => return false,
            }
        }
    }
}

impl FileSystem for MemFs {
    fn root_ino(&self) -> Ino {
        ROOT
    }

    fn cache_policy(&self) -> KernelCachePolicy {
        self.policy
    }

    fn statfs(&self) -> Result<StatFs> {
        let n = self.inner.lock().nodes.len() as u64;
        Ok(StatFs {
            blocks: 1 << 20,
            bfree: 1 << 19,
            bavail: 1 << 19,
            files: 1 << 20,
            ffree: (1 << 20) - n,
            bsize: 4096,
            namelen: NAME_MAX as u32,
            frsize: 4096,
        })
    }

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        if self.panic_name.lock().as_deref() == Some(name) {
            panic!("lookup of {name:?} (test hook)");
        }
        let delay = *self.lookup_delay.lock();
        if !delay.is_zero() {
            self.lookups_running.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(delay);
            self.lookups_running.fetch_sub(1, Ordering::SeqCst);
        }
        let mut g = self.inner.lock();
        if name.len() > NAME_MAX {
            return err(Errno::ENAMETOOLONG);
        }
        let dir = g.dir(parent)?;
        let ino = match name.to_str() {
            Some(".") => parent,
            Some("..") => dir.parent,
            _ => dir.get(name).ok_or(FsError::Errno(Errno::ENOENT))?,
        };
        g.check(ctx, parent, Access::X)?;
        let attr = g.node(ino)?.attr;
        g.looked_up(ino);
        Ok(attr)
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        let mut g = self.inner.lock();
        if let Some(c) = g.lookups.get_mut(&ino) {
            *c = c.saturating_sub(nlookup);
            if *c == 0 {
                g.lookups.remove(&ino);
            }
        }
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.inner.lock().node(ino)?.attr)
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr> {
        let mut g = self.inner.lock();
        let owner = g.node(ino)?.attr.uid;
        let is_owner = ctx.is_root() || ctx.uid == owner;
        if (set.mode.is_some() || set.uid.is_some() || set.gid.is_some()) && !is_owner {
            return err(Errno::EPERM);
        }
        if set.uid.is_some_and(|u| u != owner) && !ctx.is_root() {
            return err(Errno::EPERM);
        }
        if set.size.is_some() && set.fh.is_none() {
            g.check(ctx, ino, Access::W)?;
        }
        let n = g.node_mut(ino)?;
        let t = now();
        if let Some(m) = set.mode {
            n.attr.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = set.uid {
            n.attr.uid = u;
        }
        if let Some(gid) = set.gid {
            n.attr.gid = gid;
        }
        if let Some(size) = set.size {
            match &mut n.data {
                Data::File(d) => {
                    let size = usize::try_from(size).map_err(|_| FsError::Errno(Errno::EFBIG))?;
                    d.resize(size, 0);
                    n.attr.size = size as u64;
                    n.attr.mtime = t;
                }
                Data::Dir(_) => return err(Errno::EISDIR),
                _ => return err(Errno::EINVAL),
            }
        }
        let at = |s: SetTime| match s {
            SetTime::Now => t,
            SetTime::At(x) => x,
        };
        if let Some(a) = set.atime {
            n.attr.atime = at(a);
        }
        if let Some(m) = set.mtime {
            n.attr.mtime = at(m);
        }
        n.attr.ctime = set.ctime.unwrap_or(t);
        Ok(n.attr)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        match &self.inner.lock().node(ino)?.data {
            Data::Symlink(t) => Ok(t.clone()),
            _ => err(Errno::EINVAL),
        }
    }

    fn mknod(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let mut g = self.inner.lock();
        let gid = g.prepare_create(ctx, parent, name)?;
        let kind = FileKind::from_mode(mode).unwrap_or(FileKind::RegularFile);
        if kind == FileKind::Directory || kind == FileKind::Symlink {
            return err(Errno::EINVAL);
        }
        let mut a = new_attr(0, kind, mode & !umask, ctx, gid);
        a.rdev = rdev;
        let data = if kind == FileKind::RegularFile {
            Data::File(Vec::new())
        } else {
            Data::Special
        };
        g.add(parent, name, a, data)
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        let mut g = self.inner.lock();
        let gid = g.prepare_create(ctx, parent, name)?;
        let setgid = g.node(parent)?.attr.perm & 0o2000;
        let a = new_attr(
            0,
            FileKind::Directory,
            (mode & !umask) | setgid as u32,
            ctx,
            gid,
        );
        g.add(parent, name, a, Data::Dir(Dir::new(parent)))
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let mut g = self.inner.lock();
        g.check(ctx, parent, Access::WX)?;
        let ino = g
            .dir(parent)?
            .get(name)
            .ok_or(FsError::Errno(Errno::ENOENT))?;
        if matches!(g.node(ino)?.data, Data::Dir(_)) {
            return err(Errno::EISDIR);
        }
        g.sticky_ok(ctx, parent, ino)?;
        g.dir_mut(parent)?.remove(name);
        g.touch(parent);
        let n = g.node_mut(ino)?;
        n.attr.nlink -= 1;
        n.attr.ctime = now();
        g.maybe_free(ino);
        Ok(())
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let mut g = self.inner.lock();
        if name == "." {
            return err(Errno::EINVAL);
        }
        if name == ".." {
            return err(Errno::ENOTEMPTY);
        }
        g.check(ctx, parent, Access::WX)?;
        let ino = g
            .dir(parent)?
            .get(name)
            .ok_or(FsError::Errno(Errno::ENOENT))?;
        if !g.dir(ino)?.entries.is_empty() {
            return err(Errno::ENOTEMPTY);
        }
        g.sticky_ok(ctx, parent, ino)?;
        g.dir_mut(parent)?.remove(name);
        g.node_mut(parent)?.attr.nlink -= 1;
        g.touch(parent);
        g.node_mut(ino)?.attr.nlink = 0;
        g.maybe_free(ino);
        Ok(())
    }

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr> {
        let mut g = self.inner.lock();
        let gid = g.prepare_create(ctx, parent, name)?;
        let mut a = new_attr(0, FileKind::Symlink, 0o777, ctx, gid);
        a.size = target.len() as u64;
        g.add(parent, name, a, Data::Symlink(target.to_vec()))
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout {
            // No whiteouts here (`supports_whiteout` is false): never a plain rename.
            return err(Errno::EINVAL);
        }
        let mut g = self.inner.lock();
        if new_name.len() > NAME_MAX {
            return err(Errno::ENAMETOOLONG);
        }
        g.check(ctx, parent, Access::WX)?;
        g.check(ctx, new_parent, Access::WX)?;
        let src = g
            .dir(parent)?
            .get(name)
            .ok_or(FsError::Errno(Errno::ENOENT))?;
        let dst = g.dir(new_parent)?.get(new_name);
        let src_dir = matches!(g.node(src)?.data, Data::Dir(_));
        if src_dir && src != new_parent && g.is_ancestor(src, new_parent) {
            return err(Errno::EINVAL);
        }
        g.sticky_ok(ctx, parent, src)?;
        if flags.exchange {
            let dst = dst.ok_or(FsError::Errno(Errno::ENOENT))?;
            let dst_dir = matches!(g.node(dst)?.data, Data::Dir(_));
            if dst_dir && g.is_ancestor(dst, parent) {
                return err(Errno::EINVAL);
            }
            g.dir_mut(parent)?.remove(name);
            g.dir_mut(new_parent)?.remove(new_name);
            g.dir_mut(parent)?.insert(name, dst);
            g.dir_mut(new_parent)?.insert(new_name, src);
            if src_dir {
                g.dir_mut(src)?.parent = new_parent;
            }
            if dst_dir {
                g.dir_mut(dst)?.parent = parent;
            }
            if src_dir != dst_dir && parent != new_parent {
                let (gain, lose) = if src_dir {
                    (new_parent, parent)
                } else {
                    (parent, new_parent)
                };
                g.node_mut(gain)?.attr.nlink += 1;
                g.node_mut(lose)?.attr.nlink -= 1;
            }
            g.touch(parent);
            g.touch(new_parent);
            return Ok(());
        }
        if let Some(dst) = dst {
            if flags.noreplace {
                return err(Errno::EEXIST);
            }
            if dst == src {
                return Ok(());
            }
            match (&g.node(dst)?.data, src_dir) {
                (Data::Dir(d), true) if !d.entries.is_empty() => return err(Errno::ENOTEMPTY),
                (Data::Dir(_), false) => return err(Errno::EISDIR),
                (Data::Dir(_), true) => {}
                (_, true) => return err(Errno::ENOTDIR),
                _ => {}
            }
            g.sticky_ok(ctx, new_parent, dst)?;
            g.dir_mut(new_parent)?.remove(new_name);
            let n = g.node_mut(dst)?;
            if src_dir {
                n.attr.nlink = 0;
                g.node_mut(new_parent)?.attr.nlink -= 1;
            } else {
                n.attr.nlink -= 1;
            }
            g.maybe_free(dst);
        }
        g.dir_mut(parent)?.remove(name);
        g.dir_mut(new_parent)?.insert(new_name, src);
        if src_dir {
            g.dir_mut(src)?.parent = new_parent;
            g.node_mut(parent)?.attr.nlink -= 1;
            g.node_mut(new_parent)?.attr.nlink += 1;
        }
        g.node_mut(src)?.attr.ctime = now();
        g.touch(parent);
        g.touch(new_parent);
        Ok(())
    }

    fn link(&self, ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr> {
        let mut g = self.inner.lock();
        if matches!(g.node(ino)?.data, Data::Dir(_)) {
            return err(Errno::EPERM);
        }
        g.prepare_create(ctx, new_parent, new_name)?;
        g.dir_mut(new_parent)?.insert(new_name, ino);
        g.touch(new_parent);
        let n = g.node_mut(ino)?;
        n.attr.nlink += 1;
        n.attr.ctime = now();
        let a = n.attr;
        g.looked_up(ino);
        Ok(a)
    }

    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        let mut g = self.inner.lock();
        match g.node(ino)?.data {
            Data::Dir(_) if flags & libc::O_ACCMODE != libc::O_RDONLY => return err(Errno::EISDIR),
            _ => {}
        }
        g.check(ctx, ino, Access::for_open_flags(flags))?;
        if flags & libc::O_TRUNC != 0 {
            let n = g.node_mut(ino)?;
            if let Data::File(d) = &mut n.data {
                d.clear();
                n.attr.size = 0;
                n.attr.mtime = now();
                n.attr.ctime = n.attr.mtime;
            }
        }
        g.node_mut(ino)?.open += 1;
        let fh = g.next_fh;
        g.next_fh += 1;
        g.handles.insert(fh, Handle { ino, flags });
        Ok(fh)
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let mut g = self.inner.lock();
        let gid = g.prepare_create(ctx, parent, name)?;
        let a = new_attr(0, FileKind::RegularFile, mode & !umask, ctx, gid);
        let a = g.add(parent, name, a, Data::File(Vec::new()))?;
        g.node_mut(a.ino)?.open += 1;
        let fh = g.next_fh;
        g.next_fh += 1;
        g.handles.insert(fh, Handle { ino: a.ino, flags });
        Ok((a, fh))
    }

    fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        let g = self.inner.lock();
        let h = g.handles.get(&fh).ok_or(FsError::Errno(Errno::EBADF))?;
        if h.ino != ino || h.flags & libc::O_ACCMODE == libc::O_WRONLY {
            return err(Errno::EBADF);
        }
        match &g.node(ino)?.data {
            Data::File(d) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(d.len());
                let end = start.saturating_add(size as usize).min(d.len());
                buf.extend_from_slice(&d[start..end]);
                Ok(())
            }
            Data::Dir(_) => err(Errno::EISDIR),
            _ => err(Errno::EINVAL),
        }
    }

    fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        let mut g = self.inner.lock();
        let h = g.handles.get(&fh).ok_or(FsError::Errno(Errno::EBADF))?;
        if h.ino != ino || h.flags & libc::O_ACCMODE == libc::O_RDONLY {
            return err(Errno::EBADF);
        }
        let append = cairn_vfs::perm::appends(h.flags);
        let n = g.node_mut(ino)?;
        let Data::File(d) = &mut n.data else {
            return err(Errno::EINVAL);
        };
        let off = if append { d.len() as u64 } else { offset };
        // Memory, not the format, bounds this file system: 1 TiB is plenty for tests.
        let end = off.checked_add(data.len() as u64).filter(|&e| e <= 1 << 40);
        let end = end.ok_or(FsError::Errno(Errno::EFBIG))? as usize;
        if d.len() < end {
            d.resize(end, 0);
        }
        d[off as usize..end].copy_from_slice(data);
        n.attr.size = d.len() as u64;
        n.attr.blocks = n.attr.size.div_ceil(512);
        n.attr.mtime = now();
        n.attr.ctime = n.attr.mtime;
        Ok(data.len() as u32)
    }

    /// Nothing to do at close(2), as in cairn's own formats (`ffs::ops`): ENOSYS tells the
    /// kernel once, and it stops sending FLUSH on every close. `cairn mount --memory` is the
    /// FUSE floor the benchmark measures cairn's modes against (`fuse-floor`): it must not
    /// make a round trip per file that they do not.
    fn flush(&self, _ino: Ino, _fh: Fh) -> Result<()> {
        err(Errno::ENOSYS)
    }

    fn release(&self, _ino: Ino, fh: Fh) -> Result<()> {
        let mut g = self.inner.lock();
        let h = g.handles.remove(&fh).ok_or(FsError::Errno(Errno::EBADF))?;
        if let Ok(n) = g.node_mut(h.ino) {
            n.open -= 1;
        }
        g.maybe_free(h.ino);
        Ok(())
    }

    fn fsync(&self, _ino: Ino, _fh: Fh, _datasync: bool) -> Result<()> {
        Ok(())
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        let mut g = self.inner.lock();
        g.dir(ino)?;
        g.check(ctx, ino, Access::R)?;
        let fh = g.next_fh;
        g.next_fh += 1;
        Ok(fh)
    }

    fn readdir(
        &self,
        ino: Ino,
        _fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let mut g = self.inner.lock();
        let dir = g.dir(ino)?;
        let mut list: Vec<(u64, OsString, Ino)> = Vec::new();
        if offset < 1 {
            list.push((0, ".".into(), ino));
        }
        if offset < 2 {
            list.push((1, "..".into(), dir.parent));
        }
        for (&c, (name, i)) in dir.entries.range(offset.max(FIRST_COOKIE)..) {
            list.push((c, name.clone(), *i));
        }
        for (cookie, name, i) in list {
            let n = g.node(i)?;
            let dot = cookie < FIRST_COOKIE;
            let e = DirEntry {
                ino: i,
                next_offset: cookie + 1,
                kind: n.attr.kind,
                name: &name,
                attr: (plus && !dot).then_some(n.attr),
            };
            if !emit(e) {
                break;
            }
            // The kernel links (and later forgets) every readdirplus entry except `.` and `..`.
            if plus && !dot {
                g.looked_up(i);
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, _ino: Ino, _fh: Fh, _datasync: bool) -> Result<()> {
        Ok(())
    }

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let mut g = self.inner.lock();
        g.check(ctx, ino, Access::W)?;
        let n = g.node_mut(ino)?;
        let exists = n.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return err(Errno::ENODATA);
        }
        n.xattrs.insert(name.to_owned(), value.to_vec());
        n.attr.ctime = now();
        Ok(())
    }

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        let g = self.inner.lock();
        g.check(ctx, ino, Access::R)?;
        g.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(FsError::Errno(Errno::ENODATA))
    }

    fn listxattr(&self, _ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        let g = self.inner.lock();
        let mut out = Vec::new();
        for k in g.node(ino)?.xattrs.keys() {
            out.extend_from_slice(k.as_encoded_bytes());
            out.push(0);
        }
        Ok(out)
    }

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()> {
        let mut g = self.inner.lock();
        g.check(ctx, ino, Access::W)?;
        let n = g.node_mut(ino)?;
        n.xattrs
            .remove(name)
            .ok_or(FsError::Errno(Errno::ENODATA))?;
        n.attr.ctime = now();
        Ok(())
    }

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()> {
        self.inner.lock().check(ctx, ino, mask)
    }

    fn fallocate(
        &self,
        ino: Ino,
        _fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        if mode != 0 {
            return err(Errno::EOPNOTSUPP);
        }
        let mut g = self.inner.lock();
        let n = g.node_mut(ino)?;
        let Data::File(d) = &mut n.data else {
            return err(Errno(libc::ENODEV));
        };
        let end = offset.checked_add(length).filter(|&e| e <= 1 << 40);
        let end = end.ok_or(FsError::Errno(Errno::EFBIG))? as usize;
        if d.len() < end {
            d.resize(end, 0);
            n.attr.size = end as u64;
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn destroy(&self) -> Result<()> {
        self.destroys.fetch_add(1, Ordering::SeqCst);
        if self.lookups_running.load(Ordering::SeqCst) > 0 {
            self.destroyed_mid_request.store(true, Ordering::SeqCst);
        }
        self.sync_all()
    }

    fn stats_json(&self) -> String {
        let g = self.inner.lock();
        serde_json::json!({
            "inodes": g.nodes.len(),
            "open_handles": g.handles.len(),
            "syncs": self.syncs.load(Ordering::SeqCst),
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readdir_resumes_at_cookies_across_unlinks() {
        let fs = MemFs::default();
        let c = Ctx::root();
        for i in 0..5 {
            fs.mknod(
                &c,
                ROOT,
                OsStr::new(&format!("f{i}")),
                libc::S_IFREG | 0o644,
                0,
                0,
            )
            .unwrap();
        }
        let list = |off: u64| {
            let mut v = Vec::new();
            fs.readdir(ROOT, 0, off, false, &mut |e| {
                v.push((e.name.to_string_lossy().into_owned(), e.next_offset));
                true
            })
            .unwrap();
            v
        };
        let all = list(0);
        assert_eq!(all.len(), 7);
        let (_, resume) = all[3].clone(); // after ".", "..", "f0", "f1"
        fs.unlink(&c, ROOT, OsStr::new("f0")).unwrap();
        fs.unlink(&c, ROOT, OsStr::new("f3")).unwrap();
        let rest: Vec<_> = list(resume).into_iter().map(|e| e.0).collect();
        assert_eq!(rest, ["f2", "f4"]);
    }
}
