//! POSIX access control lists, as Linux keeps them (`fs/posix_acl.c`,
//! `include/uapi/linux/posix_acl_xattr.h`): the binary form a file system stores in the
//! `system.posix_acl_access` and `system.posix_acl_default` extended attributes, its
//! validation, and the four rules a file system that stores ACLs applies itself:
//!
//! - [`Acl::permission`]: who may read, write or search an inode that has an access ACL
//!   (`posix_acl_permission`, reached through [`crate::Ctx::permission`]);
//! - [`Acl::equiv_mode`]: setting an access ACL sets the mode's permission bits from it,
//!   and an ACL the mode says entirely is not stored (`posix_acl_update_mode`);
//! - [`Acl::chmod`]: chmod rewrites the owner, mask (or group) and other entries
//!   (`posix_acl_chmod`);
//! - [`Acl::create_masq`]: a new inode in a directory with a default ACL inherits it,
//!   masked by the mode asked for, and the umask is not applied (`posix_acl_create`).
//!
//! Over FUSE the kernel leaves all four to the file system: it checks an inode against the
//! ACL it reads back (with `FUSE_POSIX_ACL`), but it never updates the mode, rewrites an
//! ACL on chmod or inherits a default ACL (`fs/fuse/acl.c`: "Fuse userspace is responsible
//! for updating access permissions in the inode").
//!
//! The binary form, little-endian:
//!
//! ```text
//!   0  version  u32   2
//!   4  entries  8 bytes each, in the order below:
//!        tag    u16   USER_OBJ 0x01, USER 0x02, GROUP_OBJ 0x04, GROUP 0x08,
//!                     MASK 0x10, OTHER 0x20
//!        perm   u16   r 4, w 2, x 1
//!        id     u32   the uid (USER) or gid (GROUP); 0xffffffff for the others
//! ```
//!
//! A valid ACL (`posix_acl_valid`) has exactly one USER_OBJ, then any USER entries, one
//! GROUP_OBJ, any GROUP entries, a MASK (required when there is a USER or GROUP entry), and
//! one OTHER, in that order. Anything else — a short or ragged value, an unknown tag or
//! permission bit, an entry out of order, a named entry with the undefined id — is
//! [`AclError`], never a panic: the value comes from a caller or from a disk.

use std::fmt;

use crate::perm::{Access, Ctx};
use crate::{Errno, FsError, Result};

/// The access ACL's extended attribute.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// A directory's default ACL, inherited by what is created in it.
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";
/// The only version of the binary form.
pub const VERSION: u32 = 2;
/// The id stored in entries that name no user or group.
pub const UNDEFINED_ID: u32 = u32::MAX;
/// Most entries cairn accepts: what fits one 4 KiB page, the kernel's own limit for a FUSE
/// file system's ACL (`fs/fuse/acl.c`, E2BIG beyond it).
pub const MAX_ENTRIES: usize = (4096 - 4) / 8;

const TAG_USER_OBJ: u16 = 0x01;
const TAG_USER: u16 = 0x02;
const TAG_GROUP_OBJ: u16 = 0x04;
const TAG_GROUP: u16 = 0x08;
const TAG_MASK: u16 = 0x10;
const TAG_OTHER: u16 = 0x20;

/// Which of an inode's two ACLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Access,
    Default,
}

impl Kind {
    /// The ACL an extended-attribute name holds, if it names one.
    pub fn of_xattr(name: &[u8]) -> Option<Kind> {
        match name {
            ACCESS_XATTR => Some(Kind::Access),
            DEFAULT_XATTR => Some(Kind::Default),
            _ => None,
        }
    }

    pub fn xattr(self) -> &'static [u8] {
        match self {
            Kind::Access => ACCESS_XATTR,
            Kind::Default => DEFAULT_XATTR,
        }
    }
}

/// An entry's tag, with the id of the named ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj,
    User(u32),
    GroupObj,
    Group(u32),
    Mask,
    Other,
}

/// One entry: a tag and its permission bits (r 4, w 2, x 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u16,
}

/// Why a value is not a valid ACL. Each is EINVAL, except a version other than 2, which the
/// kernel answers with EOPNOTSUPP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclError {
    /// Shorter than its header, or not a whole number of entries.
    BadLength(usize),
    BadVersion(u32),
    /// More entries than [`MAX_ENTRIES`].
    TooMany(usize),
    /// Entry `i` has a tag that is none of the six.
    BadTag {
        i: usize,
        tag: u16,
    },
    /// Entry `i` has permission bits beyond rwx.
    BadPerm {
        i: usize,
        perm: u16,
    },
    /// Entry `i` is out of the required order, or a second USER_OBJ, GROUP_OBJ, MASK or
    /// OTHER.
    Order {
        i: usize,
    },
    /// Entry `i` names the undefined user or group.
    UndefinedId {
        i: usize,
    },
    /// Named entries without a MASK, or an entry missing (USER_OBJ, GROUP_OBJ, OTHER).
    Incomplete,
}

impl AclError {
    pub fn errno(self) -> Errno {
        match self {
            AclError::BadVersion(_) => Errno::EOPNOTSUPP,
            _ => Errno::EINVAL,
        }
    }
}

impl fmt::Display for AclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AclError::BadLength(n) => {
                write!(f, "ACL of {n} bytes is not a header and whole entries")
            }
            AclError::BadVersion(v) => write!(f, "ACL version {v}, not {VERSION}"),
            AclError::TooMany(n) => write!(f, "ACL of {n} entries (at most {MAX_ENTRIES})"),
            AclError::BadTag { i, tag } => write!(f, "ACL entry {i}: unknown tag {tag:#x}"),
            AclError::BadPerm { i, perm } => write!(f, "ACL entry {i}: permission bits {perm:#o}"),
            AclError::Order { i } => write!(f, "ACL entry {i} out of order or repeated"),
            AclError::UndefinedId { i } => write!(f, "ACL entry {i} names the undefined id"),
            AclError::Incomplete => write!(f, "ACL lacks an owner, group, other or mask entry"),
        }
    }
}

impl std::error::Error for AclError {}

impl From<AclError> for FsError {
    fn from(e: AclError) -> FsError {
        FsError::Errno(e.errno())
    }
}

/// An inode's extended attributes as a format keeps them in memory (FFS: a list in the
/// xattr block's order; LFS: a map by name), seen by name — what [`find`] and [`put`] need.
pub trait Xattrs {
    /// The value of attribute `name`, if the inode has one.
    fn value(&self, name: &[u8]) -> Option<&[u8]>;
    /// Sets attribute `name` to `value`, or removes it (`None`).
    fn set(&mut self, name: &[u8], value: Option<Vec<u8>>);
}

/// In the order the attributes are stored: a new one goes last, a replaced one keeps its
/// place.
impl Xattrs for Vec<(Vec<u8>, Vec<u8>)> {
    fn value(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter()
            .find(|(k, _)| k.as_slice() == name)
            .map(|(_, v)| v.as_slice())
    }

    fn set(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        let pos = self.iter().position(|(k, _)| k.as_slice() == name);
        match (pos, value) {
            (Some(i), Some(v)) => self[i].1 = v,
            (None, Some(v)) => self.push((name.to_vec(), v)),
            (Some(i), None) => {
                self.remove(i);
            }
            (None, None) => {}
        }
    }
}

impl Xattrs for std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    fn value(&self, name: &[u8]) -> Option<&[u8]> {
        self.get(name).map(Vec::as_slice)
    }

    fn set(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        match value {
            Some(v) => {
                self.insert(name.to_vec(), v);
            }
            None => {
                self.remove(name);
            }
        }
    }
}

/// A stored ACL that is not valid: on a disk that is corruption, and the message names the
/// inode and the attribute (`inode 12: system.posix_acl_access: ACL entry 2 out of order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredAclError {
    pub ino: u64,
    pub kind: Kind,
    pub error: AclError,
}

impl fmt::Display for StoredAclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "inode {}: {}: {}",
            self.ino,
            String::from_utf8_lossy(self.kind.xattr()),
            self.error
        )
    }
}

impl std::error::Error for StoredAclError {}

/// The ACL of kind `kind` among inode `ino`'s attributes, decoded. A value that is not a
/// valid ACL is the error a format reports as corruption (fsck names it and drops it).
pub fn find(
    ino: u64,
    attrs: &impl Xattrs,
    kind: Kind,
) -> std::result::Result<Option<Acl>, StoredAclError> {
    let Some(v) = attrs.value(kind.xattr()) else {
        return Ok(None);
    };
    Acl::decode(v).map_err(|error| StoredAclError { ino, kind, error })
}

/// `attrs` with the ACL of kind `kind` set to `acl`, or removed (`None`).
pub fn put(attrs: &mut impl Xattrs, kind: Kind, acl: Option<&Acl>) {
    attrs.set(kind.xattr(), acl.map(Acl::encode));
}

/// A valid ACL: the only way to make one is [`Acl::decode`] or [`Acl::from_mode`], so every
/// `Acl` has its USER_OBJ, GROUP_OBJ and OTHER entries (and a MASK if it names anyone), in
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Decodes and validates the binary form. `Ok(None)`: a header without entries, which
    /// the kernel reads as "no ACL" (setting it removes the ACL).
    pub fn decode(b: &[u8]) -> std::result::Result<Option<Acl>, AclError> {
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return Err(AclError::BadLength(b.len()));
        }
        let version = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if version != VERSION {
            return Err(AclError::BadVersion(version));
        }
        let n = (b.len() - 4) / 8;
        if n == 0 {
            return Ok(None);
        }
        if n > MAX_ENTRIES {
            return Err(AclError::TooMany(n));
        }
        let mut entries = Vec::with_capacity(n);
        for (i, e) in b[4..].chunks_exact(8).enumerate() {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = match tag {
                TAG_USER_OBJ => Tag::UserObj,
                TAG_USER => Tag::User(id),
                TAG_GROUP_OBJ => Tag::GroupObj,
                TAG_GROUP => Tag::Group(id),
                TAG_MASK => Tag::Mask,
                TAG_OTHER => Tag::Other,
                _ => return Err(AclError::BadTag { i, tag }),
            };
            if perm & !7 != 0 {
                return Err(AclError::BadPerm { i, perm });
            }
            if matches!(tag, Tag::User(UNDEFINED_ID) | Tag::Group(UNDEFINED_ID)) {
                return Err(AclError::UndefinedId { i });
            }
            entries.push(Entry { tag, perm });
        }
        let acl = Acl { entries };
        acl.validate()?;
        Ok(Some(acl))
    }

    /// `posix_acl_valid`: the order USER_OBJ, USER*, GROUP_OBJ, GROUP*, MASK?, OTHER, a
    /// MASK whenever a USER or GROUP entry exists. (Like the kernel, it does not ask the
    /// named entries to be sorted or distinct: the first that matches decides.)
    fn validate(&self) -> std::result::Result<(), AclError> {
        #[derive(PartialEq)]
        enum S {
            UserObj,
            User,
            Group,
            Other,
            Done,
        }
        let mut s = S::UserObj;
        let mut needs_mask = false;
        for (i, e) in self.entries.iter().enumerate() {
            s = match (e.tag, s) {
                (Tag::UserObj, S::UserObj) => S::User,
                (Tag::User(_), S::User) => {
                    needs_mask = true;
                    S::User
                }
                (Tag::GroupObj, S::User) => S::Group,
                (Tag::Group(_), S::Group) => {
                    needs_mask = true;
                    S::Group
                }
                (Tag::Mask, S::Group) => S::Other,
                (Tag::Other, S::Other) => S::Done,
                (Tag::Other, S::Group) if !needs_mask => S::Done,
                (Tag::Other, S::Group) => return Err(AclError::Incomplete),
                _ => return Err(AclError::Order { i }),
            };
        }
        if s == S::Done {
            Ok(())
        } else {
            Err(AclError::Incomplete)
        }
    }

    /// The canonical binary form (ids of unnamed entries stored as [`UNDEFINED_ID`], as
    /// the kernel's `posix_acl_to_xattr` writes them).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4 + 8 * self.entries.len());
        b.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            let (tag, id) = match e.tag {
                Tag::UserObj => (TAG_USER_OBJ, UNDEFINED_ID),
                Tag::User(u) => (TAG_USER, u),
                Tag::GroupObj => (TAG_GROUP_OBJ, UNDEFINED_ID),
                Tag::Group(g) => (TAG_GROUP, g),
                Tag::Mask => (TAG_MASK, UNDEFINED_ID),
                Tag::Other => (TAG_OTHER, UNDEFINED_ID),
            };
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    /// The three-entry ACL a mode's permission bits say.
    pub fn from_mode(mode: u32) -> Acl {
        let p = |shift: u32| ((mode >> shift) & 7) as u16;
        Acl {
            entries: vec![
                Entry {
                    tag: Tag::UserObj,
                    perm: p(6),
                },
                Entry {
                    tag: Tag::GroupObj,
                    perm: p(3),
                },
                Entry {
                    tag: Tag::Other,
                    perm: p(0),
                },
            ],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    fn perm_of(&self, want: Tag) -> Option<u16> {
        self.entries.iter().find(|e| e.tag == want).map(|e| e.perm)
    }

    /// `posix_acl_equiv_mode`: `mode` with its permission bits (not its type or
    /// setuid/setgid/sticky bits) replaced by what the ACL says — owner, mask (or the owning
    /// group without a mask) and other — and whether the mode says the whole ACL (no named
    /// entry, no mask), in which case it need not be stored.
    pub fn equiv_mode(&self, mode: u32) -> (u32, bool) {
        let mut perms = 0u32;
        let mut equiv = true;
        for e in &self.entries {
            let p = u32::from(e.perm);
            match e.tag {
                Tag::UserObj => perms |= p << 6,
                Tag::GroupObj => perms |= p << 3,
                Tag::Other => perms |= p,
                Tag::Mask => {
                    perms = (perms & !0o070) | (p << 3);
                    equiv = false;
                }
                Tag::User(_) | Tag::Group(_) => equiv = false,
            }
        }
        ((mode & !0o777) | perms, equiv)
    }

    /// `posix_acl_chmod`: the owner, other and mask entries (the owning group's without a
    /// mask) take the permission bits of `mode`; named entries are kept.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.perm_of(Tag::Mask).is_some();
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => e.perm = ((mode >> 6) & 7) as u16,
                Tag::Other => e.perm = (mode & 7) as u16,
                Tag::Mask => e.perm = ((mode >> 3) & 7) as u16,
                Tag::GroupObj if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: this ACL (a copy of the parent's default ACL) becomes a new
    /// inode's access ACL, masked by the mode asked for, which in turn keeps only what the
    /// ACL grants. Returns whether the ACL must be stored (it says more than the mode).
    pub fn create_masq(&mut self, mode: &mut u32) -> bool {
        let mut m = *mode & 0o777;
        let mut not_equiv = false;
        let has_mask = self.perm_of(Tag::Mask).is_some();
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= ((m >> 6) & 7) as u16;
                    m &= (u32::from(e.perm) << 6) | !0o700;
                }
                Tag::User(_) | Tag::Group(_) => not_equiv = true,
                Tag::Other => {
                    e.perm &= (m & 7) as u16;
                    m &= u32::from(e.perm) | !0o007;
                }
                Tag::Mask => not_equiv = true,
                Tag::GroupObj => {}
            }
        }
        // The group class: the mask when there is one, else the owning group's entry.
        let class = if has_mask { Tag::Mask } else { Tag::GroupObj };
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == class) {
            e.perm &= ((m >> 3) & 7) as u16;
            m &= (u32::from(e.perm) << 3) | !0o070;
        }
        *mode = (*mode & !0o777) | (m & 0o777);
        not_equiv
    }

    /// `posix_acl_permission`: whether `ctx`, who does not own the inode (its owner is
    /// checked against the mode first, see [`Ctx::permission`]), may do `want` to an inode
    /// owned by group `gid` under this ACL. The first named user that is the caller decides;
    /// otherwise any group entry the caller is in that grants everything asked decides, a
    /// named entry only through the mask; a caller in some group that grants too little is
    /// refused; everyone else gets the other entry.
    pub fn permission(&self, ctx: &Ctx, uid: u32, gid: u32, want: Access) -> Result<()> {
        let want = (want.0 & 7) as u16;
        let mask = self.perm_of(Tag::Mask).unwrap_or(7);
        let ok = |granted: u16| {
            if granted & want == want {
                Ok(())
            } else {
                Err(FsError::Errno(Errno::EACCES))
            }
        };
        // Supplementary groups, looked up at most once for the whole list.
        let groups = std::cell::OnceCell::new();
        let in_group = |g: u32| ctx.gid == g || groups.get_or_init(|| ctx.groups()).contains(&g);
        let mut found = false;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj if ctx.uid == uid => return ok(e.perm),
                Tag::User(u) if ctx.uid == u => return ok(e.perm & mask),
                Tag::GroupObj if in_group(gid) => {
                    found = true;
                    if e.perm & want == want {
                        return ok(e.perm & mask);
                    }
                }
                Tag::Group(g) if in_group(g) => {
                    found = true;
                    if e.perm & want == want {
                        return ok(e.perm & mask);
                    }
                }
                Tag::Other if found => return Err(FsError::Errno(Errno::EACCES)),
                Tag::Other => return ok(e.perm),
                _ => {}
            }
        }
        Err(FsError::Errno(Errno::EACCES))
    }
}

/// The binary form of raw (tag, perm, id) triples, valid or not: for tests and tools that
/// build values (`Acl::encode` is the form of a valid ACL).
pub fn encode_raw(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = VERSION.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// What a new inode starts with in a directory whose default ACL is `default`
/// (`posix_acl_create`): with one, its mode is the mode asked for masked by the ACL (the
/// umask is not applied), its access ACL the default masked by that mode (none when the mode
/// says it all), and a directory keeps the default as its own; without one, the umask
/// applies and there is nothing to store. Symlinks inherit nothing (the caller passes no
/// default for them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    pub mode: u32,
    pub access: Option<Acl>,
    pub default: Option<Acl>,
}

impl Inherited {
    /// The extended attributes to store: (name, value) of each ACL inherited.
    pub fn xattrs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        [(Kind::Access, &self.access), (Kind::Default, &self.default)]
            .into_iter()
            .filter_map(|(k, a)| Some((k.xattr().to_vec(), a.as_ref()?.encode())))
            .collect()
    }
}

/// An access ACL granting user `uid` rwx through `mask` (owner rw-, owning group r--,
/// other ---): one fixture for the tests of several crates.
#[doc(hidden)]
pub fn example_named(uid: u32, mask: u16) -> Vec<u8> {
    encode_raw(&[
        (TAG_USER_OBJ, 6, UNDEFINED_ID),
        (TAG_USER, 7, uid),
        (TAG_GROUP_OBJ, 4, UNDEFINED_ID),
        (TAG_MASK, mask, UNDEFINED_ID),
        (TAG_OTHER, 0, UNDEFINED_ID),
    ])
}

pub fn inherit(default: Option<&Acl>, mode: u32, umask: u32) -> Inherited {
    let Some(default) = default else {
        return Inherited {
            mode: mode & !(umask & 0o777),
            access: None,
            default: None,
        };
    };
    let mut mode = mode;
    let mut access = default.clone();
    let store = access.create_masq(&mut mode);
    Inherited {
        mode,
        access: store.then_some(access),
        default: (mode & libc::S_IFMT == libc::S_IFDIR).then(|| default.clone()),
    }
}

/// `posix_acl_update_mode`: the mode an inode of `mode` in group `gid` takes when `ctx` sets
/// access ACL `acl` — its permission bits from the ACL, S_ISGID dropped unless `ctx` is root
/// or in the group — and whether the ACL must be stored (the mode does not say it all).
pub fn update_mode(ctx: &Ctx, acl: &Acl, mode: u32, gid: u32) -> (u32, bool) {
    let (mut m, equiv) = acl.equiv_mode(mode);
    if !ctx.is_root() && !ctx.in_group(gid) {
        m &= !libc::S_ISGID;
    }
    (m, !equiv)
}

impl fmt::Display for Acl {
    /// The short text form of acl(5): `u::rw-,u:1000:r--,g::r--,m::r--,o::---`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match e.tag {
                Tag::UserObj => f.write_str("u::")?,
                Tag::User(u) => write!(f, "u:{u}:")?,
                Tag::GroupObj => f.write_str("g::")?,
                Tag::Group(g) => write!(f, "g:{g}:")?,
                Tag::Mask => f.write_str("m::")?,
                Tag::Other => f.write_str("o::")?,
            }
            for (bit, c) in [(4, 'r'), (2, 'w'), (1, 'x')] {
                write!(f, "{}", if e.perm & bit != 0 { c } else { '-' })?;
            }
        }
        Ok(())
    }
}

/// One thing a checker finds wrong with an inode's stored ACLs (fsck of either format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The value is not a valid ACL: it is dropped.
    Malformed(Kind, AclError),
    /// A default ACL on something that is not a directory: dropped.
    DefaultOnNonDirectory,
    /// An ACL on a symlink, which has none: dropped.
    OnSymlink(Kind),
    /// The mode's permission bits are not what the access ACL says (`mode`, `want`): a
    /// change of one reached disk without the other. The ACL is the one the permission
    /// checks use, so the mode is set from it.
    ModeDisagrees { mode: u32, want: u32 },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |k: &Kind| String::from_utf8_lossy(k.xattr()).into_owned();
        match self {
            Problem::Malformed(k, e) => write!(f, "{}: {e}; dropped", name(k)),
            Problem::DefaultOnNonDirectory => {
                write!(f, "{} on a non-directory; dropped", name(&Kind::Default))
            }
            Problem::OnSymlink(k) => write!(f, "{} on a symlink; dropped", name(k)),
            Problem::ModeDisagrees { mode, want } => write!(
                f,
                "mode {:o} disagrees with its access ACL ({:o}); set from the ACL",
                mode & 0o7777,
                want & 0o7777
            ),
        }
    }
}

/// What a checker does about an inode's ACLs: the problems, the attributes to drop and the
/// mode to keep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Audit {
    pub problems: Vec<Problem>,
    pub drop: Vec<Kind>,
    pub mode: u32,
}

/// Checks the ACL attributes of an inode of `mode` (`value(kind)`: the stored value, if
/// any).
pub fn audit<'a>(mode: u32, value: impl Fn(Kind) -> Option<&'a [u8]>) -> Audit {
    let mut a = Audit {
        mode,
        ..Default::default()
    };
    let t = mode & libc::S_IFMT;
    for kind in [Kind::Access, Kind::Default] {
        let Some(v) = value(kind) else { continue };
        let problem = if t == libc::S_IFLNK {
            Some(Problem::OnSymlink(kind))
        } else if kind == Kind::Default && t != libc::S_IFDIR {
            Some(Problem::DefaultOnNonDirectory)
        } else {
            match Acl::decode(v) {
                Err(e) => Some(Problem::Malformed(kind, e)),
                Ok(Some(acl)) if kind == Kind::Access => {
                    let (want, _) = acl.equiv_mode(mode);
                    (want != mode)
                        .then_some(Problem::ModeDisagrees { mode, want })
                        .inspect(|_| {
                            a.mode = want;
                        })
                }
                Ok(_) => None,
            }
        };
        if let Some(p) = problem {
            if !matches!(p, Problem::ModeDisagrees { .. }) {
                a.drop.push(kind);
            }
            a.problems.push(p);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        encode_raw(entries)
    }

    const U: u32 = UNDEFINED_ID;

    fn named() -> Acl {
        Acl::decode(&raw(&[
            (TAG_USER_OBJ, 6, U),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 4, U),
            (TAG_GROUP, 6, 44),
            (TAG_MASK, 6, U),
            (TAG_OTHER, 0, U),
        ]))
        .unwrap()
        .unwrap()
    }

    #[test]
    fn round_trip_and_text() {
        let a = named();
        assert_eq!(Acl::decode(&a.encode()).unwrap().unwrap(), a);
        assert_eq!(
            a.to_string(),
            "u::rw-,u:1000:rwx,g::r--,g:44:rw-,m::rw-,o::---"
        );
        assert_eq!(
            Acl::decode(&raw(&[])).unwrap(),
            None,
            "a bare header is no ACL"
        );
        // Ids of unnamed entries are not kept: the canonical form has the undefined id.
        let b = Acl::decode(&raw(&[(1, 6, 5), (4, 4, 6), (0x20, 4, 7)]))
            .unwrap()
            .unwrap();
        assert_eq!(b.encode(), raw(&[(1, 6, U), (4, 4, U), (0x20, 4, U)]));
    }

    #[test]
    fn hostile_values_are_refused() {
        let ok = [
            (TAG_USER_OBJ, 6, U),
            (TAG_GROUP_OBJ, 4, U),
            (TAG_OTHER, 4, U),
        ];
        assert!(Acl::decode(&raw(&ok)).is_ok());
        let cases: Vec<(Vec<u8>, AclError)> = vec![
            (vec![], AclError::BadLength(0)),
            (vec![2, 0, 0], AclError::BadLength(3)),
            (raw(&ok)[..11].to_vec(), AclError::BadLength(11)),
            (
                {
                    let mut b = raw(&ok);
                    b[0] = 1;
                    b
                },
                AclError::BadVersion(1),
            ),
            (
                raw(&[(TAG_USER_OBJ, 6, U), (0x40, 4, U), (TAG_OTHER, 4, U)]),
                AclError::BadTag { i: 1, tag: 0x40 },
            ),
            (
                raw(&[
                    (TAG_USER_OBJ, 8, U),
                    (TAG_GROUP_OBJ, 4, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::BadPerm { i: 0, perm: 8 },
            ),
            (
                raw(&[
                    (TAG_GROUP_OBJ, 4, U),
                    (TAG_USER_OBJ, 6, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::Order { i: 0 },
            ),
            (
                raw(&[
                    (TAG_USER_OBJ, 6, U),
                    (TAG_USER_OBJ, 6, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::Order { i: 1 },
            ),
            (
                raw(&[(TAG_USER_OBJ, 6, U), (TAG_GROUP_OBJ, 4, U)]),
                AclError::Incomplete,
            ),
            (
                raw(&[
                    (TAG_USER_OBJ, 6, U),
                    (TAG_USER, 6, 7),
                    (TAG_GROUP_OBJ, 4, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::Incomplete,
            ),
            (
                raw(&[
                    (TAG_USER_OBJ, 6, U),
                    (TAG_USER, 6, U),
                    (TAG_GROUP_OBJ, 4, U),
                    (TAG_MASK, 4, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::UndefinedId { i: 1 },
            ),
            (
                raw(&[
                    (TAG_USER_OBJ, 6, U),
                    (TAG_GROUP_OBJ, 4, U),
                    (TAG_OTHER, 4, U),
                    (TAG_OTHER, 4, U),
                ]),
                AclError::Order { i: 3 },
            ),
        ];
        for (b, want) in cases {
            assert_eq!(Acl::decode(&b), Err(want), "{b:?}");
        }
        assert_eq!(AclError::BadVersion(3).errno(), Errno::EOPNOTSUPP);
        assert_eq!(AclError::Incomplete.errno(), Errno::EINVAL);
        let too_many = raw(&vec![(TAG_USER, 4, 5); MAX_ENTRIES + 1]);
        assert_eq!(
            Acl::decode(&too_many),
            Err(AclError::TooMany(MAX_ENTRIES + 1))
        );
    }

    #[test]
    fn mode_rules() {
        let a = named();
        // The mask, not the owning group's entry, is the group class.
        assert_eq!(
            a.equiv_mode(libc::S_IFREG | 0o4777),
            (libc::S_IFREG | 0o4660, false)
        );
        let plain = Acl::from_mode(0o751);
        assert_eq!(plain.equiv_mode(0o100000), (0o100751, true));
        let mut b = named();
        b.chmod(0o754);
        assert_eq!(
            b.to_string(),
            "u::rwx,u:1000:rwx,g::r--,g:44:rw-,m::r-x,o::r--"
        );
        let mut c = Acl::from_mode(0o640);
        c.chmod(0o705);
        assert_eq!(c.to_string(), "u::rwx,g::---,o::r-x");
    }

    #[test]
    fn inheritance_masks_both_ways() {
        let mut a = named();
        let mut mode = libc::S_IFREG | 0o644;
        assert!(a.create_masq(&mut mode));
        assert_eq!(mode, libc::S_IFREG | 0o640);
        assert_eq!(
            a.to_string(),
            "u::rw-,u:1000:rwx,g::r--,g:44:rw-,m::r--,o::---"
        );
        let mut p = Acl::from_mode(0o750);
        let mut mode = libc::S_IFDIR | 0o777;
        assert!(
            !p.create_masq(&mut mode),
            "a three-entry default is the mode"
        );
        assert_eq!(mode, libc::S_IFDIR | 0o750);
    }

    #[test]
    fn permission_follows_posix_acl_permission() {
        let a = named();
        let bob = Ctx::user(1000, 1000);
        // Named user: rwx, but the mask (rw-) limits it.
        assert!(a.permission(&bob, 0, 0, Access::R | Access::W).is_ok());
        assert!(a.permission(&bob, 0, 0, Access::X).is_err());
        // Owning group r--; group 44 rw- through the mask.
        let mut g = Ctx::user(2000, 0);
        assert!(a.permission(&g, 0, 0, Access::R).is_ok());
        g.groups = Some(vec![44]);
        assert!(
            a.permission(&g, 0, 0, Access::W).is_ok(),
            "any matching group entry"
        );
        // In a group that grants too little: refused, never "other".
        let h = Ctx::user(3000, 0);
        let mut lax = named();
        lax.entries[5].perm = 7;
        assert!(lax.permission(&h, 0, 0, Access::W).is_err());
        // Neither named nor in a group: other.
        let o = Ctx::user(3000, 3000);
        assert!(lax.permission(&o, 0, 0, Access::W).is_ok());
        assert!(a.permission(&o, 0, 0, Access::R).is_err());
    }

    #[test]
    fn audit_finds_what_a_torn_update_or_hostile_image_leaves() {
        let a = named().encode();
        let reg = libc::S_IFREG | 0o640;
        // Agreeing: nothing.
        assert_eq!(
            audit(libc::S_IFREG | 0o660, |k| (k == Kind::Access)
                .then_some(&a[..]))
            .problems,
            vec![]
        );
        // The mode without the mask's bits: set from the ACL.
        let r = audit(reg, |k| (k == Kind::Access).then_some(&a[..]));
        assert_eq!(
            r.problems,
            vec![Problem::ModeDisagrees {
                mode: reg,
                want: libc::S_IFREG | 0o660
            }]
        );
        assert_eq!(r.mode, libc::S_IFREG | 0o660);
        // Garbage, a default on a file, anything on a symlink: dropped.
        let r = audit(reg, |_| Some(&b"junk"[..]));
        assert_eq!(r.drop, vec![Kind::Access, Kind::Default]);
        assert_eq!(r.problems[1], Problem::DefaultOnNonDirectory);
        let r = audit(libc::S_IFLNK | 0o777, |k| {
            (k == Kind::Access).then_some(&a[..])
        });
        assert_eq!(r.problems, vec![Problem::OnSymlink(Kind::Access)]);
        assert!(r.problems[0].to_string().contains("symlink"));
    }

    /// Both in-memory shapes answer alike: an ACL put is found again, a removed one is gone,
    /// the list keeps its order, and a bad stored value names its inode and attribute.
    #[test]
    fn stored_acls_are_found_put_and_named_when_bad() {
        let a = Acl::decode(&example_named(1000, 5)).unwrap().unwrap();
        let mut list: Vec<(Vec<u8>, Vec<u8>)> = vec![(b"user.x".to_vec(), b"1".to_vec())];
        let mut map = std::collections::BTreeMap::new();
        put(&mut list, Kind::Access, Some(&a));
        put(&mut map, Kind::Access, Some(&a));
        assert_eq!(find(7, &list, Kind::Access).unwrap().as_ref(), Some(&a));
        assert_eq!(find(7, &map, Kind::Access).unwrap().as_ref(), Some(&a));
        assert_eq!(find(7, &list, Kind::Default).unwrap(), None);
        assert_eq!(list[0].0, b"user.x", "a new attribute goes last");
        put(&mut list, Kind::Access, None);
        put(&mut map, Kind::Access, None);
        assert_eq!(list.len(), 1);
        assert!(map.is_empty());
        list.set(DEFAULT_XATTR, Some(vec![2, 0, 0, 0, 1]));
        let e = find(12, &list, Kind::Default).unwrap_err();
        assert_eq!(e.error, AclError::BadLength(5));
        assert!(
            e.to_string()
                .starts_with("inode 12: system.posix_acl_default: ACL of 5 bytes"),
            "{e}"
        );
    }
}
