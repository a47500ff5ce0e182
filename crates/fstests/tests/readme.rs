//! The README's shell examples marked `<!-- runs in CI -->` run as written.
//!
//! A newcomer copies them first; an example that no longer runs (a renamed option, a
//! subcommand that changed) is the first thing they meet. Each marked block runs in `bash
//! -e` from the repository's root, with the `cairn` of this build first in `PATH`, its
//! scratch directories (`mktemp -d`) in a temporary directory of the test's own and its
//! runtime files (`CAIRN_RUNTIME_DIR`) there too; whatever a failing block left mounted is
//! unmounted afterwards. A block has two minutes.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn_fstests::{cairn_bin, say, workspace_root};

const MARK: &str = "<!-- runs in CI -->";
const DEADLINE: Duration = Duration::from_secs(120);

/// The marked blocks of `text`, each the lines between its opening ```sh and closing ```.
fn marked_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() != MARK {
            continue;
        }
        let open = lines.next().unwrap_or_default();
        assert_eq!(
            open.trim(),
            "```sh",
            "{MARK} must be followed by a ```sh block"
        );
        let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        out.push(body.join("\n") + "\n");
    }
    out
}

/// Unmounts every mount below `dir` (what a failing block left behind).
fn unmount_below(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in info.lines().rev() {
        if let Some(mp) = l.split(' ').nth(4)
            && Path::new(mp).starts_with(dir)
        {
            let _ = Command::new("umount").args(["-l", mp]).status();
        }
    }
}

fn run_block(n: usize, block: &str) -> Result<(), String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let bin_dir = cairn_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-e", "-c", block])
        .current_dir(workspace_root())
        .env("PATH", path)
        .env("TMPDIR", scratch.path())
        .env("CAIRN_RUNTIME_DIR", scratch.path().join("run"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(s) => break Some(s),
            None if start.elapsed() > DEADLINE => {
                let _ = child.kill();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    unmount_below(scratch.path());
    let shown = format!(
        "--- stdout ---\n{}--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match status {
        Some(s) if s.success() => {
            say!(
                "README block {n}: ran in {:.1} s",
                start.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some(s) => Err(format!("README block {n} failed ({s}):\n{block}\n{shown}")),
        None => Err(format!(
            "README block {n} did not finish in {DEADLINE:?}:\n{block}\n{shown}"
        )),
    }
}

#[test]
fn the_readme_examples_run_as_written() {
    if !nix::unistd::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        say!("not root or no /dev/fuse: README examples skipped");
        return;
    }
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let blocks = marked_blocks(&readme);
    assert!(
        blocks.len() >= 2,
        "the README marks fewer blocks than it did"
    );
    // Blocks are independent (each has its own scratch directory): run them at once.
    let failures: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = blocks
            .iter()
            .enumerate()
            .map(|(n, b)| s.spawn(move || run_block(n, b)))
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap().err())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The runner fails a block that fails: a broken example is caught, not skipped.
#[test]
fn a_failing_example_is_caught() {
    let b = marked_blocks(&format!("{MARK}\n```sh\ntrue\nfalse\n```\n"));
    assert_eq!(b, vec!["true\nfalse\n".to_string()]);
    assert!(run_block(0, &b[0]).is_err());
    assert!(run_block(1, "cairn no-such-subcommand\n").is_err());
}
