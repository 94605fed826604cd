//! Counting the bytes the process holds, for `capdex bench --memory`: a
//! wrapper around the binary's allocator that, once [`start`] is called,
//! keeps the live heap bytes in one counter, so the memory account can
//! attribute each structure the bytes its construction left allocated.
//!
//! Until [`start`], the wrapper adds one relaxed load of a flag to each
//! allocation and writes nothing: the service calls it only when
//! `CAPDEX_COUNT_HEAP` is set (then its retention sweep sets the gauge
//! `capdex_heap_live_bytes`; `capdex bench --soak` sets it), at the price of
//! two atomic operations on one counter per allocation.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The highest [`LIVE`] reached since the last [`Meter::now`].
static HIGH: AtomicIsize = AtomicIsize::new(0);

/// Counts `size` more live bytes, raising the high-water mark.
fn grow(size: isize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    HIGH.fetch_max(live, Ordering::Relaxed);
}

/// `A`, counting live bytes after [`start`].
pub struct Counting<A>(pub A);

// SAFETY: every call is passed to `A` unchanged; the counter has no effect on
// what is allocated.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A`'s.
        let pointer = unsafe { self.0.alloc(layout) };
        if !pointer.is_null() && COUNTING.load(Ordering::Relaxed) {
            grow(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A`'s.
        let pointer = unsafe { self.0.alloc_zeroed(layout) };
        if !pointer.is_null() && COUNTING.load(Ordering::Relaxed) {
            grow(layout.size() as isize);
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
            grow(new_size as isize - layout.size() as isize);
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

/// Whether [`start`] was called (the live heap is being counted).
pub fn counting() -> bool {
    COUNTING.load(Ordering::Relaxed)
}

/// The bytes allocated and not freed since [`start`].
pub fn live_bytes() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// The live bytes at a point, to measure what a step left allocated and
/// the most it held on the way. One meter at a time: reading one restarts
/// the high-water mark.
#[derive(Clone, Copy, Debug)]
pub struct Meter(isize);

impl Meter {
    pub fn now() -> Meter {
        let live = live_bytes();
        HIGH.store(live, Ordering::SeqCst);
        Meter(live)
    }

    /// The bytes allocated since this meter was read, net of frees.
    pub fn grown(self) -> isize {
        live_bytes() - self.0
    }

    /// The most bytes held at once since this meter was read, above what
    /// is held now: a step's temporaries (buffers, growing tables).
    pub fn transient(self) -> isize {
        HIGH.load(Ordering::SeqCst).max(live_bytes()) - live_bytes()
    }
}

/// mimalloc's option numbers (`mi_option_t` in the v3 `mimalloc.h` that
/// libmimalloc-sys builds by default), for the options it does not name.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// Makes mimalloc give freed memory back to the OS at once and commit its
/// arenas page by page as they are used, instead of committing a whole arena
/// up front and keeping freed pages resident for a second (more in arenas).
///
/// Building a catalog frees its temporaries (embedding batches, the texts
/// they were made from) in bursts; with mimalloc's defaults those pages stay
/// resident, a third of the process at 10,000 capabilities. Measured on the
/// discovery benchmark and the NATS service (`docs/performance.md`, "Memory"):
/// peak RSS at 10,000 fell by a third, throughput did not move.
///
/// And it turns transparent huge pages off for the process. mimalloc marks
/// its arenas `MADV_HUGEPAGE`, and Linux's khugepaged, scanning in the
/// background (4,096 pages every 10 s by default), collapses any 2 MiB range
/// of them in which one 4 KiB page is used (`max_ptes_none` 511) into a huge
/// page, resident whole: under the soak the service's RSS rose 10 to 15 MB
/// in a step twelve minutes after start, whatever the load, its live heap
/// flat (`AnonHugePages` 47 MB of 105 MB anonymous; `docs/performance.md`,
/// "The minute-12 step"). mimalloc turns THP off only at its own start, from
/// `MIMALLOC_ALLOW_THP=0`, so the process does it here (`PR_SET_THP_DISABLE`,
/// which covers mappings made before it); later arenas are not marked. The
/// flag is inherited by the processes capdex starts (a stdio MCP server,
/// the soak's `nats-server`): they run on 4 KiB pages too.
///
/// A `MIMALLOC_PURGE_DELAY`, `MIMALLOC_ARENA_EAGER_COMMIT` or
/// `MIMALLOC_ALLOW_THP` in the environment wins (mimalloc reads it itself), so
/// an operator can still tune each.
pub fn tune_mimalloc(environment: impl Fn(&str) -> bool) {
    for (variable, option, value) in [
        ("MIMALLOC_PURGE_DELAY", MI_OPTION_PURGE_DELAY, 0),
        ("MIMALLOC_ARENA_EAGER_COMMIT", MI_OPTION_ARENA_EAGER_COMMIT, 0),
    ] {
        if !environment(variable) {
            // SAFETY: `mi_option_set` takes any option number and value; it
            // only stores the value, read by later allocations and frees.
            unsafe { libmimalloc_sys::mi_option_set(option, value) };
        }
    }
    if !environment("MIMALLOC_ALLOW_THP") {
        // SAFETY: as above.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) };
        disable_transparent_huge_pages();
    }
}

/// Turns transparent huge pages off for this process (its mappings old and
/// new); a kernel without the call leaves them as they are.
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integers only and changes a flag of
    // the process's memory map, nothing Rust holds.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option numbers are the ones whose documented defaults are
    /// mimalloc's (purge delay 1,000 ms, arena eager commit 2, THP allowed),
    /// so a library upgrade that renumbers them fails here, not silently in
    /// production; and after tuning, the kernel says THP is off for the process.
    #[test]
    fn the_option_numbers_name_the_purge_delay_the_eager_commit_and_thp() {
        if ["MIMALLOC_PURGE_DELAY", "MIMALLOC_ARENA_EAGER_COMMIT", "MIMALLOC_ALLOW_THP"]
            .iter()
            .any(|variable| std::env::var_os(variable).is_some())
        {
            return;
        }
        // SAFETY: reading an option has no precondition.
        let read = |option| unsafe { libmimalloc_sys::mi_option_get(option) };
        assert_eq!(read(MI_OPTION_PURGE_DELAY), 1000);
        assert_eq!(read(MI_OPTION_ARENA_EAGER_COMMIT), 2);
        assert_eq!(read(MI_OPTION_ALLOW_THP), 1);
        tune_mimalloc(|_| false);
        assert_eq!(read(MI_OPTION_PURGE_DELAY), 0);
        assert_eq!(read(MI_OPTION_ARENA_EAGER_COMMIT), 0);
        assert_eq!(read(MI_OPTION_ALLOW_THP), 0);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: PR_GET_THP_DISABLE only reads the flag.
            let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(disabled, 1, "THP off for the process");
        }
    }
}
