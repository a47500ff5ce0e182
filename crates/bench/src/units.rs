//! How numbers read in tables, progress lines and descriptions: rates, factors, sizes. The
//! lowest floor of the crate (nothing here knows a workload or a target), so every floor
//! above formats the same number the same way.

/// A rate with three significant figures and thousands separators: 152,000 / 1,210 / 95.3.
pub fn fmt_rate(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    let digits = if v.abs() >= 1.0 {
        v.abs().log10().floor() as i32 + 1
    } else {
        0
    };
    let decimals = (3 - digits).clamp(0, 2) as usize;
    let rounded = if digits > 3 {
        let p = 10f64.powi(digits - 3);
        (v / p).round() * p
    } else {
        v
    };
    let s = format!("{rounded:.decimals$}");
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let (sign, int) = int.strip_prefix('-').map_or(("", int), |i| ("-", i));
    let mut grouped = String::new();
    for (k, c) in int.chars().enumerate() {
        if k > 0 && (int.len() - k) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// A scale factor with at most four significant digits and no trailing zeros: 1, 0.1, 0.01
/// (`--scale 0.1` gives netnews 0.1 × 0.1, which `{}` prints as 0.010000000000000002).
pub fn fmt_factor(v: f64) -> String {
    if !v.is_finite() {
        return "—".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let decimals = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// An optional value through `f`; a dash when there is none.
pub fn fmt_opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "—".into())
}

/// A byte count in whole GiB, else MiB, else bytes.
pub fn fmt_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 => format!("{} MiB", n >> 20),
        n => format!("{n} B"),
    }
}

/// A file size the way the papers' axes print it: 0, 512, 1K, 96K, 1M, 4M.
pub fn fmt_size(bytes: f64) -> String {
    let b = bytes.max(0.0) as u64;
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}
