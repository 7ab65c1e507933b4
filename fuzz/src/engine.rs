//! A small mutation fuzzer that runs on stable Rust.
//!
//! cargo-fuzz needs a nightly toolchain, which these machines cannot install, so the
//! harness mutates a seed corpus of valid wire images (bit flips, byte overwrites with
//! interesting values, inserts, deletes, truncation, splicing two inputs) and runs each input
//! through a target under `catch_unwind`. It is not coverage-guided; it is deterministic for a
//! given seed, and any panic is reported with the input saved to disk for reproduction.

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// A deterministic xorshift64* generator: tiny, seedable and reproducible across runs,
/// which is all a mutation engine needs (no cryptographic quality required).
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

const INTERESTING: &[u8] = &[
    0x00, 0x01, 0x02, 0x03, 0x04, 0x07, 0x0f, 0x10, 0x3f, 0x40, 0x41, 0x47, 0x7f, 0x80, 0x81, 0xc1,
    0xfe, 0xff,
];

/// Apply between one and four random mutations to `data`.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(data.len() + 1);
                let n = 1 + rng.below(16);
                for _ in 0..n {
                    data.insert(i, rng.next_u64() as u8);
                }
            }
            3 if !data.is_empty() => {
                let i = rng.below(data.len());
                let n = 1 + rng.below((data.len() - i).min(16));
                data.drain(i..i + n);
            }
            4 => {
                let n = rng.below(data.len() + 1);
                data.truncate(n);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(data.len() + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            _ if data.len() >= 2 => {
                // Overwrite a big-endian 16-bit field with a boundary value (lengths, PD_Length).
                let i = rng.below(data.len() - 1);
                let v: u16 =
                    [0, 1, 3, 4, 13, 14, 17, 18, 46, 256, 257, 512, 513, 0xffff][rng.below(14)];
                data[i..i + 2].copy_from_slice(&v.to_be_bytes());
            }
            _ => data.push(rng.next_u64() as u8),
        }
    }
}

/// One fuzz target: a name, a seed corpus and the function under test.
pub struct Target {
    /// Name used on the command line.
    pub name: &'static str,
    /// Builds valid inputs to start mutating from.
    pub corpus: fn() -> Vec<Vec<u8>>,
    /// Runs one input; must never panic.
    pub run: fn(&[u8]),
}

/// What one fuzzing session did.
pub struct Report {
    /// Inputs executed.
    pub execs: u64,
    /// The first panicking input, if any.
    pub crash: Option<Vec<u8>>,
}

/// Fuzz `target` for `budget` with a deterministic `seed`; stops at the first panic.
pub fn fuzz(target: &Target, budget: Duration, seed: u64) -> Report {
    let corpus = (target.corpus)();
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let mut execs = 0u64;
    // Seeds themselves must pass first.
    for input in &corpus {
        if run_one(target, input).is_err() {
            return Report {
                execs,
                crash: Some(input.clone()),
            };
        }
        execs += 1;
    }
    let mut input = Vec::new();
    while start.elapsed() < budget {
        for _ in 0..256 {
            input.clear();
            if corpus.is_empty() || rng.below(16) == 0 {
                let n = rng.below(256);
                input.extend((0..n).map(|_| rng.next_u64() as u8));
            } else {
                input.extend_from_slice(&corpus[rng.below(corpus.len())]);
            }
            mutate(&mut rng, &mut input, &corpus);
            if run_one(target, &input).is_err() {
                return Report {
                    execs,
                    crash: Some(input),
                };
            }
            execs += 1;
        }
    }
    Report { execs, crash: None }
}

fn run_one(target: &Target, input: &[u8]) -> Result<(), ()> {
    panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|_| ())
}
