//! Shared by the cli's test binaries.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// Runs the shell `script` (with `set -e`, in `cwd`, `$CAIRN` the binary under test) inside
/// a private mount namespace in which the directory /sbin points to is an overlay: helpers
/// installed there (`cairn install-helper`) vanish with the namespace, so a test never
/// touches the machine's /sbin. Fails the test, with the script's output, when it fails.
pub fn in_private_sbin(script: &str, cwd: &Path, runtime: &Path) {
    let sbin = std::fs::canonicalize("/sbin").unwrap();
    let full = format!(
        r#"set -e
mkdir -p ov && mount -t tmpfs none ov && mkdir ov/up ov/work
mount -t overlay overlay -o lowerdir={sbin},upperdir=ov/up,workdir=ov/work {sbin}
{script}"#,
        sbin = sbin.display()
    );
    // `slave`, not `private`: a private copy of the namespace would hold every other test's
    // FUSE mount alive after its unmount, and those daemons could not end until this one did.
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "slave", "sh", "-c", &full])
        .env("CAIRN", env!("CARGO_BIN_EXE_cairn"))
        .env("CAIRN_RUNTIME_DIR", runtime)
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}
