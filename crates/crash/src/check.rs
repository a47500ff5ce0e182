//! Checking crash states (issue 5 §3): build the state over the epoch's shared base, run the
//! mode's recovery if it has one, fsck it (check only), mount it read-only in process and
//! walk it, and ask the durability oracle.
//!
//! A recording of two devices (a journal's log device: [`crate::record`]) builds each state
//! as one overlay of both devices' blocks, handed out as two devices ([`Slice`]): the file
//! system's to fsck, the walk and the oracle, both to the mode's recovery and to the
//! read-only mount (which shows the log's replay in memory).

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cairn_blockdev::BlockDevice;
use cairn_ffs::format::{Geometry, INODE_SIZE, Superblock};
use cairn_ffs::strategy::journal::Commit;
use cairn_ffs::{Ffs, MountOptions};
use cairn_fsck::{CheckOptions, Class};
use cairn_vfs::FileSystem;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::model::Model;
use crate::modes::{Allow, Expectation};
use crate::oracle::{Observed, Timeline, model_of, observe};
use crate::overlay::{Base, Overlay, Slice};
use crate::record::{self, Event, Op, Recording};
pub use crate::repro::StateClass;
use crate::states::{CrashState, Epoch, crash_point, epochs};

/// What a finding in a state is: it decides the state's class, and whether the mode's
/// expectation allows it. Read from fsck's typed findings (`cairn_fsck::Class`,
/// `cairn_fsck::Kind`), never from their text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// fsck: allocated but unreferenced, a link count too high, a summary off.
    Leak,
    /// fsck: a directory rename's footprint while a directory rename was in flight.
    InterruptedRename,
    /// fsck: any other inconsistency.
    Corruption,
    /// The read-only mount refused the state, or its walk failed.
    Walk,
    /// The state could not be checked: its recovery or fsck failed to run, or it panicked.
    Unusable,
}

/// One finding in a state, with its line for reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub line: String,
}

impl Finding {
    fn new(kind: FindingKind, line: impl Into<String>) -> Finding {
        Finding {
            kind,
            line: line.into(),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

/// The result of checking one state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateOutcome {
    pub class: StateClass,
    /// fsck's findings and the walk's errors.
    pub findings: Vec<Finding>,
    /// Broken durability promises.
    pub violations: Vec<String>,
    /// Files holding data that is not theirs (a violation only where promised).
    pub stale: Vec<String>,
    /// The event index taken as the crash point.
    pub crash_point: usize,
}

impl StateOutcome {
    /// Whether this outcome breaks `e`.
    pub fn unexpected(&self, e: &Expectation) -> bool {
        let class_ok = match self.class {
            StateClass::Clean => true,
            StateClass::LeakOnly => e.leak != Allow::Forbidden,
            StateClass::InterruptedRename => e.interrupted_rename != Allow::Forbidden,
            StateClass::Corrupt => e.corrupt != Allow::Forbidden,
        };
        !class_ok || !self.violations.is_empty()
    }

    /// Why this outcome breaks `e`, one line each: the broken promises, then every finding
    /// of a kind `e` forbids. Never empty for an unexpected outcome.
    pub fn reasons(&self, e: &Expectation) -> Vec<String> {
        let forbidden = |k: FindingKind| {
            let a = match k {
                FindingKind::Leak => e.leak,
                FindingKind::InterruptedRename => e.interrupted_rename,
                FindingKind::Corruption | FindingKind::Walk | FindingKind::Unusable => e.corrupt,
            };
            a == Allow::Forbidden
        };
        let mut out: Vec<String> = self.violations.clone();
        out.extend(
            self.findings
                .iter()
                .filter(|f| forbidden(f.kind))
                .map(|f| f.line.clone()),
        );
        if out.is_empty() && self.unexpected(e) {
            out.push(format!(
                "a {:?} state, which mode {} forbids",
                self.class, e.mode
            ));
        }
        out
    }
}

/// Everything needed to check the states of one recording.
pub struct Checker {
    pub rec: Recording,
    pub epochs: Vec<Epoch>,
    pub timeline: Timeline,
    pub expect: Expectation,
    /// The image at the recording's start (before epoch 0).
    start: Arc<Base>,
    /// A mode for the read-only mount (any registered one reads the same format).
    mount_mode: String,
    /// The format's registry entry when it is not FFS: its device check and mount judge
    /// the states (FFS states are judged by cairn's fsck and an FFS mount, as before).
    other: Option<&'static cairn_fstypes::FsType>,
    /// Where inodes live (from the start image's superblock), for the fsync-order check.
    geo: Option<Geometry>,
    /// The inode slot of each in-flight fsync's file as it could be on disk before the
    /// fsync began (every version written up to then), by operation id.
    pre_fsync: Mutex<HashMap<u64, Vec<Box<[u8]>>>>,
}

impl Checker {
    pub fn new(rec: Recording, expect: Expectation) -> Result<Checker, Error> {
        let h = &rec.header;
        let mut base = match &h.base {
            record::Base::Zero => Base::zeroed(h.block_size, h.total_blocks()),
            record::Base::File(p) => {
                let bytes = std::fs::read(p).map_err(|e| Error::io(p, e))?;
                let want = h.block_size as usize * h.total_blocks() as usize;
                if bytes.len() < want {
                    return Err(Error::Format(format!(
                        "base image {} has {} bytes, the recording needs {want}",
                        p.display(),
                        bytes.len()
                    )));
                }
                let mut bytes = bytes;
                bytes.truncate(want);
                Base {
                    block_size: h.block_size,
                    bytes,
                }
            }
        };
        for ev in &rec.events[..h.start] {
            if let Event::Write { block, data, .. } = ev {
                data.copy_to(base.block_mut(*block));
            }
        }
        let start = Arc::new(base);
        let mount_mode = crate::modes::mount_mode(&h.mode);
        let other = crate::modes::format_of(&h.mode).filter(|_| !crate::modes::is_ffs(&h.mode));
        let initial = match mount_ro(start.clone(), &mount_mode, other, h) {
            Ok(fs) => model_of(&observe(fs.as_ref())),
            // An image that does not mount at the start: nothing to compare names with.
            Err(_) => Model {
                unknown: true,
                ..Default::default()
            },
        };
        let timeline = Timeline::new(&rec, initial);
        let epochs = epochs(&rec);
        let geo = Superblock::decode(start.block(0))
            .ok()
            .and_then(|sb| sb.geometry().ok())
            .filter(|g| g.block_size == h.block_size);
        Ok(Checker {
            rec,
            epochs,
            timeline,
            expect,
            start,
            mount_mode,
            other,
            geo,
            pre_fsync: Mutex::new(HashMap::new()),
        })
    }

    /// Checks `states` (any order), calling `each` with every result. States are grouped
    /// by epoch so the shared base only moves forward.
    pub fn check_all(
        &self,
        states: &[CrashState],
        mut each: impl FnMut(&CrashState, &StateOutcome),
    ) {
        let mut order: Vec<&CrashState> = states.iter().collect();
        order.sort_by_key(|s| s.epoch);
        let mut base = self.start.clone();
        let mut at = 0usize;
        for st in order {
            if st.epoch >= self.epochs.len() {
                continue;
            }
            while at < st.epoch {
                self.apply_epoch(&mut base, at);
                at += 1;
            }
            let out = self.check_on(&base, st);
            each(st, &out);
        }
    }

    /// Makes durable what the flush ending epoch `e` settles.
    fn apply_epoch(&self, base: &mut Arc<Base>, e: usize) {
        let b = make_mut_base(base);
        for &i in &self.epochs[e].settled {
            if let Event::Write { block, data, .. } = &self.rec.events[i] {
                data.copy_to(b.block_mut(*block));
            }
        }
    }

    /// The state as a device, built from scratch (replay, saving it as an image).
    pub fn state_device(&self, st: &CrashState) -> Result<Overlay, Error> {
        if st.epoch >= self.epochs.len() {
            return Err(Error::Format(format!(
                "state names epoch {} of {}",
                st.epoch,
                self.epochs.len()
            )));
        }
        let mut base = self.start.clone();
        for e in 0..st.epoch {
            self.apply_epoch(&mut base, e);
        }
        self.device(&base, st)
    }

    /// Checks one state from scratch (replay).
    pub fn check_one(&self, st: &CrashState) -> StateOutcome {
        let mut out = None;
        self.check_all(std::slice::from_ref(st), |_, o| out = Some(o.clone()));
        out.unwrap_or_else(|| StateOutcome {
            class: StateClass::Corrupt,
            findings: vec![Finding::new(
                FindingKind::Unusable,
                format!("state names epoch {} of {}", st.epoch, self.epochs.len()),
            )],
            violations: Vec::new(),
            stale: Vec::new(),
            crash_point: 0,
        })
    }

    /// The state as a device over `base` (the image with every epoch before `st.epoch`).
    pub fn device(&self, base: &Arc<Base>, st: &CrashState) -> Result<Overlay, Error> {
        let ep = &self.epochs[st.epoch];
        let bs = base.block_size as usize;
        let mut delta: HashMap<u64, Box<[u8]>> = HashMap::new();
        for &k in &st.kept {
            let Some(&i) = ep.writes.get(k as usize) else {
                return Err(Error::Format(format!(
                    "state keeps write {k} of {}",
                    ep.writes.len()
                )));
            };
            let Event::Write { block, data, .. } = &self.rec.events[i] else {
                continue;
            };
            let torn = st.torn.as_ref().filter(|t| t.write == k);
            let slot = delta
                .entry(*block)
                .or_insert_with(|| Box::from(base.block(*block)));
            match torn {
                None => data.copy_to(slot),
                Some(t) => {
                    let mut new = vec![0u8; bs];
                    data.copy_to(&mut new);
                    for &s in &t.sectors {
                        let r = s as usize * 512..(s as usize + 1) * 512;
                        if r.end <= bs {
                            slot[r.clone()].copy_from_slice(&new[r]);
                        }
                    }
                }
            }
        }
        Overlay::new(base.clone(), delta).map_err(|e| Error::Format(e.to_string()))
    }

    fn check_on(&self, base: &Arc<Base>, st: &CrashState) -> StateOutcome {
        let cp = crash_point(&self.epochs, st, self.rec.events.len());
        let r = catch_unwind(AssertUnwindSafe(|| self.check_inner(base, st, cp)));
        r.unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "?".into());
            StateOutcome {
                class: StateClass::Corrupt,
                findings: vec![Finding::new(
                    FindingKind::Unusable,
                    format!("PANIC while checking: {msg}"),
                )],
                violations: Vec::new(),
                stale: Vec::new(),
                crash_point: cp,
            }
        })
    }

    fn check_inner(&self, base: &Arc<Base>, st: &CrashState, cp: usize) -> StateOutcome {
        let mut out = StateOutcome {
            class: StateClass::Clean,
            findings: Vec::new(),
            violations: Vec::new(),
            stale: Vec::new(),
            crash_point: cp,
        };
        let devs = self.device(base, st).and_then(|d| {
            split(Arc::new(d), &self.rec.header).map_err(|e| Error::Format(e.to_string()))
        });
        let (dev, log) = match devs {
            Ok(d) => d,
            Err(e) => {
                out.class = StateClass::Corrupt;
                out.findings
                    .push(Finding::new(FindingKind::Unusable, e.to_string()));
                return out;
            }
        };
        if let Some(recover) = self.expect.recovery
            && let Err(e) = recover(dev.clone(), log.clone())
        {
            out.class = StateClass::Corrupt;
            out.findings.push(Finding::new(
                FindingKind::Unusable,
                format!("recovery failed: {e}"),
            ));
            return out;
        }
        let rename_in_flight = self.timeline.dir_rename_in_flight(cp);
        let fsync_wrote = self.fsync_wrote(dev.as_ref(), cp);
        let (mut corrupt, mut leak, mut irename) = (false, false, false);
        let checked = match self.other {
            Some(f) => (f.device.check)(dev.clone()),
            None => cairn_fsck::check(&*dev, CheckOptions::default()),
        };
        match checked {
            Ok(rep) => {
                for f in &rep.findings {
                    // A directory rename caught between its steps (001 §6: without a log,
                    // "both old and new names persist"): a second name (fsck: leak, the
                    // name `..` agrees with is kept) or a stale `..` (fsck: corruption),
                    // a class of its own only while such a rename was in flight.
                    let kind = match f.class {
                        _ if rename_in_flight && f.kind.is_rename_footprint() => {
                            irename = true;
                            FindingKind::InterruptedRename
                        }
                        Class::Leak => {
                            leak = true;
                            FindingKind::Leak
                        }
                        Class::Corruption => {
                            corrupt = true;
                            FindingKind::Corruption
                        }
                    };
                    out.findings.push(Finding::new(kind, f.to_string()));
                }
            }
            Err(e) => {
                corrupt = true;
                out.findings.push(Finding::new(
                    FindingKind::Unusable,
                    format!("fsck cannot check: {e}"),
                ));
            }
        }
        let obs = match mount_ro_dev(dev, &self.mount_mode, self.other, log) {
            Ok(fs) => {
                let o = observe(fs.as_ref());
                drop(fs);
                o
            }
            Err(e) => {
                out.findings.push(Finding::new(
                    FindingKind::Walk,
                    format!("WALK: mount refused: {e}"),
                ));
                corrupt = true;
                Observed::default()
            }
        };
        if !obs.errors.is_empty() {
            corrupt = true;
            out.findings.extend(
                obs.errors
                    .iter()
                    .map(|e| Finding::new(FindingKind::Walk, format!("WALK: {e}"))),
            );
        }
        out.class = if corrupt {
            StateClass::Corrupt
        } else if irename {
            StateClass::InterruptedRename
        } else if leak {
            StateClass::LeakOnly
        } else {
            StateClass::Clean
        };
        // A state that does not mount has no tree to judge; its corruption is the finding.
        if !(corrupt && obs.paths.is_empty()) {
            let v = self
                .timeline
                .judge(cp, &obs, self.expect.promises, &fsync_wrote);
            out.violations = v.violations;
            out.stale = v.stale;
        }
        out
    }

    /// The inodes whose fsync was in flight at `cp` and whose inode on `dev` the fsync
    /// itself wrote: the slot differs from every version it had on disk before the fsync
    /// began. Before that write the file is as earlier calls left it (a size that reached
    /// disk ahead of its data is FFS's ordinary stale-data window, not the fsync's doing);
    /// after it, the fsync's promise — data before the pointers to it — says the contents
    /// are complete. FFS layout: a new format locates its inodes its own way.
    fn fsync_wrote(&self, dev: &dyn BlockDevice, cp: usize) -> HashSet<u64> {
        let mut out = HashSet::new();
        let Some(geo) = self.geo else { return out };
        for o in self.timeline.in_flight(cp) {
            let Op::Fsync { ino } = o.op else { continue };
            if !geo.valid_ino(ino) {
                continue;
            }
            let (blk, off) = geo.inode_location(ino);
            let mut block = vec![0u8; geo.bs()];
            if dev.read_blocks(blk, &mut block).is_err() {
                continue;
            }
            let slot = &block[off..off + INODE_SIZE];
            let mut cache = self.pre_fsync.lock();
            let pre = cache.entry(o.id).or_insert_with(|| {
                let mut v: Vec<Box<[u8]>> =
                    vec![Box::from(&self.start.block(blk)[off..off + INODE_SIZE])];
                let mut tmp = vec![0u8; geo.bs()];
                for ev in &self.rec.events[self.rec.header.start..o.begin] {
                    if let Event::Write { block, data, .. } = ev
                        && *block == blk
                    {
                        data.copy_to(&mut tmp);
                        let s = &tmp[off..off + INODE_SIZE];
                        if !v.iter().any(|x| **x == *s) {
                            v.push(Box::from(s));
                        }
                    }
                }
                v
            });
            if !pre.iter().any(|s| **s == *slot) {
                out.insert(ino);
            }
        }
        out
    }

    /// A short description of the crash point: the last operation that had returned and
    /// the ones in flight.
    pub fn describe_point(&self, cp: usize) -> String {
        let last = self
            .timeline
            .last_returned(cp)
            .map_or("none".to_string(), |o| {
                format!("{} #{} {}", o.op.kind(), o.id, o.op.path())
            });
        let flying: Vec<String> = self
            .timeline
            .in_flight(cp)
            .iter()
            .map(|o| format!("{} #{} {}", o.op.kind(), o.id, o.op.path()))
            .collect();
        format!(
            "last returned: {last}; in flight: {}",
            if flying.is_empty() {
                "none".into()
            } else {
                flying.join(", ")
            }
        )
    }

    /// The shortest prefix of the workload's calls that reaches a crash at `cp`: every call
    /// that had begun by then (the recording is deterministic, so running only these calls
    /// gives the same writes up to that point). Releases are left out, and forgets unless
    /// in flight (the one that frees); calls in flight are marked.
    pub fn op_prefix(&self, cp: usize) -> Vec<String> {
        self.timeline
            .begun_before(cp)
            .iter()
            .filter(|o| {
                let flying = o.end.is_none_or(|e| e >= cp);
                match o.op {
                    Op::Release { .. } => false,
                    Op::Forget { .. } => flying,
                    _ => true,
                }
            })
            .map(|o| {
                let failed = o
                    .result
                    .as_ref()
                    .filter(|r| !r.ok() && o.end.is_some_and(|e| e < cp))
                    .map_or(String::new(), |r| format!(" (errno {})", r.errno));
                let flying = if o.end.is_none_or(|e| e >= cp) {
                    " (in flight)"
                } else {
                    ""
                };
                format!("{} #{} {}{failed}{flying}", o.op.kind(), o.id, o.op.path())
                    .replace("  ", " ")
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    /// The recording cut right after the state's epoch (its flush included): with the state,
    /// everything a reproducer needs.
    pub fn prefix_end(&self, st: &CrashState) -> usize {
        if st.at_end {
            return self.rec.events.len();
        }
        self.epochs[st.epoch]
            .flush
            .map_or(self.rec.events.len(), |f| f + 1)
    }
}

type Format = Option<&'static cairn_fstypes::FsType>;

fn mount_ro(
    base: Arc<Base>,
    mode: &str,
    other: Format,
    h: &record::Header,
) -> Result<Arc<dyn FileSystem>, cairn_vfs::FsError> {
    let dev = Overlay::new(base, HashMap::new())?;
    let (dev, log) = split(Arc::new(dev), h)?;
    mount_ro_dev(dev, mode, other, log)
}

/// The file system's device, and the log's for a recording of two.
type Devices = (Arc<dyn BlockDevice>, Option<Arc<dyn BlockDevice>>);

/// A state of the recording's devices as the file system's device and, for a recording of
/// two, the log's (both views of the one overlay: what recovery writes to either lands in
/// it).
fn split(state: Arc<Overlay>, h: &record::Header) -> std::io::Result<Devices> {
    if h.log_blocks == 0 {
        return Ok((state, None));
    }
    let state: Arc<dyn BlockDevice> = state;
    let slice = |first, blocks| -> std::io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(Slice::new(Arc::clone(&state), first, blocks)?))
    };
    Ok((
        slice(0, h.num_blocks)?,
        Some(slice(h.num_blocks, h.log_blocks)?),
    ))
}

/// A read-only mount of a state: FFS in `mode` (with its log device when it has one: the
/// journal's read-only mount replays the log in memory), another format through its
/// registry entry (whose read-only mount recovers in memory: LFS rolls forward).
fn mount_ro_dev(
    dev: Arc<dyn BlockDevice>,
    mode: &str,
    other: Format,
    log: Option<Arc<dyn BlockDevice>>,
) -> Result<Arc<dyn FileSystem>, cairn_vfs::FsError> {
    if let Some(f) = other {
        return (f.device.mount)(
            dev,
            &[("mode".to_string(), Some(mode.to_string()))],
            cairn_fstypes::DeviceMount {
                read_only: true,
                background: false,
            },
        );
    }
    let opts = MountOptions {
        mode: mode.into(),
        cache_bytes: 16 << 20,
        syncer_interval: None,
        read_only: true,
        force: false,
        mode_options: Vec::new(),
    };
    let ffs = match log {
        Some(log) => Ffs::mount_device_with_strategy(
            dev,
            &opts,
            Box::new(crate::modes::journal_on(log, Commit::Sync)),
        )?,
        None => Ffs::mount_device(dev, &opts)?,
    };
    Ok(ffs)
}

/// `Arc::make_mut` for the base: copies only if a device of an earlier state still holds it.
fn make_mut_base(this: &mut Arc<Base>) -> &mut Base {
    if Arc::get_mut(this).is_none() {
        let copy = Base {
            block_size: this.block_size,
            bytes: this.bytes.clone(),
        };
        *this = Arc::new(copy);
    }
    Arc::get_mut(this).expect("unique after copy")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(class: StateClass, findings: Vec<Finding>) -> StateOutcome {
        StateOutcome {
            class,
            findings,
            violations: Vec::new(),
            stale: Vec::new(),
            crash_point: 0,
        }
    }

    /// A failing state says why in its first line: a leak in a mode that forbids leaks
    /// (its reasons were empty when findings were filtered by their text).
    #[test]
    fn an_unexpected_state_always_has_a_reason() {
        let lfs = crate::modes::expectation("lfs").unwrap();
        let sync = crate::modes::expectation("sync").unwrap();
        let leak = outcome(
            StateClass::LeakOnly,
            vec![Finding::new(
                FindingKind::Leak,
                "LEAK: inode 9: in no directory",
            )],
        );
        assert!(leak.unexpected(&lfs) && !leak.unexpected(&sync));
        assert_eq!(leak.reasons(&lfs), vec!["LEAK: inode 9: in no directory"]);
        assert!(leak.reasons(&sync).is_empty());
        // A rename's footprint counts against a mode that forbids interrupted renames only.
        let irename = outcome(
            StateClass::InterruptedRename,
            vec![Finding::new(FindingKind::InterruptedRename, "second name")],
        );
        assert!(irename.unexpected(&lfs) && !irename.unexpected(&sync));
        assert_eq!(irename.reasons(&lfs).len(), 1);
        // Whatever the findings, an unexpected state names its class at least.
        let bare = outcome(StateClass::Corrupt, Vec::new());
        assert!(!bare.reasons(&sync).is_empty());
    }
}
