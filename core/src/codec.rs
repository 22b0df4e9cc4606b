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
        Compression::Lz4 => lz4_frames::decompress_within(body, limit),
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

/// Kafka's lz4: the LZ4 frame format (`doc/lz4_Frame_format.md` of lz4), which the Java
/// client, librdkafka and our own `compress_at` write with independent blocks of at most
/// 64 KiB. Each block is decompressed straight into the one output buffer, sized before the
/// first block from the frame's content size or its block sizes (never past the limit), so
/// that no byte is zeroed first or copied twice (LZ4F's streaming decoder under
/// `read_to_end` wrote into an output grown by doubling, each growth zeroed first and the
/// bytes before it copied by `realloc`, and into a buffer of its own when the room left was
/// smaller than a block).
///
/// What LZ4F checks is checked here too: magic, version, reserved bits, the header
/// checksum, block sizes, block and content checksums (xxHash32) when the frame has them,
/// the content size when it states one. Frames may follow one another (skippable frames are
/// skipped); a frame cut short is an error (LZ4F through `read_to_end` ended the output
/// there without one). Linked blocks are decoded with the 64 KiB before them as their
/// dictionary; a dictionary id is read and otherwise ignored, as LZ4F does.
mod lz4_frames {
    use std::os::raw::{c_char, c_int};

    use twox_hash::XxHash32;

    const MAGIC: u32 = 0x184D_2204;
    /// Skippable frames: 0x184D2A50 to 0x184D2A5F.
    const SKIPPABLE: u32 = 0x184D_2A50;
    /// The high bit of a block's size: its bytes are stored as they are.
    const STORED: u32 = 1 << 31;
    /// What a linked block may refer back to.
    const WINDOW: usize = 64 << 10;

    extern "C" {
        // liblz4's (lz4.h, LZ4LIB_API), compiled into the binary by lz4-sys, which binds
        // `LZ4_decompress_safe` but not this one.
        fn LZ4_decompress_safe_usingDict(
            src: *const c_char,
            dst: *mut c_char,
            src_size: c_int,
            dst_capacity: c_int,
            dict_start: *const c_char,
            dict_size: c_int,
        ) -> c_int;
    }

    /// The frame descriptor's flags.
    struct Frame {
        linked: bool,
        block_checksums: bool,
        content_checksum: bool,
        content_size: Option<u64>,
        block_max: usize,
    }

    /// Why the output has the room it has: a block that does not fit it is over the limit,
    /// or over the frame's own content size.
    #[derive(Clone, Copy)]
    enum Room {
        Limit,
        ContentSize(u64),
        Blocks,
    }

    fn cut() -> String {
        "an lz4 frame is cut short".to_string()
    }

    fn le32(input: &[u8], at: usize) -> Result<u32, String> {
        input
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(cut)
    }

    fn xxh32(bytes: &[u8]) -> u32 {
        XxHash32::oneshot(0, bytes)
    }

    /// `body` (one or more frames) decompressed, at most `limit` bytes of it.
    pub(super) fn decompress_within(body: &[u8], limit: usize) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let magic = le32(body, at)?;
            if magic & 0xFFFF_FFF0 == SKIPPABLE {
                let len = le32(body, at + 4)? as usize;
                at = (at + 8).checked_add(len).ok_or_else(cut)?;
                if at > body.len() {
                    return Err(cut());
                }
            } else if magic == MAGIC {
                at += frame(&body[at..], &mut out, limit)?;
            } else {
                return Err(format!("not an lz4 frame (magic number {magic:#010x})"));
            }
            if at == body.len() {
                return Ok(out);
            }
        }
    }

    /// The descriptor after the magic number, and where the first block begins.
    fn descriptor(input: &[u8]) -> Result<(Frame, usize), String> {
        let (&flg, &bd) = (input.get(4).ok_or_else(cut)?, input.get(5).ok_or_else(cut)?);
        if flg >> 6 != 1 {
            return Err(format!("an lz4 frame of version {} (1 is known)", flg >> 6));
        }
        if flg & 0b10 != 0 || bd & 0b1000_1111 != 0 {
            return Err("an lz4 frame descriptor has reserved bits set".to_string());
        }
        let block_max = match (bd >> 4) & 0b111 {
            4 => 64 << 10,
            5 => 256 << 10,
            6 => 1 << 20,
            7 => 4 << 20,
            id => {
                return Err(format!(
                    "an lz4 frame has block size id {id} (4 to 7 are known)"
                ))
            }
        };
        let has_size = flg & 0b1000 != 0;
        let has_dict = flg & 0b1 != 0;
        let checksum_at = 6 + if has_size { 8 } else { 0 } + if has_dict { 4 } else { 0 };
        let header = input.get(..checksum_at + 1).ok_or_else(cut)?;
        if (xxh32(&header[4..checksum_at]) >> 8) as u8 != header[checksum_at] {
            return Err("an lz4 frame's header checksum does not match".to_string());
        }
        let content_size =
            has_size.then(|| u64::from_le_bytes(header[6..14].try_into().expect("8 bytes")));
        let frame = Frame {
            linked: flg & 0b10_0000 == 0,
            block_checksums: flg & 0b1_0000 != 0,
            content_checksum: flg & 0b100 != 0,
            content_size,
            block_max,
        };
        Ok((frame, checksum_at + 1))
    }

    /// One frame (`input` begins with its magic number) appended to `out`, which may hold
    /// at most `limit` bytes in all. The bytes of the frame read.
    fn frame(input: &[u8], out: &mut Vec<u8>, limit: usize) -> Result<usize, String> {
        let (f, first_block) = descriptor(input)?;
        let checksum_len = if f.block_checksums { 4 } else { 0 };
        // First the block sizes, each checked against the frame and the input: the most
        // the blocks can hold sizes the output before anything is decompressed.
        let mut most = 0usize;
        let mut at = first_block;
        loop {
            let size = le32(input, at)?;
            at += 4;
            if size == 0 {
                break;
            }
            let len = (size & !STORED) as usize;
            if len > f.block_max {
                return Err(format!(
                    "an lz4 block of {len} bytes in a frame of blocks of at most {}",
                    f.block_max
                ));
            }
            at += len + checksum_len;
            if at > input.len() {
                return Err(cut());
            }
            most = most.saturating_add(if size & STORED != 0 { len } else { f.block_max });
        }
        let end = at + if f.content_checksum { 4 } else { 0 };
        if end > input.len() {
            return Err(cut());
        }
        let left = limit - out.len();
        let (room, why) = match f.content_size {
            Some(n) if n > left as u64 => return Err(super::too_large(limit)),
            Some(n) => (n as usize, Room::ContentSize(n)),
            None if most > left => (left, Room::Limit),
            None => (most, Room::Blocks),
        };
        let over = || match why {
            Room::Limit => super::too_large(limit),
            Room::ContentSize(n) => format!("an lz4 frame holds more than its content size, {n}"),
            // a block's room is its block size here: one that does not fit is damaged
            Room::Blocks => "an lz4 block is damaged".to_string(),
        };
        out.reserve_exact(room);
        let start = out.len();
        let room_end = start + room;
        let mut at = first_block;
        loop {
            let size = le32(input, at)?;
            at += 4;
            if size == 0 {
                break;
            }
            let len = (size & !STORED) as usize;
            let block = &input[at..at + len];
            at += len;
            if f.block_checksums {
                if xxh32(block) != le32(input, at)? {
                    return Err("an lz4 block's checksum does not match".to_string());
                }
                at += 4;
            }
            let free = room_end - out.len();
            if size & STORED != 0 {
                if len > free {
                    return Err(over());
                }
                out.extend_from_slice(block);
                continue;
            }
            let capacity = free.min(f.block_max);
            let dict = if f.linked {
                (out.len() - start).min(WINDOW)
            } else {
                0
            };
            let tail = out.len();
            // SAFETY: `out` has `free >= capacity` bytes reserved past its length, and liblz4
            // writes at most `capacity` bytes at `dst` and returns how many (or a negative
            // number, writing nothing it reports); it reads only `block` and the `dict`
            // bytes of `out` just before `dst`, all initialized. Only the bytes it reports
            // written are taken into `out`'s length.
            let n = unsafe {
                let base = out.as_mut_ptr();
                LZ4_decompress_safe_usingDict(
                    block.as_ptr().cast(),
                    base.add(tail).cast(),
                    len as c_int,
                    capacity as c_int,
                    base.add(tail - dict).cast_const().cast(),
                    dict as c_int,
                )
            };
            let Ok(n) = usize::try_from(n) else {
                return Err(if capacity < f.block_max {
                    // does not fit what is left (or is damaged, which the batch's CRC-32C,
                    // checked before this, makes unlikely)
                    over()
                } else {
                    "an lz4 block is damaged".to_string()
                });
            };
            // SAFETY: liblz4 initialized these `n <= capacity` bytes.
            unsafe { out.set_len(tail + n) };
        }
        let content = &out[start..];
        if let Some(n) = f.content_size {
            if content.len() as u64 != n {
                return Err(format!(
                    "an lz4 frame holds {} bytes, its content size says {n}",
                    content.len()
                ));
            }
        }
        if f.content_checksum && xxh32(content) != le32(input, at)? {
            return Err("an lz4 frame's content checksum does not match".to_string());
        }
        Ok(end)
    }
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

    /// Bytes that compress well for a while, then not at all (`lz4` stores those blocks
    /// as they are), and so on.
    fn half_random(len: usize) -> Vec<u8> {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (i / 50_000) % 2 == 0 {
                    (i % 97) as u8
                } else {
                    x as u8
                }
            })
            .collect()
    }

    /// `raw` as LZ4F (the `lz4` crate's encoder) frames it with these options.
    fn lz4f_frame(raw: &[u8], o: &Lz4Options) -> Vec<u8> {
        use lz4::liblz4::{BlockChecksum, BlockMode, ContentChecksum};
        use std::io::Write;
        let mut b = lz4::EncoderBuilder::new();
        b.block_size(o.block_size.clone())
            .block_mode(if o.linked {
                BlockMode::Linked
            } else {
                BlockMode::Independent
            })
            .block_checksum(if o.block_checksums {
                BlockChecksum::BlockChecksumEnabled
            } else {
                BlockChecksum::NoBlockChecksum
            })
            .checksum(if o.content_checksum {
                ContentChecksum::ChecksumEnabled
            } else {
                ContentChecksum::NoChecksum
            });
        if o.content_size {
            b.content_size(raw.len() as u64);
        }
        let mut e = b.build(Vec::new()).unwrap();
        e.write_all(raw).unwrap();
        let (out, done) = e.finish();
        done.unwrap();
        out
    }

    #[derive(Clone, Debug)]
    struct Lz4Options {
        block_size: lz4::liblz4::BlockSize,
        linked: bool,
        block_checksums: bool,
        content_checksum: bool,
        content_size: bool,
    }

    impl Lz4Options {
        fn all() -> Vec<Lz4Options> {
            use lz4::liblz4::BlockSize;
            let mut all = Vec::new();
            for block_size in [BlockSize::Max64KB, BlockSize::Max256KB, BlockSize::Max4MB] {
                for bits in 0..16u8 {
                    all.push(Lz4Options {
                        block_size: block_size.clone(),
                        linked: bits & 1 != 0,
                        block_checksums: bits & 2 != 0,
                        content_checksum: bits & 4 != 0,
                        content_size: bits & 8 != 0,
                    });
                }
            }
            all
        }
    }

    /// The old way: LZ4F's streaming decoder read to the end.
    fn lz4f_decoded(frame: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        lz4::Decoder::new(frame)
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn lz4_frames_of_every_kind_decompress_as_lz4f_does() {
        for len in [0, 1, 1_000, 65_536, 300_000] {
            let raw = half_random(len);
            for o in Lz4Options::all() {
                let frame = lz4f_frame(&raw, &o);
                let out = decompress_within(Compression::Lz4, &frame, raw.len())
                    .unwrap_or_else(|e| panic!("{len} bytes, {o:?}: {e}"));
                assert!(out == raw, "{len} bytes, {o:?}");
                assert!(lz4f_decoded(&frame) == raw, "{len} bytes, {o:?}");
                // the limit one byte short
                if len > 0 {
                    let e = decompress_within(Compression::Lz4, &frame, len - 1).unwrap_err();
                    assert!(e.contains("more than"), "{len} bytes, {o:?}: {e}");
                }
            }
        }
    }

    /// An lz4 frame put together by hand: `flg` and 64 KiB blocks, each `(stored, bytes)`;
    /// a content size, block and content checksums as `flg` says.
    fn lz4_frame_by_hand(flg: u8, blocks: &[(bool, &[u8])], content: &[u8]) -> Vec<u8> {
        let xxh = |b: &[u8]| twox_hash::XxHash32::oneshot(0, b);
        let mut f = 0x184D_2204_u32.to_le_bytes().to_vec();
        f.extend_from_slice(&[flg, 0x40]);
        if flg & 0x08 != 0 {
            f.extend_from_slice(&(content.len() as u64).to_le_bytes());
        }
        f.push((xxh(&f[4..]) >> 8) as u8);
        for (stored, data) in blocks {
            let len = data.len() as u32 | if *stored { 1 << 31 } else { 0 };
            f.extend_from_slice(&len.to_le_bytes());
            f.extend_from_slice(data);
            if flg & 0x10 != 0 {
                f.extend_from_slice(&xxh(data).to_le_bytes());
            }
        }
        f.extend_from_slice(&0u32.to_le_bytes());
        if flg & 0x04 != 0 {
            f.extend_from_slice(&xxh(content).to_le_bytes());
        }
        f
    }

    /// Independent blocks, block checksums, content size, content checksum.
    const ALL_FLAGS: u8 = 0x40 | 0x20 | 0x10 | 0x08 | 0x04;

    #[test]
    fn lz4_stored_blocks_checksums_and_content_size_are_checked() {
        let words = b"settlement settlement settlement".repeat(10);
        let packed = lz4::block::compress(&words, None, false).unwrap();
        let content = [&b"stored first, "[..], &words, b", stored last"].concat();
        let blocks: [(bool, &[u8]); 3] = [
            (true, b"stored first, "),
            (false, &packed),
            (true, b", stored last"),
        ];
        let lz4 = |f: &[u8]| decompress_within(Compression::Lz4, f, 1 << 20);
        let frame = lz4_frame_by_hand(ALL_FLAGS, &blocks, &content);
        assert_eq!(lz4(&frame).unwrap(), content);
        assert_eq!(lz4f_decoded(&frame), content);
        for flg in [0x60, 0x40 | 0x10, 0x60 | 0x04, 0x60 | 0x08] {
            let frame = lz4_frame_by_hand(flg, &blocks, &content);
            assert_eq!(lz4(&frame).unwrap(), content, "{flg:#x}");
        }
        // a byte of each checksum changed, and a content size one short
        let header_checksum = 4 + 2 + 8;
        let first_block_checksum = header_checksum + 1 + 4 + 14;
        for (at, what) in [
            (header_checksum, "header checksum"),
            (first_block_checksum, "block's checksum"),
            (frame.len() - 1, "content checksum"),
        ] {
            let mut bad = frame.clone();
            bad[at] ^= 1;
            let e = lz4(&bad).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        let mut short = lz4_frame_by_hand(0x60 | 0x08, &blocks, &content);
        short[6] -= 1;
        short[14] = (twox_hash::XxHash32::oneshot(0, &short[4..14]) >> 8) as u8;
        let e = lz4(&short).unwrap_err();
        assert!(e.contains("more than its content size"), "{e}");
        // a block longer than the frame's block size, version 0, reserved bits
        let big = vec![7u8; (64 << 10) + 1];
        let e = lz4(&lz4_frame_by_hand(0x60, &[(true, &big)], &big)).unwrap_err();
        assert!(e.contains("at most 65536"), "{e}");
        for flg in [0x20, 0x62] {
            assert!(lz4(&lz4_frame_by_hand(flg, &blocks, &content)).is_err());
        }
    }

    #[test]
    fn lz4_frames_follow_one_another_and_skippable_frames_are_skipped() {
        let (a, b) = (half_random(100_000), b"and the rest".to_vec());
        let mut body = compress(Compression::Lz4, &a).unwrap();
        body.extend_from_slice(&0x184D_2A53_u32.to_le_bytes());
        body.extend_from_slice(&3u32.to_le_bytes());
        body.extend_from_slice(b"xyz");
        body.extend_from_slice(&compress(Compression::Lz4, &b).unwrap());
        let out = decompress_within(Compression::Lz4, &body, 1 << 20).unwrap();
        assert!(out == [a.clone(), b.clone()].concat());
        // the two frames' output is held to the one limit
        let e = decompress_within(Compression::Lz4, &body, a.len() + 1).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        // something after the frames that is not one
        body.extend_from_slice(b"junk");
        assert!(decompress_within(Compression::Lz4, &body, 1 << 20).is_err());
    }

    /// LZ4F read to the end ended its output where the input ended: a frame cut short
    /// between blocks came out short, without an error.
    #[test]
    fn an_lz4_frame_cut_short_is_an_error() {
        let raw = half_random(200_000);
        for o in Lz4Options::all().into_iter().step_by(5) {
            let frame = lz4f_frame(&raw, &o);
            for cut in 0..frame.len() {
                let r = decompress_within(Compression::Lz4, &frame[..cut], raw.len());
                assert!(r.is_err(), "{o:?}: cut at {cut} of {}", frame.len());
            }
        }
    }

    /// A frame that claims a content size past the limit is refused before anything is
    /// allocated (1 TiB here would abort the test); stored blocks are held to the limit too.
    #[test]
    fn an_lz4_bomb_is_refused_before_allocating() {
        let mut claim = 0x184D_2204_u32.to_le_bytes().to_vec();
        claim.extend_from_slice(&[0x68, 0x40]);
        claim.extend_from_slice(&(1u64 << 40).to_le_bytes());
        claim.push((twox_hash::XxHash32::oneshot(0, &claim[4..]) >> 8) as u8);
        claim.extend_from_slice(&0u32.to_le_bytes());
        let e = decompress_within(Compression::Lz4, &claim, MAX_DECOMPRESSED_BATCH).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let block = vec![0u8; 64 << 10];
        let blocks = vec![(true, &block[..]); 20];
        let stored = lz4_frame_by_hand(0x60, &blocks, &[]);
        let e = decompress_within(Compression::Lz4, &stored, 1 << 20).unwrap_err();
        assert!(e.contains("more than 1048576 bytes"), "{e}");
        assert_eq!(
            decompress_within(Compression::Lz4, &stored, 20 << 16)
                .unwrap()
                .len(),
            20 << 16
        );
    }

    proptest::proptest! {
        /// Any frame LZ4F writes comes back whole; a frame with any one byte changed is an
        /// error or some output, never a panic.
        #[test]
        fn lz4_frames_round_trip_and_damage_never_panics(
            runs in proptest::collection::vec((proptest::prelude::any::<u8>(), 1..300usize), 0..400),
            options in 0..48usize,
            flip in proptest::prelude::any::<proptest::sample::Index>(),
            by in 1..=255u8,
        ) {
            let raw: Vec<u8> = runs
                .iter()
                .enumerate()
                .flat_map(|(i, &(b, n))| {
                    // a run of one byte, or as many bytes each different
                    (0..n).map(move |j| if i % 3 == 0 { b.wrapping_add(j as u8) } else { b })
                })
                .collect();
            let frame = lz4f_frame(&raw, &Lz4Options::all()[options]);
            proptest::prop_assert_eq!(
                decompress_within(Compression::Lz4, &frame, raw.len()).unwrap(),
                raw.clone()
            );
            let mut bad = frame.clone();
            bad[flip.index(frame.len())] ^= by;
            let _ = decompress_within(Compression::Lz4, &bad, raw.len() + 1024);
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
