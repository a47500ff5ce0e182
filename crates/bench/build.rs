//! Embeds which commit of cairn's source this build was made from, and whether the working
//! tree had uncommitted changes to tracked files, as `CAIRN_BUILD_COMMIT` (full hash) and
//! `CAIRN_BUILD_DIRTY` (`true`/`false`); a benchmark run records both (`meta.json`).
//!
//! Why at build time: the question is "what source is this binary", which only the build
//! knows. Asking git when the benchmark runs would report the tree as it is then (a newer
//! checkout, an edit since the build), or nothing once the binary runs away from its source.
//! Git is asked in this crate's own directory, so where cargo puts the binaries
//! (CARGO_TARGET_DIR) does not matter.
//!
//! Why these rerun-if-changed lines: the answer changes when HEAD moves (HEAD itself, the
//! branch ref it names, packed refs), when the index changes (staging), or when any tracked
//! file changes. Each tracked file is named, not the repository's directory, so the target
//! directory (possibly inside the tree) never triggers a rerun of itself. Without git or a
//! repository (a source tarball) nothing is embedded and the run records "unknown".

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        // Never write the index (git status may refresh it): writing it would mark it changed
        // and rerun this script on the next build, and could race a git command of the user's.
        .arg("--no-optional-locks")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn watch(path: &Path) {
    println!("cargo:rerun-if-changed={}", path.display());
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Some(here) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    let Some(top) = git(&here, &["rev-parse", "--show-toplevel"]) else {
        return;
    };
    let top = PathBuf::from(top.trim_end());
    let abs = |p: String| {
        let p = PathBuf::from(p.trim_end());
        if p.is_absolute() { p } else { here.join(p) }
    };
    if let Some(git_dir) = git(&here, &["rev-parse", "--absolute-git-dir"]).map(abs) {
        watch(&git_dir.join("HEAD"));
        if git_dir.join("index").exists() {
            watch(&git_dir.join("index"));
        }
    }
    if let Some(common) = git(&here, &["rev-parse", "--git-common-dir"]).map(abs) {
        // A path that does not exist would rerun this script on every build: name only those
        // that do (a branch ref packed away shows as a change of packed-refs).
        if common.join("packed-refs").exists() {
            watch(&common.join("packed-refs"));
        }
        if let Some(r) = git(&here, &["symbolic-ref", "-q", "HEAD"]) {
            let r = common.join(r.trim_end());
            if r.exists() {
                watch(&r);
            }
        }
    }
    // Where this build writes: a watched directory must not contain it, or every build would
    // change what it watches and rerun it.
    let out_dir = std::env::var_os("OUT_DIR").map(PathBuf::from);
    if let Some(files) = git(&top, &["ls-files", "-z"]) {
        for f in files.split('\0').filter(|f| !f.is_empty()) {
            let p = top.join(f);
            if p.exists() {
                watch(&p);
                continue;
            }
            // A tracked file deleted from the tree: watch its directory instead, which changes
            // when the file comes back.
            if let Some(d) = p
                .parent()
                .filter(|d| d.exists() && !out_dir.as_deref().is_some_and(|o| o.starts_with(d)))
            {
                watch(d);
            }
        }
    }
    let Some(commit) = git(&here, &["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=CAIRN_BUILD_COMMIT={}", commit.trim_end());
    if let Some(status) = git(&top, &["status", "--porcelain", "--untracked-files=no"]) {
        println!(
            "cargo:rustc-env=CAIRN_BUILD_DIRTY={}",
            !status.trim().is_empty()
        );
    }
}
