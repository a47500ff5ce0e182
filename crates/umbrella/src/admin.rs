//! The control commands of a mount: status, where, reload, enforce, branch add/remove/list.
//! Answers are JSON documents (the cli's control socket carries them).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use crate::branch::{Branch, State};
use crate::config::Config;
use crate::fs::{Inner, config_path};
use crate::ns::{Entry, ROOT};
use crate::rules::{BranchView, Facts, RuleRef};
use crate::sys;
use cairn_vfs::Ino;

fn error(msg: impl Into<String>) -> Value {
    json!({ "error": msg.into() })
}

pub fn command(i: &Arc<Inner>, cmd: &str, args: &[&str]) -> Value {
    match cmd {
        "status" => status(i),
        "where" => match args.first().and_then(|h| unhex(h)) {
            Some(p) => where_is(i, &p),
            None => error("usage: where HEX-PATH"),
        },
        "reload" => reload(
            i,
            args.first()
                .and_then(|h| unhex(h))
                .map(|b| PathBuf::from(OsStr::from_bytes(&b))),
        ),
        "enforce" => {
            let rate = args
                .first()
                .and_then(|r| r.parse::<u64>().ok())
                .filter(|&r| r > 0);
            let j = i.start_enforce(rate);
            json!({ "started": true, "job": j.to_json() })
        }
        "enforce-status" => match i.enforce.lock().as_ref() {
            Some(j) => j.to_json(),
            None => error("no enforcer run yet"),
        },
        "quiesce" => {
            i.quiesce();
            json!({ "ok": true })
        }
        "branch-list" => json!({ "branches": branches(i) }),
        "branch-add" => match (args.first(), args.get(1).and_then(|h| unhex(h))) {
            (Some(name), Some(path)) => branch_add(i, name, Path::new(OsStr::from_bytes(&path))),
            _ => error("usage: branch-add NAME HEX-PATH"),
        },
        "branch-remove" => match args.first() {
            Some(name) => branch_remove(i, name),
            None => error("usage: branch-remove NAME"),
        },
        _ => error(format!("unknown umbrella command '{cmd}'")),
    }
}

/// Paths travel hex-encoded: the control protocol splits on white space.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|c| format!("{c:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|k| u8::from_str_radix(s.get(k..k + 2)?, 16).ok())
        .collect()
}

/// The branches as `status` shows them: state with why and since when, the deadline and
/// whether calls are isolated, errors by kind. From memory only (the health checker's last
/// readings): a status request never waits on a branch.
fn branches(i: &Inner) -> Vec<Value> {
    let (files, away) = {
        let ns = i.ns.read();
        let mut away: HashMap<usize, u64> = HashMap::new();
        for w in ns.away.values() {
            *away.entry(*w).or_insert(0) += 1;
        }
        (ns.files(), away)
    };
    let index = i.policy().index_branch;
    i.branches
        .read()
        .iter()
        .map(|b| {
            let (free, total) = if b.state() == State::Removed {
                (0, 0)
            } else {
                b.space_cached().unwrap_or((0, 0))
            };
            let h = b.health();
            let since = h
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let for_s = h.since.elapsed().map_or(0.0, |d| d.as_secs_f64());
            let (stuck, workers) = b.exec.stuck();
            let e = &b.errors;
            json!({
                "name": b.name,
                "path": b.path.read().display().to_string(),
                "state": b.state().name(),
                "reason": h.reason,
                "since": since,
                "for_seconds": for_s,
                "isolated": b.exec.isolated(),
                "timeout_ms": b.exec.timeout().as_millis() as u64,
                "workers": workers,
                "stuck_workers": stuck,
                "errors": {
                    "timeouts": e.timeouts.load(Ordering::Relaxed),
                    "unavailable": e.unavailable.load(Ordering::Relaxed),
                    "enotconn": e.enotconn.load(Ordering::Relaxed),
                    "estale": e.estale.load(Ordering::Relaxed),
                    "eio": e.eio.load(Ordering::Relaxed),
                },
                "free_bytes": free,
                "total_bytes": total,
                "files": files.iter().filter(|(_, _, fb)| *fb == b.id).count(),
                "waiting_to_return": away.get(&b.id).copied().unwrap_or(0),
                "index": b.id == index,
            })
        })
        .collect()
}

pub fn status(i: &Inner) -> Value {
    let p = i.policy();
    let hits = i.hits.lock().clone();
    let rules: Vec<Value> = p
        .rules
        .refs()
        .into_iter()
        .map(|r| {
            json!({
                "rule": p.rules.describe(r),
                "active": p.rules.is_active(r, i),
                "hits": hits.get(&r).copied().unwrap_or(0),
            })
        })
        .collect();
    let c = &i.counters;
    let up: Vec<Arc<Branch>> = i
        .branches
        .read()
        .iter()
        .filter(|b| b.active())
        .cloned()
        .collect();
    json!({
        "errors": p.errors.name(),
        "config": config_path(i).map(|p| p.display().to_string()),
        "branches": branches(i),
        "rules": rules,
        "migrations": {
            "done": c.migrations_done.load(Ordering::Relaxed),
            "pending": i.pending.lock().len(),
            "failed": c.migrations_failed.load(Ordering::Relaxed),
            "abandoned": c.migrations_abandoned.load(Ordering::Relaxed),
            "unfinished": c.unfinished.load(Ordering::Relaxed),
            "records": crate::recover::records_present(&up),
            "bytes": c.migrated_bytes.load(Ordering::Relaxed),
            "overflows": c.overflows.load(Ordering::Relaxed),
            "recovered_at_mount": c.recovered.load(Ordering::Relaxed),
            "kept_at_mount": c.kept.load(Ordering::Relaxed),
        },
        "kept": crate::recover::kept_dirs(&up),
        "conflicts": c.conflicts.load(Ordering::Relaxed),
        "conflict_names": i.conflict_list.lock().clone(),
        "enforce": i.enforce.lock().as_ref().map(|j| j.to_json()),
    })
}

fn where_is(i: &Inner, path: &[u8]) -> Value {
    let ns = i.ns.read();
    let mut stat_of: Option<(Ino, std::ffi::OsString, usize)> = None;
    let mut dir = ROOT;
    let parts: Vec<&[u8]> = path
        .split(|&c| c == b'/')
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        return json!({ "path": "/", "kind": "directory", "branches": dir_names(i, ns.dirs[&ROOT].mask) });
    }
    for (k, part) in parts.iter().enumerate() {
        let name = OsStr::from_bytes(part);
        let Some(d) = ns.dirs.get(&dir) else {
            return error("not found");
        };
        match d.children.get(name) {
            Some(Entry::Dir(c)) if k + 1 < parts.len() => dir = *c,
            Some(Entry::Dir(c)) => {
                return json!({
                    "path": String::from_utf8_lossy(path),
                    "kind": "directory",
                    "branches": dir_names(i, ns.dirs.get(c).map_or(0, |d| d.mask)),
                });
            }
            Some(Entry::File(b)) if k + 1 == parts.len() => {
                stat_of = Some((dir, name.to_os_string(), *b));
                break;
            }
            _ => {
                return error(format!(
                    "{}: no such file in the union",
                    String::from_utf8_lossy(path)
                ));
            }
        }
    }
    drop(ns);
    if let Some((dir, name, b)) = stat_of {
        let name = name.as_os_str();
        {
            {
                let bname = i.branch(b).map(|x| x.name.clone()).unwrap_or_default();
                let (_, st) = match i.stat_entry(dir, name, b) {
                    Ok(x) => x,
                    Err(e) => return error(format!("{}: {e}", String::from_utf8_lossy(path))),
                };
                let a = sys::attr_from(&st, 0);
                let up = i.ns.read().union_path(dir, name);
                let f = Facts::of(&up, &a, b);
                let d = i.decide(&f, false);
                let target = i.target_for(&d, Some(b), a.size);
                let names = |v: &[usize]| {
                    v.iter()
                        .filter_map(|&x| i.branch(x).ok().map(|b| b.name.clone()))
                        .collect::<Vec<_>>()
                };
                return json!({
                    "path": String::from_utf8_lossy(&up),
                    "kind": "file",
                    "branch": bname,
                    "host_path": i.branch(b).map(|x| x.path.read().join(OsStr::from_bytes(&up[1..])).display().to_string()).unwrap_or_default(),
                    "rule": i.policy().rules.describe(d.rule),
                    "rule_branches": names(&d.branches),
                    "overflow": d.overflow,
                    "misplaced": target.is_some(),
                    "would_move_to": target.and_then(|t| i.branch(t).ok().map(|b| b.name.clone())),
                });
            }
        }
    }
    error("not found")
}

fn dir_names(i: &Inner, mask: u64) -> Vec<String> {
    i.branches
        .read()
        .iter()
        .filter(|b| mask & (1u64 << b.id) != 0)
        .map(|b| b.name.clone())
        .collect()
}

/// Re-reads the configuration. On any error the old rules stay in force.
fn reload(i: &Arc<Inner>, path: Option<PathBuf>) -> Value {
    let Some(path) = path.or_else(|| config_path(i)) else {
        return error("no configuration file known");
    };
    let cfg = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => return error(format!("reload refused, old rules kept: {e}")),
    };
    // Config branch ids -> live ids, adding branches the file names for the first time.
    let mut map = Vec::new();
    let mut added = Vec::new();
    for bc in &cfg.branches {
        let live = i
            .branches
            .read()
            .iter()
            .find(|b| b.name == bc.name)
            .map(|b| b.id);
        match live {
            Some(id) => map.push(id),
            None => match add_branch(i, &bc.name, &bc.path) {
                Ok(id) => {
                    added.push(bc.name.clone());
                    map.push(id);
                }
                Err(e) => return error(format!("reload refused, old rules kept: {e}")),
            },
        }
    }
    // Deadlines and isolation per branch, as the file now says.
    for bc in &cfg.branches {
        let t = crate::branch::Tuning {
            timeout: bc.timeout,
            isolate: bc.isolate,
        };
        i.tuning.lock().insert(bc.name.clone(), t);
        if let Some(b) = i.branches.read().iter().find(|b| b.name == bc.name) {
            b.exec.set_timeout(bc.timeout);
            if let Some(on) = bc.isolate {
                b.exec.set_isolated(on);
            }
        }
    }
    let rules = cfg.rules.remap(&|b| map[b]);
    let old = i.policy();
    let newp = crate::fs::Policy {
        rules,
        errors: cfg.errors,
        min_free: cfg.min_free,
        passthrough_headroom: cfg.passthrough_headroom,
        enforce_rate: cfg.enforce_rate,
        enforce_interval: cfg.enforce_interval,
        index_branch: old.index_branch,
    };
    *i.policy.write() = Arc::new(newp);
    i.hits.lock().clear();
    *i.config_path.lock() = Some(path.clone());
    json!({ "ok": true, "config": path.display().to_string(), "rules": cfg.rules.rules.len(), "added_branches": added })
}

fn add_branch(i: &Arc<Inner>, name: &str, path: &Path) -> Result<usize, String> {
    let tune = i.tuning.lock().get(name).copied().unwrap_or_default();
    // With the branch's deadline: a control request never waits on a hung path.
    let resolved = crate::config::resolve_dirs(&[path.to_path_buf()], &[tune.timeout]);
    let canon = match resolved.into_iter().next() {
        Some(crate::config::Resolved::Dir(c)) => c,
        Some(crate::config::Resolved::NotDir(c)) => {
            return Err(format!("{} is not a directory", c.display()));
        }
        Some(crate::config::Resolved::Failed(e)) => {
            return Err(format!("{}: {e}", path.display()));
        }
        _ => {
            return Err(format!(
                "{}: no answer within {:?} (branch_timeout)",
                path.display(),
                tune.timeout
            ));
        }
    };
    for b in i.branches.read().iter() {
        let p = b.path.read().clone();
        if b.name != name
            && b.state() != State::Removed
            && (p.starts_with(&canon) || canon.starts_with(&p))
        {
            return Err(format!(
                "{} overlaps branch '{}' ({})",
                canon.display(),
                b.name,
                p.display()
            ));
        }
    }
    let existing = i.branches.read().iter().find(|b| b.name == name).cloned();
    let br = match existing {
        Some(b) if b.state() != State::Removed => {
            return Err(format!("branch '{name}' is already part of the mount"));
        }
        Some(b) => {
            b.reopen(Some(canon)).map_err(|e| e.to_string())?;
            b
        }
        None => {
            let mut bs = i.branches.write();
            if bs.len() >= 64 {
                return Err("at most 64 branches".into());
            }
            let id = bs.len();
            let b = Arc::new(
                Branch::open(id, name, canon, tune, i.epoch.clone(), true)
                    .map_err(|e| e.to_string())?,
            );
            b.set_state(State::Removed);
            bs.push(b.clone());
            b
        }
    };
    if i.acls && br.acl_support() == Some(false) {
        return Err(format!(
            "{}: its file system does not keep POSIX ACLs, which this mount enforces \
             (every branch of it keeps them); use a directory on one that does (ext4, xfs, \
             btrfs, tmpfs, NFSv4 with ACLs…)",
            br.path.read().display()
        ));
    }
    // Scan before the branch becomes visible; names it shares with the union keep the
    // union's copy (the scan counts them as conflicts). The scan's host calls run with no
    // lock held, into a tree of its own, merged afterwards.
    let mut scanned = crate::ns::Tree::new(0);
    i.scan_branch(&mut scanned, &br);
    {
        let _shape = i.shape.write();
        let mut ns = i.ns.write();
        i.merge_scanned(&mut ns, scanned, &br);
    }
    br.forget_dirs();
    br.set_state(State::Active);
    i.epoch.fetch_add(1, Ordering::Relaxed);
    Ok(br.id)
}

fn branch_add(i: &Arc<Inner>, name: &str, path: &Path) -> Value {
    match add_branch(i, name, path) {
        Ok(id) => {
            let p = i.policy();
            let reactivated: Vec<String> = p
                .rules
                .refs()
                .into_iter()
                .filter(|r| *r != RuleRef::Default && p.rules.is_active(*r, i.as_ref()))
                .map(|r| p.rules.describe(r))
                .collect();
            json!({ "ok": true, "branch": name, "id": id, "active_rules": reactivated })
        }
        Err(e) => error(e),
    }
}

fn branch_remove(i: &Arc<Inner>, name: &str) -> Value {
    let b = i.branches.read().iter().find(|b| b.name == name).cloned();
    let Some(b) = b else {
        return error(format!("no branch '{name}'"));
    };
    if b.state() == State::Removed {
        return error(format!("branch '{name}' is already removed"));
    }
    let others = i
        .branches
        .read()
        .iter()
        .filter(|x| x.id != b.id && x.active())
        .count();
    if others == 0 {
        return error("cannot remove the last active branch");
    }
    // Let queued moves from or to it finish or fail first.
    i.quiesce();
    b.set_state(State::Removed);
    i.epoch.fetch_add(1, Ordering::Relaxed);
    let root = b.root();
    let _ = b.run(move || sys::syncfs(root.as_fd()));
    let p = i.policy();
    let inactive: Vec<String> = p
        .rules
        .refs()
        .into_iter()
        .filter(|r| !p.rules.is_active(*r, i.as_ref()))
        .map(|r| p.rules.describe(r))
        .collect();
    let _ = BranchView::active(i.as_ref(), b.id);
    json!({ "ok": true, "branch": name, "inactive_rules": inactive })
}
