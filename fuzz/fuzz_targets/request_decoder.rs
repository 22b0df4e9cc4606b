//! Any bytes a client sends as a request frame decode into a request or a refusal, never a
//! panic.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = strata_hot::kafka::decode_request(bytes::Bytes::copy_from_slice(data));
});
