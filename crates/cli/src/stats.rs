//! `cairn stats`: the live counters of a mount, from its daemon's control socket.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{control, runtime};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the daemon's JSON document as it is
    #[arg(long)]
    pub json: bool,
    /// Print again every SECS seconds until interrupted
    #[arg(long, value_name = "SECS")]
    pub watch: Option<f64>,
    /// The mount point
    pub mountpoint: PathBuf,
}

pub fn run(args: Args) -> Result<i32> {
    let mp = runtime::canonical_mountpoint(&args.mountpoint)?;
    let sock = runtime::socket_for(&mp);
    if !sock.exists() {
        bail!(
            "no cairn daemon serves {} (no control socket {})",
            args.mountpoint.display(),
            sock.display()
        );
    }
    let interval = match args.watch {
        Some(s) if !(s.is_finite() && s > 0.0) => {
            bail!("--watch needs a positive number of seconds")
        }
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => None,
    };
    let clear = interval.is_some() && std::io::stdout().is_terminal() && !args.json;
    loop {
        let v = control::request(&sock, "stats")
            .with_context(|| format!("asking the daemon of {}", args.mountpoint.display()))?;
        if args.json {
            println!("{v}");
        } else {
            if clear {
                print!("\x1b[H\x1b[2J");
            }
            print!("{}", render(&v));
        }
        match interval {
            Some(d) => {
                if !clear && !args.json {
                    println!();
                }
                std::thread::sleep(d);
            }
            None => return Ok(0),
        }
    }
}

/// Aligned `key  value` lines, nested objects flattened to dotted keys. A derived FUSE
/// line (requests per second of uptime) is added when the fields are there.
pub fn render(v: &Value) -> String {
    let mut rows = Vec::new();
    flatten("", v, &mut rows);
    let total = v.pointer("/fuse/total").and_then(Value::as_f64);
    let up = v.pointer("/daemon/uptime_secs").and_then(Value::as_f64);
    if let (Some(t), Some(u)) = (total, up)
        && u > 0.0
    {
        rows.push(("fuse.requests_per_sec".into(), format!("{:.1}", t / u)));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, val)| format!("{k:<width$}  {val}\n"))
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), x, out);
            }
        }
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        Value::Number(n) => {
            let s = match n.as_f64() {
                Some(f) if n.is_f64() => format!("{f:.3}"),
                _ => n.to_string(),
            };
            out.push((prefix.to_string(), s));
        }
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_fields_flatten_and_align() {
        let v = serde_json::json!({
            "fs": {"device": {"reads": 3, "writes": 10}, "cache": {"hit_rate": 0.5}},
            "fuse": {"total": 20, "requests": {"lookup": 4}},
            "daemon": {"uptime_secs": 2.0, "image": "/x.img"},
        });
        let text = render(&v);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"fs.device.writes       10"), "{text}");
        assert!(lines.contains(&"fuse.requests.lookup   4"), "{text}");
        assert!(lines.contains(&"fs.cache.hit_rate      0.500"), "{text}");
        assert!(lines.contains(&"daemon.image           /x.img"), "{text}");
        assert!(lines.contains(&"fuse.requests_per_sec  10.0"), "{text}");
    }
}
