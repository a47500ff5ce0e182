//! Tests of the log as a whole: behaviour ([`unit`]), crash states ([`crash`]), group commit
//! ([`group`]). The codecs' tests sit beside them in `format.rs` and `region.rs`.

mod crash;
mod group;
mod unit;

/// A small deterministic generator (SplitMix64): a seed replays the same run on any build.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// The seed of a randomized test: `CAIRN_WAL_SEED` if set, else a fresh one; printed so a
/// failure can be replayed.
pub(crate) fn seed(name: &str) -> u64 {
    let s = std::env::var("CAIRN_WAL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let t = crate::now_ns() as u64;
            t ^ (u64::from(std::process::id()) << 20)
        });
    println!("{name}: seed {s} (CAIRN_WAL_SEED={s} to replay)");
    s
}
