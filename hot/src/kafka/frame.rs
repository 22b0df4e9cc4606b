//! Response frames that refer to the records they carry instead of copying them. A fetch
//! response's records are the `Bytes` read from the log; encoding them into one buffer would
//! copy every byte served once more before the socket copies it again. `encode_sharing`
//! keeps them as parts of the frame, and the connection writes the parts with one vectored
//! write.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

/// Byte fields shorter than this are copied: a part of their own costs more than the copy.
const MIN_SHARED: usize = 4096;

/// A frame ready to write.
pub(crate) enum Frame {
    Flat(BytesMut),
    Parts(Parts),
}

impl From<BytesMut> for Frame {
    fn from(b: BytesMut) -> Frame {
        Frame::Flat(b)
    }
}

impl Frame {
    pub(crate) async fn write<W: tokio::io::AsyncWrite + Unpin>(
        self,
        wr: &mut W,
    ) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match self {
            Frame::Flat(b) => wr.write_all(&b).await,
            Frame::Parts(mut p) => wr.write_all_buf(&mut p).await,
        }
    }
}

/// A frame's bytes in order, some of them shared with the log reads they came from.
pub(crate) struct Parts {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Parts {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advanced past the frame's end");
        self.remaining -= n;
        while n > 0 {
            let front = self.parts.front_mut().expect("bytes remain");
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.parts.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, part) in dst.iter_mut().zip(self.parts.iter()) {
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }
}

/// An encoding buffer that keeps a slice of one of `shared` as a reference to it.
pub(crate) struct SharingBuf<'a> {
    shared: &'a [Bytes],
    /// Finished parts, `frozen` bytes in all.
    parts: Vec<Bytes>,
    frozen: usize,
    tail: BytesMut,
}

impl<'a> SharingBuf<'a> {
    pub(crate) fn new(shared: &'a [Bytes]) -> Self {
        SharingBuf {
            shared,
            parts: Vec::new(),
            frozen: 0,
            tail: BytesMut::with_capacity(256),
        }
    }

    /// Copies the shared parts back into one buffer, for an encoder that goes back over
    /// bytes already written (none does for the responses shared so far; this keeps it
    /// correct if one ever does).
    fn flatten(&mut self) {
        if self.parts.is_empty() {
            return;
        }
        let mut all = BytesMut::with_capacity(self.frozen + self.tail.len());
        for p in self.parts.drain(..) {
            all.extend_from_slice(&p);
        }
        all.extend_from_slice(&self.tail);
        self.tail = all;
        self.frozen = 0;
    }

    /// The frame: a big-endian length, then what was encoded.
    pub(crate) fn finish(mut self) -> Parts {
        let len = self.frozen + self.tail.len();
        let mut parts = VecDeque::with_capacity(self.parts.len() + 2);
        parts.push_back(Bytes::copy_from_slice(&(len as i32).to_be_bytes()));
        parts.extend(self.parts.drain(..));
        if !self.tail.is_empty() {
            parts.push_back(self.tail.freeze());
        }
        Parts {
            parts,
            remaining: len + 4,
        }
    }
}

fn within(outer: &Bytes, inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

// SAFETY: every method delegates to `tail`, a `BytesMut`, except `put_slice`, which only
// calls safe methods.
unsafe impl BufMut for SharingBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.tail.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialized `cnt` bytes of `chunk_mut`, which is the tail's.
        unsafe { self.tail.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.tail.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= MIN_SHARED {
            if let Some(owner) = self.shared.iter().find(|b| within(b, src)) {
                let part = owner.slice_ref(src);
                if !self.tail.is_empty() {
                    let done = self.tail.split().freeze();
                    self.frozen += done.len();
                    self.parts.push(done);
                }
                self.frozen += part.len();
                self.parts.push(part);
                return;
            }
        }
        self.tail.extend_from_slice(src);
    }
}

impl ByteBufMut for SharingBuf<'_> {
    fn offset(&self) -> usize {
        self.frozen + self.tail.len()
    }

    fn seek(&mut self, offset: usize) {
        if offset < self.frozen {
            self.flatten();
        }
        self.tail.resize(offset - self.frozen, 0);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        if r.start < self.frozen {
            self.flatten();
        }
        let f = self.frozen;
        &mut self.tail[r.start - f..r.end - f]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(mut p: Parts) -> (Vec<u8>, usize) {
        let parts = p.parts.len();
        let mut out = Vec::new();
        while p.has_remaining() {
            let c = p.chunk().to_vec();
            p.advance(c.len());
            out.extend(c);
        }
        (out, parts)
    }

    #[test]
    fn shared_slices_are_parts_and_the_bytes_are_the_same() {
        let records = Bytes::from(vec![7u8; 10_000]);
        let other = vec![1u8; 5_000];
        let mut b = SharingBuf::new(std::slice::from_ref(&records));
        b.put_i32(42);
        b.put_slice(&records[100..9_000]);
        b.put_slice(&other); // not shared: copied
        b.put_slice(&records[..10]); // too small to share
        let mut expected = (4 + 8_900 + 5_000 + 10i32).to_be_bytes().to_vec();
        expected.extend(42i32.to_be_bytes());
        expected.extend(&records[100..9_000]);
        expected.extend(&other);
        expected.extend(&records[..10]);
        let (bytes, parts) = collect(b.finish());
        assert_eq!(bytes, expected);
        assert_eq!(parts, 4, "length, head, the shared records, the rest");
    }

    #[test]
    fn going_back_over_a_shared_part_flattens_it() {
        let records = Bytes::from(vec![7u8; 10_000]);
        let mut b = SharingBuf::new(std::slice::from_ref(&records));
        let gap = b.offset();
        b.put_i32(0);
        b.put_slice(&records[..]);
        let end = b.offset();
        b.range(gap..gap + 4).copy_from_slice(&9i32.to_be_bytes());
        b.seek(end);
        b.put_u8(1);
        let (bytes, _) = collect(b.finish());
        assert_eq!(&bytes[4..8], &9i32.to_be_bytes());
        assert_eq!(bytes.len(), 4 + 4 + 10_000 + 1);
        assert_eq!(bytes[8..10_008], records[..]);
    }

    #[test]
    fn a_fetch_response_encodes_the_same_shared_or_not() {
        use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
        use kafka_protocol::messages::{FetchResponse, TopicName};
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let records: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i; 5_000 + usize::from(i)]))
            .collect();
        let resp = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(
                records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        PartitionData::default()
                            .with_partition_index(i as i32)
                            .with_records(Some(r.clone()))
                    })
                    .collect(),
            )]);
        for version in [4, 11, 12, 16] {
            let mut flat = BytesMut::new();
            flat.put_i32(0);
            resp.encode(&mut flat, version).unwrap();
            let len = (flat.len() - 4) as i32;
            flat[..4].copy_from_slice(&len.to_be_bytes());
            let mut shared = SharingBuf::new(&records);
            resp.encode(&mut shared, version).unwrap();
            let (bytes, parts) = collect(shared.finish());
            assert_eq!(bytes, flat.to_vec(), "v{version}");
            assert!(parts >= 5, "v{version}: the records are parts ({parts})");
        }
    }
}
