//! Time as people read it: a Unix time as a UTC civil date, for the timestamps tools print
//! (a log record's time, a result directory's name). Here, below every tool, so that there
//! is one conversion. And the range of times a cairn file system keeps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// The earliest time, in whole seconds since the epoch, every cairn file system keeps: ffs
/// stores nanoseconds in an `i64` (FORMAT.md, the inode), whose earliest whole second is
/// this. lfs's seconds-and-nanoseconds hold more, but the contract promises what the
/// narrowest format holds, so a time reads back the same in every mode and after a
/// remount.
pub const TIME_MIN_SECS: i64 = i64::MIN / 1_000_000_000;
/// The latest whole second every cairn file system keeps (see [`TIME_MIN_SECS`]); times up
/// to `i64::MAX` nanoseconds, a fraction of a second later, are kept too.
pub const TIME_MAX_SECS: i64 = i64::MAX / 1_000_000_000;

/// `t` brought into the range every cairn file system keeps: the earliest second
/// ([`TIME_MIN_SECS`]) to `i64::MAX` nanoseconds after the epoch. The FUSE adapter clamps
/// every time it is asked to set, as the kernel clamps a time to its superblock's
/// `s_time_min`/`s_time_max` (`timestamp_truncate`) — which a FUSE superblock leaves
/// unbounded — so that a file system never stores one time and reports another.
pub fn clamp_time(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) if d.as_nanos() > i64::MAX as u128 => {
            UNIX_EPOCH + Duration::from_nanos(i64::MAX as u64)
        }
        Err(e)
            if e.duration().as_secs() > TIME_MIN_SECS.unsigned_abs()
                || (e.duration().as_secs() == TIME_MIN_SECS.unsigned_abs()
                    && e.duration().subsec_nanos() > 0) =>
        {
            UNIX_EPOCH - Duration::from_secs(TIME_MIN_SECS.unsigned_abs())
        }
        _ => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64, nanos: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
                + Duration::from_nanos(nanos.into())
        }
    }

    #[test]
    fn times_clamp_to_what_an_i64_of_nanoseconds_holds() {
        // In range: unchanged, at both ends' whole seconds too.
        for (s, n) in [
            (0, 0),
            (1_700_000_000, 5),
            (-1, 999_999_999),
            (TIME_MAX_SECS, 854_775_807),
            (TIME_MIN_SECS, 0),
        ] {
            assert_eq!(clamp_time(at(s, n)), at(s, n), "{s}.{n}");
        }
        // Past the end: the last nanosecond an i64 holds (whose second is TIME_MAX_SECS).
        for (s, n) in [
            (TIME_MAX_SECS, 854_775_808),
            (TIME_MAX_SECS + 1, 0),
            (i64::MAX / 2, 0),
        ] {
            assert_eq!(
                clamp_time(at(s, n)),
                at(TIME_MAX_SECS, 854_775_807),
                "{s}.{n}"
            );
        }
        // Before the start: the earliest whole second.
        for (s, n) in [
            (TIME_MIN_SECS - 1, 999_999_999),
            (TIME_MIN_SECS - 1, 0),
            (i64::MIN / 2, 0),
        ] {
            assert_eq!(clamp_time(at(s, n)), at(TIME_MIN_SECS, 0), "{s}.{n}");
        }
    }

    #[test]
    fn known_dates() {
        assert_eq!(utc_civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(utc_civil(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(utc_civil(1_700_000_000), (2023, 11, 14, 22, 13, 20));
        assert_eq!(utc_civil(-1), (1969, 12, 31, 23, 59, 59));
    }
}
