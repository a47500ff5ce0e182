//! The policy decision module (UmbrellaFS §2.2): which branches a file belongs on.
//!
//! Pure: no I/O. The caller hands in the facts of one file ([`Facts`]) and a view of the
//! branches ([`BranchView`]: which are usable, how much room they have) and gets a
//! [`Decision`] back: the rule that matched and the ordered branch list it names.
//!
//! Evaluation follows the paper:
//! - metadata rules are tried in order and the first match wins;
//! - a namespace rule sits in that ordered list as one rule; when it is reached, its entries
//!   are compared against the path and the entry with the **longest overall match** wins
//!   (the count of literal pattern characters that matched, not just the longest prefix).
//!   Ties go to the entry listed first. If no entry matches, evaluation continues with the
//!   next rule;
//! - a rule whose first-choice branch is unavailable is inactive and skipped (§5.4); so is a
//!   namespace entry whose first choice is unavailable;
//! - nothing matching gives the default branch list.
//!
//! Beyond the paper (its §4.5 and §7 future work): conditions on branch state (free space),
//! and hysteresis on size and age thresholds. Hysteresis is a bias toward the file's current
//! placement: a threshold condition of a rule that already holds the file (its current
//! branch is one the rule names) is relaxed by the margin, and one of a rule that does not
//! hold it is tightened by the margin. A file therefore changes side only after crossing the
//! threshold by the margin, and the 7.5–8.5 KiB oscillation of §4.5 does not move it.

use std::time::{Duration, SystemTime};

use cairn_vfs::FileKind;

/// Index of a branch in the configuration's branch table.
pub type BranchId = usize;

/// A comparison in a size, age or free-space condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Cmp {
    fn holds(self, a: u128, b: u128) -> bool {
        match self {
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }

    /// The threshold after hysteresis: `inside` means the file currently sits where the
    /// rule puts it, so the condition should be easier to keep satisfied.
    fn biased(self, threshold: u128, margin: u128, inside: bool) -> u128 {
        let loosen_up = matches!(self, Cmp::Lt | Cmp::Le);
        match (loosen_up, inside) {
            // `x > T` stays true down to T - m once inside; needs T + m to get in.
            (false, true) | (true, false) => threshold.saturating_sub(margin),
            (false, false) | (true, true) => threshold.saturating_add(margin),
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
            Cmp::Eq => "=",
            Cmp::Ne => "!=",
        }
    }
}

/// The paper's "access type" attribute, read from the permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessType {
    /// No write bit for anybody (the paper's "read only").
    ReadOnly,
    /// At least one write bit.
    Writable,
    /// At least one execute bit.
    Executable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeField {
    Atime,
    Mtime,
    Ctime,
}

/// An amount of free space: bytes or a percentage of the branch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Bytes(u64),
    Percent(f64),
}

/// One condition of a metadata rule; a rule matches when all of its conditions hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Cond {
    Size {
        cmp: Cmp,
        bytes: u64,
        margin: u64,
    },
    Access(AccessType),
    /// `mode & mask == value` on the permission bits.
    Perm {
        mask: u32,
        value: u32,
    },
    Uid(Vec<u32>),
    Gid(Vec<u32>),
    /// The name ends with one of these.
    Suffix(Vec<Vec<u8>>),
    /// The name (last component) matches one of these globs.
    Name(Vec<Vec<u8>>),
    /// The whole path matches one of these globs (no longest-match: a plain condition).
    Path(Vec<Vec<u8>>),
    Kind(Vec<FileKind>),
    /// `now - field` compared with `age`.
    Age {
        field: TimeField,
        cmp: Cmp,
        age: Duration,
        margin: Duration,
    },
    /// Free space of a branch (the rule's first choice when `branch` is None).
    Free {
        branch: Option<BranchId>,
        cmp: Cmp,
        amount: Amount,
    },
}

/// One entry of a namespace rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsEntry {
    pub pattern: Vec<u8>,
    pub branches: Vec<BranchId>,
    pub overflow: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum RuleBody {
    Meta {
        conds: Vec<Cond>,
        branches: Vec<BranchId>,
        overflow: bool,
    },
    Namespace(Vec<NsEntry>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// A name for status output ("rule 1", or the config's `name`).
    pub name: String,
    pub body: RuleBody,
}

/// The whole policy: ordered rules and the default.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
    pub default: Vec<BranchId>,
    pub default_overflow: bool,
}

/// Which rule produced a decision. Namespace entries are `(rule, entry)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuleRef {
    Rule(usize),
    Entry(usize, usize),
    Default,
}

/// The outcome: the rule and its ordered candidates (the first with room is used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub rule: RuleRef,
    pub branches: Vec<BranchId>,
    /// False: only the first branch may hold the file; if it is full the answer is ENOSPC.
    pub overflow: bool,
}

impl Decision {
    /// The branches a file may be placed on, in order of preference.
    pub fn candidates(&self) -> &[BranchId] {
        if self.overflow {
            &self.branches
        } else {
            &self.branches[..self.branches.len().min(1)]
        }
    }
}

/// What the rules may know about a file.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The path in the unified namespace, starting with `/`.
    pub path: &'a [u8],
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (mode & 0o7777).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// The branch holding the file now (None at create): the anchor of hysteresis.
    pub current: Option<BranchId>,
}

impl<'a> Facts<'a> {
    /// The facts of an existing file at `path` on branch `current`, from its attributes.
    pub fn of(path: &'a [u8], a: &cairn_vfs::Attr, current: BranchId) -> Facts<'a> {
        Facts {
            path,
            kind: a.kind,
            size: a.size,
            perm: a.perm as u32,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            current: Some(current),
        }
    }

    fn name(&self) -> &[u8] {
        match self.path.iter().rposition(|&b| b == b'/') {
            Some(i) => &self.path[i + 1..],
            None => self.path,
        }
    }
}

/// The state of the branches as the rules see it.
pub trait BranchView {
    /// Usable now (present, not failed, not removed).
    fn active(&self, b: BranchId) -> bool;
    /// (free bytes available to us, total bytes).
    fn space(&self, b: BranchId) -> Option<(u64, u64)>;
}

impl RuleSet {
    fn rule_active(branches: &[BranchId], view: &dyn BranchView) -> bool {
        branches.first().is_some_and(|&b| view.active(b))
    }

    /// Evaluates the rules for one file.
    pub fn evaluate(&self, f: &Facts<'_>, view: &dyn BranchView, now: SystemTime) -> Decision {
        for (i, rule) in self.rules.iter().enumerate() {
            match &rule.body {
                RuleBody::Meta {
                    conds,
                    branches,
                    overflow,
                } => {
                    if !Self::rule_active(branches, view) {
                        continue;
                    }
                    let inside = f.current.is_some_and(|c| branches.contains(&c));
                    if conds
                        .iter()
                        .all(|c| cond_holds(c, f, view, now, inside, branches))
                    {
                        return Decision {
                            rule: RuleRef::Rule(i),
                            branches: branches.clone(),
                            overflow: *overflow,
                        };
                    }
                }
                RuleBody::Namespace(entries) => {
                    let mut best: Option<(usize, usize)> = None;
                    for (j, e) in entries.iter().enumerate() {
                        if !Self::rule_active(&e.branches, view) {
                            continue;
                        }
                        if let Some(score) = glob_score(&e.pattern, f.path)
                            && best.is_none_or(|(_, s)| score > s)
                        {
                            best = Some((j, score));
                        }
                    }
                    if let Some((j, _)) = best {
                        let e = &entries[j];
                        return Decision {
                            rule: RuleRef::Entry(i, j),
                            branches: e.branches.clone(),
                            overflow: e.overflow,
                        };
                    }
                }
            }
        }
        Decision {
            rule: RuleRef::Default,
            branches: self.default.clone(),
            overflow: self.default_overflow,
        }
    }

    /// Human name of a rule reference.
    pub fn describe(&self, r: RuleRef) -> String {
        match r {
            RuleRef::Default => "default".into(),
            RuleRef::Rule(i) => self.rules.get(i).map_or("?".into(), |r| r.name.clone()),
            RuleRef::Entry(i, j) => match self.rules.get(i).map(|r| &r.body) {
                Some(RuleBody::Namespace(e)) => format!(
                    "{} entry {} ({})",
                    self.rules[i].name,
                    j + 1,
                    e.get(j)
                        .map_or("?".into(), |e| String::from_utf8_lossy(&e.pattern)
                            .into_owned())
                ),
                _ => "?".into(),
            },
        }
    }

    /// Every rule reference, in order (for hit-count tables).
    pub fn refs(&self) -> Vec<RuleRef> {
        let mut v = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            match &r.body {
                RuleBody::Meta { .. } => v.push(RuleRef::Rule(i)),
                RuleBody::Namespace(e) => v.extend((0..e.len()).map(|j| RuleRef::Entry(i, j))),
            }
        }
        v.push(RuleRef::Default);
        v
    }

    /// Is the rule (or entry) active under `view`? Inactive ones are skipped.
    pub fn is_active(&self, r: RuleRef, view: &dyn BranchView) -> bool {
        match r {
            RuleRef::Default => true,
            RuleRef::Rule(i) => match self.rules.get(i).map(|r| &r.body) {
                Some(RuleBody::Meta { branches, .. }) => Self::rule_active(branches, view),
                _ => false,
            },
            RuleRef::Entry(i, j) => match self.rules.get(i).map(|r| &r.body) {
                Some(RuleBody::Namespace(e)) => e
                    .get(j)
                    .is_some_and(|e| Self::rule_active(&e.branches, view)),
                _ => false,
            },
        }
    }

    /// Does any rule look at times (so only the enforcer can act on it)?
    pub fn uses_time(&self) -> bool {
        self.rules.iter().any(|r| match &r.body {
            RuleBody::Meta { conds, .. } => conds.iter().any(|c| matches!(c, Cond::Age { .. })),
            RuleBody::Namespace(_) => false,
        })
    }
}

fn age_of(now: SystemTime, t: SystemTime) -> u128 {
    now.duration_since(t).unwrap_or(Duration::ZERO).as_nanos()
}

fn cond_holds(
    c: &Cond,
    f: &Facts<'_>,
    view: &dyn BranchView,
    now: SystemTime,
    inside: bool,
    branches: &[BranchId],
) -> bool {
    match c {
        Cond::Size { cmp, bytes, margin } => {
            let t = if f.current.is_some() {
                cmp.biased(*bytes as u128, *margin as u128, inside)
            } else {
                *bytes as u128
            };
            cmp.holds(f.size as u128, t)
        }
        Cond::Access(AccessType::ReadOnly) => f.perm & 0o222 == 0,
        Cond::Access(AccessType::Writable) => f.perm & 0o222 != 0,
        Cond::Access(AccessType::Executable) => f.perm & 0o111 != 0,
        Cond::Perm { mask, value } => f.perm & mask == *value,
        Cond::Uid(v) => v.contains(&f.uid),
        Cond::Gid(v) => v.contains(&f.gid),
        Cond::Suffix(v) => v.iter().any(|s| f.name().ends_with(s)),
        Cond::Name(v) => v.iter().any(|g| glob_score(g, f.name()).is_some()),
        Cond::Path(v) => v.iter().any(|g| glob_score(g, f.path).is_some()),
        Cond::Kind(v) => v.contains(&f.kind),
        Cond::Age {
            field,
            cmp,
            age,
            margin,
        } => {
            let t = match field {
                TimeField::Atime => f.atime,
                TimeField::Mtime => f.mtime,
                TimeField::Ctime => f.ctime,
            };
            let thr = if f.current.is_some() {
                cmp.biased(age.as_nanos(), margin.as_nanos(), inside)
            } else {
                age.as_nanos()
            };
            cmp.holds(age_of(now, t), thr)
        }
        Cond::Free {
            branch,
            cmp,
            amount,
        } => {
            let Some(b) = branch.or_else(|| branches.first().copied()) else {
                return false;
            };
            let Some((free, total)) = view.space(b) else {
                return false;
            };
            match amount {
                Amount::Bytes(n) => cmp.holds(free as u128, *n as u128),
                Amount::Percent(p) => {
                    // Compare in hundredths of a percent to stay in integers.
                    let have = if total == 0 {
                        0
                    } else {
                        (free as u128 * 10_000) / total as u128
                    };
                    cmp.holds(have, (p * 100.0).round() as u128)
                }
            }
        }
    }
}

/// Matches `text` against a glob (`*` any run of bytes including `/`, `?` one byte,
/// `[...]` a class with ranges and `!`/`^` negation, `\` escapes). On a match returns the
/// number of literal pattern characters (classes count one): the "length of the match" used
/// to rank namespace entries.
pub fn glob_score(pat: &[u8], text: &[u8]) -> Option<usize> {
    if glob_match(pat, text) {
        Some(literal_len(pat))
    } else {
        None
    }
}

fn literal_len(pat: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < pat.len() {
        match pat[i] {
            b'*' | b'?' => i += 1,
            b'[' => {
                i = class_end(pat, i).map_or(i + 1, |e| e + 1);
                n += 1;
            }
            b'\\' if i + 1 < pat.len() => {
                n += 1;
                i += 2;
            }
            _ => {
                n += 1;
                i += 1;
            }
        }
    }
    n
}

/// Index of the `]` closing the class opened at `start`, if the class is well formed.
fn class_end(pat: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    if i < pat.len() && (pat[i] == b'!' || pat[i] == b'^') {
        i += 1;
    }
    if i < pat.len() && pat[i] == b']' {
        i += 1;
    }
    while i < pat.len() {
        if pat[i] == b']' {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn class_matches(class: &[u8], c: u8) -> bool {
    let (neg, body) = match class.first() {
        Some(b'!') | Some(b'^') => (true, &class[1..]),
        _ => (false, class),
    };
    let mut hit = false;
    let mut i = 0;
    while i < body.len() {
        if i + 2 < body.len() && body[i + 1] == b'-' {
            hit |= body[i] <= c && c <= body[i + 2];
            i += 3;
        } else {
            hit |= body[i] == c;
            i += 1;
        }
    }
    hit != neg
}

/// Iterative glob matching with single-star backtracking (linear in practice, never
/// exponential).
pub fn glob_match(pat: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some(e) = class_end(pat, p) {
                        if class_matches(&pat[p + 1..e], text[t]) {
                            p = e + 1;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == b'[' {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pat.len() => {
                    if pat[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                p = sp + 1;
                t = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while p < pat.len() && pat[p] == b'*' {
        p += 1;
    }
    p == pat.len()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    struct View {
        active: Vec<bool>,
        space: Vec<(u64, u64)>,
    }
    impl BranchView for View {
        fn active(&self, b: BranchId) -> bool {
            self.active.get(b).copied().unwrap_or(false)
        }
        fn space(&self, b: BranchId) -> Option<(u64, u64)> {
            self.space.get(b).copied()
        }
    }
    fn all_up(n: usize) -> View {
        View {
            active: vec![true; n],
            space: vec![(1 << 30, 2 << 30); n],
        }
    }

    fn facts(path: &str, perm: u32, size: u64) -> Facts<'_> {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        Facts {
            path: path.as_bytes(),
            kind: FileKind::RegularFile,
            size,
            perm,
            uid: 1000,
            gid: 1000,
            atime: t,
            mtime: t,
            ctime: t,
            current: None,
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_100)
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"/home/dave/*", b"/home/dave/a/b.txt"));
        assert!(glob_match(b"/home/dave/*.avi", b"/home/dave/x/y.avi"));
        assert!(!glob_match(b"/home/dave/*.avi", b"/home/dave/y.avi.txt"));
        assert!(glob_match(b"/*", b"/anything"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(!glob_match(b"a?c", b"ac"));
        assert!(glob_match(b"[a-c]x", b"bx"));
        assert!(!glob_match(b"[!a-c]x", b"bx"));
        assert!(glob_match(b"\\*", b"*"));
        assert!(!glob_match(b"\\*", b"x"));
        assert!(glob_match(b"*a*b*c", b"xxaxxbxxc"));
        assert!(!glob_match(b"*a*b*c", b"xxaxxcxxb"));
        assert_eq!(literal_len(b"/home/dave/*"), 11);
        assert_eq!(literal_len(b"/home/dave/*.avi"), 15);
        assert_eq!(literal_len(b"/*"), 1);
        // A pathological pattern must not take exponential time.
        let text = vec![b'a'; 10_000];
        assert!(!glob_match(b"*a*a*a*a*a*a*a*a*b", &text));
    }

    /// Fig. 4 of the paper, built by hand (the config test builds it from the TOML example).
    /// Branches: 0 = /fs1 (magnetic), 1 = /fs2 (flash), 2 = /fs3 (encrypted).
    pub(crate) fn fig4() -> RuleSet {
        RuleSet {
            rules: vec![
                Rule {
                    name: "rule 1".into(),
                    body: RuleBody::Meta {
                        conds: vec![Cond::Access(AccessType::ReadOnly)],
                        branches: vec![1, 0],
                        overflow: true,
                    },
                },
                Rule {
                    name: "rule 2".into(),
                    body: RuleBody::Namespace(vec![
                        NsEntry {
                            pattern: b"/home/dave/*".to_vec(),
                            branches: vec![2],
                            overflow: true,
                        },
                        NsEntry {
                            pattern: b"/home/dave/*.avi".to_vec(),
                            branches: vec![0, 2],
                            overflow: true,
                        },
                        NsEntry {
                            pattern: b"/*".to_vec(),
                            branches: vec![0],
                            overflow: true,
                        },
                    ]),
                },
            ],
            default: vec![0],
            default_overflow: true,
        }
    }

    #[test]
    fn fig4_decisions_stated_in_the_paper() {
        let rs = fig4();
        let v = all_up(3);
        // "if user Dave creates a read only .avi file in his home directory, it will be
        // placed on /fs2 since rule 1 is applied before the filename rules are examined."
        let d = rs.evaluate(&facts("/home/dave/movie.avi", 0o444, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Rule(0));
        assert_eq!(d.branches, vec![1, 0]);
        // "all of user Dave's files should be placed on the encrypted device, /fs3."
        let d = rs.evaluate(&facts("/home/dave/notes.txt", 0o644, 0), &v, now());
        assert_eq!(
            (d.rule, d.branches.clone()),
            (RuleRef::Entry(1, 0), vec![2])
        );
        let d = rs.evaluate(&facts("/home/dave/deep/er/notes.txt", 0o644, 0), &v, now());
        assert_eq!(d.branches, vec![2]);
        // "The exception is .avi files which should be placed preferably on /fs1 ... and
        // then on /fs3": the longest overall match, not the longest prefix.
        let d = rs.evaluate(&facts("/home/dave/movie.avi", 0o644, 0), &v, now());
        assert_eq!(
            (d.rule, d.branches.clone()),
            (RuleRef::Entry(1, 1), vec![0, 2])
        );
        // "Finally, all other files should be directed to /fs1."
        let d = rs.evaluate(&facts("/home/alice/movie.avi", 0o644, 0), &v, now());
        assert_eq!(
            (d.rule, d.branches.clone()),
            (RuleRef::Entry(1, 2), vec![0])
        );
        // Read-only files anywhere go to flash first, then the magnetic disk.
        let d = rs.evaluate(&facts("/etc/motd", 0o444, 0), &v, now());
        assert_eq!(d.candidates(), &[1, 0]);
        // Rules 2.1 and 2.3 allow one choice only.
        let d = rs.evaluate(&facts("/home/dave/notes.txt", 0o644, 0), &v, now());
        assert_eq!(d.candidates(), &[2]);
    }

    #[test]
    fn inactive_rules_are_skipped_and_default_applies() {
        let rs = fig4();
        // /fs2 gone: rule 1 is inactive; the read-only .avi falls to rule 2.
        let v = View {
            active: vec![true, false, true],
            space: vec![(1, 2); 3],
        };
        let d = rs.evaluate(&facts("/home/dave/movie.avi", 0o444, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Entry(1, 1));
        // /fs3 gone: Dave's text file no longer matches 2.1; the next-longest active entry
        // (/*) applies.
        let v = View {
            active: vec![true, true, false],
            space: vec![(1, 2); 3],
        };
        let d = rs.evaluate(&facts("/home/dave/notes.txt", 0o644, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Entry(1, 2));
        // /fs1 gone: entries 2.2 and 2.3 are inactive, nothing else matches /etc/x: default.
        let v = View {
            active: vec![false, true, true],
            space: vec![(1, 2); 3],
        };
        let d = rs.evaluate(&facts("/etc/x", 0o644, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Default);
        assert!(rs.is_active(RuleRef::Rule(0), &v));
        assert!(!rs.is_active(RuleRef::Entry(1, 1), &v));
    }

    #[test]
    fn longest_match_ties_go_to_the_first_listed() {
        let rs = RuleSet {
            rules: vec![Rule {
                name: "ns".into(),
                body: RuleBody::Namespace(vec![
                    NsEntry {
                        pattern: b"/a/*.mp4".to_vec(),
                        branches: vec![0],
                        overflow: true,
                    },
                    NsEntry {
                        pattern: b"/a/x*".to_vec(),
                        branches: vec![1],
                        overflow: true,
                    },
                    NsEntry {
                        pattern: b"/a/*.mp*".to_vec(),
                        branches: vec![2],
                        overflow: true,
                    },
                ]),
            }],
            default: vec![3],
            default_overflow: true,
        };
        let v = all_up(4);
        // "/a/*.mp4" and "/a/x*" both have 7 and 4 literal chars: .mp4 wins by length.
        let d = rs.evaluate(&facts("/a/x.mp4", 0o644, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Entry(0, 0));
        // "/a/x*" (4) vs "/a/*.mp*" (6): the longer wins even though listed later.
        let d = rs.evaluate(&facts("/a/x.mpg", 0o644, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Entry(0, 2));
        // Equal scores: "/a/*.mp4" (7) and a second "/a/*.mp4"-length pattern.
        let mut rs2 = rs.clone();
        if let RuleBody::Namespace(e) = &mut rs2.rules[0].body {
            e.push(NsEntry {
                pattern: b"/a/?.mp4".to_vec(),
                branches: vec![3],
                overflow: true,
            });
        }
        let d = rs2.evaluate(&facts("/a/x.mp4", 0o644, 0), &v, now());
        assert_eq!(
            d.rule,
            RuleRef::Entry(0, 0),
            "tie: the first listed entry wins"
        );
        // No entry matches: evaluation continues to the default.
        let d = rs.evaluate(&facts("/b/x.mp4", 0o644, 0), &v, now());
        assert_eq!(d.rule, RuleRef::Default);
    }

    #[test]
    fn first_metadata_match_wins_and_conditions_combine() {
        let rs = RuleSet {
            rules: vec![
                Rule {
                    name: "big videos".into(),
                    body: RuleBody::Meta {
                        conds: vec![
                            Cond::Size {
                                cmp: Cmp::Gt,
                                bytes: 1 << 20,
                                margin: 0,
                            },
                            Cond::Suffix(vec![b".avi".to_vec()]),
                        ],
                        branches: vec![2],
                        overflow: false,
                    },
                },
                Rule {
                    name: "dave".into(),
                    body: RuleBody::Meta {
                        conds: vec![Cond::Uid(vec![1000])],
                        branches: vec![1],
                        overflow: true,
                    },
                },
            ],
            default: vec![0],
            default_overflow: true,
        };
        let v = all_up(3);
        assert_eq!(
            rs.evaluate(&facts("/v.avi", 0o644, 2 << 20), &v, now())
                .rule,
            RuleRef::Rule(0)
        );
        assert_eq!(
            rs.evaluate(&facts("/v.avi", 0o644, 10), &v, now()).rule,
            RuleRef::Rule(1)
        );
        let mut f = facts("/v.txt", 0o644, 10);
        f.uid = 7;
        assert_eq!(rs.evaluate(&f, &v, now()).rule, RuleRef::Default);
        // Forbidden overflow: only the first branch is a candidate.
        let d = rs.evaluate(&facts("/v.avi", 0o644, 2 << 20), &v, now());
        assert_eq!(d.candidates(), &[2]);
    }

    #[test]
    fn overflow_order_is_the_listed_order() {
        let rs = RuleSet {
            rules: vec![Rule {
                name: "r".into(),
                body: RuleBody::Meta {
                    conds: vec![],
                    branches: vec![2, 0, 1],
                    overflow: true,
                },
            }],
            default: vec![0],
            default_overflow: true,
        };
        let d = rs.evaluate(&facts("/x", 0o644, 0), &all_up(3), now());
        assert_eq!(d.candidates(), &[2, 0, 1]);
        let mut rs = rs;
        if let RuleBody::Meta { overflow, .. } = &mut rs.rules[0].body {
            *overflow = false;
        }
        assert_eq!(
            rs.evaluate(&facts("/x", 0o644, 0), &all_up(3), now())
                .candidates(),
            &[2]
        );
    }

    fn two_tier(margin: u64) -> RuleSet {
        RuleSet {
            rules: vec![Rule {
                name: "large to slow".into(),
                body: RuleBody::Meta {
                    conds: vec![Cond::Size {
                        cmp: Cmp::Gt,
                        bytes: 8192,
                        margin,
                    }],
                    branches: vec![1],
                    overflow: true,
                },
            }],
            default: vec![0],
            default_overflow: true,
        }
    }

    #[test]
    fn hysteresis_stops_the_paper_oscillation() {
        let v = all_up(2);
        let at = |rs: &RuleSet, size: u64, cur: Option<BranchId>| {
            let mut f = facts("/f", 0o644, size);
            f.current = cur;
            rs.evaluate(&f, &v, now()).branches[0]
        };
        // Without hysteresis, 7.5 <-> 8.5 KiB flips the branch every time (§4.5).
        let plain = two_tier(0);
        assert_eq!(at(&plain, 8704, Some(0)), 1);
        assert_eq!(at(&plain, 7680, Some(1)), 0);
        // With a 1 KiB margin, neither crossing moves the file...
        let h = two_tier(1024);
        assert_eq!(
            at(&h, 8704, Some(0)),
            0,
            "8.5 KiB on fast stays (needs > 9 KiB)"
        );
        assert_eq!(
            at(&h, 7680, Some(1)),
            1,
            "7.5 KiB on slow stays (needs <= 7 KiB)"
        );
        // ...crossing by more than the margin does.
        assert_eq!(at(&h, 9217, Some(0)), 1);
        assert_eq!(at(&h, 7168, Some(1)), 0);
        // At create there is no placement to be biased toward: the plain threshold.
        assert_eq!(at(&h, 8193, None), 1);
    }

    #[test]
    fn age_rules_with_hysteresis() {
        let day = Duration::from_secs(86_400);
        let rs = RuleSet {
            rules: vec![Rule {
                name: "cold".into(),
                body: RuleBody::Meta {
                    conds: vec![Cond::Age {
                        field: TimeField::Mtime,
                        cmp: Cmp::Gt,
                        age: 30 * day,
                        margin: day,
                    }],
                    branches: vec![1],
                    overflow: true,
                },
            }],
            default: vec![0],
            default_overflow: true,
        };
        assert!(rs.uses_time());
        let v = all_up(2);
        let now = SystemTime::UNIX_EPOCH + 100 * day;
        let mut f = facts("/f", 0o644, 1);
        f.current = Some(0);
        f.mtime = now - 30 * day - Duration::from_secs(3600);
        assert_eq!(
            rs.evaluate(&f, &v, now).branches[0],
            0,
            "30 d 1 h old: within the margin"
        );
        f.mtime = now - 32 * day;
        assert_eq!(rs.evaluate(&f, &v, now).branches[0], 1);
        f.current = Some(1);
        f.mtime = now - 30 * day + Duration::from_secs(3600);
        assert_eq!(
            rs.evaluate(&f, &v, now).branches[0],
            1,
            "touched a bit: stays cold"
        );
        f.mtime = now;
        assert_eq!(rs.evaluate(&f, &v, now).branches[0], 0);
    }

    #[test]
    fn branch_state_rules() {
        // "fast tier while it has more than 10% free".
        let rs = RuleSet {
            rules: vec![Rule {
                name: "fast while room".into(),
                body: RuleBody::Meta {
                    conds: vec![Cond::Free {
                        branch: None,
                        cmp: Cmp::Gt,
                        amount: Amount::Percent(10.0),
                    }],
                    branches: vec![0],
                    overflow: false,
                },
            }],
            default: vec![1],
            default_overflow: true,
        };
        let mut v = View {
            active: vec![true, true],
            space: vec![(50, 100), (50, 100)],
        };
        assert_eq!(
            rs.evaluate(&facts("/f", 0o644, 0), &v, now()).branches,
            vec![0]
        );
        v.space[0] = (10, 100);
        assert_eq!(
            rs.evaluate(&facts("/f", 0o644, 0), &v, now()).branches,
            vec![1]
        );
        v.space[0] = (11, 100);
        assert_eq!(
            rs.evaluate(&facts("/f", 0o644, 0), &v, now()).branches,
            vec![0]
        );
        let rs2 = RuleSet {
            rules: vec![Rule {
                name: "bytes".into(),
                body: RuleBody::Meta {
                    conds: vec![Cond::Free {
                        branch: Some(1),
                        cmp: Cmp::Lt,
                        amount: Amount::Bytes(20),
                    }],
                    branches: vec![0],
                    overflow: true,
                },
            }],
            default: vec![1],
            default_overflow: true,
        };
        assert_eq!(
            rs2.evaluate(&facts("/f", 0o644, 0), &v, now()).branches,
            vec![1]
        );
        v.space[1] = (19, 100);
        assert_eq!(
            rs2.evaluate(&facts("/f", 0o644, 0), &v, now()).branches,
            vec![0]
        );
    }

    #[test]
    fn access_perm_owner_kind_name() {
        let mk = |c: Cond| RuleSet {
            rules: vec![Rule {
                name: "r".into(),
                body: RuleBody::Meta {
                    conds: vec![c],
                    branches: vec![1],
                    overflow: true,
                },
            }],
            default: vec![0],
            default_overflow: true,
        };
        let v = all_up(2);
        let hit = |rs: &RuleSet, f: &Facts<'_>| rs.evaluate(f, &v, now()).rule == RuleRef::Rule(0);
        let rs = mk(Cond::Access(AccessType::Executable));
        assert!(hit(&rs, &facts("/x", 0o755, 0)));
        assert!(!hit(&rs, &facts("/x", 0o644, 0)));
        let rs = mk(Cond::Access(AccessType::Writable));
        assert!(hit(&rs, &facts("/x", 0o200, 0)));
        assert!(!hit(&rs, &facts("/x", 0o555, 0)));
        let rs = mk(Cond::Perm {
            mask: 0o007,
            value: 0,
        });
        assert!(hit(&rs, &facts("/x", 0o750, 0)));
        assert!(!hit(&rs, &facts("/x", 0o754, 0)));
        let rs = mk(Cond::Gid(vec![5, 1000]));
        assert!(hit(&rs, &facts("/x", 0o644, 0)));
        let rs = mk(Cond::Name(vec![b"*.jp*g".to_vec()]));
        assert!(hit(&rs, &facts("/d.jpg/x.jpeg", 0o644, 0)));
        assert!(
            !hit(&rs, &facts("/d.jpg/x.png", 0o644, 0)),
            "the name, not the path"
        );
        let rs = mk(Cond::Path(vec![b"/tmp/*".to_vec()]));
        assert!(hit(&rs, &facts("/tmp/a/b", 0o644, 0)));
        let rs = mk(Cond::Kind(vec![FileKind::Symlink]));
        assert!(!hit(&rs, &facts("/x", 0o644, 0)));
        let mut f = facts("/x", 0o777, 0);
        f.kind = FileKind::Symlink;
        assert!(hit(&rs, &f));
    }
}
