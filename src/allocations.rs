//! Counting the bytes the process holds, for `capdex bench --memory`: a
//! wrapper around the binary's allocator that, once [`start`] is called,
//! keeps the live heap bytes in one counter, so the memory account can
//! attribute each structure the bytes its construction left allocated.
//!
//! Until [`start`], the wrapper adds one relaxed load of a flag to each
//! allocation and writes nothing: the service never calls it.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);

/// `A`, counting live bytes after [`start`].
pub struct Counting<A>(pub A);

// SAFETY: every call is passed to `A` unchanged; the counter has no effect on
// what is allocated.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A`'s.
        let pointer = unsafe { self.0.alloc(layout) };
        if !pointer.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A`'s.
        let pointer = unsafe { self.0.alloc_zeroed(layout) };
        if !pointer.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `A`'s.
        unsafe { self.0.dealloc(pointer, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `A`'s.
        let moved = unsafe { self.0.realloc(pointer, layout, new_size) };
        if !moved.is_null() && COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        moved
    }
}

/// Starts counting; answers whether the process's allocator counts (it is
/// a [`Counting`]: the `capdex` binary's is, a test's or a library user's
/// may not be). Bytes allocated before are not counted, and their frees
/// lower the count: measure differences ([`Meter`]), with nothing older freed
/// in between.
pub fn start() -> bool {
    COUNTING.store(true, Ordering::SeqCst);
    let before = live_bytes();
    let probe = std::hint::black_box(vec![0u8; 4096]);
    let counted = live_bytes() - before >= 4096;
    drop(probe);
    counted
}

/// The bytes allocated and not freed since [`start`].
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// The live bytes at a point, to measure what a step left allocated.
#[derive(Clone, Copy, Debug)]
pub struct Meter(isize);

impl Meter {
    pub fn now() -> Meter {
        Meter(live_bytes())
    }

    /// The bytes allocated since this meter was read, net of frees.
    pub fn grown(self) -> isize {
        live_bytes() - self.0
    }
}
