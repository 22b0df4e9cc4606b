//! Record-batch compression (feature `codecs`): the records section of a batch
//! decompressed, and compressed again, with every codec a Kafka client uses (gzip, snappy,
//! lz4, zstd). Only the edges that decode batches need it (compaction, export, replay); the
//! broker never re-encodes.
//!
//! Decompression is bounded: a batch is untrusted input (any producer can write one), and a
//! 33-byte snappy batch can claim 4 GiB, a 1 MB gzip batch inflate to a gigabyte. Output
//! past the limit is refused with an error naming the batch, without allocating it.

use std::io::Read;

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};

use crate::batch::{BatchHeader, Compression, HEADER_LEN};

/// The most one batch's records may decompress to (64 MiB): far above what a producer
/// writes (Kafka's `max.message.bytes` caps the compressed batch at about 1 MB by default),
/// far below what would hurt the tools that decode batches.
pub const MAX_DECOMPRESSED_BATCH: usize = 64 << 20;

/// The records section of a whole batch, decompressed (at most [`MAX_DECOMPRESSED_BATCH`]).
pub fn records_section(batch: &[u8], h: &BatchHeader) -> Result<Bytes, String> {
    records_section_within(batch, h, MAX_DECOMPRESSED_BATCH)
}

/// The records section of a whole batch, decompressed to at most `limit` bytes.
pub fn records_section_within(
    batch: &[u8],
    h: &BatchHeader,
    limit: usize,
) -> Result<Bytes, String> {
    let body = &batch[HEADER_LEN..h.total_len()];
    if h.compression() == Compression::None {
        return Ok(Bytes::copy_from_slice(body));
    }
    decompress_within(h.compression(), body, limit)
        .map(Bytes::from)
        .map_err(|e| {
            format!(
                "cannot decompress the batch at offset {}: {e}",
                h.base_offset
            )
        })
}

/// `body` decompressed with `codec`, at most `limit` bytes of it.
pub fn decompress_within(codec: Compression, body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    match codec {
        Compression::None => {
            if body.len() > limit {
                return Err(too_large(limit));
            }
            Ok(body.to_vec())
        }
        Compression::Gzip => read_within(flate2::read::MultiGzDecoder::new(body), limit),
        Compression::Snappy => snappy_within(body, limit),
        Compression::Lz4 => lz4::Decoder::new(body)
            .map_err(|e| e.to_string())
            .and_then(|d| read_within(d, limit)),
        Compression::Zstd => zstd::stream::read::Decoder::new(body)
            .map_err(|e| e.to_string())
            .and_then(|d| read_within(d, limit)),
        Compression::Unknown(c) => Err(format!("unknown compression codec {c}")),
    }
}

fn too_large(limit: usize) -> String {
    format!(
        "its records decompress to more than {limit} bytes, the most one batch may hold \
         (a decompression bomb, or a batch no producer should write)"
    )
}

/// Reads all of `r`, failing once it passes `limit` bytes (memory stays under about twice
/// the limit).
fn read_within(r: impl Read, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    r.take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() > limit {
        return Err(too_large(limit));
    }
    Ok(out)
}

/// xerial-framed snappy (what the Java client writes: a magic header, then blocks each
/// with a big-endian length), or raw snappy (librdkafka). Each block's claimed length is
/// checked against what is left of `limit` before anything is allocated.
fn snappy_within(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    const MAGIC: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
    let block = |out: &mut Vec<u8>, compressed: &[u8]| -> Result<(), String> {
        let n = snap::raw::decompress_len(compressed).map_err(|e| e.to_string())?;
        if n > limit - out.len() {
            return Err(too_large(limit));
        }
        let start = out.len();
        out.resize(start + n, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut out[start..])
            .map_err(|e| e.to_string())?;
        Ok(())
    };
    let mut out = Vec::new();
    let Some(mut rest) = body.strip_prefix(MAGIC.as_slice()) else {
        block(&mut out, body)?;
        return Ok(out);
    };
    while !rest.is_empty() {
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or("a snappy block length is cut short")?;
        let len = u32::from_be_bytes(*len) as usize;
        if len > after.len() {
            return Err(format!(
                "a snappy block claims {len} bytes but {} are left",
                after.len()
            ));
        }
        let (compressed, after) = after.split_at(len);
        block(&mut out, compressed)?;
        rest = after;
    }
    Ok(out)
}

pub fn compress(codec: Compression, raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(raw.len() / 2 + 64);
    let fill = |tmp: &mut BytesMut| {
        tmp.extend_from_slice(raw);
        Ok(())
    };
    let done = match codec {
        Compression::None => {
            out.extend_from_slice(raw);
            Ok(())
        }
        Compression::Gzip => Gzip::compress(&mut out, fill),
        Compression::Snappy => Snappy::compress(&mut out, fill),
        Compression::Lz4 => Lz4::compress(&mut out, fill),
        Compression::Zstd => Zstd::compress(&mut out, fill),
        Compression::Unknown(c) => return Err(format!("unknown compression codec {c}")),
    };
    done.map_err(|e| format!("cannot compress: {e:#}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODECS: [Compression; 4] = [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    #[test]
    fn every_codec_round_trips_within_the_limit() {
        let raw: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for codec in CODECS {
            let packed = compress(codec, &raw).unwrap();
            assert_eq!(
                decompress_within(codec, &packed, raw.len()).unwrap(),
                raw,
                "{codec:?}"
            );
        }
        // raw snappy, as librdkafka writes it
        let packed = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        assert_eq!(
            decompress_within(Compression::Snappy, &packed, raw.len()).unwrap(),
            raw
        );
    }

    /// Issue 17: a 917 KB gzip batch drove strata-replay to 936 MB; every codec now stops
    /// at the limit.
    #[test]
    fn a_decompression_bomb_is_refused_at_the_limit() {
        let zeros = vec![0u8; 16 << 20];
        for codec in CODECS {
            let bomb = compress(codec, &zeros).unwrap();
            assert!(
                bomb.len() < zeros.len() / 16,
                "{codec:?}: {} bytes",
                bomb.len()
            );
            let e = decompress_within(codec, &bomb, 1 << 20).unwrap_err();
            assert!(e.contains("more than 1048576 bytes"), "{codec:?}: {e}");
        }
    }

    /// Issue 17: a 33-byte snappy batch whose header claims a huge length peaked strata-replay
    /// at 1.06 GB; the claim is checked before anything is allocated.
    #[test]
    fn a_snappy_length_claim_is_checked_before_allocating() {
        // varint 0xFFFF_FFFF (4 GiB - 1), then a literal that never comes
        let mut claim = vec![0xff, 0xff, 0xff, 0xff, 0x0f];
        claim.extend_from_slice(&[0u8; 28]);
        assert_eq!(claim.len(), 33);
        let e = decompress_within(Compression::Snappy, &claim, MAX_DECOMPRESSED_BATCH).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        // the same inside xerial framing, and a block length past the end
        let mut framed = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        framed.extend_from_slice(&(claim.len() as u32).to_be_bytes());
        framed.extend_from_slice(&claim);
        let e =
            decompress_within(Compression::Snappy, &framed, MAX_DECOMPRESSED_BATCH).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let mut cut = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        cut.extend_from_slice(&u32::MAX.to_be_bytes());
        let e = decompress_within(Compression::Snappy, &cut, MAX_DECOMPRESSED_BATCH).unwrap_err();
        assert!(e.contains("claims"), "{e}");
    }
}
