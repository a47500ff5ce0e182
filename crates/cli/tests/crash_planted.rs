//! `cairn crash list` and `cairn crash run --planted`: every planted bug is listed, and a
//! campaign against one exits 1 when it catches it (with the first failure reported) and 0
//! when it slips through.

use std::process::{Command, Output};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

fn cairn(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(CAIRN)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn list_prints_every_planted_bug() {
    let dir = tempfile::tempdir().unwrap();
    let o = cairn(dir.path(), &["crash", "list"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for p in cairn_crash::planted::CATALOGUE {
        let line = format!("planted {} — {}", p.name, p.breaks);
        assert!(
            out.lines().any(|l| l == line),
            "missing '{line}' in:\n{out}"
        );
    }
    // The journal's planted bugs and every recording variant are listed too.
    for p in cairn_crash::planted::JOURNAL_CATALOGUE {
        let line = format!("planted {} ({}) — {}", p.name, p.base, p.breaks);
        assert!(
            out.lines().any(|l| l == line),
            "missing '{line}' in:\n{out}"
        );
    }
    for name in cairn_crash::modes::variants().iter().map(|v| v.name) {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("  {name} ("))),
            "variant {name} missing in:\n{out}"
        );
    }
}

#[test]
fn run_planted_exits_1_when_caught_and_0_when_it_slips_through() {
    let dir = tempfile::tempdir().unwrap();
    let o = cairn(
        dir.path(),
        &[
            "crash",
            "run",
            "--planted",
            "lazy-return",
            "--workloads",
            "setattr-size",
            "--states",
            "100",
            "--threads",
            "1",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("planted lazy-return: caught in"), "{out}");
    assert!(
        out.contains("first failure in workload setattr-size at epoch")
            && out.contains("state(s) checked before it")
            && out.contains("shortest reproducing prefix"),
        "{out}"
    );
    // rename-remove-first cannot show in a workload without a rename.
    let o = cairn(
        dir.path(),
        &[
            "crash",
            "run",
            "--planted",
            "rename-remove-first",
            "--workloads",
            "create",
            "--states",
            "50",
            "--threads",
            "1",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("NOT CAUGHT"), "{out}");
    let o = cairn(dir.path(), &["crash", "run", "--planted", "no-such-bug"]);
    assert!(!o.status.success());
}
