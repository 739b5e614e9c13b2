//! The caching pool over host memory: classes, splitting and merging, trimming.

use super::*;
use memarray_core::{HostResource, StatisticsAdaptor};
use memarray_testing::conformance;

fn host_pool(threshold: usize) -> CachingPool {
    CachingPool::host(Arc::new(HostResource), threshold)
}

#[test]
fn host_pool_conforms() {
    conformance::check_all(Arc::new(host_pool(usize::MAX)));
    conformance::check_all(Arc::new(host_pool(0)));
    conformance::check_all(Arc::new(host_pool(3 << 20)));
}

#[test]
fn small_blocks_are_reused_by_class() {
    let pool = host_pool(usize::MAX);
    let a = pool.allocate(700, 64, None).unwrap();
    // SAFETY: freed once, with the arguments it was allocated with.
    unsafe { pool.deallocate(a, 700, 64, None) };
    let b = pool.allocate(1024, 64, None).unwrap();
    assert_eq!(a, b, "700 and 1024 bytes share the 1 KiB class");
    let c = pool.allocate(1025, 64, None).unwrap();
    assert_ne!(b, c);
    let s = pool.statistics();
    assert_eq!((s.hits, s.misses, s.used_bytes), (1, 2, 1024 + 2048));
    // SAFETY: as above.
    unsafe {
        pool.deallocate(b, 1024, 64, None);
        pool.deallocate(c, 1025, 64, None);
    }
    assert_eq!(pool.statistics().cached_bytes, 3072);
}

#[test]
fn large_blocks_split_best_fit_and_coalesce() {
    let upstream = Arc::new(StatisticsAdaptor::new(Arc::new(HostResource)));
    let pool = CachingPool::host(upstream.clone(), usize::MAX);
    // 2.5 MiB -> one 4 MiB segment: 2.5 MiB used, a 1.5 MiB free remainder.
    let (n_a, n_b) = (5 << 19, 3 << 19);
    let a = pool.allocate(n_a, 256, None).unwrap();
    assert_eq!(upstream.statistics().current_bytes, 4 << 20);
    let b = pool.allocate(n_b, 256, None).unwrap(); // the remainder, no new segment
    assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + n_a);
    assert_eq!(upstream.statistics().total_count, 1);
    // SAFETY: freed once each, with the arguments they were allocated with.
    unsafe {
        pool.deallocate(a, n_a, 256, None);
        pool.deallocate(b, n_b, 256, None);
    }
    // Merged back into one 4 MiB block: a 4 MiB request fits without a new segment.
    let c = pool.allocate(4 << 20, 256, None).unwrap();
    assert_eq!(c, a);
    assert_eq!(upstream.statistics().total_count, 1);
    // SAFETY: as above.
    unsafe { pool.deallocate(c, 4 << 20, 256, None) };
    assert_eq!(pool.trim(), 4 << 20);
    assert_eq!(
        upstream.statistics().current_bytes,
        0,
        "trim returns every segment"
    );
}

#[test]
fn release_threshold_bounds_the_cache() {
    let upstream = Arc::new(StatisticsAdaptor::new(Arc::new(HostResource)));
    let pool = CachingPool::host(upstream.clone(), 4 << 20);
    let blocks: Vec<_> = (0..8)
        .map(|_| pool.allocate(2 << 20, 256, None).unwrap())
        .collect();
    for p in blocks {
        // SAFETY: freed once, with the arguments it was allocated with.
        unsafe { pool.deallocate(p, 2 << 20, 256, None) };
        assert!(pool.statistics().cached_bytes <= 4 << 20);
    }
    assert_eq!(
        upstream.statistics().current_bytes,
        pool.statistics().cached_bytes
    );
}

#[test]
fn trimming_gives_back_big_idle_segments_before_small_blocks() {
    let pool = CachingPool::host(Arc::new(HostResource), 64 << 20);
    let big = pool.allocate(64 << 20, 256, None).unwrap();
    let small = pool.allocate(4096, 256, None).unwrap();
    // 64 MiB cached: at the limit; then over it, which trims.
    // SAFETY: freed once, with the arguments it was allocated with.
    unsafe { pool.deallocate(big, 64 << 20, 256, None) };
    // SAFETY: as above.
    unsafe { pool.deallocate(small, 4096, 256, None) };
    let cached = pool.statistics().cached_bytes;
    assert!(
        cached < 1 << 20,
        "the 64 MiB segment went back ({cached} cached)"
    );
    let again = pool.allocate(4096, 256, None).unwrap();
    assert_eq!(again, small, "the small block stayed cached");
    assert_eq!(pool.statistics().hits, 1);
    // SAFETY: as above.
    unsafe { pool.deallocate(again, 4096, 256, None) };
}

#[test]
fn free_parts_of_used_segments_do_not_push_small_blocks_out() {
    let pool = CachingPool::host(Arc::new(HostResource), 2 << 20);
    // Each 3 MiB block takes a 4 MiB segment whose free 1 MiB tail stays cached: 5 MiB
    // cached that no trim can give back while the blocks live.
    let big: Vec<_> = (0..5)
        .map(|_| pool.allocate(3 << 20, 256, None).unwrap())
        .collect();
    let small = pool.allocate(4096, 256, None).unwrap();
    // SAFETY: freed once, with the arguments it was allocated with.
    unsafe { pool.deallocate(small, 4096, 256, None) };
    assert!(pool.statistics().cached_bytes > 2 << 20);
    let again = pool.allocate(4096, 256, None).unwrap();
    assert_eq!(again, small, "the small block stayed cached");
    assert_eq!(pool.statistics().hits, 1);
    // SAFETY: as above, for every block.
    unsafe {
        pool.deallocate(again, 4096, 256, None);
        for p in big {
            pool.deallocate(p, 3 << 20, 256, None);
        }
    }
}

#[test]
fn out_of_memory_gives_the_cache_back_and_retries() {
    let limited = Arc::new(memarray_core::LimitingAdaptor::new(
        Arc::new(HostResource),
        8 << 20,
    ));
    let pool = CachingPool::host(limited.clone(), usize::MAX);
    let a = pool.allocate(6 << 20, 256, None).unwrap();
    // SAFETY: freed once, with the arguments it was allocated with.
    unsafe { pool.deallocate(a, 6 << 20, 256, None) };
    // 6 MiB cached + a new 4 MiB segment would pass 8 MiB, but 4 MiB fits in the
    // cached segment; ask for 8 MiB instead: needs the cache given back first.
    let b = pool.allocate(8 << 20, 256, None).unwrap();
    assert_eq!(limited.used(), 8 << 20);
    // SAFETY: as above.
    unsafe { pool.deallocate(b, 8 << 20, 256, None) };
    assert!(matches!(
        pool.allocate(9 << 20, 256, None),
        Err(CoreError::OutOfMemory { .. })
    ));
}

#[test]
fn foreign_and_double_frees_are_ignored() {
    let pool = host_pool(usize::MAX);
    let p = pool.allocate(64, 64, None).unwrap();
    // SAFETY: freed once...
    unsafe { pool.deallocate(p, 64, 64, None) };
    // ...and again: the pool no longer knows it and ignores it.
    // SAFETY: the pool ignores addresses it did not hand out (tested here).
    unsafe { pool.deallocate(p, 64, 64, None) };
    assert_eq!(pool.statistics().cached_bytes, 512);
}

#[test]
fn the_largest_free_block_says_what_one_allocation_can_get_from_the_cache() {
    let pool = host_pool(usize::MAX);
    assert_eq!(pool.statistics().largest_free_bytes, 0, "nothing cached");
    // 3 MiB from a 4 MiB segment: the 1 MiB rest is free.
    let a = pool.allocate(3 << 20, 256, None).unwrap();
    assert_eq!(pool.statistics().largest_free_bytes, 1 << 20);
    let b = pool.allocate(4096, 256, None).unwrap();
    // SAFETY: each freed once, with the arguments it was allocated with.
    unsafe { pool.deallocate(b, 4096, 256, None) };
    assert_eq!(
        pool.statistics().largest_free_bytes,
        1 << 20,
        "a 4 KiB class is smaller"
    );
    // SAFETY: as above.
    unsafe { pool.deallocate(a, 3 << 20, 256, None) };
    let s = pool.statistics();
    assert_eq!(
        s.largest_free_bytes,
        4 << 20,
        "freed, the block merged with its rest"
    );
    assert_eq!(s.cached_bytes, (4 << 20) + 4096);
}

mod growing {
    use super::*;
    use memarray_core::HostRange;

    const MIB: usize = 1 << 20;

    fn growing(capacity: usize, threshold: usize) -> (CachingPool, Arc<HostRange>) {
        let range = Arc::new(HostRange::reserve(capacity, 2 * MIB).unwrap());
        let pool = CachingPool::growing(Arc::new(HostResource), range.clone(), None, threshold);
        (pool, range)
    }

    fn alloc(pool: &CachingPool, n: usize) -> NonNull<u8> {
        pool.allocate(n, 256, None).unwrap()
    }

    fn free(pool: &CachingPool, p: NonNull<u8>, n: usize) {
        // SAFETY: each test frees a block once, with its arguments.
        unsafe { pool.deallocate(p, n, 256, None) };
    }

    #[test]
    fn a_growing_host_pool_conforms() {
        conformance::check_all(Arc::new(growing(256 * MIB, usize::MAX).0));
        conformance::check_all(Arc::new(growing(256 * MIB, 0).0));
    }

    #[test]
    fn blocks_of_different_growths_coalesce_and_fill_what_segments_could_not() {
        let (pool, range) = growing(64 * MIB, usize::MAX);
        let a = alloc(&pool, 3 * MIB); // backs 4 MiB, 1 MiB of it free at the end
        let b = alloc(&pool, 3 * MIB); // extends that free end by 2 MiB
        assert_eq!(range.backed(), 6 * MIB, "segments would hold 8 MiB");
        assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + 3 * MIB);
        // SAFETY: both blocks are ours, 3 MiB each, backed.
        unsafe {
            a.as_ptr().write_bytes(1, 3 * MIB);
            b.as_ptr().write_bytes(2, 3 * MIB);
        }
        free(&pool, a, 3 * MIB);
        free(&pool, b, 3 * MIB);
        let s = pool.statistics();
        assert_eq!(
            (s.largest_free_bytes, s.upstream_bytes),
            ((6 * MIB) as u64, (6 * MIB) as u64),
            "one free block across both growths"
        );
        // 5 MiB now comes from the cache (two 4 MiB segments could not serve it).
        let c = alloc(&pool, 5 * MIB);
        assert_eq!(c, a);
        assert_eq!((pool.statistics().hits, range.backed()), (1, 6 * MIB));
        free(&pool, c, 5 * MIB);
        assert_eq!(pool.release_cached(), 6 * MIB);
        assert_eq!((range.backed(), pool.statistics().upstream_bytes), (0, 0));
    }

    #[test]
    fn giving_back_unmaps_the_free_end_only_and_data_stays() {
        let (pool, range) = growing(64 * MIB, usize::MAX);
        let a = alloc(&pool, 4 * MIB);
        let b = alloc(&pool, 4 * MIB);
        let c = alloc(&pool, 4 * MIB);
        // SAFETY: c is ours, 4 MiB, backed.
        unsafe { c.as_ptr().write_bytes(9, 4 * MIB) };
        free(&pool, a, 4 * MIB); // a free block inside: stays
        free(&pool, b, 4 * MIB); // merges with a: still inside (c after it)
        assert_eq!(pool.release_cached(), 0, "nothing at the end is free");
        assert_eq!(range.backed(), 12 * MIB);
        // SAFETY: c is still ours.
        assert_eq!(unsafe { *c.as_ptr().add(4 * MIB - 1) }, 9);
        free(&pool, c, 4 * MIB); // everything free: one block, the whole range
        assert_eq!(pool.release_cached(), 12 * MIB);
        assert_eq!(range.backed(), 0);
        // And it grows again from the start.
        let d = alloc(&pool, 2 * MIB);
        assert_eq!(d, a);
        free(&pool, d, 2 * MIB);
    }

    #[test]
    fn a_release_threshold_unmaps_the_end_as_frees_pass_it() {
        let (pool, range) = growing(64 * MIB, 2 * MIB);
        let a = alloc(&pool, 8 * MIB);
        let b = alloc(&pool, 8 * MIB);
        free(&pool, b, 8 * MIB); // 8 MiB cached at the end, past 2 MiB: unmapped
        assert_eq!(range.backed(), 8 * MIB);
        assert_eq!(pool.statistics().cached_bytes, 0);
        free(&pool, a, 8 * MIB);
        assert_eq!(range.backed(), 0);
    }

    #[test]
    fn a_full_range_is_out_of_memory_naming_it() {
        let (pool, _range) = growing(8 * MIB, usize::MAX);
        let a = alloc(&pool, 6 * MIB);
        let e = pool.allocate(4 * MIB, 256, None).unwrap_err();
        assert!(
            matches!(e, CoreError::OutOfMemory { .. }) && e.to_string().contains("range"),
            "{e}"
        );
        free(&pool, a, 6 * MIB);
        let b = alloc(&pool, 8 * MIB); // the whole range, from the cache and one growth
        free(&pool, b, 8 * MIB);
    }

    #[test]
    fn a_backing_that_fails_fails_the_allocation_and_out_of_memory_is_retried_once() {
        let failing = |e: CoreError| Arc::new(crate::resource::test_range::Faulty::failing(e));
        let broken = failing(CoreError::Alloc {
            bytes: 0,
            align: 0,
            resource: "r".into(),
            reason: "the driver said no".into(),
        });
        let pool = CachingPool::growing(Arc::new(HostResource), broken, None, usize::MAX);
        let e = pool.allocate(4 * MIB, 256, None).unwrap_err();
        assert!(e.to_string().contains("the driver said no"), "{e}");
        assert_eq!(
            pool.statistics().upstream_bytes,
            0,
            "nothing was counted as backed"
        );
        let a = alloc(&pool, 4 * MIB); // the next try backs it
        free(&pool, a, 4 * MIB);
        let full = failing(CoreError::OutOfMemory {
            bytes: 0,
            resource: "r".into(),
            reason: "no memory".into(),
        });
        let pool = CachingPool::growing(Arc::new(HostResource), full, None, usize::MAX);
        let b = alloc(&pool, 4 * MIB); // out of memory once, then retried after a trim
        free(&pool, b, 4 * MIB);
    }

    #[test]
    fn a_pool_dropped_with_blocks_out_leaves_their_memory_in_place() {
        let (pool, range) = growing(16 * MIB, usize::MAX);
        let a = alloc(&pool, 4 * MIB);
        drop(pool);
        drop(range);
        // SAFETY: the block was never freed: the range stayed reserved and backed.
        unsafe { a.as_ptr().write_bytes(5, 4 * MIB) };
    }
}
