//! The fstests run's summary (`scripts/fstests/summarize.sh`): every test the run was asked
//! for appears once with its status and reason — passed, failed, not run by the suite, not
//! run because this machine lacks what the test needs (`scripts/fstests/machine`, left out
//! on every target, ext4 included), excluded with the exclusion file's reason — and the
//! counts line says the same.

use std::fs;
use std::process::Command;

use cairn_fstests::{Workdir, workspace_root};

const XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="xfstests" failures="1" skipped="1" tests="3">
	<testcase classname="xfstests.global" name="generic/001" time="4">
	</testcase>
	<testcase classname="xfstests.global" name="generic/002" time="0">
		<skipped message="no O_TMPFILE" />
	</testcase>
	<testcase classname="xfstests.global" name="generic/003" time="2">
		<failure message="- output mismatch" type="TestFail" />
	</testcase>
</testsuite>
"#;

/// Runs `scripts/fstests/NAME ARGS...`, which must succeed; its standard output.
fn script(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/fstests").join(name))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn summarize(mode: &str, machine: &str) -> (String, String) {
    let w = Workdir::new();
    let results = w.p("results");
    fs::create_dir_all(results.join("raw")).unwrap();
    fs::write(results.join("raw/result.xml"), XML).unwrap();
    fs::write(results.join("machine-notrun.tsv"), machine).unwrap();
    // `check` names every test it left out; generic/564 (a machine need too) and 010 (an
    // exclusion) were not asked for, so the summary does not count them.
    fs::write(
        results.join("check.out"),
        "generic/001 4s\ngeneric/009        [expunged]\ngeneric/394        [expunged]\n\
         generic/564        [expunged]\n",
    )
    .unwrap();
    let exclude = w.p("exclude");
    fs::write(
        &exclude,
        "# header\ngeneric/009  # the kernel's FUSE has no such ioctl\ngeneric/010  # another\n",
    )
    .unwrap();
    script(
        "summarize.sh",
        &[results.as_os_str(), exclude.as_os_str(), mode.as_ref()],
    );
    (
        fs::read_to_string(results.join("summary.tsv")).unwrap(),
        fs::read_to_string(results.join("summary.txt")).unwrap(),
    )
}

#[test]
fn every_test_is_counted_once_with_its_reason() {
    let machine = "generic/394\tnotrun\t\tthis machine: root lacks CAP_SYS_RESOURCE (x)\n\
                   generic/718\tnotrun\t\tthis machine: not asked for\n";
    let (tsv, txt) = summarize("softdep", machine);
    let lines: Vec<&str> = tsv.lines().collect();
    assert_eq!(
        lines,
        [
            "generic/001\tpass\t4\t",
            "generic/002\tnotrun\t0\tno O_TMPFILE",
            "generic/003\tfail\t2\t- output mismatch",
            "generic/009\texcluded\t\tthe kernel's FUSE has no such ioctl",
            "generic/394\tnotrun\t\tthis machine: root lacks CAP_SYS_RESOURCE (x)",
        ],
        "{tsv}"
    );
    assert!(
        txt.starts_with("fstests on softdep: 1 passed, 1 failed, 2 not run, 1 excluded\n"),
        "{txt}"
    );
}

#[test]
fn the_machine_s_limits_count_on_ext4_too_but_cairn_s_exclusions_do_not() {
    let machine = "generic/564\tnotrun\t\tthis machine: root lacks CAP_SYS_RESOURCE (x)\n";
    let (tsv, txt) = summarize("ext4", machine);
    assert!(tsv.contains("generic/564\tnotrun\t"), "{tsv}");
    assert!(!tsv.contains("generic/009"), "{tsv}");
    assert!(
        txt.starts_with("fstests on ext4: 1 passed, 1 failed, 2 not run, 0 excluded\n"),
        "{txt}"
    );
}

/// `table.sh` reads runs — finished, cut short or still going — and writes nothing into
/// them: a run without a summary yet is summarized into a directory of its own.
#[test]
fn the_table_writes_nothing_into_the_runs_it_reads() {
    let w = Workdir::new();
    let (ext4, live) = (w.p("ext4"), w.p("softdep"));
    for (d, out) in [
        (
            &ext4,
            "generic/001 4s\ngeneric/002 [not run] no O_TMPFILE\n",
        ),
        (
            &live,
            "generic/001 3s\ngeneric/002 - output mismatch (see x)\n",
        ),
    ] {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join("check.out"), out).unwrap();
    }
    let listing = |d: &std::path::Path| {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = (listing(&ext4), listing(&live));
    let table = script("table.sh", &[ext4.as_os_str(), live.as_os_str()]);
    assert!(
        table.contains("| softdep | 2 | 1 | 1 | 0 | 1 / 0 / 1 | 002 |"),
        "{table}"
    );
    assert_eq!((listing(&ext4), listing(&live)), before, "nothing written");
}

/// Every exclusion names its reason, in the form the summary reads (`generic/NNN  # why`):
/// a line without one would leave the test out of the run and out of the summary's
/// reasons, unexplained.
#[test]
fn every_exclusion_says_why() {
    for file in ["exclude", "exclude.umbrella"] {
        let path = workspace_root().join("scripts/fstests").join(file);
        let text = fs::read_to_string(&path).unwrap();
        let entries: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .collect();
        assert!(!entries.is_empty(), "{file}: no exclusion");
        for l in entries {
            let (test, why) = l.split_once('#').unwrap_or((l, ""));
            let test = test.trim();
            assert!(
                test.split_once('/')
                    .is_some_and(|(g, n)| !g.is_empty() && n.parse::<u32>().is_ok()),
                "{file}: {l:?} names no test"
            );
            assert!(why.trim().len() > 10, "{file}: {test} gives no reason");
        }
    }
}
