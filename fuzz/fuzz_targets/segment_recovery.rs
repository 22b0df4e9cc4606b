//! A segment after a crash or disk damage: valid batches (shaped by the input), then byte
//! flips and a cut at input-chosen places, or raw input bytes. Recovery must serve only
//! intact batches and leave a usable log.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;
use strata_core::batch::build::{batch, ProducerIds, Rec};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some((&mode, rest)) = data.split_first() else { return };
    let segment = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        damaged_segment(mode, rest)
    };
    strata_hot::log::fuzzing::recover_arbitrary_segment(dir.path(), &segment);
});

fn damaged_segment(mode: u8, rest: &[u8]) -> Vec<u8> {
    let batches = 1 + (mode >> 1) as usize % 16;
    let mut seg = Vec::new();
    let mut offset = 0i64;
    for i in 0..batches {
        let n = 1 + i % 3;
        let value = vec![i as u8; 10 + i * 7];
        let recs: Vec<Rec<'_>> = (0..n)
            .map(|j| Rec { key: Some(b"k"), value: Some(&value), timestamp_delta: j as i64 })
            .collect();
        let mut b = batch(1_000 + i as i64, ProducerIds::NONE, &recs);
        b[..8].copy_from_slice(&offset.to_be_bytes());
        offset += n as i64;
        seg.extend_from_slice(&b);
    }
    let mut chunks = rest.chunks_exact(3);
    if let Some(cut) = chunks.next() {
        let at = u16::from_be_bytes([cut[0], cut[1]]) as usize;
        if cut[2] & 1 == 1 && at < seg.len() {
            seg.truncate(at);
        }
    }
    for flip in chunks {
        if seg.is_empty() {
            break;
        }
        let at = u16::from_be_bytes([flip[0], flip[1]]) as usize % seg.len();
        seg[at] ^= flip[2];
    }
    seg
}
