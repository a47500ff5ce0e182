//! [`RecordingFs`]: a [`FileSystem`] wrapper that puts operation markers into a
//! [`Recorder`] around every call that changes something — the operation, the path it
//! names, and the moment it returned. Used by the in-process workload driver and by
//! `cairn mount -o record=FILE` (between the FUSE adapter and the file system), so real
//! programs get the same durability oracle as scripted workloads.
//!
//! The file-system contract is inode based; the oracle wants paths. Directories have exactly
//! one name, so the wrapper keeps a map from directory inode to path, learned from lookups,
//! mkdir and readdirplus and kept current across rename and rmdir. A call naming a directory
//! the wrapper never saw is recorded as [`Op::Unknown`].

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use cairn_vfs::{
    Access, Attr, Ctx, DirEntry, FallocMode, Fh, FileKind, FileSystem, Ino, KernelCachePolicy,
    RenameFlags, Result, SetAttr, StatFs,
};
use parking_lot::Mutex;

use crate::model::under;
use crate::record::{Op, OpResult, Recorder};

pub struct RecordingFs {
    inner: Arc<dyn FileSystem>,
    rec: Arc<Recorder>,
    /// Directory inode → path ("" for the root).
    dirs: Mutex<HashMap<Ino, String>>,
    /// Handles opened with O_APPEND.
    appending: Mutex<HashSet<Fh>>,
}

impl RecordingFs {
    pub fn new(inner: Arc<dyn FileSystem>, rec: Arc<Recorder>) -> RecordingFs {
        let mut dirs = HashMap::new();
        dirs.insert(inner.root_ino(), String::new());
        RecordingFs {
            inner,
            rec,
            dirs: Mutex::new(dirs),
            appending: Mutex::new(HashSet::new()),
        }
    }

    fn note_flags(&self, fh: Fh, flags: i32) {
        if flags & libc::O_APPEND != 0 {
            self.appending.lock().insert(fh);
        }
    }

    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.rec
    }

    pub fn inner(&self) -> &Arc<dyn FileSystem> {
        &self.inner
    }

    fn path(&self, parent: Ino, name: &OsStr) -> Option<String> {
        let d = self.dirs.lock();
        let dir = d.get(&parent)?;
        let name = String::from_utf8_lossy(name.as_bytes());
        Some(if dir.is_empty() {
            name.into_owned()
        } else {
            format!("{dir}/{name}")
        })
    }

    fn learn(&self, parent: Ino, name: &OsStr, attr: &Attr) {
        if attr.kind == FileKind::Directory
            && let Some(p) = self.path(parent, name)
        {
            self.dirs.lock().insert(attr.ino, p);
        }
    }

    fn named(&self, parent: Ino, name: &OsStr, make: impl FnOnce(String) -> Op) -> Op {
        match self.path(parent, name) {
            Some(p) => make(p),
            None => Op::Unknown {
                what: format!("#{parent}/{}", String::from_utf8_lossy(name.as_bytes())),
            },
        }
    }

    /// Runs `f` between a begin and an end marker.
    fn run<T>(
        &self,
        op: Op,
        f: impl FnOnce() -> Result<T>,
        info: impl Fn(&T) -> OpResult,
    ) -> Result<T> {
        let id = self.rec.begin(op);
        let r = f();
        let res = match &r {
            Ok(v) => info(v),
            Err(e) => OpResult {
                errno: e.errno().0,
                ino: None,
                perm: None,
                generation: None,
            },
        };
        self.rec.end(id, res);
        r
    }

    /// Records an unmount around `f` (the in-process driver unmounts the Ffs directly).
    pub fn record_unmount(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.run(Op::Unmount, f, |_| done())
    }
}

fn done() -> OpResult {
    OpResult {
        errno: 0,
        ino: None,
        perm: None,
        generation: None,
    }
}

fn of_attr(a: &Attr) -> OpResult {
    OpResult {
        errno: 0,
        ino: Some(a.ino),
        perm: Some(a.perm & 0o7777),
        generation: Some(a.generation),
    }
}

impl FileSystem for RecordingFs {
    fn root_ino(&self) -> Ino {
        self.inner.root_ino()
    }

    fn cache_policy(&self) -> KernelCachePolicy {
        self.inner.cache_policy()
    }

    fn statfs(&self) -> Result<StatFs> {
        self.inner.statfs()
    }

    fn lookup(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<Attr> {
        let a = self.inner.lookup(ctx, parent, name)?;
        self.learn(parent, name, &a);
        Ok(a)
    }

    fn forget(&self, ino: Ino, nlookup: u64) {
        // Marked: dropping the last reference to an unlinked inode frees it, and those
        // writes belong to this call, not to the one before.
        let _ = self.run(
            Op::Forget { ino },
            || {
                self.inner.forget(ino, nlookup);
                Ok(())
            },
            |_| done(),
        );
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        self.inner.getattr(ino)
    }

    fn setattr(&self, ctx: &Ctx, ino: Ino, set: SetAttr) -> Result<Attr> {
        let op = match (set.size, set.mode) {
            (Some(size), _) => Op::Truncate { ino, size },
            (None, Some(mode)) => Op::Chmod { ino, mode },
            _ => Op::SetAttr { ino },
        };
        self.run(op, || self.inner.setattr(ctx, ino, set), of_attr)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.inner.readlink(ino)
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
        let kind = FileKind::from_mode(mode);
        let op = self.named(parent, name, |path| {
            if kind == Some(FileKind::RegularFile) {
                Op::Create { path }
            } else {
                Op::Mknod { path }
            }
        });
        self.run(
            op,
            || self.inner.mknod(ctx, parent, name, mode, umask, rdev),
            of_attr,
        )
    }

    fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        let op = self.named(parent, name, |path| Op::Mkdir { path });
        let a = self.run(
            op,
            || self.inner.mkdir(ctx, parent, name, mode, umask),
            of_attr,
        )?;
        self.learn(parent, name, &a);
        Ok(a)
    }

    fn unlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let op = self.named(parent, name, |path| Op::Unlink { path });
        self.run(op, || self.inner.unlink(ctx, parent, name), |_| done())
    }

    fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &OsStr) -> Result<()> {
        let op = self.named(parent, name, |path| Op::Rmdir { path });
        let path = self.path(parent, name);
        self.run(op, || self.inner.rmdir(ctx, parent, name), |_| done())?;
        if let Some(p) = path {
            self.dirs.lock().retain(|_, d| !under(d, &p));
        }
        Ok(())
    }

    fn symlink(&self, ctx: &Ctx, parent: Ino, name: &OsStr, target: &[u8]) -> Result<Attr> {
        let op = self.named(parent, name, |path| Op::Symlink {
            path,
            target: String::from_utf8_lossy(target).into_owned(),
        });
        self.run(
            op,
            || self.inner.symlink(ctx, parent, name, target),
            of_attr,
        )
    }

    fn supports_whiteout(&self) -> bool {
        self.inner.supports_whiteout()
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
        let (from, to) = (self.path(parent, name), self.path(new_parent, new_name));
        let op = match (&from, &to) {
            (Some(f), Some(t)) if !flags.exchange => Op::Rename {
                from: f.clone(),
                to: t.clone(),
                whiteout: flags.whiteout,
            },
            _ => Op::Unknown {
                what: format!("rename #{parent}/{name:?} -> #{new_parent}/{new_name:?}"),
            },
        };
        self.run(
            op,
            || {
                self.inner
                    .rename(ctx, parent, name, new_parent, new_name, flags)
            },
            |_| done(),
        )?;
        if let (Some(f), Some(t)) = (from, to) {
            let mut d = self.dirs.lock();
            d.retain(|_, p| !under(p, &t));
            for p in d.values_mut() {
                if under(p, &f) {
                    *p = format!("{t}{}", &p[f.len()..]);
                }
            }
        }
        Ok(())
    }

    fn link(&self, ctx: &Ctx, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr> {
        let op = self.named(new_parent, new_name, |path| Op::Link { ino, path });
        self.run(
            op,
            || self.inner.link(ctx, ino, new_parent, new_name),
            of_attr,
        )
    }

    fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        let fh = if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.run(
                Op::Truncate { ino, size: 0 },
                || self.inner.open(ctx, ino, flags),
                |_| done(),
            )?
        } else {
            self.inner.open(ctx, ino, flags)?
        };
        self.note_flags(fh, flags);
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
        let op = self.named(parent, name, |path| Op::Create { path });
        let (a, fh) = self.run(
            op,
            || self.inner.create(ctx, parent, name, mode, umask, flags),
            |(a, _)| of_attr(a),
        )?;
        self.note_flags(fh, flags);
        Ok((a, fh))
    }

    fn tmpfile(
        &self,
        ctx: &Ctx,
        parent: Ino,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let dir = self.dirs.lock().get(&parent).cloned();
        let op = match dir {
            Some(dir) => Op::Tmpfile { dir },
            None => Op::Unknown {
                what: format!("tmpfile in #{parent}"),
            },
        };
        let (a, fh) = self.run(
            op,
            || self.inner.tmpfile(ctx, parent, mode, umask, flags),
            |(a, _)| of_attr(a),
        )?;
        self.note_flags(fh, flags);
        Ok((a, fh))
    }

    fn read(&self, ino: Ino, fh: Fh, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.read(ino, fh, offset, size, buf)
    }

    fn write(&self, ino: Ino, fh: Fh, offset: u64, data: &[u8]) -> Result<u32> {
        // O_APPEND places the data at the end of the file whatever the offset says: record
        // where it actually goes.
        let offset = if self.appending.lock().contains(&fh) {
            self.inner.getattr(ino).map_or(offset, |a| a.size)
        } else {
            offset
        };
        let op = Op::Write {
            ino,
            offset,
            data: Arc::from(data),
        };
        self.run(op, || self.inner.write(ino, fh, offset, data), |_| done())
    }

    fn flush(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.inner.flush(ino, fh)
    }

    fn release(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.appending.lock().remove(&fh);
        self.run(
            Op::Release { ino },
            || self.inner.release(ino, fh),
            |_| done(),
        )
    }

    fn fsync(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        self.run(
            Op::Fsync { ino },
            || self.inner.fsync(ino, fh, datasync),
            |_| done(),
        )
    }

    fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        self.inner.opendir(ctx, ino)
    }

    fn readdir(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        emit: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        if !plus {
            return self.inner.readdir(ino, fh, offset, plus, emit);
        }
        let mut learned = Vec::new();
        let r = self.inner.readdir(ino, fh, offset, plus, &mut |e| {
            let a = e.attr;
            let name = e.name.to_os_string();
            let taken = emit(e);
            if taken && let Some(a) = a {
                learned.push((name, a));
            }
            taken
        });
        for (name, a) in learned {
            if name != "." && name != ".." {
                self.learn(ino, &name, &a);
            }
        }
        r
    }

    fn releasedir(&self, ino: Ino, fh: Fh) -> Result<()> {
        self.inner.releasedir(ino, fh)
    }

    fn fsyncdir(&self, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        let path = self.dirs.lock().get(&ino).cloned();
        let op = match path {
            Some(path) => Op::Fsyncdir { path },
            None => Op::Fsyncdir {
                path: format!("#{ino}"),
            },
        };
        self.run(op, || self.inner.fsyncdir(ino, fh, datasync), |_| done())
    }

    fn setxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.run(
            Op::SetAttr { ino },
            || self.inner.setxattr(ctx, ino, name, value, flags),
            |_| done(),
        )
    }

    fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.inner.getxattr(ctx, ino, name)
    }

    fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        self.inner.listxattr(ctx, ino)
    }

    fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &OsStr) -> Result<()> {
        self.run(
            Op::SetAttr { ino },
            || self.inner.removexattr(ctx, ino, name),
            |_| done(),
        )
    }

    fn access(&self, ctx: &Ctx, ino: Ino, mask: Access) -> Result<()> {
        self.inner.access(ctx, ino, mask)
    }

    fn fallocate(
        &self,
        ino: Ino,
        fh: Fh,
        offset: u64,
        length: u64,
        mode: FallocMode,
    ) -> Result<()> {
        // Growth by fallocate extends the file with zeros; a punched hole zeroes a range.
        // Neither is described exactly: the file's contents become unknown to the model.
        let op = Op::Unknown {
            what: format!("fallocate #{ino} {offset}+{length} mode {mode:#x}"),
        };
        self.run(
            op,
            || self.inner.fallocate(ino, fh, offset, length, mode),
            |_| done(),
        )
    }

    fn lseek(&self, ino: Ino, fh: Fh, offset: u64, whence: i32) -> Result<u64> {
        self.inner.lseek(ino, fh, offset, whence)
    }

    fn sync_all(&self) -> Result<()> {
        self.run(Op::SyncAll, || self.inner.sync_all(), |_| done())
    }

    fn destroy(&self) -> Result<()> {
        self.run(Op::Unmount, || self.inner.destroy(), |_| done())
    }

    fn stats_json(&self) -> String {
        self.inner.stats_json()
    }
}
