//! Record-batch compression (feature `codecs`): the records section of a batch
//! decompressed, and compressed again, with every codec a Kafka client uses (gzip, snappy,
//! lz4, zstd), by the Kafka codec crate. Only the edges that decode batches need it
//! (compaction, export, replay); the broker never re-encodes.

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};

use crate::batch::{BatchHeader, Compression, HEADER_LEN};

/// The records section of a whole batch, decompressed.
pub fn records_section(batch: &[u8], h: &BatchHeader) -> Result<Bytes, String> {
    let mut body = &batch[HEADER_LEN..h.total_len()];
    let take = |b: &mut Bytes| Ok(std::mem::take(b));
    let got = match h.compression() {
        Compression::None => return Ok(Bytes::copy_from_slice(body)),
        Compression::Gzip => Gzip::decompress(&mut body, take),
        Compression::Snappy => Snappy::decompress(&mut body, take),
        Compression::Lz4 => Lz4::decompress(&mut body, take),
        Compression::Zstd => Zstd::decompress(&mut body, take),
        Compression::Unknown(c) => return Err(format!("unknown compression codec {c}")),
    };
    got.map_err(|e| {
        format!(
            "cannot decompress the batch at offset {}: {e:#}",
            h.base_offset
        )
    })
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
