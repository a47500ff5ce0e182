//! The simulator's random numbers: SplitMix64 (Steele, Lea & Flood, OOPSLA 2014), written
//! out here rather than taken from a crate so that a seed names the same run on every
//! platform and every future build of cairn — the results in docs/bench/history.md can be
//! reproduced from the seed printed beside them.

/// SplitMix64: 64 bits of state, one add and two multiply-xorshifts per number.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`; 0 for `n == 0`), by Lemire's multiply-shift: no division,
    /// and a bias below `n / 2^32`, far under anything the simulator can measure.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// A seed for one run derived from the user's seed and the run's identity, so that a run's
/// numbers do not depend on which other runs share the invocation.
pub fn derive(seed: u64, parts: &[u64]) -> u64 {
    let mut r = Rng::new(seed);
    let mut h = r.next_u64();
    for &p in parts {
        r = Rng::new(h ^ p);
        h = r.next_u64();
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of SplitMix64 seeded with 0 (the reference implementation's).
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn derived_seeds_differ_by_part_and_repeat() {
        assert_eq!(derive(1, &[2, 3]), derive(1, &[2, 3]));
        assert_ne!(derive(1, &[2, 3]), derive(1, &[3, 2]));
        assert_ne!(derive(1, &[2]), derive(2, &[2]));
    }
}
