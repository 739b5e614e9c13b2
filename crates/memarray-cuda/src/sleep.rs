//! Offload and restore ("sleep") of a pool growing in place, with every address kept:
//! [`offload`] copies the bytes of each large block handed out to host memory (page-locked
//! for a device, so the copies run at the link's speed) through the copy wing, then the
//! pool releases its range's memory; [`restore`] has the pool back the same addresses and
//! copies the bytes back. Pointers held anywhere into the pool (torch's tensors, CuPy's
//! arrays, memarray's arrays) are valid again after a restore without their owners
//! knowing; between the two nothing may use them. The host copy stays with the pool
//! after a restore and serves the next offload (sleep and wake again in a loop pays the
//! pinning once); the pool's `trim` gives it back. The pool's half is
//! [`CachingPool::offload_begin`] and the calls after it.

use std::sync::Arc;

use memarray_core::{HostBuffer, MemoryResource};

use crate::buffer::DeviceBuffer;
use crate::copy::{self, Span};
use crate::device::Device;
use crate::error::Result;
use crate::resource::{CachingPool, PinnedResource, Restore};
use crate::stream::{Stream, StreamRef};

/// Copies every large block `pool` has handed out to host memory and releases the pool's
/// memory, every address kept; returns the bytes released. See the module's docs.
///
/// # Errors
/// `CoreError::Offload` for a pool not growing in place, one offloaded already, or one
/// with blocks held for CUDA graphs; a copy's or an allocation's error (the pool is then
/// awake, its memory untouched).
pub fn offload(pool: &CachingPool) -> Result<u64> {
    let blocks = pool.offload_begin()?;
    let copy = match copy_out(pool, &blocks) {
        Ok(copy) => copy,
        Err(e) => {
            pool.offload_abort();
            return Err(e);
        }
    };
    pool.offload_finish(blocks, copy).or_else(|e| {
        // Part of the memory went: it comes back with the blocks' bytes.
        if pool.offloaded() {
            restore(pool)?;
        }
        Err(e.into())
    })
}

/// Backs an offloaded pool's addresses again, in the pieces they were backed in, and copies
/// its blocks back, each queued as soon as its pieces are backed (the next pieces are backed
/// while it runs); returns the bytes restored.
///
/// # Errors
/// `CoreError::Offload` when not offloaded; out of memory when the device has no room, or
/// a copy's error: the pool then stays offloaded, its copy kept (what was backed is
/// released again), and a later restore may succeed.
pub fn restore(pool: &CachingPool) -> Result<u64> {
    let mut restore = pool.restore_begin()?;
    match back_and_copy(pool, &mut restore) {
        Ok(()) => {
            let bytes = restore.blocks.iter().map(|b| b.1 as u64).sum();
            // The host copy stays with the pool for its next offload (`trim` drops it).
            pool.restore_finish(Some(restore.copy));
            Ok(bytes)
        }
        Err(e) => {
            pool.restore_abort(restore);
            Err(e)
        }
    }
}

/// Backs `r`'s parts in order and queues each block's copy back once the parts under it
/// are backed, on a stream of the pool's device; waits for the copies (also on an error,
/// before the caller releases what was backed).
fn back_and_copy(pool: &CachingPool, r: &mut Restore) -> Result<()> {
    let stream = pool.device().map(Stream::new).transpose()?;
    let mut parts = r.parts.iter().copied();
    let mut backed = r.parts.first().map_or(usize::MAX, |p| p.0);
    // Device views of the blocks, kept until their copies have run.
    let mut views = Vec::with_capacity(r.blocks.len());
    let mut queued = || -> Result<()> {
        let mut at = 0;
        for &(addr, n) in &r.blocks {
            let end = addr + n - r.base;
            while backed < end {
                let Some((from, to)) = parts.next() else {
                    return Err(memarray_core::CoreError::Offload {
                        resource: pool.name().to_string(),
                        what: "restore",
                        reason: format!("a block ends past the range's parts ({end} > {backed})"),
                    }
                    .into());
                };
                pool.restore_back(from, to)?;
                backed = to;
            }
            match (pool.device(), &stream) {
                (Some(device), Some(stream)) => {
                    // SAFETY: a block of the pool's range, backed above, not used by anyone
                    // until the restore ends (the pool refuses allocations meanwhile).
                    let view = unsafe { block_view(device, addr, n) }?;
                    // SAFETY: the host copy is neither freed nor written until the stream
                    // is waited for below, before this function returns.
                    unsafe {
                        copy::enqueue(
                            Span::Device(&view, 0),
                            Span::Host(&r.copy, at),
                            n,
                            stream.as_ref(),
                        )
                    }?;
                    views.push(view);
                }
                _ => {
                    // SAFETY: as above, a backed block of the pool's host range.
                    let block = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
                    copy::host_to_host(block, &r.copy.as_slice()[at..at + n])?;
                }
            }
            at += n;
        }
        // The parts past the last block (up to the end of the piece it lies in).
        for (from, to) in parts.by_ref() {
            pool.restore_back(from, to)?;
        }
        Ok(())
    };
    let result = queued();
    let waited = stream.as_ref().map_or(Ok(()), |s| s.synchronize());
    drop(views);
    result.and(waited)
}

fn host_buffer(pool: &CachingPool, bytes: usize) -> Result<HostBuffer> {
    let resource: Arc<dyn MemoryResource> = match pool.device() {
        Some(device) => Arc::new(PinnedResource::new(device)),
        None => Arc::new(memarray_core::HostResource),
    };
    // SAFETY: every byte is written by the copies out before anything reads it.
    Ok(unsafe { HostBuffer::uninit_in(bytes.max(1), resource) }?)
}

/// The blocks' bytes in host memory, laid end to end in list order: in the last offload's
/// copy when it is large enough (pinning 8 GiB anew takes seconds, the copy itself a
/// fraction of one).
fn copy_out(pool: &CachingPool, blocks: &[(usize, usize)]) -> Result<HostBuffer> {
    let total = blocks.iter().map(|b| b.1).sum();
    let mut copy = match pool.take_spare_copy().filter(|c| c.len() >= total) {
        Some(copy) => copy,
        None => host_buffer(pool, total)?,
    };
    blocks_out(pool, blocks, &mut copy)?;
    Ok(copy)
}

/// Copies each block to its place in `copy` (the blocks in list order), each copy waited
/// for.
fn blocks_out(pool: &CachingPool, blocks: &[(usize, usize)], copy: &mut HostBuffer) -> Result<()> {
    let mut at = 0;
    for &(addr, n) in blocks {
        match pool.device() {
            Some(device) => {
                // SAFETY: the block is live device memory of `device`, handed out and not
                // released (the offload waited for the device first).
                let view = unsafe { block_view(device, addr, n) }?;
                copy::copy_to(Span::Host(copy, at), Span::Device(&view, 0), n, None)?;
            }
            None => {
                // SAFETY: as above, `n` host bytes of the pool's range.
                let block = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
                copy::host_to_host(&mut copy.as_mut_slice()[at..at + n], block)?;
            }
        }
        at += n;
    }
    Ok(())
}

/// A device buffer over `n` bytes of a pool block at `addr` on `device`, owning nothing.
///
/// # Safety
/// 1. `[addr, addr + n)` is device memory of `device`, backed and not used by anyone else
///    while the view and the copies through it live.
unsafe fn block_view(device: &Arc<Device>, addr: usize, n: usize) -> Result<DeviceBuffer> {
    // SAFETY: item 1 is from_foreign's item 1; the view owns nothing and orders nothing.
    unsafe { DeviceBuffer::from_foreign(device, addr as u64, n, Box::new(()), StreamRef::legacy()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::{CoreError, GrowableRange, HostRange, HostResource};
    use std::ptr::NonNull;

    const MIB: usize = 1 << 20;

    #[test]
    fn an_offloaded_pool_keeps_every_address_and_restores_the_bytes() {
        let range = Arc::new(HostRange::reserve(64 * MIB, 2 * MIB).unwrap());
        let pool = CachingPool::growing(Arc::new(HostResource), range.clone(), None, usize::MAX);
        let sizes = [3 * MIB, 5 * MIB, 2 * MIB];
        let blocks: Vec<NonNull<u8>> = sizes
            .iter()
            .map(|&n| pool.allocate(n, 256, None).unwrap())
            .collect();
        for (k, (&p, &n)) in blocks.iter().zip(&sizes).enumerate() {
            // SAFETY: each block is ours, n bytes.
            unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n) }
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i as u8).wrapping_mul(k as u8 + 3));
        }
        // The middle one freed first: its bytes are not kept.
        // SAFETY: freed once, with its arguments.
        unsafe { pool.deallocate(blocks[1], sizes[1], 256, None) };
        let backed = range.backed();
        assert_eq!(offload(&pool).unwrap(), backed as u64);
        assert!(
            pool.offloaded() && range.backed() == 0,
            "the memory went back"
        );
        assert!(offload(&pool).is_err(), "offloaded already");
        let e = pool.allocate(MIB * 2, 256, None).unwrap_err();
        assert!(e.to_string().contains("offloaded"), "{e}");
        assert_eq!(pool.trim(), 0, "nothing more to give back while offloaded");
        assert_eq!(restore(&pool).unwrap(), (sizes[0] + sizes[2]) as u64);
        assert_eq!(range.backed(), backed);
        for k in [0, 2] {
            // SAFETY: the blocks are ours again, at the same addresses.
            let got = unsafe { std::slice::from_raw_parts(blocks[k].as_ptr(), sizes[k]) };
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &b)| b == (i as u8).wrapping_mul(k as u8 + 3)),
                "block {k}"
            );
        }
        assert!(restore(&pool).is_err(), "not offloaded");
        let more = pool.allocate(4 * MIB, 256, None).unwrap();
        // SAFETY: freed once each.
        unsafe {
            pool.deallocate(more, 4 * MIB, 256, None);
            pool.deallocate(blocks[0], sizes[0], 256, None);
            pool.deallocate(blocks[2], sizes[2], 256, None);
        }
        let segments = CachingPool::host(Arc::new(HostResource), usize::MAX);
        let e = offload(&segments).unwrap_err();
        assert!(
            matches!(&e, crate::CudaError::Core(CoreError::Offload { .. })),
            "segments cannot keep addresses: {e}"
        );
    }

    #[test]
    fn an_offload_drops_the_free_end_of_the_range_and_a_restore_backs_only_the_rest() {
        let range = Arc::new(HostRange::reserve(64 * MIB, 2 * MIB).unwrap());
        let pool = CachingPool::growing(Arc::new(HostResource), range.clone(), None, usize::MAX);
        let a = pool.allocate(3 * MIB, 256, None).unwrap();
        let tail = pool.allocate(8 * MIB, 256, None).unwrap();
        // SAFETY: ours, 3 MiB; the tail freed once, with its arguments.
        unsafe {
            a.as_ptr().write_bytes(9, 3 * MIB);
            pool.deallocate(tail, 8 * MIB, 256, None);
        }
        let backed = range.backed();
        assert!(backed >= 11 * MIB, "{backed}");
        assert_eq!(offload(&pool).unwrap(), backed as u64, "all of it released");
        assert_eq!(range.backed(), 0);
        assert_eq!(restore(&pool).unwrap(), 3 * MIB as u64);
        // Up to the live block's end, in whole pieces: the free end stays unbacked.
        assert_eq!(range.backed(), 4 * MIB);
        // SAFETY: ours again, its bytes back.
        unsafe {
            assert_eq!(*a.as_ptr(), 9);
            assert_eq!(*a.as_ptr().add(3 * MIB - 1), 9);
        }
        // The pool grows again past it, at the addresses after.
        let more = pool.allocate(8 * MIB, 256, None).unwrap();
        assert!(more.as_ptr() as usize >= a.as_ptr() as usize + 3 * MIB);
        assert!(range.backed() >= 11 * MIB);
        // SAFETY: freed once each.
        unsafe {
            pool.deallocate(more, 8 * MIB, 256, None);
            pool.deallocate(a, 3 * MIB, 256, None);
        }
    }

    #[test]
    fn the_host_copy_serves_the_next_offload_until_a_trim() {
        let range = Arc::new(HostRange::reserve(64 * MIB, 2 * MIB).unwrap());
        let pool = CachingPool::growing(Arc::new(HostResource), range, None, usize::MAX);
        let a = pool.allocate(4 * MIB, 256, None).unwrap();
        // The kept copy's address, put back where the restore left it.
        let spare_at = |pool: &CachingPool| {
            let spare = pool.take_spare_copy().expect("a copy kept");
            let at = spare.as_ptr() as usize;
            pool.restore_finish(Some(spare));
            at
        };
        assert!(pool.take_spare_copy().is_none(), "none before an offload");
        offload(&pool).unwrap();
        restore(&pool).unwrap();
        let first = spare_at(&pool);
        // SAFETY: ours, 4 MiB.
        unsafe { a.as_ptr().write_bytes(7, 4 * MIB) };
        offload(&pool).unwrap();
        restore(&pool).unwrap();
        assert_eq!(
            spare_at(&pool),
            first,
            "the second offload reused the first's copy"
        );
        // SAFETY: ours again, its bytes back.
        assert_eq!(unsafe { *a.as_ptr().add(4 * MIB - 1) }, 7);
        pool.trim();
        assert!(pool.take_spare_copy().is_none(), "a trim drops the copy");
        // SAFETY: freed once.
        unsafe { pool.deallocate(a, 4 * MIB, 256, None) };
    }

    #[test]
    fn a_restore_that_cannot_back_the_memory_stays_offloaded_and_a_later_one_succeeds() {
        let range = Arc::new(crate::resource::test_range::Faulty::plain());
        let pool = CachingPool::growing(Arc::new(HostResource), range.clone(), None, usize::MAX);
        let (a, b) = (
            pool.allocate(4 * MIB, 256, None).unwrap(),
            pool.allocate(6 * MIB, 256, None).unwrap(),
        );
        // SAFETY: both ours, 4 and 6 MiB.
        unsafe {
            a.as_ptr().write_bytes(5, 4 * MIB);
            b.as_ptr().write_bytes(6, 6 * MIB);
        }
        let backed = range.backed();
        assert_eq!(range.pieces().len(), 2, "two growths, two pieces");
        offload(&pool).unwrap();
        range.fail_next(CoreError::OutOfMemory {
            bytes: backed,
            resource: "test".into(),
            reason: "no room".into(),
        });
        let e = restore(&pool).unwrap_err();
        assert!(
            matches!(&e, crate::CudaError::Core(CoreError::OutOfMemory { .. })),
            "{e}"
        );
        assert!(pool.offloaded(), "still offloaded");
        assert_eq!(range.backed(), 0, "nothing left backed");
        assert_eq!(restore(&pool).unwrap(), 10 * MIB as u64);
        assert_eq!(range.backed(), backed);
        // Small pieces are backed again as one.
        assert_eq!(range.pieces(), [backed]);
        // SAFETY: both ours again, their bytes back.
        unsafe {
            assert_eq!(*a.as_ptr(), 5);
            assert_eq!(*a.as_ptr().add(4 * MIB - 1), 5);
            assert_eq!(*b.as_ptr().add(6 * MIB - 1), 6);
            pool.deallocate(a, 4 * MIB, 256, None);
            pool.deallocate(b, 6 * MIB, 256, None);
        }
    }

    #[test]
    fn an_offload_that_cannot_release_everything_restores_and_says_so() {
        let range = Arc::new(crate::resource::test_range::Faulty::stubborn());
        let pool = CachingPool::growing(Arc::new(HostResource), range, None, usize::MAX);
        let (a, b) = (
            pool.allocate(4 * MIB, 256, None).unwrap(),
            pool.allocate(4 * MIB, 256, None).unwrap(),
        );
        // SAFETY: both ours, 4 MiB each.
        unsafe {
            a.as_ptr().write_bytes(3, 4 * MIB);
            b.as_ptr().write_bytes(4, 4 * MIB);
        }
        let e = offload(&pool).unwrap_err();
        assert!(e.to_string().contains("could be released"), "{e}");
        assert!(!pool.offloaded(), "restored at once");
        // SAFETY: both ours again, the bytes back (b's piece was released and restored).
        unsafe {
            assert_eq!(*a.as_ptr().add(4 * MIB - 1), 3);
            assert_eq!(*b.as_ptr().add(4 * MIB - 1), 4);
            pool.deallocate(a, 4 * MIB, 256, None);
            pool.deallocate(b, 4 * MIB, 256, None);
        }
    }
}
