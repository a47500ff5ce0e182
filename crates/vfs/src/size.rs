//! Sizes as people write them in options, configurations and command lines: the one parser
//! every crate uses (mount options, mkfs, the policy layer's configuration, the benchmark).

/// Parses `4096`, `64K`, `256M`, `1.5G`, `2T`, `8KiB`, `8KB` (binary units, any case,
/// surrounding blanks ignored; a fraction only with a unit, rounded down to a byte). A
/// one-line reason for anything else, or a size beyond 2^64 − 1.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("bad size '{t}' (a number of bytes, or with K, M, G or T)");
    let t2 = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix(['B', 'b']))
        .unwrap_or(t);
    let (num, shift) = match t2.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t2[..t2.len() - 1], 10),
        Some('M') => (&t2[..t2.len() - 1], 20),
        Some('G') => (&t2[..t2.len() - 1], 30),
        Some('T') => (&t2[..t2.len() - 1], 40),
        // "8B" is bytes; "B" alone, or a bare "iB", is nothing.
        _ if t2.len() < t.len() && t.ends_with("iB") => return Err(bad()),
        _ => (t2, 0),
    };
    let num = num.trim();
    if num.is_empty() {
        return Err(bad());
    }
    let mult = 1u64 << shift;
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| format!("size '{t}' too large"));
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if shift == 0 || !f.is_finite() || f < 0.0 || !num.contains('.') {
        return Err(bad());
    }
    let v = f * mult as f64;
    if v >= u64::MAX as f64 {
        return Err(format!("size '{t}' too large"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        for (s, n) in [
            ("4096", 4096),
            (" 64k ", 64 << 10),
            ("256M", 256 << 20),
            ("1G", 1 << 30),
            ("2T", 2 << 40),
            ("8KiB", 8 << 10),
            ("8KB", 8 << 10),
            ("512B", 512),
            ("1.5M", 3 << 19),
            ("0", 0),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
        for s in [
            "", "K", "B", "iB", "G", "1.5", "-1", "-1K", "1X", "nanK", "infM", "1e3K", "4 096",
        ] {
            assert!(parse_size(s).is_err(), "{s}");
        }
        let e = parse_size("99999999999T").unwrap_err();
        assert!(e.contains("too large"), "{e}");
        assert!(parse_size("99999999999999999999.5T").is_err());
    }
}
