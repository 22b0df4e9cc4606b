//! The remote-segment reader (cold tier, and so strata-replay and the compactor) on an
//! object that may be anything: valid batches shaped by the input then damaged, or raw
//! input bytes, with an input-chosen offset index. Reads from any offset and lookups by
//! time must return whole CRC-checked batches or an error, never panic or loop.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use strata_cold::manifest::RemoteSegment;
use strata_cold::object_store::memory::InMemory;
use strata_cold::object_store::path::Path;
use strata_cold::object_store::ObjectStore;
use strata_cold::read::{ReadConfig, RemoteReader};
use strata_core::batch::build::{batch, ProducerIds, Rec};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (index, body) = rest.split_at(rest.len().min((mode as usize & 7) * 8));
    let object = if mode & 0x80 == 0 { body.to_vec() } else { batches(mode, body) };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        store.put(&Path::from("s.log"), object.clone().into()).await.unwrap();
        store.put(&Path::from("s.log.index"), index.to_vec().into()).await.unwrap();
        store.put(&Path::from("s.log.timeindex"), index.to_vec().into()).await.unwrap();
        let seg = RemoteSegment {
            base_offset: 0,
            end_offset: 64,
            min_timestamp: 0,
            max_timestamp: 2_000,
            size_bytes: object.len() as u64,
            leader_epoch: 0,
            key: "s.log".into(),
            compacted: None,
        };
        let config = ReadConfig { chunk_size: 1 + (mode as u64 >> 3 & 15) * 37, ..ReadConfig::default() };
        let reader = RemoteReader::open(store, config).await.unwrap();
        for offset in [0, 1, 7, 40, 63] {
            if let Ok(got) = reader.read(&seg, offset, 1 + (mode as usize) * 16).await {
                strata_core::batch::BatchIter::new(&got).for_each(|b| {
                    b.expect("the reader returns whole batches");
                });
            }
        }
        let _ = reader.offset_for_timestamp(&seg, 1_005).await;
    });
});

/// Valid batches, then a byte of the input flipped in at an input-chosen place.
fn batches(mode: u8, rest: &[u8]) -> Vec<u8> {
    let mut seg = Vec::new();
    let mut offset = 0i64;
    for i in 0..(1 + (mode as usize & 7)) {
        let value = vec![i as u8; 5 + i * 11];
        let recs: Vec<Rec<'_>> =
            (0..2).map(|j| Rec { key: Some(b"k"), value: Some(&value), timestamp_delta: j }).collect();
        let b = batch(1_000 + i as i64, ProducerIds::NONE, &recs);
        seg.extend_from_slice(&strata_core::batch::stamped_prefix(&b, offset, 0));
        seg.extend_from_slice(&b[strata_core::batch::STAMP_LEN..]);
        offset += 2;
    }
    if let [at_hi, at_lo, flip, ..] = rest {
        let at = (usize::from(*at_hi) << 8 | usize::from(*at_lo)) % seg.len().max(1);
        if let Some(b) = seg.get_mut(at) {
            *b ^= flip;
        }
    }
    seg
}
