//! The fuzz targets' allocator: the system's, except that any single allocation over
//! [`LIMIT`] aborts the process, so libFuzzer reports the input that asked for it. This is
//! the memory bound a decoder of untrusted bytes must keep (without a sanitizer, libFuzzer's
//! own `-malloc_limit_mb` cannot see allocations, and `-rss_limit_mb` misses the ones never
//! touched).

use std::alloc::{GlobalAlloc, Layout, System};

/// 128 MiB: above the 64 MiB a batch may decompress to, far below what a claim on the wire
/// could ask for.
pub const LIMIT: usize = 128 << 20;

pub struct Bounded;

fn check(size: usize) {
    if size > LIMIT {
        // no formatting here: it would allocate inside the allocator
        let msg = b"bounded_alloc: one allocation over 128 MiB\n";
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg);
        std::process::abort();
    }
}

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}
