//! A tiny deterministic generator for the tests' long random sequences, so
//! they need no crate.

/// Xorshift; the seed must not be 0.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// A number below `n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        // The modulus keeps it below n, which is a usize.
        #[allow(clippy::cast_possible_truncation)]
        let r = (self.0 % n as u64) as usize;
        r
    }
}
