//! Chunk buffers, recycled: a chunk's memory goes back to a small free list when the cache
//! has evicted the chunk and the last reply sliced from it is dropped, and the next GET
//! reads into it. A replay longer than the cache then reads into memory that is already
//! mapped, instead of faulting in fresh pages for every chunk. (A local directory's chunks
//! are not read into buffers: they are mappings of the object files.)

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Free chunk-sized buffers, at most `keep` of them.
#[derive(Debug)]
pub(super) struct Buffers {
    free: Mutex<Vec<Vec<u8>>>,
    size: usize,
    keep: usize,
    /// Buffers allocated, not taken from the free list.
    pub(super) allocated: AtomicU64,
}

impl Buffers {
    pub(super) fn new(size: usize, keep: usize) -> Arc<Self> {
        Arc::new(Buffers {
            free: Mutex::new(Vec::new()),
            size,
            keep,
            allocated: AtomicU64::new(0),
        })
    }

    /// An empty buffer for `len` bytes: for a whole chunk, a free one or a new one; for a
    /// shorter one (a segment's last chunk), a new one of that size, never kept, so the
    /// cache's weight of a chunk stays the memory it holds.
    pub(super) fn take(self: &Arc<Self>, len: usize) -> Buffer {
        // Never zeroed: bytes are only ever appended, so no pass over the memory before
        // the read (zeroing a fresh buffer costs as much as the read's own copy).
        self.allocated.fetch_add(1, Relaxed);
        if len < self.size {
            return Buffer {
                buf: Vec::with_capacity(len),
                home: None,
            };
        }
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let buf = match free {
            Some(mut buf) => {
                self.allocated.fetch_sub(1, Relaxed);
                buf.clear();
                buf
            }
            None => Vec::with_capacity(self.size),
        };
        Buffer {
            buf,
            home: Some(self.clone()),
        }
    }
}

/// One chunk's bytes, in a buffer of the chunk's capacity that goes back to its free list
/// when dropped.
#[derive(Debug)]
pub(super) struct Buffer {
    buf: Vec<u8>,
    /// The free list it goes back to, if any.
    home: Option<Arc<Buffers>>,
}

impl Buffer {
    /// Room left for this many bytes.
    pub(super) fn room(&self) -> usize {
        self.buf.capacity() - self.buf.len()
    }

    /// Appends `part`; false when it does not fit.
    pub(super) fn extend(&mut self, part: &[u8]) -> bool {
        if part.len() > self.room() {
            return false;
        }
        self.buf.extend_from_slice(part);
        true
    }

    /// Shared bytes that hand the buffer back when the last of them (and of their slices)
    /// is dropped.
    pub(super) fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let Some(home) = &self.home else { return };
        let buf = std::mem::take(&mut self.buf);
        let mut free = home.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < home.keep {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_once_its_last_slice_is_gone() {
        let buffers = Buffers::new(16, 2);
        let mut b = buffers.take(16);
        assert!(b.extend(b"hello"));
        assert!(b.extend(b" world"));
        assert!(!b.extend(&[0; 6]), "16 bytes at most");
        let bytes = b.freeze();
        let slice = bytes.slice(6..);
        let at = slice.as_ptr();
        assert_eq!(&slice[..], b"world");
        drop(bytes);
        // A slice still holds it: the next buffer is a new one.
        let other = buffers.take(16);
        assert_eq!(buffers.allocated.load(Relaxed), 2);
        drop(other);
        drop(slice);
        let again = buffers.take(16);
        assert_eq!(again.as_ref(), b"", "reused empty");
        assert_eq!(buffers.allocated.load(Relaxed), 2);
        assert_eq!(again.room(), 16);
        assert_eq!(again.buf.as_ptr(), at.wrapping_sub(6));
    }

    #[test]
    fn the_free_list_keeps_at_most_keep_buffers() {
        let buffers = Buffers::new(8, 1);
        let (a, b) = (buffers.take(8), buffers.take(8));
        drop(a);
        drop(b);
        assert_eq!(buffers.free.lock().unwrap().len(), 1);
        // A shorter buffer (a segment's last chunk) is its own size and never kept.
        let mut short = buffers.take(3);
        assert!(short.extend(b"abc") && !short.extend(b"d"));
        drop(short);
        assert_eq!(buffers.free.lock().unwrap().len(), 1);
        assert_eq!(buffers.allocated.load(Relaxed), 3);
    }
}
