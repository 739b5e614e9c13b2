//! One conformance suite for every [`MemoryResource`] (after RMM's `mr_ref_test_basic`).
//!
//! Host-accessible resources also get their memory written and read back. Device
//! resources are checked by memarray-cuda's tests, which call [`check`] and then copy.

use std::collections::HashSet;

use super::{Location, MemoryResource};

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

#[cfg(test)]
mod tests {
    #[test]
    fn host_resource_conforms() {
        super::check(&crate::resource::HostResource);
    }
}
