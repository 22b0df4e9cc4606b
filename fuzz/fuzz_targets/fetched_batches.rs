//! The native consumer's decoding of fetched record batches (kafka-protocol's decoder with
//! strata-core's bounded decompression, `strata_client::native::decode_batches`) on any
//! bytes: an error or records, never a panic, and never an allocation from a count or
//! length the input claims (the bounded allocator aborts on any over 128 MiB).
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = bytes::Bytes::copy_from_slice(data);
    let _ = strata_client::native::decode_batches(&mut buf);
});
