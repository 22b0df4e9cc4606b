//! The batch CRC's speed (`strata_core::batch::compute_crc`, crc-fast) against the crc32c
//! crate, on 64 MiB cut into batches of several sizes:
//! `cargo run --release -p strata-core --example crc_speed`.

use std::time::Instant;

use strata_core::batch::{compute_crc, CRC_START};

/// Seconds of one pass of `f` over every batch.
fn timed(f: &impl Fn() -> u32) -> (f64, u32) {
    let t = Instant::now();
    let crc = f();
    (t.elapsed().as_secs_f64(), crc)
}

/// The best of five passes each, the two alternated so that a busy moment costs both alike.
fn best_of_both(fast: impl Fn() -> u32, reference: impl Fn() -> u32) -> (f64, f64) {
    let (mut a, mut b) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let (t, x) = timed(&fast);
        let (u, y) = timed(&reference);
        assert_eq!(x, y, "the two CRCs disagree");
        (a, b) = (a.min(t), b.min(u));
    }
    (a, b)
}

fn main() {
    let data: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    println!("batch size   compute_crc (crc-fast)   crc32c crate   ratio");
    for size in [1_150usize, 4_096, 16_384, 1 << 20] {
        let batches: Vec<&[u8]> = data.chunks_exact(size).collect();
        let bytes = batches.len() * (size - CRC_START);
        let (fast, reference) = best_of_both(
            || batches.iter().fold(0, |acc, b| acc ^ compute_crc(b)),
            || {
                batches
                    .iter()
                    .fold(0, |acc, b| acc ^ crc32c::crc32c(&b[CRC_START..]))
            },
        );
        let (fast, reference) = (bytes as f64 / fast / 1e9, bytes as f64 / reference / 1e9);
        println!(
            "{size:>10} B   {fast:>15.1} GB/s   {reference:>7.1} GB/s   {:>5.2}x",
            fast / reference
        );
    }
}
