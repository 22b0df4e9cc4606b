//! Record-batch compression (feature `codecs`): the records section of a batch
//! decompressed, and compressed again, with every codec a Kafka client uses (gzip, snappy,
//! lz4, zstd). Compaction, export and replay decode batches; the broker re-encodes one only
//! for a topic whose `compression.type` names a codec other than the producer's.
//!
//! Decompression is bounded: a batch is untrusted input (any producer can write one), and a
//! 33-byte snappy batch can claim 4 GiB, a 1 MB gzip batch inflate to a gigabyte. Output
//! past the limit is refused with an error naming the batch, without allocating it.

use std::io::Read;

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};

pub use crate::batch::Levels;
use crate::batch::{BatchHeader, Compression, HEADER_LEN};
use crate::validate::{check_records, OverLimit, RecordRules, RecordsError};

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

/// Checks the records of a produced batch ([`crate::validate::check_records`]),
/// decompressing them as a stream: gzip, lz4 and zstd through a 64 KiB buffer, snappy one
/// block at a time (each block's claimed length checked against the limit and against what
/// snappy can expand its input to before it is allocated). The output is never held whole.
pub fn check_produced(
    batch: &[u8],
    h: &BatchHeader,
    rules: RecordRules,
) -> Result<(), RecordsError> {
    let body = &batch[HEADER_LEN..h.total_len()];
    let count = h.record_count;
    let decode = |e: std::io::Error| RecordsError::Decompress(e.to_string());
    match h.compression() {
        Compression::None => check_records(body, count, rules),
        Compression::Gzip => check_records(
            buffered(flate2::read::MultiGzDecoder::new(body)),
            count,
            rules,
        ),
        Compression::Snappy => {
            check_records(buffered(SnappyBlocks::new(body, rules.limit)), count, rules)
        }
        Compression::Lz4 => check_records(
            buffered(lz4::Decoder::new(body).map_err(decode)?),
            count,
            rules,
        ),
        Compression::Zstd => check_records(
            buffered(zstd::stream::read::Decoder::new(body).map_err(decode)?),
            count,
            rules,
        ),
        Compression::Unknown(c) => Err(RecordsError::Decompress(format!(
            "unknown compression codec {c}"
        ))),
    }
}

/// A decompressing reader behind the 64 KiB buffer a compressed batch is checked through.
fn buffered<R: Read>(r: R) -> std::io::BufReader<R> {
    std::io::BufReader::with_capacity(64 << 10, r)
}

/// The most raw snappy can expand to: a 3-byte copy yields at most 64 bytes.
fn snappy_max_expansion(compressed: usize) -> u64 {
    compressed as u64 * 22 + 64
}

/// Snappy records as a stream: xerial framing (blocks each with a big-endian length) or one
/// raw block (librdkafka), each decompressed when the reader reaches it.
struct SnappyBlocks<'a> {
    rest: &'a [u8],
    framed: bool,
    block: Vec<u8>,
    at: usize,
    /// Output still allowed.
    left: u64,
}

impl<'a> SnappyBlocks<'a> {
    const MAGIC: &'static [u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

    /// `limit`: the output allowed in all (the checker's own bound, known here so that a
    /// block past it is never allocated).
    fn new(body: &'a [u8], limit: u64) -> Self {
        let (rest, framed) = match body.strip_prefix(Self::MAGIC.as_slice()) {
            Some(rest) => (rest, true),
            None => (body, false),
        };
        SnappyBlocks {
            rest,
            framed,
            block: Vec::new(),
            at: 0,
            left: limit,
        }
    }

    /// Decompresses the next block; false at the end.
    fn next_block(&mut self) -> std::io::Result<bool> {
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        if self.rest.is_empty() {
            return Ok(false);
        }
        let compressed = if self.framed {
            let (len, after) = self
                .rest
                .split_first_chunk::<4>()
                .ok_or_else(|| bad("a snappy block length is cut short".into()))?;
            let len = u32::from_be_bytes(*len) as usize;
            if len > after.len() {
                return Err(bad(format!(
                    "a snappy block claims {len} bytes but {} are left",
                    after.len()
                )));
            }
            let (block, after) = after.split_at(len);
            self.rest = after;
            block
        } else {
            std::mem::take(&mut self.rest)
        };
        let n = snap::raw::decompress_len(compressed).map_err(|e| bad(e.to_string()))?;
        if n as u64 > snappy_max_expansion(compressed.len()) {
            return Err(bad(format!(
                "a snappy block of {} bytes claims {n}, more than snappy can expand it to",
                compressed.len()
            )));
        }
        if n as u64 > self.left {
            return Err(std::io::Error::other(OverLimit));
        }
        self.left -= n as u64;
        self.block.clear();
        self.block.resize(n, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut self.block)
            .map_err(|e| bad(e.to_string()))?;
        self.at = 0;
        Ok(true)
    }
}

impl Read for SnappyBlocks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.block.len() {
            if !self.next_block()? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `raw` compressed with `codec` at `levels` (snappy has none).
pub fn compress_at(codec: Compression, raw: &[u8], levels: Levels) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let err = |e: std::io::Error| format!("cannot compress: {e}");
    match codec {
        Compression::Gzip => {
            let level = match levels.gzip {
                -1 => flate2::Compression::default(),
                l => flate2::Compression::new(l.clamp(1, 9) as u32),
            };
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 2), level);
            e.write_all(raw).map_err(err)?;
            e.finish().map_err(err)
        }
        Compression::Lz4 => {
            // independent blocks, as Kafka's and librdkafka's lz4 frames
            let mut e = lz4::EncoderBuilder::new()
                .level(levels.lz4)
                .block_mode(lz4::BlockMode::Independent)
                .build(Vec::with_capacity(raw.len() / 2))
                .map_err(err)?;
            e.write_all(raw).map_err(err)?;
            let (out, done) = e.finish();
            done.map_err(err)?;
            Ok(out)
        }
        Compression::Zstd => zstd::bulk::compress(raw, levels.zstd).map_err(err),
        other => compress(other, raw),
    }
}

/// The batch with its records encoded with `to` instead of their codec (a topic's
/// `compression.type`, applied by the leader as Kafka's broker does): the same offsets,
/// producer id, epoch, sequence and timestamps; new attributes, length and CRC. The records
/// may decompress to at most [`MAX_DECOMPRESSED_BATCH`].
pub fn recompress(
    batch: &[u8],
    h: &BatchHeader,
    to: Compression,
    levels: Levels,
) -> Result<Vec<u8>, String> {
    let raw = records_section(batch, h)?;
    let body = match to {
        Compression::None => raw.to_vec(),
        codec => compress_at(codec, &raw, levels)?,
    };
    crate::batch::rebuilt(batch, to, h.record_count, &body)
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
    fn a_recompressed_batch_holds_the_same_records_under_the_new_codec() {
        use crate::batch::verify;
        let plain = sample_batch();
        let all = [
            Compression::None,
            CODECS[0],
            CODECS[1],
            CODECS[2],
            CODECS[3],
        ];
        for from in all {
            let batch = match from {
                Compression::None => plain.clone(),
                codec => compressed_batch(codec, &plain),
            };
            let h = verify(&batch).unwrap();
            for to in all {
                let levels = Levels {
                    gzip: 1,
                    lz4: 1,
                    zstd: 19,
                };
                let out = recompress(&batch, &h, to, levels).unwrap();
                let h2 = verify(&out).expect("length and CRC match");
                assert_eq!(h2.compression(), to, "{from:?} -> {to:?}");
                let same = |h: &BatchHeader| {
                    let ids = (
                        h.base_offset,
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                    );
                    let counts = (h.record_count, h.last_offset_delta);
                    (
                        ids,
                        counts,
                        h.base_timestamp,
                        h.max_timestamp,
                        h.attributes & !0x07,
                    )
                };
                assert_eq!(same(&h2), same(&h), "{from:?} -> {to:?}");
                let records = records_section(&out, &h2).unwrap();
                assert_eq!(&records[..], &plain[HEADER_LEN..], "{from:?} -> {to:?}");
            }
        }
    }

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

    /// `plain` (an uncompressed batch) with its records section compressed by `codec`.
    fn compressed_batch(codec: Compression, plain: &[u8]) -> Vec<u8> {
        let packed = match codec {
            // raw snappy, as librdkafka writes it
            Compression::Snappy => snap::raw::Encoder::new()
                .compress_vec(&plain[HEADER_LEN..])
                .unwrap(),
            _ => compress(codec, &plain[HEADER_LEN..]).unwrap(),
        };
        with_records(plain, codec, &packed)
    }

    /// `plain`'s header over `records`, with `codec` in the attributes and a fresh CRC.
    fn with_records(plain: &[u8], codec: Compression, records: &[u8]) -> Vec<u8> {
        let count = i32::from_be_bytes(plain[57..61].try_into().unwrap());
        crate::batch::rebuilt(plain, codec, count, records).unwrap()
    }

    fn sample_batch() -> Vec<u8> {
        use crate::batch::build::{batch, ProducerIds, Rec};
        let values: Vec<Vec<u8>> = (0..500u32)
            .map(|i| format!("settlement {i} ").repeat(20).into_bytes())
            .collect();
        let recs: Vec<Rec> = values
            .iter()
            .map(|v| Rec {
                key: Some(b"fund-7"),
                value: Some(v),
                timestamp_delta: 0,
            })
            .collect();
        batch(0, ProducerIds::NONE, &recs)
    }

    const RULES: RecordRules = RecordRules {
        keys_required: true,
        limit: MAX_DECOMPRESSED_BATCH as u64,
        timestamps: None,
    };

    #[test]
    fn produced_batches_of_every_codec_are_checked_as_they_decompress() {
        let plain = sample_batch();
        for codec in CODECS {
            let b = compressed_batch(codec, &plain);
            let h = crate::batch::validate_produced(&b).unwrap();
            assert_eq!(h.compression(), codec);
            check_produced(&b, &h, RULES).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            // one record fewer than the header claims: bytes left over
            let mut short = b.clone();
            short[57..61].copy_from_slice(&499i32.to_be_bytes());
            let h = crate::batch::BatchHeader::parse(&short).unwrap();
            assert_eq!(
                check_produced(&short, &h, RULES),
                Err(RecordsError::Trailing { count: 499 }),
                "{codec:?}"
            );
        }
        // xerial-framed snappy, as the Java client writes it
        let b = with_records(
            &plain,
            Compression::Snappy,
            &compress(Compression::Snappy, &plain[HEADER_LEN..]).unwrap(),
        );
        let h = crate::batch::validate_produced(&b).unwrap();
        check_produced(&b, &h, RULES).unwrap();
        let h = crate::batch::validate_produced(&plain).unwrap();
        check_produced(&plain, &h, RULES).unwrap();
    }

    /// Issue 17: a decompression bomb is refused at produce without its output ever being
    /// held: every codec stops at the limit.
    #[test]
    fn a_produced_bomb_is_refused_at_the_limit() {
        use crate::batch::build::{batch, ProducerIds, Rec};
        let zeros = vec![0u8; 8 << 20];
        let plain = batch(
            0,
            ProducerIds::NONE,
            &[Rec {
                key: Some(b"k"),
                value: Some(&zeros),
                timestamp_delta: 0,
            }],
        );
        let rules = RecordRules {
            keys_required: false,
            limit: 1 << 20,
            timestamps: None,
        };
        for codec in CODECS {
            let b = compressed_batch(codec, &plain);
            assert!(b.len() < 1 << 20, "{codec:?}: {} bytes", b.len());
            let h = crate::batch::validate_produced(&b).unwrap();
            assert_eq!(
                check_produced(&b, &h, rules),
                Err(RecordsError::TooLarge { limit: 1 << 20 }),
                "{codec:?}"
            );
        }
        // a raw snappy block claiming 4 GiB - 1 in 33 bytes, and one claiming more than
        // snappy can expand its input to
        for claim in [&[0xffu8, 0xff, 0xff, 0xff, 0x0f][..], &[0x80, 0x80, 0x04]] {
            let mut body = claim.to_vec();
            body.resize(33, 0);
            let b = with_records(&plain, Compression::Snappy, &body);
            let h = crate::batch::validate_produced(&b).unwrap();
            let e = check_produced(&b, &h, RULES).unwrap_err();
            assert!(
                matches!(e, RecordsError::Decompress(ref m) if m.contains("more than snappy")),
                "{e}"
            );
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
