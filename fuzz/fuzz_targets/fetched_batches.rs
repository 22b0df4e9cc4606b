//! The native consumer's decoding of fetched record batches (kafka-protocol's decoder with
//! strata-core's bounded decompression, `strata_client::native::decode_batches`) on any
//! bytes: an error or records, never a panic, and never an allocation from a count or
//! length the input claims: run with `-malloc_limit_mb=128` (scripts/fuzz.sh).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = bytes::Bytes::copy_from_slice(data);
    let _ = strata_client::native::decode_batches(&mut buf);
});
