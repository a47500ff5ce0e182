//! rename(2) across a union.
//!
//! A file lives on one branch, so renaming it is one host rename on that branch (the
//! target directory is created there if missing), plus the removal of a replaced file that
//! lived on another branch. A directory has a copy on several branches: each copy is
//! renamed. Exchange swaps whatever each branch holds under the two names.
//!
//! Not atomic across branches: a crash between the host renames of a directory's copies
//! leaves copies under both names; the rebuild scan then shows both directories, each with
//! the files of its branches, and nothing is lost.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;

use cairn_vfs::{Access, Ctx, Ino, RenameFlags, Result};

use crate::fs::{Inner, err, ioerr};
use crate::ns::{Entry, ROOT, Tree};
use crate::rules::RuleBody;
use crate::sys;

fn branches_of(i: &Inner, ns: &Tree, e: Entry) -> u64 {
    match e {
        Entry::File(b) => 1u64 << b,
        Entry::Dir(d) => {
            let mask = ns.dirs.get(&d).map_or(0, |d| d.mask);
            let active: u64 = i
                .branches
                .read()
                .iter()
                .filter(|b| b.active())
                .map(|b| 1u64 << b.id)
                .sum();
            mask & active
        }
    }
}

/// Moves a directory entry in the index from (p, n) to (np, nn) (the target slot is free).
fn move_entry(ns: &mut Tree, p: Ino, n: &OsStr, np: Ino, nn: &OsStr) {
    let Some(e) = ns.dirs.get_mut(&p).and_then(|d| d.children.remove(n)) else {
        return;
    };
    ns.move_mark((p, n), (np, nn));
    if let Entry::Dir(d) = e {
        if let Some(pd) = ns.dirs.get_mut(&p) {
            pd.nsubdirs = pd.nsubdirs.saturating_sub(1);
        }
        if let Some(dd) = ns.dirs.get_mut(&d) {
            dd.parent = np;
            dd.name = nn.to_os_string();
        }
        if let Some(npd) = ns.dirs.get_mut(&np) {
            npd.nsubdirs += 1;
        }
    }
    if let Some(npd) = ns.dirs.get_mut(&np) {
        npd.children.insert(nn.to_os_string(), e);
    }
}

fn rename_node_name(
    i: &Inner,
    key: (u64, u64),
    from: (Ino, &OsStr),
    to: (Ino, &OsStr),
) -> Option<Ino> {
    let nodes = i.nodes.lock();
    let ino = *nodes.keymap.get(&key)?;
    drop(nodes);
    let mut nodes = i.nodes.lock();
    if let Some(n) = nodes.files.get_mut(&ino) {
        for (d, nm) in n.names.iter_mut() {
            if *d == from.0 && nm == from.1 {
                *d = to.0;
                *nm = to.1.to_os_string();
            }
        }
    }
    Some(ino)
}

pub fn rename(
    i: &Inner,
    ctx: &Ctx,
    parent: Ino,
    name: &OsStr,
    np: Ino,
    nn: &OsStr,
    flags: RenameFlags,
) -> Result<()> {
    if nn.len() > 255 {
        return Err(err(libc::ENAMETOOLONG));
    }
    for (p, n) in [(parent, name), (np, nn)] {
        if n == "." || n == ".." {
            return Err(err(libc::EBUSY));
        }
        if p == ROOT && n == crate::branch::META {
            return Err(err(libc::EPERM));
        }
    }
    // A rename that moves a directory changes the host paths of everything below it:
    // it holds `shape` exclusively, so no path resolved before it is used after it. Any
    // other rename holds it shared and the two parents' directory locks.
    for _ in 0..3 {
        let involves_dir = [(parent, name), (np, nn)]
            .iter()
            .any(|(p, n)| matches!(i.entry_of(*p, n).map(|e| e.0), Ok(Some(Entry::Dir(_)))));
        let r = if involves_dir {
            let _w = i.shape.write();
            rename_locked(i, ctx, parent, name, np, nn, flags, true)
        } else {
            let _r = i.shape.read_recursive();
            let _dl = i.lock_dirs(&[parent, np]);
            rename_locked(i, ctx, parent, name, np, nn, flags, false)
        };
        match r {
            // A directory appeared under one of the names since the first look.
            Err(e) if e.errno().0 == libc::EAGAIN => continue,
            r => return r,
        }
    }
    Err(err(libc::EBUSY))
}

#[allow(clippy::too_many_arguments)]
fn rename_locked(
    i: &Inner,
    ctx: &Ctx,
    parent: Ino,
    name: &OsStr,
    np: Ino,
    nn: &OsStr,
    flags: RenameFlags,
    exclusive: bool,
) -> Result<()> {
    let (se, de, prel, nrel) = {
        let ns = i.ns.read();
        let sd = ns.dirs.get(&parent).ok_or_else(|| err(libc::ENOENT))?;
        let se = i
            .visible_entry(sd, name)?
            .ok_or_else(|| err(libc::ENOENT))?;
        let dd = ns.dirs.get(&np).ok_or_else(|| err(libc::ENOENT))?;
        let de = i.visible_entry(dd, nn)?;
        (se, de, ns.rel(parent), ns.rel(np))
    };
    let dir_involved = matches!(se, Entry::Dir(_)) || matches!(de, Some(Entry::Dir(_)));
    if dir_involved && !exclusive {
        return Err(err(libc::EAGAIN));
    }
    let pa = i.check_parent_write(ctx, parent)?;
    let npa = i.check_parent_write(ctx, np)?;
    let s_attr = attr_entry(i, &prel, name, se)?;
    i.check_sticky(ctx, &pa, &s_attr)?;
    if let Some(de) = de {
        let d_attr = attr_entry(i, &nrel, nn, de)?;
        i.check_sticky(ctx, &npa, &d_attr)?;
    }
    if let Entry::Dir(s) = se
        && parent != np
        && !ctx.is_root()
    {
        // Moving a directory rewrites its "..": needs write permission on it.
        i.permit(ctx, s, &s_attr, Access::W)?;
    }
    if parent == np && name == nn {
        return Ok(());
    }
    if flags.noreplace && de.is_some() {
        return Err(err(libc::EEXIST));
    }
    if flags.exchange && de.is_none() {
        return Err(err(libc::ENOENT));
    }
    {
        let ns = i.ns.read();
        // A directory cannot move below itself, and nothing can replace an ancestor of the
        // source.
        if let Entry::Dir(s) = se
            && ns.is_ancestor(s, np)
        {
            return Err(err(libc::EINVAL));
        }
        if let Some(Entry::Dir(t)) = de
            && ns.is_ancestor(t, parent)
        {
            return Err(err(if flags.exchange {
                libc::EINVAL
            } else {
                libc::ENOTEMPTY
            }));
        }
        if !flags.exchange {
            match (se, de) {
                (Entry::Dir(_), Some(Entry::File(_))) => return Err(err(libc::ENOTDIR)),
                (Entry::File(_), Some(Entry::Dir(_))) => return Err(err(libc::EISDIR)),
                (Entry::Dir(_), Some(Entry::Dir(t)))
                    if !ns.dirs.get(&t).is_some_and(|d| d.children.is_empty()) =>
                {
                    return Err(err(libc::ENOTEMPTY));
                }
                _ => {}
            }
        }
    }
    if flags.exchange {
        return exchange(i, parent, name, se, np, nn, de.expect("checked"));
    }
    match se {
        Entry::File(b) => rename_file(i, parent, name, b, np, nn, de, &prel, &nrel),
        Entry::Dir(s) => rename_dir(i, parent, name, s, np, nn, de, &prel),
    }
}

#[allow(clippy::too_many_arguments)]
fn rename_file(
    i: &Inner,
    parent: Ino,
    name: &OsStr,
    b: usize,
    np: Ino,
    nn: &OsStr,
    de: Option<Entry>,
    prel: &[u8],
    nrel: &[u8],
) -> Result<()> {
    let br = i.branch(b)?;
    let (ofd, sst) = i.stat_in(b, prel, name)?;
    let mut victim = None;
    if let Some(Entry::File(c)) = de {
        let (_, tst) = i.stat_in(c, nrel, nn)?;
        if c == b && (tst.st_dev, tst.st_ino) == (sst.st_dev, sst.st_ino) {
            // Two names of one file: rename(2) does nothing.
            return Ok(());
        }
        victim = Some((c, tst));
    }
    let nfd = i.ensure_dir(np, b)?;
    let (n1, n2) = (name.to_os_string(), nn.to_os_string());
    br.run(move || sys::renameat2(ofd.as_fd(), &n1, nfd.as_fd(), &n2, 0))
        .map_err(ioerr)?;
    if let Some((c, tst)) = victim {
        if c != b {
            let cb = i.branch(c)?;
            let (cbb, nrel, n2) = (cb.clone(), nrel.to_vec(), nn.to_os_string());
            let r = cb.run(move || {
                cbb.dir_here(&nrel)
                    .and_then(|fd| sys::unlinkat(fd.as_fd(), &n2, false))
            });
            if let Err(e) = r {
                log::warn!("rename: removing the replaced file on '{}': {e}", cb.name);
            }
        }
        forget_name(i, (tst.st_dev, tst.st_ino), tst.st_nlink, np, nn);
    }
    {
        let mut ns = i.ns.write();
        ns.remove(np, nn);
        move_entry(&mut ns, parent, name, np, nn);
    }
    if let Some(ino) = rename_node_name(i, (sst.st_dev, sst.st_ino), (parent, name), (np, nn)) {
        let open = i.nodes.lock().files.get(&ino).map_or(0, |n| n.open);
        if open == 0 {
            // A rename into a path with another rule migrates the file (issue 3 item 3).
            i.queue_check(ino);
        }
    }
    Ok(())
}

/// Renames every copy of a directory (under `shape` held exclusively).
#[allow(clippy::too_many_arguments)]
fn rename_dir(
    i: &Inner,
    parent: Ino,
    name: &OsStr,
    s: Ino,
    np: Ino,
    nn: &OsStr,
    de: Option<Entry>,
    prel: &[u8],
) -> Result<()> {
    let (smask, tmask) = {
        let ns = i.ns.read();
        (
            branches_of(i, &ns, Entry::Dir(s)),
            de.map_or(0, |e| branches_of(i, &ns, e)),
        )
    };
    let mut done: Vec<usize> = Vec::new();
    let branches = i.branches.read().clone();
    for b in branches.iter().filter(|b| smask & (1u64 << b.id) != 0) {
        let r = (|| -> Result<()> {
            let ofd = b.dir(prel).map_err(ioerr)?;
            let nfd = i.ensure_dir(np, b.id)?;
            let (n1, n2) = (name.to_os_string(), nn.to_os_string());
            b.run(move || sys::renameat2(ofd.as_fd(), &n1, nfd.as_fd(), &n2, 0))
                .map_err(ioerr)
        })();
        if let Err(e) = r {
            // Put back the copies already moved, so the directory stays whole.
            let nrel = i.rel(np);
            for id in done {
                let b = &branches[id];
                let (bb, prel, nrel) = (b.clone(), prel.to_vec(), nrel.clone());
                let (n1, n2) = (name.to_os_string(), nn.to_os_string());
                let _ = b.run(move || {
                    let o = bb.dir_here(&prel)?;
                    let n = bb.dir_here(&nrel)?;
                    sys::renameat2(n.as_fd(), &n2, o.as_fd(), &n1, 0)
                });
            }
            i.forget_dirs();
            return Err(e);
        }
        done.push(b.id);
    }
    // Copies of the replaced (empty) directory on branches the source is not on.
    let nrel = i.rel(np);
    for b in branches
        .iter()
        .filter(|b| tmask & !smask & (1u64 << b.id) != 0)
    {
        let (bb, nrel, n2) = (b.clone(), nrel.clone(), nn.to_os_string());
        if let Err(e) = b.run(move || {
            bb.dir_here(&nrel)
                .and_then(|fd| sys::unlinkat(fd.as_fd(), &n2, true))
        }) {
            log::warn!(
                "rename: removing a replaced directory copy on '{}': {e}",
                b.name
            );
        }
    }
    let files = {
        let mut ns = i.ns.write();
        if let Some(Entry::Dir(_)) = de {
            ns.remove(np, nn);
        }
        move_entry(&mut ns, parent, name, np, nn);
        subtree_files(&ns, s)
            .into_iter()
            .map(|(d, n, b)| (ns.rel(d), d, n, b))
            .collect::<Vec<_>>()
    };
    i.forget_dirs();
    let path_rules = i.policy().rules.rules.iter().any(|r| match &r.body {
        RuleBody::Namespace(_) => true,
        RuleBody::Meta { conds, .. } => conds
            .iter()
            .any(|c| matches!(c, crate::rules::Cond::Path(_))),
    });
    if path_rules {
        let inos = files
            .into_iter()
            .filter_map(|(rel, d, n, b)| {
                let (_, st) = i.stat_in(b, &rel, &n).ok()?;
                Some(i.node_for_enforce(d, &n, b, &st))
            })
            .collect::<Vec<_>>();
        for ino in inos {
            i.queue_check(ino);
        }
    }
    Ok(())
}

fn subtree_files(ns: &Tree, root: Ino) -> Vec<(Ino, OsString, usize)> {
    let mut v = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        let Some(dir) = ns.dirs.get(&d) else { continue };
        for (n, e) in &dir.children {
            match e {
                Entry::Dir(c) => stack.push(*c),
                Entry::File(b) => v.push((d, n.clone(), *b)),
            }
        }
    }
    v
}

/// A name of a file went away (replaced by rename).
fn forget_name(i: &Inner, key: (u64, u64), nlink: u64, dir: Ino, name: &OsStr) {
    let mut nodes = i.nodes.lock();
    if let Some(&ino) = nodes.keymap.get(&key) {
        if nlink <= 1 {
            nodes.keymap.remove(&key);
        }
        if let Some(n) = nodes.files.get_mut(&ino) {
            n.names.retain(|(d, nm)| !(*d == dir && nm == name));
        }
    }
}

fn attr_entry(i: &Inner, rel: &[u8], name: &OsStr, e: Entry) -> Result<cairn_vfs::Attr> {
    match e {
        Entry::Dir(d) => i.dir_attr(d),
        Entry::File(b) => {
            let (_, st) = i.stat_in(b, rel, name)?;
            Ok(sys::attr_from(&st, 0))
        }
    }
}

/// RENAME_EXCHANGE: each branch swaps what it holds under the two names. The caller holds
/// `shape` exclusively when a directory is involved, the parents' locks otherwise.
fn exchange(i: &Inner, p: Ino, n: &OsStr, se: Entry, np: Ino, nn: &OsStr, de: Entry) -> Result<()> {
    let (smask, dmask, prel, nrel) = {
        let ns = i.ns.read();
        (
            branches_of(i, &ns, se),
            branches_of(i, &ns, de),
            ns.rel(p),
            ns.rel(np),
        )
    };
    let key = |rel: &[u8], name: &OsStr, e: Entry| -> Option<(u64, u64)> {
        match e {
            Entry::File(b) => i
                .stat_in(b, rel, name)
                .ok()
                .map(|(_, st)| (st.st_dev, st.st_ino)),
            Entry::Dir(_) => None,
        }
    };
    let skey = key(&prel, n, se);
    let dkey = key(&nrel, nn, de);
    let branches = i.branches.read().clone();
    for b in branches
        .iter()
        .filter(|b| (smask | dmask) & (1u64 << b.id) != 0)
    {
        let here_s = smask & (1u64 << b.id) != 0;
        let here_d = dmask & (1u64 << b.id) != 0;
        let pfd = i.ensure_dir(p, b.id)?;
        let nfd = i.ensure_dir(np, b.id)?;
        let (n1, n2) = (n.to_os_string(), nn.to_os_string());
        b.run(move || match (here_s, here_d) {
            (true, true) => {
                sys::renameat2(pfd.as_fd(), &n1, nfd.as_fd(), &n2, libc::RENAME_EXCHANGE)
            }
            (true, false) => {
                sys::renameat2(pfd.as_fd(), &n1, nfd.as_fd(), &n2, libc::RENAME_NOREPLACE)
            }
            (false, true) => {
                sys::renameat2(nfd.as_fd(), &n2, pfd.as_fd(), &n1, libc::RENAME_NOREPLACE)
            }
            (false, false) => Ok(()),
        })
        .map_err(ioerr)?;
    }
    {
        let mut ns = i.ns.write();
        let ns = &mut *ns;
        // Swap the index entries (and their marks).
        let a = ns.dirs.get_mut(&p).and_then(|d| d.children.remove(n));
        let bb = ns.dirs.get_mut(&np).and_then(|d| d.children.remove(nn));
        let ma = ns.away.remove(&(p, n.to_os_string()));
        let mb = ns.away.remove(&(np, nn.to_os_string()));
        if let Some(w) = ma {
            ns.away.insert((np, nn.to_os_string()), w);
        }
        if let Some(w) = mb {
            ns.away.insert((p, n.to_os_string()), w);
        }
        let fix = |ns: &mut Tree, e: Option<Entry>, dir: Ino, name: &OsStr, from: Ino| {
            let Some(e) = e else { return };
            if let Entry::Dir(d) = e {
                if let Some(x) = ns.dirs.get_mut(&d) {
                    x.parent = dir;
                    x.name = name.to_os_string();
                }
                if from != dir {
                    if let Some(x) = ns.dirs.get_mut(&from) {
                        x.nsubdirs = x.nsubdirs.saturating_sub(1);
                    }
                    if let Some(x) = ns.dirs.get_mut(&dir) {
                        x.nsubdirs += 1;
                    }
                }
            }
            if let Some(x) = ns.dirs.get_mut(&dir) {
                x.children.insert(name.to_os_string(), e);
            }
        };
        fix(ns, a, np, nn, p);
        fix(ns, bb, p, n, np);
    }
    i.forget_dirs();
    // File nodes: names swap too. Do the second through a placeholder so the two updates do
    // not undo each other.
    let tmp = OsString::from("\0swap");
    if let Some(k) = skey {
        rename_node_name(i, k, (p, n), (u64::MAX, &tmp));
    }
    if let Some(k) = dkey {
        rename_node_name(i, k, (np, nn), (p, n));
    }
    if let Some(k) = skey {
        rename_node_name(i, k, (u64::MAX, &tmp), (np, nn));
    }
    Ok(())
}
