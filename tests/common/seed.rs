//! Replayable randomness for every test of both test binaries (`tests/cpu`
//! and `tests/gpu` include this file by path as `crate::seed`).
//!
//! Each test draws its random inputs from [`rng`] instead of `rand::rng()`.
//! The first call in a test picks the test's seed, `$GPT2_TEST_SEED` if set
//! (a u64), else a fresh one, and prints it with the test's name:
//! `<test>: seed N (replay with GPT2_TEST_SEED=N)`. libtest shows a test's
//! output when it fails, so a failure always names its seed; then
//! `GPT2_TEST_SEED=N cargo test <test>` runs it again on the same inputs.
//!
//! Why that replays: libtest runs every test on a thread of its own (named
//! after the test), so the seed and the count of generators handed out live
//! in thread-local state that starts afresh with each test. The k-th call of
//! [`rng`] in a test returns a generator seeded from (seed, k), and a test's
//! calls happen in program order, so the same seed gives the same inputs
//! whether the test runs alone or beside others.

#![allow(dead_code)]

use std::cell::Cell;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Environment variable that fixes the seed of every randomized test.
pub const SEED_ENV: &str = "GPT2_TEST_SEED";

thread_local! {
    /// This test's seed (once drawn) and how many generators it has made.
    static STATE: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// The name of the running test (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current().name().unwrap_or("test").to_string()
}

/// `$GPT2_TEST_SEED`, or a fresh seed when it is not set.
pub fn seed_from_env_or_fresh() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={s} is not a u64")),
        Err(_) => rand::rng().random(),
    }
}

/// The seed of the running test: drawn (and printed) on first use.
pub fn test_seed() -> u64 {
    STATE.with(|s| match s.get() {
        Some((seed, _)) => seed,
        None => {
            let seed = seed_from_env_or_fresh();
            println!("{}: seed {seed} (replay with {SEED_ENV}={seed})", test_name());
            s.set(Some((seed, 0)));
            seed
        }
    })
}

/// A generator for the running test's random inputs; use it where one would
/// write `rand::rng()`. Successive calls in one test give independent
/// streams, all fixed by the test's seed.
pub fn rng() -> StdRng {
    let seed = test_seed();
    let k = STATE.with(|s| {
        let (seed, k) = s.get().expect("seeded above");
        s.set(Some((seed, k + 1)));
        k
    });
    // SplitMix64's increment keeps the streams of nearby k apart.
    StdRng::seed_from_u64(seed ^ (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}
