//! One conformance suite for every [`MemoryResource`] (after RMM's `mr_ref_test_basic`).
//!
//! [`check_all`] runs every part: [`check`] (alignment, zero size, many sizes, zeroing,
//! no overlap, bad alignment and absurd sizes), [`check_concurrent`] (16 threads
//! allocating and freeing at once), [`check_accounting`] (a statistics adaptor over the
//! resource sees exactly what went through) and [`check_out_of_memory`] (a limit is an
//! out-of-memory error, retried once after releasing cached memory). Host-accessible
//! resources also get their memory written and read back. Device resources are checked by
//! memarray-cuda's tests, which add stream-ordered reuse.

use std::collections::HashSet;
use std::sync::Arc;

use memarray_core::{
    CoreError, LimitingAdaptor, Location, MemoryResource, RetryAdaptor, StatisticsAdaptor,
};

/// Every part of the suite against `r`.
pub fn check_all(r: Arc<dyn MemoryResource>) {
    check(r.as_ref());
    check_concurrent(r.as_ref());
    check_accounting(r.clone());
    check_out_of_memory(r);
}

/// Deterministic sizes: zero, odd, small, and a few above a MiB.
fn size_of_step(seed: u64, i: u64) -> usize {
    let x = (seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    match x % 10 {
        0 => 0,
        1..=6 => (x >> 20) as usize % 4096 + 1,
        7 | 8 => (x >> 20) as usize % (256 << 10),
        _ => (1 << 20) + (x >> 20) as usize % (64 << 10),
    }
}

/// 16 threads allocate and free at once; each fills its blocks with its own byte (where
/// the host can reach them) and checks it is intact before freeing, so overlapping
/// hand-outs fail.
pub fn check_concurrent(r: &dyn MemoryResource) {
    let host = r.is_accessible_from(Location::Host);
    std::thread::scope(|s| {
        for t in 0..16u64 {
            s.spawn(move || {
                let mut live = Vec::new();
                for i in 0..100u64 {
                    let bytes = size_of_step(t, i);
                    let p = r
                        .allocate(bytes, 64, None)
                        .unwrap_or_else(|e| panic!("{}: thread {t}: {e}", r.name()));
                    if host && bytes > 0 {
                        // SAFETY: p is a live host-accessible block of `bytes` bytes.
                        unsafe { p.as_ptr().write_bytes(t as u8, bytes) };
                    }
                    live.push((p, bytes));
                    if i % 3 == 2 {
                        let (q, n) = live.swap_remove((i as usize * 7) % live.len());
                        free_checked(r, host, q, n, t as u8);
                    }
                }
                for (q, n) in live {
                    free_checked(r, host, q, n, t as u8);
                }
            });
        }
    });
}

fn free_checked(r: &dyn MemoryResource, host: bool, p: std::ptr::NonNull<u8>, n: usize, tag: u8) {
    if host && n > 0 {
        // SAFETY: p is a live host-accessible block of n bytes written with `tag`.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), n) };
        // Spot checks (first, last and every 4 KiB): a second owner's fill shows anywhere.
        let intact = bytes.iter().step_by(4096).all(|&b| b == tag) && bytes[n - 1] == tag;
        assert!(
            intact,
            "{}: a block was handed out twice (its bytes changed under its owner)",
            r.name()
        );
    }
    // SAFETY: p came from allocate(n, 64) and is freed once.
    unsafe { r.deallocate(p, n, 64, None) };
}

/// A statistics adaptor over `r` counts exactly the bytes and blocks that went through.
pub fn check_accounting(r: Arc<dyn MemoryResource>) {
    let stats = StatisticsAdaptor::new(r);
    let sizes: Vec<usize> = (0..40).map(|i| size_of_step(99, i)).collect();
    let live: Vec<_> = sizes
        .iter()
        .map(|&n| (stats.allocate(n, 64, None).expect("allocate"), n))
        .collect();
    let sum: u64 = sizes.iter().map(|&n| n as u64).sum();
    let s = stats.statistics();
    assert_eq!(
        (s.current_bytes, s.current_count),
        (sum, 40),
        "{}",
        stats.name()
    );
    for (p, n) in live {
        // SAFETY: p came from allocate(n, 64) and is freed once.
        unsafe { stats.deallocate(p, n, 64, None) };
    }
    let s = stats.statistics();
    assert_eq!(
        (s.current_bytes, s.current_count),
        (0, 0),
        "{}",
        stats.name()
    );
    assert_eq!((s.peak_bytes, s.peak_count), (sum, 40), "{}", stats.name());
    assert_eq!(
        (s.total_bytes, s.total_count),
        (sum, 40),
        "{}",
        stats.name()
    );
}

/// Past a limit, allocation is [`CoreError::OutOfMemory`] and nothing is counted; a retry
/// adaptor tries once more (after releasing cached memory below) and reports the same.
pub fn check_out_of_memory(r: Arc<dyn MemoryResource>) {
    let limited = Arc::new(LimitingAdaptor::new(r, 1 << 20));
    let p = limited
        .allocate(600 << 10, 64, None)
        .expect("under the limit");
    let e = limited.allocate(600 << 10, 64, None).unwrap_err();
    assert!(matches!(e, CoreError::OutOfMemory { .. }), "{e}");
    assert_eq!(
        limited.used(),
        600 << 10,
        "a refused allocation is not counted"
    );
    let retry = RetryAdaptor::new(limited.clone());
    let e = retry.allocate(600 << 10, 64, None).unwrap_err();
    assert!(matches!(e, CoreError::OutOfMemory { .. }), "{e}");
    assert_eq!(retry.retries(), 1);
    // SAFETY: p came from allocate(600 KiB, 64) and is freed once.
    unsafe { limited.deallocate(p, 600 << 10, 64, None) };
    let q = retry
        .allocate(600 << 10, 64, None)
        .expect("room again after the free");
    // SAFETY: as above.
    unsafe { retry.deallocate(q, 600 << 10, 64, None) };
    assert_eq!(limited.used(), 0);
}

/// Runs the suite against `r`, panicking with a message on the first violation.
pub fn check(r: &dyn MemoryResource) {
    let host = r.is_accessible_from(Location::Host);
    // Sizes include zero, odd sizes and a multi-page block.
    for &bytes in &[0usize, 1, 7, 64, 4096, 1 << 20, (1 << 20) + 3] {
        for &align in &[1usize, 8, 64, 256, 4096] {
            let p = r
                .allocate(bytes, align, None)
                .unwrap_or_else(|e| panic!("{}: allocate({bytes}, {align}): {e}", r.name()));
            assert_eq!(
                p.as_ptr() as usize % align,
                0,
                "{}: misaligned for {align}",
                r.name()
            );
            if host && bytes > 0 {
                // SAFETY: p is a live host-accessible allocation of `bytes` bytes.
                unsafe {
                    p.as_ptr().write_bytes(0xA5, bytes);
                    assert_eq!(*p.as_ptr().add(bytes - 1), 0xA5);
                }
            }
            // SAFETY: p came from allocate with these arguments and is freed once.
            unsafe { r.deallocate(p, bytes, align, None) };
        }
    }
    // Zeroed memory is zero.
    let n = 1 << 16;
    let z = r.allocate_zeroed(n, 64, None).expect("allocate_zeroed");
    if host {
        // SAFETY: z is a live host-accessible allocation of n bytes.
        let all_zero = unsafe { std::slice::from_raw_parts(z.as_ptr(), n) }
            .iter()
            .all(|&b| b == 0);
        assert!(all_zero, "{}: allocate_zeroed gave nonzero bytes", r.name());
    }
    // SAFETY: z came from allocate_zeroed(n, 64) and is freed once.
    unsafe { r.deallocate(z, n, 64, None) };
    // Live allocations never overlap.
    let live: Vec<_> = (0..64)
        .map(|_| r.allocate(256, 64, None).expect("allocate"))
        .collect();
    let starts: HashSet<usize> = live.iter().map(|p| p.as_ptr() as usize).collect();
    assert_eq!(starts.len(), live.len(), "{}: duplicate pointers", r.name());
    let mut sorted: Vec<usize> = starts.into_iter().collect();
    sorted.sort_unstable();
    assert!(
        sorted.windows(2).all(|w| w[1] - w[0] >= 256),
        "{}: overlapping allocations",
        r.name()
    );
    for p in live {
        // SAFETY: each p came from allocate(256, 64) and is freed once.
        unsafe { r.deallocate(p, 256, 64, None) };
    }
    // Bad alignment is an error, not a panic.
    assert!(
        r.allocate(64, 3, None).is_err(),
        "{}: accepted align 3",
        r.name()
    );
    // Absurd sizes fail cleanly.
    assert!(
        r.allocate(usize::MAX / 2, 64, None).is_err(),
        "{}: allocated usize::MAX / 2 bytes",
        r.name()
    );
    if let Some(info) = r.memory_info() {
        assert!(info.free <= info.total, "{}: free > total", r.name());
    }
}
