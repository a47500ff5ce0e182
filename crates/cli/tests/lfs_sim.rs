//! `cairn lfs sim --quick` end to end: the command writes sim.md, sim.json and the five
//! plots, with the real-file-system comparison in both, its JSON holds the paper's shapes (the checks themselves are tested, including
//! that they fail for wrong policies, in crates/lfs/tests/sim_shapes.rs), and bad arguments
//! are refused without a panic. Needs no root.

use std::path::Path;
use std::process::Command;

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

#[test]
fn lfs_sim_quick_writes_tables_and_plots() {
    let seed = 3;
    println!("seed {seed}");
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(CAIRN)
        .args([
            "lfs",
            "sim",
            "--quick",
            "--seed",
            &seed.to_string(),
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains(&format!("seed {seed}")), "{stdout}");
    for f in [
        "fig4-write-cost.png",
        "fig5-distribution.png",
        "fig6-distribution.png",
        "fig7-write-cost.png",
        "cleaned-distribution.png",
    ] {
        let b = std::fs::read(out.path().join(f)).unwrap_or_default();
        assert!(b.starts_with(b"\x89PNG"), "{f} is not a PNG");
    }
    let md = std::fs::read_to_string(out.path().join("sim.md")).unwrap();
    for s in [
        "# LFS cleaning simulator (004 §3.5)",
        "## Write cost against disk utilization (Figs. 4 and 7)",
        "## The paper's claims",
        "(Figs. 5 and 6)",
        &format!("seed {seed}"),
        "## The real file system against the simulator",
        "| greedy |",
        "| cost-benefit+age-sort |",
    ] {
        assert!(md.contains(s), "sim.md lacks {s:?}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("sim.json")).unwrap())
            .unwrap();
    assert_eq!(json["seed"], seed);
    assert_eq!(json["report"]["suite"]["name"], "quick");
    // The real file system ran both policies, each with the simulator's prediction.
    let real = json["real"]["results"].as_array().unwrap();
    assert_eq!(real.len(), 2, "{:?}", json["real"]);
    for r in real {
        assert!(r["write_cost"].as_f64().unwrap() > 1.0, "{r}");
        assert!(r["sim_write_cost"].as_f64().unwrap() > 1.0, "{r}");
    }
    let holds = |id: &str| {
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no check {id}"))["holds"]
            .as_bool()
            .unwrap()
    };
    for id in [
        "cost-benefit-beats-greedy",
        "greedy-locality-not-better",
        "cost-benefit-bimodal",
    ] {
        assert!(holds(id), "{id} fails for seed {seed}:\n{md}");
    }
    // Six curves over the quick sweep, each point with its write cost.
    let curves = json["report"]["curves"].as_array().unwrap();
    assert_eq!(curves.len(), 6);
    for c in curves {
        for p in c["points"].as_array().unwrap() {
            assert!(p["write_cost"].as_f64().unwrap() >= 1.0);
        }
    }
}

#[test]
fn lfs_sim_refuses_bad_arguments() {
    for args in [
        vec!["lfs", "sim", "--threads", "0"],
        vec!["lfs", "sim", "--seed", "-1"],
        vec!["lfs", "sim", "--bogus"],
        vec!["lfs"],
    ] {
        let o = Command::new(CAIRN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // An output directory that cannot be created: one line, exit 1.
    let o = Command::new(CAIRN)
        .args(["lfs", "sim", "--quick", "--out"])
        .arg(Path::new("/proc/cairn-no-such-dir/x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("cairn: creating"), "{err}");
}
