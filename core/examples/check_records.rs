//! How fast the broker's produce-side record check runs (strata_core::codec::check_produced),
//! per codec, against the speed of copying the same batch once (the machine's floor for
//! touching every byte): `cargo run --release -p strata-core --features codecs --example
//! check_records`. Batches of 1,300 records of 800 bytes (about 1 MiB), as a producer
//! with `batch.size=1048576` sends them.

use std::time::Instant;

use strata_core::batch::build::{batch, ProducerIds, Rec};
use strata_core::batch::{self, Compression, HEADER_LEN, LOG_OVERHEAD};
use strata_core::codec::{check_produced, compress};
use strata_core::validate::RecordRules;

fn main() {
    let values: Vec<Vec<u8>> = (0..1300u32)
        .map(|i| {
            format!(
                "{{\"order\":{i},\"fund\":\"MF-{}\",\"units\":{}}}",
                i % 97,
                i * 7
            )
            .into_bytes()
        })
        .map(|mut v| {
            v.resize(800, b' ');
            v
        })
        .collect();
    let recs: Vec<Rec> = values
        .iter()
        .map(|v| Rec {
            key: Some(b"fund-7"),
            value: Some(v),
            timestamp_delta: 0,
        })
        .collect();
    let plain = batch(0, ProducerIds::NONE, &recs);
    let rules = RecordRules {
        keys_required: false,
        limit: strata_core::codec::MAX_DECOMPRESSED_BATCH as u64,
        timestamps: None,
    };
    let copy_mb_s = {
        let mut sink = vec![0u8; plain.len()];
        let started = Instant::now();
        let mut n = 0;
        while started.elapsed().as_secs_f64() < 1.0 {
            sink.copy_from_slice(&plain);
            std::hint::black_box(&sink);
            n += 1;
        }
        n as f64 * plain.len() as f64 / started.elapsed().as_secs_f64() / 1e6
    };
    println!(
        "batch: {} records, {} bytes uncompressed; one copy of it: {copy_mb_s:.0} MB/s",
        recs.len(),
        plain.len()
    );
    for codec in [
        Compression::None,
        Compression::Lz4,
        Compression::Zstd,
        Compression::Snappy,
        Compression::Gzip,
    ] {
        let b = with_codec(&plain, codec);
        let h = batch::validate_produced(&b).expect("a valid batch");
        let started = Instant::now();
        let mut n = 0;
        while started.elapsed().as_secs_f64() < 1.0 {
            check_produced(&b, &h, rules).expect("accepted");
            n += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        let mb_s = n as f64 * plain.len() as f64 / secs / 1e6;
        println!(
            "{codec:?}: {} bytes on the wire, checked at {mb_s:.0} MB/s of records ({:.3} of a copy), {:.0} us per batch",
            b.len(),
            mb_s / copy_mb_s,
            secs / n as f64 * 1e6
        );
    }
}

fn with_codec(plain: &[u8], codec: Compression) -> Vec<u8> {
    let id: i16 = match codec {
        Compression::None => return plain.to_vec(),
        Compression::Gzip => 1,
        Compression::Snappy => 2,
        Compression::Lz4 => 3,
        _ => 4,
    };
    let packed = compress(codec, &plain[HEADER_LEN..]).expect("compressible");
    let mut out = plain[..HEADER_LEN].to_vec();
    out.extend_from_slice(&packed);
    let len = (out.len() - LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    out[21..23].copy_from_slice(&id.to_be_bytes());
    let crc = batch::compute_crc(&out);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out
}
