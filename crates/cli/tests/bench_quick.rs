//! `cairn bench run --suite quick` end to end on cairn's async mode and kernel ext4: every
//! workload of the paper suite must run on both and produce numbers, and the report must hold
//! every paper table and plot. Speeds are never asserted (the machine is shared); that the
//! harness works is.
//!
//! Needs root (loop devices, mounts) and /dev/fuse, like the benchmark itself; CI has both.
//! The run's scratch parent is a private directory (never a fixed path another run could be
//! using) that is removed when the test ends, failed or not.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private parent for the run's scratch directory on the local disk (/var/tmp; /tmp may be
/// tmpfs, which the benchmark refuses). Removed on drop, also when the test fails: first
/// whatever a run that died left in it (the benchmark's own cleanup), then the directory,
/// never through a mount.
struct ScratchParent(PathBuf);

impl ScratchParent {
    fn new() -> ScratchParent {
        let d = tempfile::Builder::new()
            .prefix("cairn-bench-test.")
            .tempdir_in("/var/tmp")
            .unwrap();
        ScratchParent(d.keep())
    }
}

impl Drop for ScratchParent {
    fn drop(&mut self) {
        let _ = cairn_bench::scratch::cleanup_dead_runs(&self.0);
        if let Err(e) = cairn_bench::scratch::remove_tree(&self.0) {
            eprintln!("bench_quick: {e:#}");
        }
    }
}

fn can_run() -> bool {
    nix::unistd::geteuid().is_root() && Path::new("/dev/fuse").exists()
}

#[test]
fn quick_suite_produces_every_workload_on_cairn_and_ext4() {
    if !can_run() {
        // Outside CI (no root): the suite cannot mount anything. CI runs as root.
        eprintln!("bench_quick: needs root and /dev/fuse; skipped");
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run this test as root"
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let scratch = ScratchParent::new();
    let run = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args([
            "bench",
            "run",
            "--suite",
            "quick",
            "--targets",
            "cairn-async,ext4",
        ])
        // Unpinned: the test asserts no speeds, and the caller's placement stays in force.
        .args(["--no-progress", "--no-flush-rate", "--cpu", "none", "--out"])
        .arg(out.path())
        .arg("--scratch")
        .arg(&scratch.0)
        .output()
        .unwrap();
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap_or_default();
    let terminal = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "cairn bench run failed ({}):\n{}\n{summary}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    // The run made its own directory under the parent and removed it at the end.
    let left: Vec<_> = std::fs::read_dir(&scratch.0).unwrap().flatten().collect();
    assert!(left.is_empty(), "the run left {left:?}");
    // The terminal gets a short summary pointing at the files, not summary.md.
    assert!(
        terminal.contains("0-length create/delete (000 Table 4)")
            && terminal.contains(&out.path().display().to_string())
            && !terminal.contains("## ")
            && terminal.lines().count() < 40,
        "{terminal}"
    );

    // Every number in summary.md is formatted: no float's full binary expansion
    // (1.2799997329711914) anywhere, tables or prose.
    let long: Vec<&str> = summary
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter(|t| {
            t.split('.')
                .skip(1)
                .any(|f| f.len() > 4 && f.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "unformatted numbers {long:?} in:\n{summary}"
    );

    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("meta.json")).unwrap())
            .unwrap();
    let workloads: Vec<String> = meta["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    // The papers' workloads, which run on both targets; the suite also holds the ones that
    // need a cairn journal or lfs (group commit, the recovery sweep), which run on neither.
    let paper = [
        "create-unlink",
        "smallfile",
        "largefile",
        "micro",
        "postmark",
        "postmark-umbrella",
        "postmark-large",
        "ssh",
        "netnews",
        "sdet",
        "recovery",
    ];
    for w in paper.iter().chain(&["group-create", "recovery-sweep"]) {
        assert!(workloads.iter().any(|x| x == w), "suite lacks {w}");
    }
    let workloads: Vec<String> = paper.iter().map(|w| w.to_string()).collect();
    let mut records = Vec::new();
    for e in std::fs::read_dir(out.path()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("rec-") {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            records.push(v);
        }
    }
    for w in &workloads {
        for t in ["cairn-async", "ext4"] {
            let r = records
                .iter()
                .find(|r| r["workload"] == w.as_str() && r["target"] == t)
                .unwrap_or_else(|| panic!("no record of {w} on {t}"));
            assert!(r["error"].is_null(), "{w} on {t} failed: {}", r["error"]);
            let phases = r["phases"].as_array().unwrap();
            assert!(!phases.is_empty(), "{w} on {t}: no phases");
            for p in phases {
                let rate = p["rate"].as_f64().unwrap();
                assert!(
                    rate.is_finite() && rate > 0.0,
                    "{w} on {t}: phase {} has rate {rate}",
                    p["phase"]
                );
            }
        }
    }
    for heading in [
        "000 Table 4",
        "000 Figures 1–4",
        "000 Table 5",
        "000 Table 6",
        "000 Figure 5",
        "000 Table 7",
        "004 Fig. 8",
        "004 Fig. 9",
        "002 Table III",
    ] {
        assert!(summary.contains(heading), "summary.md lacks {heading}");
    }
    for png in [
        "micro-create.png",
        "micro-read.png",
        "micro-overwrite.png",
        "micro-delete.png",
        "sdet.png",
        "smallfile.png",
        "largefile.png",
    ] {
        let len = std::fs::metadata(out.path().join(png))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 1000, "{png} missing or empty");
    }

    // `cairn bench report` re-renders the same tables from the JSON alone.
    std::fs::remove_file(out.path().join("summary.md")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["bench", "report"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success());
    let again = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert_eq!(again, summary);
}
