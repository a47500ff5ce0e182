//! The configuration file (TOML): branches, rules, error semantics.
//!
//! ```toml
//! [umbrella]
//! errors = "or"            # "or": any branch error fails a merged operation; "and": skip it
//! default = ["fs1"]        # where files go when no rule matches (default: the first branch)
//! index = "fs1"            # the branch holding the hidden .umbrella/ metadata directory
//! min_free = "1%"          # a branch with less free space than this counts as full
//! passthrough_headroom = "1G" # pass a file that may overflow through to the kernel while
//!                          # its branch has this much room beyond min_free (default: never)
//! enforce_interval = "6h"  # run the policy enforcer periodically (optional)
//! enforce_rate = "100M"    # enforcer throttle, bytes per second (optional)
//! branch_timeout = "3s"    # the deadline of every host call on a branch (default 3s)
//!
//! [[branch]]
//! name = "fs1"
//! path = "fs1"             # relative paths are relative to this file's directory
//! timeout = "10s"          # this branch's own deadline (optional)
//! isolate = true           # host calls on workers with the deadline (default: network and
//!                          # FUSE file systems yes, local ones no; see `exec`)
//!
//! [[rule]]                 # a metadata rule: all conditions must hold
//! access = "read-only"
//! branches = ["fs2", "fs1"]
//!
//! [[rule]]                 # a namespace rule: longest overall match among its entries
//! namespace = [
//!   { match = "/home/dave/*", branches = ["fs3"] },
//!   { match = "/home/dave/*.avi", branches = ["fs1", "fs3"] },
//!   { match = "/*", branches = ["fs1"] },
//! ]
//! ```
//!
//! Every error names the line it is about. Unknown keys are errors (a misspelt condition
//! must not silently match everything).

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_vfs::FileKind;
use serde::Deserialize;
use toml::Spanned;

use crate::rules::{
    AccessType, Amount, BranchId, Cmp, Cond, NsEntry, Rule, RuleBody, RuleSet, TimeField,
};

/// `or` / `and` failure semantics for operations that span branches (§2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorMode {
    Or,
    And,
}

impl ErrorMode {
    pub fn name(self) -> &'static str {
        match self {
            ErrorMode::Or => "or",
            ErrorMode::And => "and",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BranchConf {
    pub name: String,
    /// Canonical absolute path; when the path did not answer in time at load
    /// (`answered` false), the absolute path as written.
    pub path: PathBuf,
    /// The path was resolved within the branch's deadline. A branch whose path hangs
    /// (a network file system whose server stopped) is mounted `stalled` instead of
    /// hanging `cairn umbrella` itself; its first probe that answers resolves it.
    pub answered: bool,
    /// The deadline of each host call on this branch (`timeout`, else `branch_timeout`).
    pub timeout: Duration,
    /// `isolate = true|false`: run host calls on the branch's workers with the deadline, or
    /// inline. None: decided by the host file system's type (network and FUSE file systems
    /// are isolated, local ones inline; see `exec`).
    pub isolate: Option<bool>,
}

/// A validated configuration. Branch ids in `rules` index `branches`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The file it was read from; absolute (canonical) when read by [`Config::load`].
    pub source: PathBuf,
    pub branches: Vec<BranchConf>,
    pub rules: RuleSet,
    pub errors: ErrorMode,
    pub index: BranchId,
    pub min_free: Amount,
    /// Room beyond `min_free` on its branch with which a file whose rule lets it overflow is
    /// still passed through to the kernel at open (FUSE passthrough); None: never (such a
    /// file's writes always come through the layer, which overflows them on ENOSPC).
    pub passthrough_headroom: Option<Amount>,
    pub enforce_interval: Option<Duration>,
    pub enforce_rate: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
    #[error("{path}:{line}: {msg}")]
    At {
        path: String,
        line: usize,
        msg: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    umbrella: Option<Spanned<RawGlobal>>,
    #[serde(default)]
    branch: Vec<Spanned<RawBranch>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    errors: Option<Spanned<String>>,
    default: Option<Spanned<OneOrMany<String>>>,
    default_overflow: Option<bool>,
    index: Option<Spanned<String>>,
    min_free: Option<Spanned<String>>,
    passthrough_headroom: Option<Spanned<String>>,
    enforce_interval: Option<Spanned<String>>,
    enforce_rate: Option<Spanned<String>>,
    branch_timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBranch {
    name: Spanned<String>,
    path: Spanned<String>,
    timeout: Option<Spanned<String>>,
    isolate: Option<bool>,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    fn list(&self) -> Vec<T> {
        match self {
            OneOrMany::One(x) => vec![x.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPerm {
    mask: String,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    branches: Option<Spanned<Vec<Spanned<String>>>>,
    overflow: Option<bool>,
    namespace: Option<Vec<Spanned<RawNs>>>,
    size: Option<Spanned<String>>,
    size_margin: Option<Spanned<String>>,
    access: Option<Spanned<String>>,
    perm: Option<Spanned<RawPerm>>,
    uid: Option<OneOrMany<u32>>,
    gid: Option<OneOrMany<u32>>,
    suffix: Option<OneOrMany<String>>,
    #[serde(rename = "name_glob")]
    name_glob: Option<OneOrMany<String>>,
    path: Option<OneOrMany<String>>,
    #[serde(rename = "type")]
    kind: Option<Spanned<OneOrMany<String>>>,
    mtime: Option<Spanned<String>>,
    atime: Option<Spanned<String>>,
    ctime: Option<Spanned<String>>,
    age_margin: Option<Spanned<String>>,
    free: Option<Spanned<String>>,
    free_branch: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNs {
    #[serde(rename = "match")]
    pattern: String,
    branches: Spanned<Vec<Spanned<String>>>,
    overflow: Option<bool>,
}

struct Ctx<'a> {
    text: &'a str,
    path: String,
}

impl Ctx<'_> {
    fn line(&self, span: std::ops::Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text[..end].bytes().filter(|&b| b == b'\n').count() + 1
    }
    fn err(&self, span: std::ops::Range<usize>, msg: impl Into<String>) -> ConfigError {
        ConfigError::At {
            path: self.path.clone(),
            line: self.line(span),
            msg: msg.into(),
        }
    }
}

/// Parses "1024", "8K", "1.5M", "2GiB" (powers of 1024): the house's one size parser.
pub fn parse_bytes(s: &str) -> Option<u64> {
    cairn_vfs::parse_size(s).ok()
}

/// Parses "500ms", "30s", "5m", "12h", "30d", "2w" (a bare number is seconds).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        let n: f64 = ms.trim().parse().ok()?;
        return (n.is_finite() && n >= 0.0).then(|| Duration::from_secs_f64(n / 1000.0));
    }
    let (num, unit) = match s.chars().last()? {
        c if c.is_ascii_alphabetic() => (&s[..s.len() - 1], c),
        _ => (s, 's'),
    };
    let secs = match unit {
        's' => 1.0,
        'm' => 60.0,
        'h' => 3600.0,
        'd' => 86_400.0,
        'w' => 7.0 * 86_400.0,
        _ => return None,
    };
    let n: f64 = num.trim().parse().ok()?;
    (n.is_finite() && n >= 0.0).then(|| Duration::from_secs_f64(n * secs))
}

fn parse_cmp(s: &str) -> Option<(Cmp, &str)> {
    let s = s.trim();
    for (p, c) in [
        ("<=", Cmp::Le),
        (">=", Cmp::Ge),
        ("!=", Cmp::Ne),
        ("==", Cmp::Eq),
        ("<", Cmp::Lt),
        (">", Cmp::Gt),
        ("=", Cmp::Eq),
    ] {
        if let Some(rest) = s.strip_prefix(p) {
            return Some((c, rest.trim()));
        }
    }
    None
}

fn parse_amount(s: &str) -> Option<Amount> {
    match s.trim().strip_suffix('%') {
        Some(p) => {
            let p: f64 = p.trim().parse().ok()?;
            (0.0..=100.0).contains(&p).then_some(Amount::Percent(p))
        }
        None => parse_bytes(s).map(Amount::Bytes),
    }
}

fn parse_kind(s: &str) -> Option<FileKind> {
    Some(match s {
        "file" | "regular" => FileKind::RegularFile,
        "dir" | "directory" => FileKind::Directory,
        "symlink" | "link" => FileKind::Symlink,
        "fifo" => FileKind::Fifo,
        "socket" => FileKind::Socket,
        "char" => FileKind::CharDevice,
        "block" => FileKind::BlockDevice,
        _ => return None,
    })
}

fn parse_octal(s: &str) -> Option<u32> {
    let s = s.trim();
    let s = s.strip_prefix("0o").unwrap_or(s);
    u32::from_str_radix(s, 8).ok().filter(|&m| m <= 0o7777)
}

/// Is `a` inside `b` or `b` inside `a` (component-wise)?
fn overlapping(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// What resolving a branch path found.
#[derive(Debug)]
pub enum Resolved {
    /// The canonical path of a directory.
    Dir(PathBuf),
    /// The path (as given) of something else.
    NotDir(PathBuf),
    Failed(std::io::Error),
    /// No answer within the deadline: the path is on a file system that stopped answering
    /// (its walk stays blocked in a process of its own until the host answers).
    NoAnswer,
}

/// Resolves `paths` (canonical path, is it a directory) all at once, each within its
/// `timeouts` entry counted from now. A path on a hung mount is answered
/// [`Resolved::NoAnswer`] at its deadline; the walk stays in a process of its own
/// (`sys::resolve_paths`), so nothing of this process waits for it.
pub fn resolve_dirs(paths: &[PathBuf], timeouts: &[Duration]) -> Vec<Resolved> {
    use std::os::unix::ffi::OsStrExt;
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    crate::sys::resolve_paths(&refs, timeouts)
        .into_iter()
        .zip(paths)
        .map(|(a, p)| match a {
            crate::sys::PathAnswer::Dir(c) => {
                Resolved::Dir(PathBuf::from(std::ffi::OsStr::from_bytes(&c)))
            }
            crate::sys::PathAnswer::NotDir => Resolved::NotDir(p.clone()),
            crate::sys::PathAnswer::Failed(e) => {
                Resolved::Failed(std::io::Error::from_raw_os_error(e))
            }
            crate::sys::PathAnswer::NoAnswer => Resolved::NoAnswer,
        })
        .collect()
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: shown.clone(),
            msg: e.to_string(),
        })?;
        let canon = path.canonicalize().ok();
        let dir = canon
            .as_ref()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        let mut cfg = Config::parse(&text, &shown, &dir)?;
        // Absolute, resolved now: a daemon changes its working directory before it mounts,
        // and `reload` without a path re-reads this file (issue 9 §10).
        if let Some(abs) = canon.or_else(|| std::path::absolute(path).ok()) {
            cfg.source = abs;
        }
        Ok(cfg)
    }

    /// Parses `text`; relative branch paths are resolved against `base`.
    pub fn parse(text: &str, shown: &str, base: &Path) -> Result<Config, ConfigError> {
        let cx = Ctx {
            text,
            path: shown.to_string(),
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| cx.line(s));
            ConfigError::At {
                path: shown.to_string(),
                line,
                msg: e.message().to_string(),
            }
        })?;
        if raw.branch.is_empty() {
            return Err(cx.err(0..0, "no [[branch]] defined"));
        }
        let g = raw.umbrella.as_ref().map(|s| s.get_ref());
        let branches = cx.branches(&raw.branch, g, base)?;
        let names = Names {
            cx: &cx,
            branches: &branches,
        };
        let globals = names.globals(g)?;
        let rules = raw
            .rule
            .iter()
            .enumerate()
            .map(|(i, r)| names.rule(i, r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Config {
            source: PathBuf::from(shown),
            rules: RuleSet {
                rules,
                default: globals.default,
                default_overflow: g.and_then(|g| g.default_overflow).unwrap_or(true),
            },
            errors: globals.errors,
            index: globals.index,
            min_free: globals.min_free,
            passthrough_headroom: globals.passthrough_headroom,
            enforce_interval: globals.enforce_interval,
            enforce_rate: globals.enforce_rate,
            branches,
        })
    }
}

/// The `[umbrella]` table, checked.
struct Globals {
    errors: ErrorMode,
    default: Vec<BranchId>,
    index: BranchId,
    min_free: Amount,
    passthrough_headroom: Option<Amount>,
    enforce_interval: Option<Duration>,
    enforce_rate: Option<u64>,
}

impl Ctx<'_> {
    /// A deadline (`branch_timeout`, a branch's `timeout`): 10 ms to 1 h.
    fn timeout(&self, s: &Spanned<String>, what: &str) -> Result<Duration, ConfigError> {
        parse_duration(s.get_ref())
            .filter(|d| *d >= Duration::from_millis(10) && *d <= Duration::from_secs(3600))
            .ok_or_else(|| {
                self.err(
                    s.span(),
                    format!("bad {what} '{}' (10ms to 1h, like \"3s\")", s.get_ref()),
                )
            })
    }

    /// The `[[branch]]` tables: names unique, paths directories that do not overlap.
    fn branches(
        &self,
        raw: &[Spanned<RawBranch>],
        g: Option<&RawGlobal>,
        base: &Path,
    ) -> Result<Vec<BranchConf>, ConfigError> {
        let branch_timeout = match g.and_then(|g| g.branch_timeout.as_ref()) {
            None => crate::exec::DEFAULT_TIMEOUT,
            Some(s) => self.timeout(s, "branch_timeout")?,
        };
        // Every branch path is resolved at once, each with its branch's deadline: a path
        // on a file system that stopped answering must not hang the loader (and with it
        // `cairn umbrella`, `reload` and `branch add`).
        let timeouts: Vec<Duration> = raw
            .iter()
            .map(|b| match &b.get_ref().timeout {
                None => Ok(branch_timeout),
                Some(t) => self.timeout(t, "timeout"),
            })
            .collect::<Result<_, _>>()?;
        let fulls: Vec<PathBuf> = raw
            .iter()
            .map(|b| {
                let p = b.get_ref().path.get_ref();
                if Path::new(p).is_absolute() {
                    PathBuf::from(p)
                } else {
                    base.join(p)
                }
            })
            .collect();
        let resolved = resolve_dirs(&fulls, &timeouts);
        let cx = self;
        let mut branches: Vec<BranchConf> = Vec::new();
        for (k, b) in raw.iter().enumerate() {
            let name = b.get_ref().name.get_ref();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(cx.err(b.get_ref().name.span(), format!("bad branch name '{name}'")));
            }
            if branches.iter().any(|x| &x.name == name) {
                return Err(cx.err(
                    b.get_ref().name.span(),
                    format!("branch '{name}' defined twice"),
                ));
            }
            let span = b.get_ref().path.span();
            let full = &fulls[k];
            let (canon, answered) = match &resolved[k] {
                Resolved::Dir(c) => (c.clone(), true),
                Resolved::NotDir(c) => {
                    return Err(cx.err(
                        span,
                        format!("branch '{name}': {} is not a directory", c.display()),
                    ));
                }
                Resolved::Failed(e) => {
                    return Err(cx.err(span, format!("branch '{name}': {}: {e}", full.display())));
                }
                // The kernel resolves it when the branch is opened by path later.
                Resolved::NoAnswer => (
                    std::path::absolute(full).unwrap_or_else(|_| full.clone()),
                    false,
                ),
            };
            if let Some(o) = branches.iter().find(|x| overlapping(&x.path, &canon)) {
                return Err(cx.err(
                    span,
                    format!(
                        "branch '{name}' ({}) overlaps branch '{}' ({}): one is inside the other",
                        canon.display(),
                        o.name,
                        o.path.display()
                    ),
                ));
            }
            branches.push(BranchConf {
                name: name.clone(),
                path: canon,
                answered,
                timeout: timeouts[k],
                isolate: b.get_ref().isolate,
            });
        }
        Ok(branches)
    }
}

/// Branch names resolved against the configuration's branches, for the global table and the
/// rules.
struct Names<'a> {
    cx: &'a Ctx<'a>,
    branches: &'a [BranchConf],
}

impl Names<'_> {
    fn find(&self, s: &Spanned<String>) -> Result<BranchId, ConfigError> {
        self.branches
            .iter()
            .position(|b| &b.name == s.get_ref())
            .ok_or_else(|| {
                self.cx
                    .err(s.span(), format!("unknown branch '{}'", s.get_ref()))
            })
    }

    /// A rule's (or the default's) ordered branch list: at least one, none twice.
    fn list(&self, v: &Spanned<Vec<Spanned<String>>>) -> Result<Vec<BranchId>, ConfigError> {
        if v.get_ref().is_empty() {
            return Err(self
                .cx
                .err(v.span(), "a rule must name at least one branch"));
        }
        let mut out = Vec::new();
        for s in v.get_ref() {
            let id = self.find(s)?;
            if out.contains(&id) {
                return Err(self
                    .cx
                    .err(s.span(), format!("branch '{}' listed twice", s.get_ref())));
            }
            out.push(id);
        }
        Ok(out)
    }

    fn globals(&self, g: Option<&RawGlobal>) -> Result<Globals, ConfigError> {
        let cx = self.cx;
        let errors = match g.and_then(|g| g.errors.as_ref()) {
            None => ErrorMode::Or,
            Some(s) => match s.get_ref().as_str() {
                "or" | "OR" => ErrorMode::Or,
                "and" | "AND" => ErrorMode::And,
                o => {
                    return Err(cx.err(
                        s.span(),
                        format!("errors must be \"or\" or \"and\", not \"{o}\""),
                    ));
                }
            },
        };
        let default = match g.and_then(|g| g.default.as_ref()) {
            None => vec![0],
            Some(d) => {
                let names = d.get_ref().list();
                let spanned: Vec<Spanned<String>> = names
                    .into_iter()
                    .map(|n| Spanned::new(d.span(), n))
                    .collect();
                self.list(&Spanned::new(d.span(), spanned))?
            }
        };
        let index = match g.and_then(|g| g.index.as_ref()) {
            None => 0,
            Some(s) => self.find(s)?,
        };
        let min_free = match g.and_then(|g| g.min_free.as_ref()) {
            None => Amount::Bytes(0),
            Some(s) => parse_amount(s.get_ref())
                .ok_or_else(|| cx.err(s.span(), format!("bad min_free '{}'", s.get_ref())))?,
        };
        let passthrough_headroom = match g.and_then(|g| g.passthrough_headroom.as_ref()) {
            None => None,
            Some(s) => Some(parse_amount(s.get_ref()).ok_or_else(|| {
                cx.err(
                    s.span(),
                    format!(
                        "bad passthrough_headroom '{}': bytes (\"1G\") or a share of the branch (\"10%\")",
                        s.get_ref()
                    ),
                )
            })?),
        };
        let enforce_interval = match g.and_then(|g| g.enforce_interval.as_ref()) {
            None => None,
            Some(s) => Some(
                parse_duration(s.get_ref())
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        cx.err(s.span(), format!("bad enforce_interval '{}'", s.get_ref()))
                    })?,
            ),
        };
        let enforce_rate =
            match g.and_then(|g| g.enforce_rate.as_ref()) {
                None => None,
                Some(s) => Some(parse_bytes(s.get_ref()).filter(|&n| n > 0).ok_or_else(|| {
                    cx.err(s.span(), format!("bad enforce_rate '{}'", s.get_ref()))
                })?),
            };
        Ok(Globals {
            errors,
            default,
            index,
            min_free,
            passthrough_headroom,
            enforce_interval,
            enforce_rate,
        })
    }

    /// One `[[rule]]`: a namespace rule, or metadata conditions with ordered branches.
    fn rule(&self, i: usize, r: &Spanned<RawRule>) -> Result<Rule, ConfigError> {
        let cx = self.cx;
        let span = r.span();
        let r = r.get_ref();
        let name = r.name.clone().unwrap_or_else(|| format!("rule {}", i + 1));
        if let Some(ns) = &r.namespace {
            return self.namespace_rule(name, span, r, ns);
        }
        let Some(bl) = &r.branches else {
            return Err(cx.err(span, format!("{name} names no branch (branches = [...])")));
        };
        let branches_ids = self.list(bl)?;
        let mut conds = self.file_conds(r)?;
        conds.extend(self.time_and_room_conds(r, span)?);
        Ok(Rule {
            name,
            body: RuleBody::Meta {
                conds,
                branches: branches_ids,
                overflow: r.overflow.unwrap_or(true),
            },
        })
    }

    /// A rule's conditions on the file itself: size, access, permission bits, owner,
    /// name, path and type.
    fn file_conds(&self, r: &RawRule) -> Result<Vec<Cond>, ConfigError> {
        let cx = self.cx;
        let mut conds = Vec::new();
        if let Some(s) = &r.size {
            let (cmp, rest) = parse_cmp(s.get_ref()).ok_or_else(|| {
                cx.err(
                    s.span(),
                    format!(
                        "size needs a comparison, like \"> 8K\", not '{}'",
                        s.get_ref()
                    ),
                )
            })?;
            let bytes =
                parse_bytes(rest).ok_or_else(|| cx.err(s.span(), format!("bad size '{rest}'")))?;
            let margin = match &r.size_margin {
                None => 0,
                Some(m) => parse_bytes(m.get_ref()).ok_or_else(|| {
                    cx.err(m.span(), format!("bad size_margin '{}'", m.get_ref()))
                })?,
            };
            conds.push(Cond::Size { cmp, bytes, margin });
        } else if let Some(m) = &r.size_margin {
            return Err(cx.err(m.span(), "size_margin without a size condition"));
        }
        if let Some(a) = &r.access {
            let t = match a.get_ref().as_str() {
                "read-only" | "readonly" | "ro" => AccessType::ReadOnly,
                "writable" | "rw" => AccessType::Writable,
                "executable" | "exec" => AccessType::Executable,
                o => {
                    return Err(cx.err(
                        a.span(),
                        format!("access must be read-only, writable or executable, not '{o}'"),
                    ));
                }
            };
            conds.push(Cond::Access(t));
        }
        if let Some(p) = &r.perm {
            let pp = p.get_ref();
            let (Some(mask), Some(value)) = (parse_octal(&pp.mask), parse_octal(&pp.value)) else {
                return Err(cx.err(
                    p.span(),
                    "perm mask and value are octal strings like \"0007\"",
                ));
            };
            conds.push(Cond::Perm {
                mask,
                value: value & mask,
            });
        }
        if let Some(u) = &r.uid {
            conds.push(Cond::Uid(u.list()));
        }
        if let Some(u) = &r.gid {
            conds.push(Cond::Gid(u.list()));
        }
        if let Some(s) = &r.suffix {
            conds.push(Cond::Suffix(
                s.list().into_iter().map(String::into_bytes).collect(),
            ));
        }
        if let Some(s) = &r.name_glob {
            conds.push(Cond::Name(
                s.list().into_iter().map(String::into_bytes).collect(),
            ));
        }
        if let Some(s) = &r.path {
            conds.push(Cond::Path(
                s.list().into_iter().map(String::into_bytes).collect(),
            ));
        }
        if let Some(k) = &r.kind {
            let mut kinds = Vec::new();
            for s in k.get_ref().list() {
                kinds.push(
                    parse_kind(&s)
                        .ok_or_else(|| cx.err(k.span(), format!("unknown file type '{s}'")))?,
                );
            }
            conds.push(Cond::Kind(kinds));
        }
        Ok(conds)
    }

    /// A rule's conditions on time (ages with their margin) and on room (a branch's free
    /// space).
    fn time_and_room_conds(
        &self,
        r: &RawRule,
        span: std::ops::Range<usize>,
    ) -> Result<Vec<Cond>, ConfigError> {
        let cx = self.cx;
        let mut conds = Vec::new();
        let margin = match &r.age_margin {
            None => Duration::ZERO,
            Some(m) => parse_duration(m.get_ref())
                .ok_or_else(|| cx.err(m.span(), format!("bad age_margin '{}'", m.get_ref())))?,
        };
        for (field, v) in [
            (TimeField::Mtime, &r.mtime),
            (TimeField::Atime, &r.atime),
            (TimeField::Ctime, &r.ctime),
        ] {
            if let Some(s) = v {
                let (cmp, rest) = parse_cmp(s.get_ref()).ok_or_else(|| {
                    cx.err(
                        s.span(),
                        format!(
                            "an age needs a comparison, like \"> 30d\", not '{}'",
                            s.get_ref()
                        ),
                    )
                })?;
                let age = parse_duration(rest)
                    .ok_or_else(|| cx.err(s.span(), format!("bad age '{rest}'")))?;
                conds.push(Cond::Age {
                    field,
                    cmp,
                    age,
                    margin,
                });
            }
        }
        if r.age_margin.is_some() && r.mtime.is_none() && r.atime.is_none() && r.ctime.is_none() {
            return Err(cx.err(span, "age_margin without an mtime/atime/ctime condition"));
        }
        if let Some(s) = &r.free {
            let (cmp, rest) = parse_cmp(s.get_ref()).ok_or_else(|| {
                cx.err(
                    s.span(),
                    format!(
                        "free needs a comparison, like \"> 10%\", not '{}'",
                        s.get_ref()
                    ),
                )
            })?;
            let amount = parse_amount(rest)
                .ok_or_else(|| cx.err(s.span(), format!("bad amount '{rest}'")))?;
            let branch = match &r.free_branch {
                None => None,
                Some(b) => Some(self.find(b)?),
            };
            conds.push(Cond::Free {
                branch,
                cmp,
                amount,
            });
        } else if let Some(b) = &r.free_branch {
            return Err(cx.err(b.span(), "free_branch without a free condition"));
        }
        Ok(conds)
    }

    /// A namespace rule: only `namespace` entries, each a pattern from `/` with its own
    /// branches.
    fn namespace_rule(
        &self,
        name: String,
        span: std::ops::Range<usize>,
        r: &RawRule,
        ns: &[Spanned<RawNs>],
    ) -> Result<Rule, ConfigError> {
        let cx = self.cx;
        let has_cond = r.branches.is_some()
            || r.size.is_some()
            || r.access.is_some()
            || r.perm.is_some()
            || r.uid.is_some()
            || r.gid.is_some()
            || r.suffix.is_some()
            || r.name_glob.is_some()
            || r.path.is_some()
            || r.kind.is_some()
            || r.mtime.is_some()
            || r.atime.is_some()
            || r.ctime.is_some()
            || r.free.is_some()
            || r.overflow.is_some();
        if has_cond {
            return Err(cx.err(
                span,
                "a namespace rule holds only `namespace` entries (each with its own branches)",
            ));
        }
        if ns.is_empty() {
            return Err(cx.err(span, "empty namespace rule"));
        }
        let mut entries = Vec::new();
        for e in ns {
            let ee = e.get_ref();
            if !ee.pattern.starts_with('/') {
                return Err(cx.err(
                    e.span(),
                    format!("namespace pattern '{}' must start with /", ee.pattern),
                ));
            }
            entries.push(NsEntry {
                pattern: ee.pattern.as_bytes().to_vec(),
                branches: self.list(&ee.branches)?,
                overflow: ee.overflow.unwrap_or(true),
            });
        }
        Ok(Rule {
            name,
            body: RuleBody::Namespace(entries),
        })
    }
}

impl RuleSet {
    /// The same rules with every branch id passed through `f` (config ids to live ids).
    pub fn remap(&self, f: &dyn Fn(BranchId) -> BranchId) -> RuleSet {
        let map = |v: &Vec<BranchId>| v.iter().map(|&b| f(b)).collect::<Vec<_>>();
        RuleSet {
            rules: self
                .rules
                .iter()
                .map(|r| Rule {
                    name: r.name.clone(),
                    body: match &r.body {
                        RuleBody::Meta {
                            conds,
                            branches,
                            overflow,
                        } => RuleBody::Meta {
                            conds: conds
                                .iter()
                                .map(|c| match c {
                                    Cond::Free {
                                        branch,
                                        cmp,
                                        amount,
                                    } => Cond::Free {
                                        branch: branch.map(f),
                                        cmp: *cmp,
                                        amount: *amount,
                                    },
                                    c => c.clone(),
                                })
                                .collect(),
                            branches: map(branches),
                            overflow: *overflow,
                        },
                        RuleBody::Namespace(e) => RuleBody::Namespace(
                            e.iter()
                                .map(|e| NsEntry {
                                    pattern: e.pattern.clone(),
                                    branches: map(&e.branches),
                                    overflow: e.overflow,
                                })
                                .collect(),
                        ),
                    },
                })
                .collect(),
            default: map(&self.default),
            default_overflow: self.default_overflow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(names: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for n in names {
            std::fs::create_dir_all(d.path().join(n)).unwrap();
        }
        d
    }

    fn parse(d: &tempfile::TempDir, text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "test.toml", d.path())
    }

    #[test]
    fn the_shipped_fig4_example_is_fig4() {
        let text = include_str!("../../../examples/umbrella-fig4.toml");
        let d = dirs(&["fs1", "fs2", "fs3"]);
        let c = parse(&d, text).unwrap();
        assert_eq!(
            c.branches
                .iter()
                .map(|b| b.name.as_str())
                .collect::<Vec<_>>(),
            ["fs1", "fs2", "fs3"]
        );
        assert_eq!(
            c.branches[1].path,
            d.path().join("fs2").canonicalize().unwrap()
        );
        // Same rule set as the hand-built one in rules.rs, names aside.
        let mut want = crate::rules::tests::fig4();
        for (w, g) in want.rules.iter_mut().zip(&c.rules.rules) {
            w.name = g.name.clone();
        }
        assert_eq!(c.rules, want);
        assert_eq!(c.errors, ErrorMode::Or);
    }

    #[test]
    fn the_shipped_two_tier_example_parses() {
        let text = include_str!("../../../examples/umbrella-two-tier.toml");
        let d = dirs(&["fast", "slow"]);
        let c = parse(&d, text).unwrap();
        assert_eq!(c.rules.rules.len(), 3);
        assert_eq!(c.errors, ErrorMode::And);
        assert_eq!(c.rules.default, vec![1, 0]);
        let RuleBody::Meta { conds, .. } = &c.rules.rules[0].body else {
            panic!()
        };
        assert_eq!(
            conds,
            &vec![Cond::Size {
                cmp: Cmp::Gt,
                bytes: 64 << 20,
                margin: 8 << 20
            }]
        );
    }

    #[test]
    fn the_shipped_disconnected_example_parses() {
        let text = include_str!("../../../examples/umbrella-disconnected.toml");
        let d = dirs(&["local", "cluster/home"]);
        let text = text.replace(
            "/mnt/cluster/home",
            &d.path().join("cluster/home").display().to_string(),
        );
        let c = parse(&d, &text).unwrap();
        assert_eq!(c.errors, ErrorMode::And);
        assert_eq!(c.branches[0].timeout, Duration::from_secs(3));
        assert_eq!(c.branches[1].timeout, Duration::from_secs(5));
        assert_eq!(c.branches[1].isolate, Some(true));
        assert_eq!(c.branches[0].isolate, None);
        assert_eq!(c.rules.rules.len(), 2);
    }

    #[test]
    fn deadlines_parse_and_bad_ones_name_the_line() {
        let d = dirs(&["a"]);
        let c = parse(
            &d,
            "[umbrella]\nbranch_timeout = \"750ms\"\n[[branch]]\nname = \"a\"\npath = \"a\"\n",
        )
        .unwrap();
        assert_eq!(c.branches[0].timeout, Duration::from_millis(750));
        let e = err_of(
            &d,
            "[umbrella]\nbranch_timeout = \"0s\"\n[[branch]]\nname = \"a\"\npath = \"a\"\n",
        );
        assert!(
            e.starts_with("test.toml:2:") && e.contains("branch_timeout"),
            "{e}"
        );
        let e = err_of(
            &d,
            "[[branch]]\nname = \"a\"\npath = \"a\"\ntimeout = \"soon\"\n",
        );
        assert!(
            e.starts_with("test.toml:4:") && e.contains("timeout"),
            "{e}"
        );
    }

    /// Every TOML block of the README is a shipped example, byte for byte, and the two-tier
    /// one is shown: they cannot drift apart.
    #[test]
    fn the_readme_shows_the_shipped_examples_verbatim() {
        let readme = include_str!("../../../README.md");
        let examples = [
            include_str!("../../../examples/umbrella-two-tier.toml"),
            include_str!("../../../examples/umbrella-fig4.toml"),
        ];
        let blocks: Vec<String> = readme
            .split("```toml\n")
            .skip(1)
            .map(|b| format!("{}\n", b.split("\n```").next().unwrap_or_default()))
            .collect();
        assert!(!blocks.is_empty(), "no TOML block in the README");
        for b in &blocks {
            assert!(
                examples.contains(&b.as_str()),
                "a README TOML block is not a shipped example:\n{b}"
            );
        }
        assert!(
            blocks.iter().any(|b| b == examples[0]),
            "the two-tier example is not shown"
        );
    }

    #[test]
    fn conditions_parse() {
        let d = dirs(&["fast", "slow"]);
        let c = parse(
            &d,
            r#"
[umbrella]
errors = "and"
default = ["fast", "slow"]
min_free = "5%"
passthrough_headroom = "2G"
enforce_interval = "1h"
enforce_rate = "50M"
[[branch]]
name = "fast"
path = "fast"
[[branch]]
name = "slow"
path = "slow"
[[rule]]
name = "big"
size = "> 8K"
size_margin = "1K"
uid = [1000, 1001]
suffix = ".avi"
type = "file"
branches = ["slow"]
overflow = false
[[rule]]
mtime = ">= 30d"
age_margin = "2d"
perm = { mask = "0222", value = "0" }
free = "> 10%"
free_branch = "fast"
branches = ["slow", "fast"]
"#,
        )
        .unwrap();
        assert_eq!(c.errors, ErrorMode::And);
        assert_eq!(c.rules.default, vec![0, 1]);
        assert_eq!(c.min_free, Amount::Percent(5.0));
        assert_eq!(c.passthrough_headroom, Some(Amount::Bytes(2 << 30)));
        let bad = parse(
            &d,
            "[umbrella]\npassthrough_headroom = \"lots\"\n[[branch]]\nname = \"fast\"\npath = \"fast\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains(":2: bad passthrough_headroom 'lots'"), "{bad}");
        assert_eq!(c.enforce_interval, Some(Duration::from_secs(3600)));
        assert_eq!(c.enforce_rate, Some(50 << 20));
        let RuleBody::Meta {
            conds,
            branches,
            overflow,
        } = &c.rules.rules[0].body
        else {
            panic!()
        };
        assert_eq!(branches, &vec![1]);
        assert!(!overflow);
        assert!(conds.contains(&Cond::Size {
            cmp: Cmp::Gt,
            bytes: 8192,
            margin: 1024
        }));
        assert!(conds.contains(&Cond::Uid(vec![1000, 1001])));
        let RuleBody::Meta { conds, .. } = &c.rules.rules[1].body else {
            panic!()
        };
        assert!(conds.contains(&Cond::Age {
            field: TimeField::Mtime,
            cmp: Cmp::Ge,
            age: Duration::from_secs(30 * 86400),
            margin: Duration::from_secs(2 * 86400)
        }));
        assert!(conds.contains(&Cond::Free {
            branch: Some(0),
            cmp: Cmp::Gt,
            amount: Amount::Percent(10.0)
        }));
        assert!(conds.contains(&Cond::Perm {
            mask: 0o222,
            value: 0
        }));
    }

    fn err_of(d: &tempfile::TempDir, text: &str) -> String {
        parse(d, text).unwrap_err().to_string()
    }

    #[test]
    fn bad_configs_name_the_line() {
        let d = dirs(&["a", "b", "a/inner"]);
        let head = "[[branch]]\nname = \"a\"\npath = \"a\"\n";
        // Unknown key.
        let e = err_of(
            &d,
            &format!("{head}[[rule]]\nbranches = [\"a\"]\nsise = \"> 1K\"\n"),
        );
        assert!(
            e.starts_with("test.toml:4:") || e.starts_with("test.toml:6:"),
            "{e}"
        );
        assert!(e.contains("sise"), "{e}");
        // Missing branch directory.
        let e = err_of(&d, "[[branch]]\nname = \"x\"\npath = \"missing\"\n");
        assert!(e.starts_with("test.toml:3:"), "{e}");
        // A rule naming no branch.
        let e = err_of(&d, &format!("{head}[[rule]]\nsize = \"> 1K\"\n"));
        assert!(
            e.starts_with("test.toml:4:") && e.contains("names no branch"),
            "{e}"
        );
        let e = err_of(
            &d,
            &format!("{head}[[rule]]\nsize = \"> 1K\"\nbranches = []\n"),
        );
        assert!(
            e.starts_with("test.toml:6:") && e.contains("at least one branch"),
            "{e}"
        );
        // Unknown branch in a rule.
        let e = err_of(&d, &format!("{head}[[rule]]\nbranches = [\"zz\"]\n"));
        assert!(
            e.starts_with("test.toml:5:") && e.contains("unknown branch 'zz'"),
            "{e}"
        );
        // Overlapping branches.
        let e = err_of(
            &d,
            &format!("{head}[[branch]]\nname = \"i\"\npath = \"a/inner\"\n"),
        );
        assert!(
            e.starts_with("test.toml:6:") && e.contains("overlaps"),
            "{e}"
        );
        // Syntax error.
        let e = err_of(&d, &format!("{head}[[rule]\n"));
        assert!(e.starts_with("test.toml:4:"), "{e}");
        // Bad values.
        let e = err_of(
            &d,
            &format!("{head}[[rule]]\nbranches = [\"a\"]\nsize = \"8K\"\n"),
        );
        assert!(
            e.starts_with("test.toml:6:") && e.contains("comparison"),
            "{e}"
        );
        let e = err_of(&d, &format!("{head}[umbrella]\nerrors = \"xor\"\n"));
        assert!(e.starts_with("test.toml:5:"), "{e}");
        let e = err_of(&d, "");
        assert!(e.contains("no [[branch]]"), "{e}");
        let e = err_of(
            &d,
            &format!("{head}[[branch]]\nname = \"a\"\npath = \"b\"\n"),
        );
        assert!(e.contains("defined twice"), "{e}");
        let e = err_of(
            &d,
            &format!(
                "{head}[[rule]]\nbranches = [\"a\"]\nnamespace = [{{ match = \"/x\", branches = [\"a\"] }}]\n"
            ),
        );
        assert!(e.contains("namespace rule holds only"), "{e}");
    }

    #[test]
    fn units() {
        assert_eq!(parse_bytes("8K"), Some(8192));
        assert_eq!(parse_bytes("1.5M"), Some(3 << 19));
        assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_duration("30d"), Some(Duration::from_secs(30 * 86400)));
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("3y"), None);
        assert_eq!(parse_amount("10%"), Some(Amount::Percent(10.0)));
        assert_eq!(parse_amount("110%"), None);
    }
}
