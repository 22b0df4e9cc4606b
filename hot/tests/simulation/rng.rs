//! The simulation's only source of randomness: a seeded SplitMix64, so a seed replays the
//! same run step for step.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// One of `items`, picked by weight.
    pub fn weighted<T: Copy>(&mut self, items: &[(u64, T)]) -> T {
        let total: u64 = items.iter().map(|(w, _)| w).sum();
        let mut pick = self.below(total);
        for (w, item) in items {
            if pick < *w {
                return *item;
            }
            pick -= w;
        }
        items.last().expect("at least one item").1
    }
}
