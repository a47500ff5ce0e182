//! The plots of `cairn lfs sim` (004 §3.5, Figs. 4–7): the cleaning simulator's curves
//! beside the paper's reference curves, drawn with the benchmarks' plotter.

use std::path::{Path, PathBuf};

use anyhow::Result;
use cairn_lfs::sim::paper::{FFS_IMPROVED, FFS_TODAY, no_variance};
use cairn_lfs::sim::{Report, suite};

use crate::plot::{self, LinePlot, Series, XFormat};

/// Where a run writes when not told: `results/lfs-sim-<UTC timestamp>`.
pub fn default_out() -> PathBuf {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    PathBuf::from("results").join(format!("lfs-sim-{}", crate::sys::utc_stamp(now)))
}

/// The figures: write cost against disk utilization with the reference curves (Figs. 4 and
/// 7), and the segment utilization distributions at 75% (Figs. 5 and 6, and the segments
/// cleaned).
pub fn plots(r: &Report, out: &Path) -> Result<Vec<PathBuf>> {
    let us = &r.suite.utilizations;
    let flat = |label: &str, y: f64| Series {
        label: label.into(),
        points: us.iter().map(|&u| (u, y)).collect(),
        spread: None,
    };
    let refs = || {
        vec![
            flat("FFS today", FFS_TODAY),
            flat("FFS improved", FFS_IMPROVED),
            Series {
                label: "no variance 2/(1-u)".into(),
                points: us.iter().map(|&u| (u, no_variance(u))).collect(),
                spread: None,
            },
        ]
    };
    let curve = |key: &str| {
        r.curve(key).map(|c| Series {
            label: c.spec.label.into(),
            points: c
                .points
                .iter()
                .map(|p| (p.spec.utilization, p.write_cost))
                .collect(),
            spread: None,
        })
    };
    let cost_plot = |title: &str, keys: &[&str]| LinePlot {
        title: title.into(),
        x_label: "disk capacity utilization".into(),
        y_label: "write cost".into(),
        x_log: false,
        y_log: false,
        x_fmt: XFormat::Plain,
        series: refs()
            .into_iter()
            .chain(keys.iter().filter_map(|k| curve(k)))
            .collect(),
    };
    let at = r.suite.distribution_at;
    let dist = |key: &str, cleaned: bool| {
        let c = r.curve(key)?;
        let p = c.at(at)?;
        let levels = if cleaned { &p.cleaned } else { &p.at_cleaning };
        let bins = suite::binned(levels, r.suite.bins);
        Some(Series {
            label: c.spec.label.into(),
            points: bins
                .iter()
                .enumerate()
                .map(|(i, &f)| (suite::bin_centre(i, bins.len()), f))
                .collect(),
            spread: None,
        })
    };
    let dist_plot = |title: String, y: &str, keys: &[&str], cleaned: bool| LinePlot {
        title,
        x_label: "segment utilization".into(),
        y_label: y.into(),
        x_log: false,
        y_log: false,
        x_fmt: XFormat::Plain,
        series: keys.iter().filter_map(|k| dist(k, cleaned)).collect(),
    };
    let pct = at * 100.0;
    let figures = [
        (
            "fig4-write-cost.png",
            cost_plot(
                "LFS simulator: greedy cleaning (004 Fig. 4)",
                &[
                    suite::GREEDY_UNIFORM,
                    suite::GREEDY_UNIFORM_AGE_SORT,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::GREEDY_HOT_COLD,
                ],
            ),
        ),
        (
            "fig7-write-cost.png",
            cost_plot(
                "LFS simulator: cost-benefit vs greedy, hot-and-cold (004 Fig. 7)",
                &[
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD,
                ],
            ),
        ),
        (
            "fig5-distribution.png",
            dist_plot(
                format!(
                    "Segment utilization at cleaning time, greedy, {pct:.0}% full (004 Fig. 5)"
                ),
                "fraction of segments",
                &[suite::GREEDY_UNIFORM, suite::GREEDY_HOT_COLD_AGE_SORT],
                false,
            ),
        ),
        (
            "fig6-distribution.png",
            dist_plot(
                format!(
                    "Segment utilization at cleaning time, hot-and-cold, {pct:.0}% full (004 Fig. 6)"
                ),
                "fraction of segments",
                &[
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                ],
                false,
            ),
        ),
        (
            "cleaned-distribution.png",
            dist_plot(
                format!("Utilization of the segments cleaned, {pct:.0}% full"),
                "fraction of segments cleaned",
                &[
                    suite::GREEDY_UNIFORM,
                    suite::GREEDY_HOT_COLD_AGE_SORT,
                    suite::COST_BENEFIT_HOT_COLD_AGE_SORT,
                ],
                true,
            ),
        ),
    ];
    let mut written = Vec::new();
    for (name, p) in figures {
        let path = out.join(name);
        plot::render_line(&p, &path)?;
        written.push(path);
    }
    Ok(written)
}
