//! Time as people read it: a Unix time as a UTC civil date, for the timestamps tools print
//! (a log record's time, a result directory's name). Here, below every tool, so that there
//! is one conversion.

/// Seconds since the Unix epoch (negative: before it) as UTC (year, month, day, hour,
/// minute, second): the civil-from-days conversion of Howard Hinnant's date algorithms.
pub fn utc_civil(unix_secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, sod) = (unix_secs.div_euclid(86_400), unix_secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, sod / 3600, sod / 60 % 60, sod % 60)
}

#[cfg(test)]
mod tests {
    use super::utc_civil;

    #[test]
    fn known_dates() {
        assert_eq!(utc_civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(utc_civil(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(utc_civil(1_700_000_000), (2023, 11, 14, 22, 13, 20));
        assert_eq!(utc_civil(-1), (1969, 12, 31, 23, 59, 59));
    }
}
