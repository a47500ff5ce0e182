//! The mount(8)/umount(8) helpers: `mount -t cairn IMAGE DIR` runs
//! `/sbin/mount.cairn IMAGE DIR [-sfnv] [-o OPTIONS]`, `mount -t fuse.cairn IMAGE DIR` (the
//! type the mount table shows, and what fstests' FUSE support mounts with) runs
//! `/sbin/mount.fuse.cairn` the same way, and `umount DIR` of a `fuse.cairn`
//! mount runs `/sbin/umount.fuse.cairn DIR [-flnrv]`. All are symlinks to a copy of `cairn`
//! in /usr/local/lib/cairn (`cairn install-helper`; the copy keeps fstab mounts working after
//! the build tree is cleaned), which recognises them by its argv[0] and turns them into
//! `cairn mount` / `cairn umount` (the latter waits for the final flush, which plain
//! umount(2) does not).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const MOUNT_HELPER: &str = "mount.cairn";
/// The same helper under the name mount(8) looks for with `-t fuse.cairn`.
pub const FUSE_MOUNT_HELPER: &str = "mount.fuse.cairn";
pub const UMOUNT_HELPER: &str = "umount.fuse.cairn";

/// What a helper invocation amounts to.
#[derive(Debug, PartialEq, Eq)]
pub enum Helper {
    /// Run `cairn` with these arguments (argv[0] included).
    Run(Vec<OsString>),
    /// Exit at once with this code (mount's -f "fake" mode).
    Exit(i32),
}

/// Parsed helper arguments: bare flags, flags with values, positionals.
type Parsed = (Vec<char>, Vec<(char, String)>, Vec<OsString>);

/// Flag clusters like `-sv` and options with attached or separate values (`-oro`, `-o ro`).
fn parse_flags(argv: &[OsString], with_value: &[char]) -> Result<Parsed, String> {
    let (mut flags, mut values, mut pos) = (Vec::new(), Vec::new(), Vec::new());
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if !s.starts_with('-') || s.len() == 1 {
            pos.push(a.clone());
            continue;
        }
        for (i, c) in s[1..].char_indices() {
            if with_value.contains(&c) {
                let rest = &s[1 + i + c.len_utf8()..];
                let v = if rest.is_empty() {
                    it.next()
                        .ok_or(format!("option -{c} needs a value"))?
                        .to_string_lossy()
                        .into_owned()
                } else {
                    rest.to_string()
                };
                values.push((c, v));
                break;
            }
            flags.push(c);
        }
    }
    Ok((flags, values, pos))
}

/// `mount.cairn SOURCE DIR [-sfnvrw] [-o OPTIONS] [-t TYPE]` → `cairn mount ...`.
pub fn mount_args(argv: &[OsString]) -> Result<Helper, String> {
    let (flags, values, pos) = parse_flags(argv, &['o', 't', 'N'])?;
    let [source, dir] = <[OsString; 2]>::try_from(pos)
        .map_err(|_| "usage: mount.cairn IMAGE DIR [-sfnv] [-o OPTIONS]".to_string())?;
    let mut opts: Vec<String> = Vec::new();
    let mut sloppy = false;
    for f in flags {
        match f {
            'f' => return Ok(Helper::Exit(0)),
            's' => sloppy = true,
            'n' | 'v' => {}
            'r' => opts.push("ro".into()),
            'w' => opts.push("rw".into()),
            c => return Err(format!("unknown flag -{c}")),
        }
    }
    for (c, v) in values {
        match c {
            'o' => opts.push(v),
            'N' => return Err("mount namespaces (-N) are not supported".into()),
            _ => {} // -t cairn: we know.
        }
    }
    let mut out: Vec<OsString> = vec!["cairn".into(), "mount".into()];
    if sloppy {
        out.push("--sloppy".into());
    }
    let mut opts: Vec<String> = opts.into_iter().filter(|o| !o.is_empty()).collect();
    // mount(8) passes a helper `nodev` and `nosuid` when they are asked for, and drops
    // `dev` and `suid`, its defaults: so, as libfuse's mount.fuse does, their absence means
    // dev and suid (a `user` fstab entry gets nodev,nosuid from mount(8) itself). `cairn
    // mount` run directly keeps FUSE's nodev,nosuid default.
    let given = |o: &str| opts.iter().flat_map(|s| s.split(',')).any(|x| x == o);
    let defaults: Vec<&str> = [("dev", "nodev"), ("suid", "nosuid")]
        .into_iter()
        .filter(|(on, off)| !given(on) && !given(off))
        .map(|(on, _)| on)
        .collect();
    opts.extend(defaults.into_iter().map(String::from));
    if !opts.is_empty() {
        out.push("-o".into());
        out.push(opts.join(",").into());
    }
    out.push(source);
    out.push(dir);
    Ok(Helper::Run(out))
}

/// `umount.fuse.cairn DIR [-flnrv] [-t TYPE]` → `cairn umount [-l] DIR`.
pub fn umount_args(argv: &[OsString]) -> Result<Helper, String> {
    let (flags, values, pos) = parse_flags(argv, &['t', 'N'])?;
    if values.iter().any(|(c, _)| *c == 'N') {
        return Err("mount namespaces (-N) are not supported".into());
    }
    let [dir] = <[OsString; 1]>::try_from(pos)
        .map_err(|_| "usage: umount.fuse.cairn DIR [-l]".to_string())?;
    let mut out: Vec<OsString> = vec!["cairn".into(), "umount".into()];
    if flags.contains(&'l') {
        out.push("--lazy".into());
    }
    out.push(dir);
    Ok(Helper::Run(out))
}

#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// Directory for the helpers (where mount(8) looks for them)
    #[arg(long, default_value = "/sbin")]
    pub prefix: PathBuf,
    /// Directory the helpers' copy of this binary goes to, so that a rebuild or
    /// `cargo clean` of the tree it came from cannot break fstab mounts
    #[arg(long, default_value = "/usr/local/lib/cairn")]
    pub lib_dir: PathBuf,
    /// Point the helpers at this binary where it is instead of at a copy (for a binary
    /// already installed in a stable place, as `make install` does)
    #[arg(long)]
    pub link: bool,
}

/// Creates `PREFIX/mount.cairn`, `PREFIX/mount.fuse.cairn` and `PREFIX/umount.fuse.cairn`,
/// symlinks to a copy of this
/// binary in `LIB_DIR` (or, with `--link`, to this binary itself), and says where.
pub fn install(args: InstallArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("cannot find the cairn binary")?;
    let exe = exe.canonicalize().unwrap_or(exe);
    // A relative directory would make relative symlinks that resolve against /sbin.
    let lib_dir = std::path::absolute(&args.lib_dir)
        .with_context(|| format!("bad directory {}", args.lib_dir.display()))?;
    let target = if args.link {
        exe
    } else {
        std::fs::create_dir_all(&lib_dir)
            .with_context(|| format!("cannot create {}", lib_dir.display()))?;
        let copy = lib_dir.join("cairn");
        if copy != exe {
            // Copy beside, then rename: a mount starting meanwhile runs the old binary or
            // the new one, never half of one.
            let tmp = lib_dir.join(format!(".cairn.{}", std::process::id()));
            std::fs::copy(&exe, &tmp)
                .with_context(|| format!("cannot copy {} to {}", exe.display(), tmp.display()))?;
            std::fs::rename(&tmp, &copy)
                .with_context(|| format!("cannot install {}", copy.display()))?;
        }
        println!("{} (a copy of {})", copy.display(), exe.display());
        copy
    };
    std::fs::create_dir_all(&args.prefix)
        .with_context(|| format!("cannot create {}", args.prefix.display()))?;
    for name in [MOUNT_HELPER, FUSE_MOUNT_HELPER, UMOUNT_HELPER] {
        let link = args.prefix.join(name);
        match replace_symlink(&target, &link)? {
            Some(old) if old != target => println!(
                "{} -> {} (replaced a link to {})",
                link.display(),
                target.display(),
                old.display()
            ),
            _ => println!("{} -> {}", link.display(), target.display()),
        }
    }
    Ok(0)
}

/// Points `link` at `target`; returns where an existing symlink pointed (so the caller can
/// say what it replaced). A file that is not a symlink is never replaced.
fn replace_symlink(target: &Path, link: &Path) -> Result<Option<PathBuf>> {
    let old = match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {
            let old = std::fs::read_link(link).ok();
            std::fs::remove_file(link)?;
            old
        }
        Ok(_) => bail!(
            "{} exists and is not a symlink; not replacing it",
            link.display()
        ),
        Err(_) => None,
    };
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot create {}", link.display()))?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_helper_translates_like_mount_dot_fuse() {
        assert_eq!(
            mount_args(&v(&[
                "mount.cairn",
                "/img",
                "/mnt",
                "-o",
                "rw,mode=async",
                "-n"
            ])),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "-o",
                "rw,mode=async,dev,suid",
                "/img",
                "/mnt"
            ])))
        );
        assert_eq!(
            mount_args(&v(&[
                "mount.cairn",
                "-sv",
                "-oro",
                "/img",
                "/mnt",
                "-t",
                "cairn"
            ])),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "--sloppy",
                "-o",
                "ro,dev,suid",
                "/img",
                "/mnt"
            ])))
        );
        // mount(8) passes nodev and nosuid when asked for (and drops dev and suid).
        assert_eq!(
            mount_args(&v(&[
                "mount.cairn",
                "/img",
                "/mnt",
                "-o",
                "rw,nodev,nosuid"
            ])),
            Ok(Helper::Run(v(&[
                "cairn",
                "mount",
                "-o",
                "rw,nodev,nosuid",
                "/img",
                "/mnt"
            ])))
        );
        assert_eq!(
            mount_args(&v(&["mount.cairn", "/img", "/mnt", "-f"])),
            Ok(Helper::Exit(0))
        );
        assert!(mount_args(&v(&["mount.cairn", "/img"])).is_err());
        assert!(mount_args(&v(&["mount.cairn", "/img", "/mnt", "-o"])).is_err());
    }

    #[test]
    fn umount_helper_keeps_lazy() {
        assert_eq!(
            umount_args(&v(&["umount.fuse.cairn", "/mnt", "-l", "-t", "fuse.cairn"])),
            Ok(Helper::Run(v(&["cairn", "umount", "--lazy", "/mnt"])))
        );
        assert!(umount_args(&v(&["umount.fuse.cairn"])).is_err());
    }
}
