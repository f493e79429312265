//! SplitMix64: a tiny deterministic generator, so the arithmetic tests' pseudo-random
//! inputs are the same on every run without a dependency.
#![allow(dead_code, unreachable_pub, missing_docs)]

pub struct SplitMix(pub u64);

impl SplitMix {
    // An endless generator, not an iterator: `next` is the algorithm's own name.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the slight bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
