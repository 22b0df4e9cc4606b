//! Batch header parsing, CRC checks and produce validation never panic on any bytes.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;
use strata_core::batch;

fuzz_target!(|data: &[u8]| {
    let _ = batch::validate_produced(data);
    let _ = batch::first_record_at_or_after(data, 0);
    for item in batch::BatchIter::new(data) {
        if item.is_err() {
            break;
        }
    }
});
