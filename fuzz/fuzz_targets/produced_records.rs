//! What the broker checks inside every produced batch (strata_core::validate, and the
//! streaming decompression of strata_core::codec) on any bytes: the input is either a batch
//! as it stands, or a records section (raw, or compressed by the codec its first byte
//! names) wrapped in a valid header with a fresh CRC, so the checks past the CRC are
//! reached. Never a panic, never a loop, and never an allocation past the bound (the
//! bounded allocator aborts on any single allocation over 128 MiB).
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOCATOR: bounded_alloc::Bounded = bounded_alloc::Bounded;

use libfuzzer_sys::fuzz_target;
use strata_core::batch::{self, HEADER_LEN};
use strata_core::validate::RecordRules;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode & 0x80 == 0 {
        rest.to_vec()
    } else {
        wrap(mode & 0x07, (mode >> 3) as i32 & 0x0f, rest)
    };
    let Ok(h) = batch::validate_produced(&bytes) else { return };
    let rules = RecordRules {
        keys_required: mode & 0x40 != 0,
        limit: 1 << 20,
        timestamps: None,
    };
    let _ = strata_core::codec::check_produced(&bytes, &h, rules);
});

/// `records` behind a v2 header claiming `count` records and `codec`, CRC included.
fn wrap(codec: u8, count: i32, records: &[u8]) -> Vec<u8> {
    let count = count.max(1);
    let mut out = vec![0u8; HEADER_LEN];
    out[8..12].copy_from_slice(&((HEADER_LEN - 12 + records.len()) as i32).to_be_bytes());
    out[16] = 2;
    out[21..23].copy_from_slice(&i16::from(codec).to_be_bytes());
    out[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    out[43..51].copy_from_slice(&(-1i64).to_be_bytes());
    out[51..53].copy_from_slice(&(-1i16).to_be_bytes());
    out[53..57].copy_from_slice(&(-1i32).to_be_bytes());
    out[57..61].copy_from_slice(&count.to_be_bytes());
    out.extend_from_slice(records);
    let crc = batch::compute_crc(&out);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out
}
