//! Any bytes a client sends as a request frame decode into a request or a refusal, never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = strata_hot::kafka::decode_request(bytes::Bytes::copy_from_slice(data));
});
