//! What the cairn build says of its modes, read from `cairn modes --json`: the benchmark
//! links none of cairn's file-system crates (it measures whichever build it is given), so
//! it reads the registry's facts (the vocabulary of `cairn_vfs::modes`) from the command;
//! this is its only source of mode facts. Nothing in the benchmark
//! compares mode names: which targets exist, which workloads run on which, and how a target
//! recovers after a crash are read off these facts.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use serde::Deserialize;

use crate::sys;

/// The registry's vocabulary, read back from the JSON the command prints.
pub use cairn_vfs::modes::{AfterCrash, Commit, Facts, Family, LogPlacement, Recovery};

/// One listed mode.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Mode {
    #[serde(rename = "mode")]
    pub name: String,
    /// Its on-disk format (`cairn mkfs --format`).
    #[serde(rename = "type")]
    pub format: String,
    pub after_crash: AfterCrash,
    pub facts: Facts,
}

/// One listed variant: a mode run another way (its log on a second device, ...).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Variant {
    #[serde(rename = "variant")]
    pub name: String,
    /// The listed mode it runs.
    pub base: String,
    /// The benchmark's name for it (`cairn-NAME`).
    pub target: String,
    pub facts: Facts,
}

/// Everything `cairn modes --json` lists, in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub modes: Vec<Mode>,
    pub variants: Vec<Variant>,
}

impl Listing {
    /// The listing in `cairn modes --json` output (one object per line; lines that are
    /// neither a mode nor a variant are skipped).
    pub fn parse(out: &str) -> Listing {
        let mut l = Listing::default();
        for line in out.lines() {
            if let Ok(m) = serde_json::from_str::<Mode>(line) {
                l.modes.push(m);
            } else if let Ok(v) = serde_json::from_str::<Variant>(line) {
                l.variants.push(v);
            }
        }
        l
    }

    /// What the binary `cairn` lists, asked once per binary and run (every target's mkfs
    /// and every crash recovery want it); empty if it cannot run.
    pub fn of(cairn: &str) -> Arc<Listing> {
        static LISTED: OnceLock<Mutex<HashMap<String, Arc<Listing>>>> = OnceLock::new();
        let mut m = LISTED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        m.entry(cairn.to_string())
            .or_insert_with(|| {
                let out = sys::run(Command::new(cairn).args(["modes", "--json"]));
                Arc::new(Listing::parse(&out.unwrap_or_default()))
            })
            .clone()
    }

    pub fn mode(&self, name: &str) -> Option<&Mode> {
        self.modes.iter().find(|m| m.name == name)
    }

    /// The variant whose target is `target`.
    pub fn variant_target(&self, target: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.target == target)
    }

    /// The variants with their log on a device of their own whose base is listed: the
    /// benchmark's targets with a second image for the log.
    pub fn log_device_variants(&self) -> impl Iterator<Item = &Variant> {
        self.variants
            .iter()
            .filter(|v| v.facts.log == LogPlacement::Device && self.mode(&v.base).is_some())
    }
}

/// A listing for tests: what a build with every mode lists (the cli crate's tests hold the
/// real registry to the same parse).
#[cfg(test)]
pub fn sample() -> Listing {
    let f = |family: &str, commit: &str, recovery: &str, log: &str| {
        format!(
            r#""facts":{{"family":"{family}","commit":"{commit}","recovery":"{recovery}","log":"{log}"}}"#
        )
    };
    let mode = |name: &str, ty: &str, after: &str, facts: String| {
        format!(r#"{{"mode":"{name}","type":"{ty}","after_crash":"{after}",{facts}}}"#)
    };
    let variant = |name: &str, base: &str, facts: String| {
        format!(r#"{{"variant":"{name}","base":"{base}","target":"cairn-{name}",{facts}}}"#)
    };
    let lines = [
        mode("sync", "ffs", "fsck", f("ffs", "sync", "none", "none")),
        mode("async", "ffs", "fsck", f("ffs", "async", "none", "none")),
        mode(
            "softdep",
            "ffs",
            "mount",
            f("soft_updates", "async", "none", "none"),
        ),
        mode(
            "journal",
            "ffs",
            "recover",
            f("journal", "sync", "log_replay", "area"),
        ),
        mode(
            "journal-async",
            "ffs",
            "recover",
            f("journal", "async", "log_replay", "area"),
        ),
        mode(
            "journal-group",
            "ffs",
            "recover",
            f("journal", "group", "log_replay", "area"),
        ),
        mode(
            "lfs",
            "lfs",
            "recover",
            f("log_structured", "async", "roll_forward", "whole"),
        ),
        variant(
            "journal-2sync",
            "journal",
            f("journal", "sync", "log_replay", "device"),
        ),
        variant(
            "journal-2async",
            "journal-async",
            f("journal", "async", "log_replay", "device"),
        ),
        variant(
            "journal-2group",
            "journal-group",
            f("journal", "group", "log_replay", "device"),
        ),
        variant(
            "lfs-cleaning",
            "lfs",
            f("log_structured", "async", "roll_forward", "whole"),
        ),
        "not json".to_string(),
    ];
    Listing::parse(&lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_variants_are_parsed_apart() {
        let l = sample();
        assert_eq!(l.modes.len(), 7);
        assert_eq!(l.variants.len(), 4);
        assert_eq!(l.mode("softdep").unwrap().after_crash, AfterCrash::Mount);
        assert_eq!(l.mode("lfs").unwrap().format, "lfs");
        assert!(l.mode("journal-2sync").is_none(), "a variant is no mode");
        let two: Vec<&str> = l.log_device_variants().map(|v| v.target.as_str()).collect();
        assert_eq!(
            two,
            [
                "cairn-journal-2sync",
                "cairn-journal-2async",
                "cairn-journal-2group"
            ]
        );
        assert!(Listing::parse("").modes.is_empty());
    }
}
