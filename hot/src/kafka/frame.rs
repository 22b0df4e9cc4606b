//! Response frames that refer to the records they carry instead of copying them. A fetch
//! response's records are the `Bytes` read from the log; encoding them into one buffer would
//! copy every byte served once more before the socket copies it again. `encode_sharing`
//! keeps them as parts of the frame, and the connection writes the parts with one vectored
//! write.
//!
//! Records a plaintext fetch sends straight from a segment file (`sendfile`) are never read:
//! the response holds a stand-in of their length ([`stand_in`]), and `SharingBuf` puts the
//! file span where the encoder copies the stand-in. It recognises a stand-in by its address,
//! which works because kafka-protocol encodes a bytes field with one `put_slice` of the
//! whole field; nothing may read a stand-in's bytes (they are zeros).

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::ops::Range;
use std::sync::OnceLock;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::log::FileSpan;

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
    pub(crate) async fn write<W: FrameWrite>(self, wr: &mut W) -> std::io::Result<()> {
        match self {
            Frame::Flat(b) => wr.write_all(&b).await,
            Frame::Parts(p) => {
                for piece in p.pieces {
                    match piece {
                        Piece::Bytes(mut run) => wr.write_all_buf(&mut run).await?,
                        Piece::File(span) => wr.write_span(&span).await?,
                    }
                }
                Ok(())
            }
        }
    }
}

/// A connection's writing half, as a frame needs it: bytes, and spans of segment files.
pub(crate) trait FrameWrite: AsyncWrite + Unpin + Send {
    /// Writes `span`'s bytes.
    fn write_span(&mut self, span: &FileSpan) -> impl Future<Output = std::io::Result<()>> + Send;
}

/// Writes `span`'s bytes from `skip` on, read first (on the blocking pool: they may come
/// from the disk).
async fn write_span_read<W: AsyncWrite + Unpin + Send + ?Sized>(
    wr: &mut W,
    span: &FileSpan,
    skip: usize,
) -> std::io::Result<()> {
    let span = span.clone();
    let bytes = tokio::task::spawn_blocking(move || span.read_from(skip))
        .await
        .map_err(std::io::Error::other)??;
    wr.write_all(&bytes).await
}

/// A TLS connection encrypts every byte in this process: a span is read, then written. (A
/// TLS listener's fetches make no spans, `kafka.sendfile` being off there; this keeps any
/// frame correct.)
impl<S: tokio::io::AsyncRead + AsyncWrite + Send> FrameWrite for tokio::io::WriteHalf<S> {
    async fn write_span(&mut self, span: &FileSpan) -> std::io::Result<()> {
        write_span_read(self, span, 0).await
    }
}

impl FrameWrite for tokio::net::tcp::OwnedWriteHalf {
    /// `sendfile` from the segment file: the kernel hands the page-cache pages to the
    /// socket, with no read into the broker's memory and no copy back out of it. Each call
    /// first checks that its bytes are still in the page cache (they were when the fetch
    /// read; memory pressure may have taken them since), so it does not wait for the disk on
    /// this runtime thread: what is not cached is read on the blocking pool instead.
    async fn write_span(&mut self, span: &FileSpan) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        use tokio::io::Interest;
        let stream: &tokio::net::TcpStream = self.as_ref();
        let mut sent = 0usize;
        while sent < span.len {
            if span.cut_since() {
                // Truncated or rewritten since the fetch planned the span: its place in the
                // file may hold other batches now. The frame's length is sent already, so
                // the connection cannot go on; the client fetches again.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the log was cut while a fetch's records were being sent; closing the connection",
                ));
            }
            stream.writable().await?;
            let want = (span.len - sent).min(SENDFILE_CHUNK);
            if !span.cached(sent, want) {
                return write_span_read(self, span, sent).await;
            }
            let mut at = span.position + sent as u64;
            let done = stream.try_io(Interest::WRITABLE, || {
                rustix::fs::sendfile(stream, &*span.file, Some(&mut at), want)
                    .map_err(std::io::Error::from)
            });
            match done {
                Ok(0) => {
                    // The file ends before the span (cut): as above.
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "segment file ended before the fetch's records; closing the connection",
                    ));
                }
                Ok(n) => {
                    sent += n;
                    crate::metrics::FETCHED_FROM_FILE.fetch_add(n as u64, Relaxed);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                    ) =>
                {
                    FileSpan::stop_spans();
                    tracing::info!(error = %e, "this kernel or filesystem does not sendfile from segment files; fetches read their records instead");
                    return write_span_read(self, span, sent).await;
                }
                Err(e) => return Err(e),
            }
            // (a long span shares the thread with the runtime's other tasks)
            tokio::task::consume_budget().await;
        }
        Ok(())
    }
}

/// The most one `sendfile` call is asked to send.
const SENDFILE_CHUNK: usize = 4 << 20;

/// A frame's bytes in order: runs of bytes (some shared with the log reads they came
/// from), and spans of segment files sent from the file.
pub(crate) struct Parts {
    pieces: Vec<Piece>,
}

enum Piece {
    Bytes(Run),
    File(FileSpan),
}

/// Consecutive byte parts of a frame, written with one vectored write.
struct Run {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Run {
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

/// A segment-file span standing in a response as a records field: `bytes` is a stand-in
/// of the span's length (see [`stand_in`]) that the encoder copies from, and the frame
/// sends the span where the stand-in would go.
pub(crate) struct Spanned {
    pub bytes: Bytes,
    pub span: FileSpan,
}

/// How much address space stand-ins take: a response's stand-ins lie side by side in it.
const STAND_IN_SPACE: usize = if usize::BITS >= 64 {
    (4u64 << 30) as usize
} else {
    256 << 20
};

/// `len` bytes at `at` in the stand-in space: addresses no other memory has, so an encoder's
/// copy from them is recognised (by address, in [`SharingBuf::put_slice`]) and replaced by
/// the span they stand for. The space is zero pages mapped read-only and never touched;
/// `None` past its end, or if it could not be mapped (then the records are read instead).
pub(crate) fn stand_in(at: usize, len: usize) -> Option<Bytes> {
    static SPACE: OnceLock<Option<&'static [u8]>> = OnceLock::new();
    let space = SPACE.get_or_init(|| {
        // SAFETY: a new private anonymous read-only mapping, never unmapped, so the slice
        // stays valid (reads give zeros) for the life of the process.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                STAND_IN_SPACE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            (p != libc::MAP_FAILED)
                .then(|| std::slice::from_raw_parts(p as *const u8, STAND_IN_SPACE))
        }
    });
    let space: &'static [u8] = (*space)?;
    let end = at.checked_add(len).filter(|&end| end <= space.len())?;
    Some(Bytes::from_static(&space[at..end]))
}

/// An encoding buffer that keeps a slice of one of `shared` as a reference to it, and puts
/// a span where the encoder copies one of `spans`' stand-ins.
pub(crate) struct SharingBuf<'a> {
    shared: &'a [Bytes],
    spans: &'a [Spanned],
    /// Finished pieces, `frozen` bytes in all.
    pieces: Vec<Piece>,
    run: VecDeque<Bytes>,
    frozen: usize,
    tail: BytesMut,
    /// Set when an encoder went back over a span (see `flatten`).
    failed: bool,
}

impl<'a> SharingBuf<'a> {
    pub(crate) fn new(shared: &'a [Bytes], spans: &'a [Spanned]) -> Self {
        SharingBuf {
            shared,
            spans,
            pieces: Vec::new(),
            run: VecDeque::new(),
            frozen: 0,
            tail: BytesMut::with_capacity(256),
            failed: false,
        }
    }

    /// Copies the shared parts back into one buffer, for an encoder that goes back over
    /// bytes already written (none does for the responses shared so far; this keeps it
    /// correct if one ever does). A span cannot be copied back (reading it here would block
    /// an async task): the frame fails at `finish`.
    fn flatten(&mut self) {
        if self.pieces.is_empty() && self.run.is_empty() {
            return;
        }
        let mut all = BytesMut::with_capacity(self.frozen + self.tail.len());
        self.close_run();
        for piece in self.pieces.drain(..) {
            match piece {
                Piece::Bytes(run) => run.parts.iter().for_each(|p| all.extend_from_slice(p)),
                Piece::File(span) => {
                    all.resize(all.len() + span.len, 0);
                    self.failed = true;
                }
            }
        }
        all.extend_from_slice(&self.tail);
        self.tail = all;
        self.frozen = 0;
    }

    /// Moves the tail into the current run.
    fn freeze_tail(&mut self) {
        if !self.tail.is_empty() {
            let done = self.tail.split().freeze();
            self.frozen += done.len();
            self.run.push_back(done);
        }
    }

    /// Ends the current run of byte parts.
    fn close_run(&mut self) {
        if !self.run.is_empty() {
            let parts = std::mem::take(&mut self.run);
            let remaining = parts.iter().map(Bytes::len).sum();
            self.pieces.push(Piece::Bytes(Run { parts, remaining }));
        }
    }

    /// The frame: a big-endian length, then what was encoded. An error if the encoder went
    /// back over a span.
    pub(crate) fn finish(mut self) -> std::io::Result<Parts> {
        if self.failed {
            return Err(std::io::Error::other(
                "the response encoder went back over records sent from a segment file",
            ));
        }
        let len = self.frozen + self.tail.len();
        self.freeze_tail();
        self.close_run();
        let mut pieces = Vec::with_capacity(self.pieces.len() + 1);
        let head = Bytes::copy_from_slice(&(len as i32).to_be_bytes());
        match self.pieces.first_mut() {
            Some(Piece::Bytes(run)) => {
                run.parts.push_front(head);
                run.remaining += 4;
            }
            _ => pieces.push(Piece::Bytes(Run {
                parts: VecDeque::from([head]),
                remaining: 4,
            })),
        }
        pieces.append(&mut self.pieces);
        Ok(Parts { pieces })
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
        if src.len() < MIN_SHARED {
            self.tail.extend_from_slice(src);
            return;
        }
        // (stand-ins first: they are among the records `shared` lists too)
        if let Some(s) = self.spans.iter().find(|s| within(&s.bytes, src)) {
            let skip = src.as_ptr() as usize - s.bytes.as_ptr() as usize;
            let span = s.span.part(skip, src.len());
            self.freeze_tail();
            self.close_run();
            self.frozen += span.len;
            self.pieces.push(Piece::File(span));
            return;
        }
        {
            if let Some(owner) = self.shared.iter().find(|b| within(b, src)) {
                self.freeze_tail();
                self.frozen += src.len();
                self.run.push_back(owner.slice_ref(src));
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

    /// The frame's bytes (spans read from their files), and how many parts it has.
    fn collect(p: Parts) -> (Vec<u8>, usize) {
        let mut out = Vec::new();
        let mut parts = 0;
        for piece in p.pieces {
            match piece {
                Piece::Bytes(mut run) => {
                    parts += run.parts.len();
                    while run.has_remaining() {
                        let c = run.chunk().to_vec();
                        run.advance(c.len());
                        out.extend(c);
                    }
                }
                Piece::File(span) => {
                    parts += 1;
                    out.extend(span.read_from(0).unwrap());
                }
            }
        }
        (out, parts)
    }

    #[test]
    fn shared_slices_are_parts_and_the_bytes_are_the_same() {
        let records = Bytes::from(vec![7u8; 10_000]);
        let other = vec![1u8; 5_000];
        let mut b = SharingBuf::new(std::slice::from_ref(&records), &[]);
        b.put_i32(42);
        b.put_slice(&records[100..9_000]);
        b.put_slice(&other); // not shared: copied
        b.put_slice(&records[..10]); // too small to share
        let mut expected = (4 + 8_900 + 5_000 + 10i32).to_be_bytes().to_vec();
        expected.extend(42i32.to_be_bytes());
        expected.extend(&records[100..9_000]);
        expected.extend(&other);
        expected.extend(&records[..10]);
        let (bytes, parts) = collect(b.finish().unwrap());
        assert_eq!(bytes, expected);
        assert_eq!(parts, 4, "length, head, the shared records, the rest");
    }

    #[test]
    fn going_back_over_a_shared_part_flattens_it() {
        let records = Bytes::from(vec![7u8; 10_000]);
        let mut b = SharingBuf::new(std::slice::from_ref(&records), &[]);
        let gap = b.offset();
        b.put_i32(0);
        b.put_slice(&records[..]);
        let end = b.offset();
        b.range(gap..gap + 4).copy_from_slice(&9i32.to_be_bytes());
        b.seek(end);
        b.put_u8(1);
        let (bytes, _) = collect(b.finish().unwrap());
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
            let mut shared = SharingBuf::new(&records, &[]);
            resp.encode(&mut shared, version).unwrap();
            let (bytes, parts) = collect(shared.finish().unwrap());
            assert_eq!(bytes, flat.to_vec(), "v{version}");
            assert!(parts >= 5, "v{version}: the records are parts ({parts})");
        }
    }

    /// A file of `len` patterned bytes in a new directory (kept while the first is held):
    /// the directory, the bytes, the file open for reading.
    fn segment_file(len: u32) -> (tempfile::TempDir, Vec<u8>, std::sync::Arc<std::fs::File>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::sync::Arc::new(std::fs::File::open(&path).unwrap());
        (dir, data, file)
    }

    #[test]
    fn a_stand_in_is_sent_as_its_span_of_the_file() {
        let (_dir, data, file) = segment_file(300_000);
        let span = |position: u64, len: usize| FileSpan::of_file(file.clone(), position, len);
        // two stand-ins side by side, and records read into memory between them
        let spans = [
            Spanned {
                bytes: stand_in(0, 100_000).unwrap(),
                span: span(1_000, 100_000),
            },
            Spanned {
                bytes: stand_in(100_000, 70_000).unwrap(),
                span: span(200_000, 70_000),
            },
        ];
        let read = Bytes::from(vec![9u8; 8_000]);
        let mut b = SharingBuf::new(std::slice::from_ref(&read), &spans);
        b.put_i32(7);
        b.put_slice(&spans[0].bytes);
        b.put_slice(&read);
        b.put_i16(3);
        b.put_slice(&spans[1].bytes[..50_000]);
        let mut expected = (4 + 100_000 + 8_000 + 2 + 50_000i32).to_be_bytes().to_vec();
        expected.extend(7i32.to_be_bytes());
        expected.extend(&data[1_000..101_000]);
        expected.extend(&read);
        expected.extend(3i16.to_be_bytes());
        expected.extend(&data[200_000..250_000]);
        let parts = b.finish().unwrap();
        let files = parts
            .pieces
            .iter()
            .filter(|p| matches!(p, Piece::File(_)))
            .count();
        assert_eq!(files, 2, "the stand-ins are spans of the file");
        let (bytes, _) = collect(parts);
        assert_eq!(bytes.len(), expected.len());
        assert!(bytes == expected, "the frame's bytes");
    }

    #[test]
    fn going_back_over_a_span_fails_the_frame() {
        let (_dir, _, file) = segment_file(100_000);
        let spans = [Spanned {
            bytes: stand_in(0, 90_000).unwrap(),
            span: FileSpan::of_file(file, 5_000, 90_000),
        }];
        let mut b = SharingBuf::new(&[], &spans);
        let gap = b.offset();
        b.put_i32(0);
        b.put_slice(&spans[0].bytes);
        b.range(gap..gap + 4).copy_from_slice(&9i32.to_be_bytes());
        b.put_u8(1);
        // (reading the span back would block an async task; no encoder goes back)
        assert!(b.finish().is_err());
    }

    #[test]
    fn stand_ins_are_refused_past_their_space() {
        assert!(stand_in(0, 1 << 20).is_some());
        assert!(stand_in(STAND_IN_SPACE - 10, 10).is_some());
        assert!(stand_in(STAND_IN_SPACE - 10, 11).is_none());
        assert!(stand_in(usize::MAX, 2).is_none());
    }

    #[tokio::test]
    async fn a_span_is_sent_over_tcp_from_the_file() {
        use tokio::io::AsyncReadExt;
        // more than a socket buffer holds, so sendfile meets a full socket and waits
        let (_dir, data, file) = segment_file(20_000_000);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let (_, mut wr) = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap()
            .into_split();
        let span = FileSpan::of_file(file.clone(), 12_345, 19_000_000);
        wr.write_span(&span).await.unwrap();
        drop(wr);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), span.len);
        assert!(got == data[12_345..12_345 + 19_000_000], "the bytes sent");
        // a span past the file's end fails (the frame cannot be finished)
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
        let (_, mut wr) = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap()
            .into_split();
        let _peer = reader.await.unwrap().unwrap();
        let past = FileSpan::of_file(file, 19_999_000, 5_000);
        let e = wr.write_span(&past).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_span_of_a_log_cut_before_it_is_sent_is_not_sent() {
        use crate::log::{PartitionLog, ValidBatch};
        use strata_core::batch::build::{batch, ProducerIds, Rec};
        let dir = tempfile::tempdir().unwrap();
        let config = crate::log::LogConfig::from_map(&Default::default()).unwrap();
        let (mut log, _) = PartitionLog::open(dir.path(), config, 0).unwrap();
        let value = vec![5u8; 5_000];
        for _ in 0..3 {
            let recs: Vec<Rec<'_>> = (0..20)
                .map(|_| Rec {
                    key: None,
                    value: Some(&value),
                    timestamp_delta: 0,
                })
                .collect();
            let b = ValidBatch::new(Bytes::from(batch(0, ProducerIds::NONE, &recs))).unwrap();
            log.append(&b, 0).unwrap();
        }
        let plan = log.plan_read(0, u64::MAX).unwrap().unwrap();
        let span = plan.span(1 << 20).unwrap().expect("cached, 300 KB");
        assert!(!span.cut_since());
        log.truncate_to(20, 0).unwrap();
        assert!(span.cut_since());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut s, &mut got)
                .await
                .unwrap();
            got
        });
        let (_, mut wr) = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap()
            .into_split();
        let e = wr.write_span(&span).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        drop(wr);
        assert!(reader.await.unwrap().is_empty(), "nothing of it was sent");
    }
}
