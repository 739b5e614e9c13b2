//! One staged copy as the pipeline and the short path see it.

use std::sync::Arc;

use memarray_core::HostBuffer;

use crate::device::Device;
use crate::error::Result;
use crate::event::Event;
use crate::stream::StreamRef;

use super::settings::Direction;

/// The host side of a staged copy.
#[derive(Clone, Copy)]
pub(super) enum HostSide<'a> {
    /// Host memory at this address (the caller checked the range).
    Memory(usize),
    /// A function that fills `buf` with the source's bytes from `offset` (an upload from
    /// a file: each lane reads straight into its pinned slot).
    Fill(&'a (dyn Fn(usize, &mut [u8]) -> Result<()> + Sync)),
}

/// One staged copy: `len` bytes between `host` and `dev` (both checked by the caller),
/// ordered on `stream`.
#[derive(Clone, Copy)]
pub(super) struct Transfer<'a> {
    pub(super) len: usize,
    pub(super) stream: StreamRef,
    pub(super) dir: Direction,
    pub(super) host: HostSide<'a>,
    pub(super) dev: DevSide<'a>,
}

/// The device side of a staged copy: one range, or ranges `(address, bytes)` that take the
/// copy's bytes in turn (many arrays filled from one source, one pipeline for all).
#[derive(Clone, Copy, Debug)]
pub(super) enum DevSide<'a> {
    One(u64),
    Spans(&'a [(u64, usize)]),
}

impl DevSide<'_> {
    /// Calls `f(device address, offset in [off, off + n), bytes)` for each part of the
    /// copy's bytes `[off, off + n)`, in order: one call for [`DevSide::One`].
    pub(super) fn each(
        &self,
        off: usize,
        n: usize,
        mut f: impl FnMut(u64, usize, usize) -> Result<()>,
    ) -> Result<()> {
        match *self {
            DevSide::One(base) => f(base + off as u64, 0, n),
            DevSide::Spans(spans) => crate::copy::each_laid(spans, off, n, f),
        }
    }
}

/// A pinned slot and the event after the DMA that last used it.
pub(super) struct Slot {
    pub(super) buf: HostBuffer,
    pub(super) done: Event,
}

impl Slot {
    /// A slot of `bytes` from the device's pinned pool (pageable, counted, when pinning
    /// fails: the copies stay correct at pageable speed).
    pub(super) fn new(device: &Arc<Device>, bytes: usize) -> Result<Slot> {
        Ok(Slot {
            // SAFETY: a slot's bytes are only read after a copy into them has written
            // them.
            buf: unsafe { crate::resource::staging_host_buffer(device, bytes)? },
            done: Event::new(device)?,
        })
    }
}

/// Copies `n` bytes into pinned memory that only the DMA engine reads next, with
/// non-temporal stores on x86-64: the destination lines are not read for ownership first
/// (a DMA read has just taken them out of the CPU's caches, so each would be fetched
/// from memory), so the copy moves two bytes of memory traffic per byte instead of three.
///
/// # Safety
/// 1. `src` is valid for reads and `dst` for writes of `n` bytes; they do not overlap.
pub(super) unsafe fn copy_to_pinned(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= 4096 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.align_offset(16).min(n);
        // SAFETY: item 1; `head`, the 64-byte blocks and the tail tile [0, n) of both
        // ranges; stores through `d` are 16-byte aligned (the head aligned it).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut left) = (dst.add(head), src.add(head), n - head);
            while left >= 64 {
                let v = [0, 16, 32, 48].map(|o| _mm_loadu_si128(s.add(o).cast::<__m128i>()));
                for (o, x) in [0, 16, 32, 48].into_iter().zip(v) {
                    _mm_stream_si128(d.add(o).cast::<__m128i>(), x);
                }
                (d, s, left) = (d.add(64), s.add(64), left - 64);
            }
            std::ptr::copy_nonoverlapping(s, d, left);
            // The streamed stores are visible before the DMA is issued.
            _mm_sfence();
        }
        return;
    }
    // SAFETY: item 1.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}
