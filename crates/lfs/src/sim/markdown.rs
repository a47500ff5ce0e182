//! The suite's report as Markdown: the tables of Figs. 4–7 with the paper's reference
//! curves and stated numbers beside cairn's.

use std::fmt::Write as _;

use super::paper::{self, FFS_IMPROVED, FFS_TODAY, no_variance};
use super::suite::{
    self, COST_BENEFIT_HOT_COLD_AGE_SORT, GREEDY_HOT_COLD_AGE_SORT, GREEDY_UNIFORM, Report,
};

/// Renders `r`; `command` is the command line that produced it.
pub fn markdown(r: &Report, command: &str) -> String {
    let mut s = String::new();
    let su = &r.suite;
    let g = su.geometry;
    let _ = writeln!(s, "# LFS cleaning simulator (004 §3.5)\n");
    let _ = writeln!(s, "`{command}` — seed {}, suite `{}`.\n", r.seed, su.name);
    let _ = writeln!(
        s,
        "A disk of {} segments × {} blocks of 4 KiB ({} MiB segments, {} MiB), holding one-block \
         files; each step overwrites one file, whose new version goes to the log head. The \
         cleaner starts when fewer than {} segments are clean and cleans until {} are; live \
         blocks are written back at the log head; a segment's age counts from its {} time. \
         Runs warm up until the write cost of two successive windows of {} epochs (an epoch = \
         one disk of new data) agrees within {:.0}% (at least {}, at most {} epochs), then \
         measure {} epochs. Write cost = (new + read + rewritten blocks) / new blocks (004 \
         eq. 1); an empty segment is not read.\n",
        g.segments,
        g.blocks_per_segment,
        fmt_num(g.blocks_per_segment as f64 * 4.0 / 1024.0),
        g.blocks() * 4 / 1024,
        su.thresholds.start_below(),
        su.thresholds.stop_at(),
        su.age.name(),
        su.schedule.window_epochs,
        su.schedule.tolerance * 100.0,
        su.schedule.min_warmup_epochs,
        su.schedule.max_warmup_epochs,
        su.schedule.measure_epochs,
    );

    // Figs. 4 and 7.
    let _ = writeln!(
        s,
        "## Write cost against disk utilization (Figs. 4 and 7)\n"
    );
    let _ = writeln!(
        s,
        "Reference curves (Figs. 3–4): FFS today = {FFS_TODAY} (the paper: 10–20), FFS improved \
         = {FFS_IMPROVED}, no variance = 2/(1−u). Columns marked * are the paper's curves.\n"
    );
    let mut head = String::from("| disk utilization | no variance |");
    let mut rule = String::from("|---|---|");
    for c in &r.curves {
        let star = if c.spec.paper.is_some() { " *" } else { "" };
        let _ = write!(head, " {}{star} |", c.spec.label);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for &u in &su.utilizations {
        let _ = write!(s, "| {:.0}% | {:.2} |", u * 100.0, no_variance(u));
        for c in &r.curves {
            let _ = write!(
                s,
                " {} |",
                c.at(u)
                    .map_or("–".into(), |p| format!("{:.2}", p.write_cost))
            );
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "\nMean utilization of the non-empty segments cleaned (and, where any, the share of \
         cleaned segments that were empty):\n"
    );
    let mut head2 = String::from("| disk utilization |");
    for c in &r.curves {
        let _ = write!(head2, " {} |", c.spec.label);
    }
    let _ = writeln!(s, "{head2}\n|---|{}", "---|".repeat(r.curves.len()));
    for &u in &su.utilizations {
        let _ = write!(s, "| {:.0}% |", u * 100.0);
        for c in &r.curves {
            let cell = c.at(u).map_or("–".into(), |p| {
                if p.empty_fraction > 0.0005 {
                    format!(
                        "{:.2} ({:.0}% empty)",
                        p.cleaned_utilization,
                        p.empty_fraction * 100.0
                    )
                } else {
                    format!("{:.2}", p.cleaned_utilization)
                }
            });
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }

    // The claims.
    let checks = paper::checks(r);
    let _ = writeln!(s, "\n## The paper's claims\n");
    let _ = writeln!(s, "| 004 | the paper | cairn | holds |\n|---|---|---|---|");
    for c in &checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.source,
            c.claim,
            c.measured,
            if c.holds { "yes" } else { "**no**" }
        );
    }

    // Figs. 5 and 6.
    let at = su.distribution_at;
    let dist_curves = [
        GREEDY_UNIFORM,
        GREEDY_HOT_COLD_AGE_SORT,
        COST_BENEFIT_HOT_COLD_AGE_SORT,
    ];
    for (title, cleaned) in [
        (
            format!(
                "## Segment utilization at cleaning time, {:.0}% disk utilization (Figs. 5 and 6)\n\n\
                 As the paper draws Figs. 5–6: the utilization of every segment available to the \
                 cleaner, sampled each time a cleaning pass starts; fraction of segments per \
                 bin of {:.3}.\n",
                at * 100.0,
                1.0 / su.bins as f64
            ),
            false,
        ),
        (
            format!(
                "## Utilization of the segments cleaned, {:.0}% disk utilization\n\n\
                 The segments each policy chose, as a fraction of all segments cleaned (004 §3.5: \
                 cost-benefit \"cleans cold segments at about 75% utilization but waits until hot \
                 segments reach a utilization of about 15%\").\n",
                at * 100.0
            ),
            true,
        ),
    ] {
        let _ = writeln!(s, "\n{title}");
        let cols: Vec<(&str, Vec<f64>)> = dist_curves
            .iter()
            .filter_map(|k| {
                let c = r.curve(k)?;
                let p = c.at(at)?;
                let levels = if cleaned { &p.cleaned } else { &p.at_cleaning };
                Some((c.spec.label, suite::binned(levels, su.bins)))
            })
            .collect();
        let _ = write!(s, "| segment utilization |");
        for (l, _) in &cols {
            let _ = write!(s, " {l} |");
        }
        let _ = writeln!(s, "\n|---|{}", "---|".repeat(cols.len()));
        for i in 0..su.bins {
            let lo = i as f64 / su.bins as f64;
            let hi = (i + 1) as f64 / su.bins as f64;
            let _ = write!(s, "| {:.0}–{:.0}% |", lo * 100.0, hi * 100.0);
            for (_, v) in &cols {
                let _ = write!(s, " {} |", fmt_frac(v[i]));
            }
            s.push('\n');
        }
    }

    // Ablations.
    let _ = writeln!(s, "\n## Ablations at {:.0}% disk utilization\n", at * 100.0);
    for (title, rows) in [
        (
            "Degree of locality (writes/files to the hot group)",
            &r.localities,
        ),
        (
            "Segments cleaned per pass (the stop threshold; the paper's question 2 of §3.4)",
            &r.batches,
        ),
        (
            "What a segment's age counts from (cost-benefit, hot-and-cold 90/10)",
            &r.ages,
        ),
    ] {
        let _ = writeln!(
            s,
            "{title}:\n\n| run | write cost | mean utilization cleaned |\n|---|---|---|"
        );
        for v in rows.iter() {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {:.2} |",
                v.label, v.result.write_cost, v.result.cleaned_utilization
            );
        }
        s.push('\n');
    }

    // Steady state.
    let all: Vec<_> = r
        .curves
        .iter()
        .flat_map(|c| c.points.iter())
        .chain(r.localities.iter().map(|v| &v.result))
        .chain(r.batches.iter().map(|v| &v.result))
        .chain(r.ages.iter().map(|v| &v.result))
        .collect();
    let unsettled: Vec<String> = all
        .iter()
        .filter(|p| !p.steady)
        .map(|p| {
            format!(
                "{} {} at {:.0}%",
                p.spec.cleaner.policy.name(),
                p.spec.access.name(),
                p.spec.utilization * 100.0
            )
        })
        .collect();
    let (wmin, wmax) = all.iter().fold((u32::MAX, 0), |(a, b), p| {
        (a.min(p.warmup_epochs), b.max(p.warmup_epochs))
    });
    let _ = writeln!(
        s,
        "Steady state: {} of {} runs settled (warm-up {}–{} epochs){}.",
        all.len() - unsettled.len(),
        all.len(),
        wmin,
        wmax,
        if unsettled.is_empty() {
            String::new()
        } else {
            format!("; not settled at the cap: {}", unsettled.join(", "))
        }
    );
    s
}

fn fmt_frac(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

fn fmt_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v}")
    }
}
