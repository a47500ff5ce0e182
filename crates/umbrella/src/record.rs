//! The move record: what recovery needs to finish or undo an interrupted migration, and to
//! recognise the objects it may touch.
//!
//! A record lives at `.umbrella/moves/SEQ` on the move's target branch from the moment the
//! copy is complete until the move is committed or rolled back (see `migrate`). It names the
//! two branches, the temporary copy, every name of the file, and the *identity* of the two
//! objects involved, so that recovery never deletes, links or moves an object it did not
//! make or verify (see `recover`).
//!
//! Layout (version 2), all integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `UMBRMOV2` |
//! | 8 | 1 | phase: 0 placing (the union shows the source), 1 committed (it shows the target) |
//! | 9 | … | u16 length + bytes: source branch name |
//! | … | … | u16 length + bytes: target branch name |
//! | … | … | u16 length + bytes: temporary copy's name in the target's `.umbrella/tmp/` |
//! | … | 32 | source identity: u64 st_dev, u64 st_ino, u64 size, i64 mtime seconds |
//! | … | 4 | source identity: u32 mtime nanoseconds |
//! | … | 36 | copy identity, same fields |
//! | … | 4 | u32 name count N |
//! | … | … | N × (u32 length + bytes: path relative to the branch root, `/`-separated) |
//! | end-4 | 4 | crc32c of everything before |
//!
//! Version 1 (magic `UMBRMOVE`: branch names, temporary name, names; no phase, no
//! identities) is still read, so a record left by an older daemon is recognised; lacking
//! identities, recovery changes nothing for it.

use crate::sys;

const MAGIC_V2: &[u8; 8] = b"UMBRMOV2";
const MAGIC_V1: &[u8; 8] = b"UMBRMOVE";

/// Which object a record means: a host object and the state it had when the move copied it.
/// `st_dev`/`st_ino` say which object; size and mtime say it is unchanged (a move never
/// changes either; its copy gets the source's mtime).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, u32),
}

impl Ident {
    pub fn of(st: &sys::Stat) -> Ident {
        Ident {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        }
    }

    /// The same host object (whatever happened to it since).
    pub fn is_object(&self, st: &sys::Stat) -> bool {
        (self.dev, self.ino) == (st.st_dev, st.st_ino)
    }

    /// The same host object, with the size and mtime recorded.
    pub fn is_unchanged(&self, st: &sys::Stat) -> bool {
        *self == Ident::of(st)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The copy is being put in place; until the commit ends the union shows the source.
    Placing,
    /// The commit ended (the union shows the target) but a source name could not be
    /// removed; recovery removes it.
    Committed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveRecord {
    pub phase: Phase,
    pub src: String,
    pub dst: String,
    pub tmp: String,
    /// None in a version 1 record.
    pub ids: Option<(Ident, Ident)>,
    pub paths: Vec<Vec<u8>>,
}

impl MoveRecord {
    /// The version 2 encoding (a record without identities cannot be written).
    pub fn encode(&self) -> Vec<u8> {
        let (s, c) = self.ids.unwrap_or_default();
        let mut v = MAGIC_V2.to_vec();
        v.push(match self.phase {
            Phase::Placing => 0,
            Phase::Committed => 1,
        });
        for t in [&self.src, &self.dst, &self.tmp] {
            v.extend_from_slice(&(t.len() as u16).to_le_bytes());
            v.extend_from_slice(t.as_bytes());
        }
        for id in [s, c] {
            v.extend_from_slice(&id.dev.to_le_bytes());
            v.extend_from_slice(&id.ino.to_le_bytes());
            v.extend_from_slice(&id.size.to_le_bytes());
            v.extend_from_slice(&id.mtime.0.to_le_bytes());
            v.extend_from_slice(&id.mtime.1.to_le_bytes());
        }
        v.extend_from_slice(&(self.paths.len() as u32).to_le_bytes());
        for p in &self.paths {
            v.extend_from_slice(&(p.len() as u32).to_le_bytes());
            v.extend_from_slice(p);
        }
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// Reads a version 2 or version 1 record; None if it is damaged, truncated or foreign.
    pub fn decode(d: &[u8]) -> Option<MoveRecord> {
        if d.len() < 12 {
            return None;
        }
        let (body, crc) = d.split_at(d.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let v2 = body.starts_with(MAGIC_V2);
        if !v2 && !body.starts_with(MAGIC_V1) {
            return None;
        }
        let mut r = Reader { d: body, at: 8 };
        let phase = if v2 {
            match r.take(1)?[0] {
                0 => Phase::Placing,
                1 => Phase::Committed,
                _ => return None,
            }
        } else {
            Phase::Placing
        };
        let src = r.string()?;
        let dst = r.string()?;
        let tmp = r.string()?;
        let ids = if v2 {
            Some((r.ident()?, r.ident()?))
        } else {
            None
        };
        let n = r.u32()? as usize;
        let mut paths = Vec::new();
        for _ in 0..n {
            let l = r.u32()? as usize;
            paths.push(r.take(l)?.to_vec());
        }
        if paths.is_empty() || r.at != body.len() {
            return None;
        }
        Some(MoveRecord {
            phase,
            src,
            dst,
            tmp,
            ids,
            paths,
        })
    }
}

struct Reader<'a> {
    d: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.d.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let l = self.u16()? as usize;
        String::from_utf8(self.take(l)?.to_vec()).ok()
    }

    fn ident(&mut self) -> Option<Ident> {
        Some(Ident {
            dev: self.u64()?,
            ino: self.u64()?,
            size: self.u64()?,
            mtime: (self.u64()? as i64, self.u32()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> MoveRecord {
        MoveRecord {
            phase: Phase::Placing,
            src: "fast".into(),
            dst: "slow".into(),
            tmp: "18eac9a8760931f2-20471-0".into(),
            ids: Some((
                Ident {
                    dev: 2049,
                    ino: 77,
                    size: 4096,
                    mtime: (1_700_000_000, 5),
                },
                Ident {
                    dev: 2050,
                    ino: 12,
                    size: 4096,
                    mtime: (1_700_000_000, 5),
                },
            )),
            paths: vec![b"d0/a".to_vec(), b"d0/b".to_vec()],
        }
    }

    #[test]
    fn round_trip_and_damage() {
        let mut r = sample();
        for phase in [Phase::Placing, Phase::Committed] {
            r.phase = phase;
            let e = r.encode();
            assert_eq!(MoveRecord::decode(&e), Some(r.clone()));
            for k in 0..e.len() {
                let mut bad = e.clone();
                bad[k] ^= 0x40;
                assert_eq!(MoveRecord::decode(&bad), None, "flip at byte {k}");
            }
            for k in 0..e.len() {
                assert_eq!(MoveRecord::decode(&e[..k]), None, "cut at {k}");
            }
        }
    }

    /// A record written by the first version (no identities) is still recognised.
    #[test]
    fn version_1_records_decode_without_identities() {
        let mut v = MAGIC_V1.to_vec();
        for s in ["fast", "slow", "seq"] {
            v.extend_from_slice(&(s.len() as u16).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&3u32.to_le_bytes());
        v.extend_from_slice(b"a/b");
        let c = crc32c::crc32c(&v);
        v.extend_from_slice(&c.to_le_bytes());
        let r = MoveRecord::decode(&v).unwrap();
        assert_eq!(r.ids, None);
        assert_eq!(r.phase, Phase::Placing);
        assert_eq!((r.src.as_str(), r.dst.as_str()), ("fast", "slow"));
        assert_eq!(r.paths, vec![b"a/b".to_vec()]);
    }
}
