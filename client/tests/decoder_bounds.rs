//! Issue 17: the vendored kafka-protocol allocated from counts and lengths the input claims
//! (`vec![0; n]` for strings and bytes, `reserve(record_count)`, `IndexMap::with_capacity`
//! of the header count), and its decompressors whatever a batch claims. Each site, fed a
//! small input with a huge claim, must fail without a large allocation: a counting
//! allocator records the largest single allocation made on the test's own thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::Decodable;

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn note(size: usize) {
    // try_with: the thread may be tearing down its locals
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning its result and the largest single allocation it made.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(|l| l.get()))
}

const SMALL: usize = 1 << 20;

/// Each length-prefixed field type, reached through a request that carries one: a
/// Metadata topic name (String in v0, CompactString in v9) and SaslAuthenticate's
/// auth_bytes (Bytes in v0, CompactBytes in v2).
#[test]
fn a_string_or_bytes_length_past_the_input_allocates_nothing() {
    use kafka_protocol::messages::{MetadataRequest, SaslAuthenticateRequest};
    let varint_max = [0xffu8, 0xff, 0xff, 0xff, 0x07]; // 2^31 - 1
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // one topic, name length 32767
        ("String", [&1i32.to_be_bytes()[..], &[0x7f, 0xff]].concat()),
        // auth_bytes of 2 GiB - 1
        ("Bytes", 0x7fff_ffffi32.to_be_bytes().to_vec()),
        // compact array of one topic (2), compact name of 2^31 - 2 bytes
        ("CompactString", [&[2u8][..], &varint_max].concat()),
        ("CompactBytes", varint_max.to_vec()),
    ];
    for (what, mut input) in cases {
        input.extend_from_slice(b"only a few bytes follow");
        let mut buf = Bytes::from(input);
        let (result, largest) = largest_allocation(|| match what {
            "String" => MetadataRequest::decode(&mut buf, 0).map(|_| ()),
            "CompactString" => MetadataRequest::decode(&mut buf, 9).map(|_| ()),
            "Bytes" => SaslAuthenticateRequest::decode(&mut buf, 0).map(|_| ()),
            _ => SaslAuthenticateRequest::decode(&mut buf, 2).map(|_| ()),
        });
        assert!(result.is_err(), "{what}: a claim past the input decoded");
        assert!(largest < SMALL, "{what}: allocated {largest} bytes");
    }
}

/// A v2 batch of `count` claimed records over `records` (uncompressed or `codec`).
fn batch(count: i32, codec: i16, records: &[u8]) -> Bytes {
    let mut after_crc = BytesMut::new();
    after_crc.put_i16(codec);
    after_crc.put_i32(count.max(1) - 1); // last offset delta
    after_crc.put_i64(0);
    after_crc.put_i64(0);
    after_crc.put_i64(-1);
    after_crc.put_i16(-1);
    after_crc.put_i32(-1);
    after_crc.put_i32(count);
    after_crc.put_slice(records);
    let mut out = BytesMut::new();
    out.put_i64(0);
    out.put_i32((4 + 1 + 4 + after_crc.len()) as i32);
    out.put_i32(0);
    out.put_i8(2);
    out.put_u32(crc32c::crc32c(&after_crc));
    out.put_slice(&after_crc);
    out.freeze()
}

#[test]
fn a_claimed_record_count_is_not_reserved() {
    // one real record (len 6: attrs, ts, offset delta, null key, null value, 0 headers),
    // claimed as 2^31 - 1
    let record = [12u8, 0, 0, 0, 1, 1, 0];
    let mut buf = batch(i32::MAX, 0, &record);
    let (result, largest) =
        largest_allocation(|| strata_client::native::decode_batches(&mut buf).map(|_| ()));
    assert!(result.is_err());
    assert!(largest < SMALL, "allocated {largest} bytes");
}

#[test]
fn a_claimed_header_count_is_not_reserved() {
    // a record claiming 2^31 - 1 headers (varint 0xfeffffff0f zigzag), then nothing
    let mut rec = vec![0u8, 0, 0, 1, 1];
    rec.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0x0f]);
    let mut record = vec![(rec.len() as u8) << 1];
    record.extend_from_slice(&rec);
    let mut buf = batch(1, 0, &record);
    let (result, largest) =
        largest_allocation(|| strata_client::native::decode_batches(&mut buf).map(|_| ()));
    assert!(result.is_err());
    assert!(largest < SMALL, "allocated {largest} bytes");
}

#[test]
fn a_compressed_batch_is_decompressed_within_the_bound() {
    // raw snappy claiming 4 GiB - 1 in 33 bytes
    let mut claim = vec![0xffu8, 0xff, 0xff, 0xff, 0x0f];
    claim.resize(33, 0);
    let mut buf = batch(1, 2, &claim);
    let (result, largest) =
        largest_allocation(|| strata_client::native::decode_batches(&mut buf).map(|_| ()));
    let e = result.unwrap_err().to_string();
    assert!(e.contains("more than"), "{e}");
    assert!(largest < SMALL, "allocated {largest} bytes");
}

#[test]
fn well_formed_batches_still_decode() {
    let b = strata_core::batch::build::batch(
        0,
        strata_core::batch::build::ProducerIds::NONE,
        &[strata_core::batch::build::Rec {
            key: Some(b"k"),
            value: Some(b"v"),
            timestamp_delta: 0,
        }],
    );
    let mut buf = Bytes::from(b);
    let sets = strata_client::native::decode_batches(&mut buf).unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].records[0].value.as_deref(), Some(&b"v"[..]));
}
