//! Many small host-device copies as one: the bytes of `move_many`. Pageable host parts
//! are packed into one pinned staging buffer at [`pack_layout`]'s offsets (pinned parts
//! are read or written in place); going up, parts that may share one new device block get
//! slices of it laid out like the staging buffer, filled by one copy; the remaining copies
//! go to the driver as one batch (`cuMemcpyBatchAsync` where the driver has it); one wait
//! at the end.

use std::sync::Arc;

use memarray_core::{CoreError, HostBuffer};

use crate::buffer::DeviceBuffer;
use crate::copy::pack::pack_layout;
use crate::copy::{direct, route, threads};
use crate::device::Device;
use crate::driver;
use crate::error::Result;
use crate::event::Event;
use crate::resource::default_resource;
use crate::stream::StreamRef;

/// Where the last batch of host-device copies (`upload_many`) spent its time, for
/// benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchProfile {
    /// Parts in the batch.
    pub arrays: usize,
    /// Microseconds packing pageable data through pinned memory.
    pub stage_us: f64,
    /// Microseconds allocating device buffers.
    pub prepare_us: f64,
    /// Microseconds in the driver enqueueing the copies.
    pub enqueue_us: f64,
    /// Microseconds waiting for the copies.
    pub wait_us: f64,
    /// Batches the driver took in one `cuMemcpyBatchAsync` call, and ones it refused
    /// (then copied one by one), since the process started.
    pub batched: u64,
    /// See `batched`.
    pub refused: u64,
}

static PROFILE: std::sync::Mutex<BatchProfile> = std::sync::Mutex::new(BatchProfile {
    arrays: 0,
    stage_us: 0.0,
    prepare_us: 0.0,
    enqueue_us: 0.0,
    wait_us: 0.0,
    batched: 0,
    refused: 0,
});

/// The profile of the last batch uploaded (`RawArray::move_many` to a device).
pub fn last_batch_profile() -> BatchProfile {
    let mut p = *PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    p.batched = driver::BATCHED.load(std::sync::atomic::Ordering::Relaxed);
    p.refused = driver::BATCH_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    p
}

fn us(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// What a batch refused under a capture is.
const BATCH_UNDER_CAPTURE: &str =
    "a batch of host copies (move_many: packed by host threads and waited for)";

/// One part of a batch: a host buffer and the bytes of it (from its start) that move.
pub(crate) type HostPart<'a> = (&'a HostBuffer, usize);

/// Where each part's bytes sit on the pinned side: its own pinned buffer, or an offset in
/// the staging buffer.
enum HostSide {
    Direct(u64),
    Staged(usize),
}

/// Pinned parts are used in place; the others get [`pack_layout`]'s offsets (over the
/// staged parts alone) in one pinned staging buffer, returned with its size.
fn plan(parts: &[HostPart<'_>]) -> (Vec<HostSide>, usize) {
    let direct = |h: &HostBuffer| route::kind_is_direct(h.kind());
    let staged: Vec<usize> = parts
        .iter()
        .filter(|(h, _)| !direct(h))
        .map(|(_, n)| *n)
        .collect();
    let (offsets, total) = pack_layout(&staged);
    let mut offsets = offsets.into_iter();
    let sides = parts
        .iter()
        .map(|(h, _)| match direct(h) {
            true => HostSide::Direct(h.as_ptr() as u64),
            false => HostSide::Staged(offsets.next().unwrap_or_default()),
        })
        .collect();
    (sides, total)
}

/// The plan and its staging buffer (none when every part is pinned), after checking that
/// each host buffer holds its part.
fn stage(
    parts: &[HostPart<'_>],
    device: &Arc<Device>,
) -> Result<(Vec<HostSide>, Option<HostBuffer>)> {
    for (h, n) in parts {
        if *n > h.len() {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: *n,
                capacity: h.len(),
            }
            .into());
        }
    }
    let (sides, total) = plan(parts);
    if total == 0 {
        return Ok((sides, None));
    }
    // SAFETY: every byte a copy reads is written by the packing first (up), or by the
    // copies themselves before it is unpacked (down).
    let buf = unsafe { crate::resource::staging_host_buffer(device, total)? };
    Ok((sides, Some(buf)))
}

/// Copies every (source, destination, bytes) piece of host memory, on up to 8 of the copy
/// threads when there is enough to share (more than 1 MiB).
///
/// # Safety
/// 1. Each source is live host memory of its `n` bytes, each destination live host memory
///    of its `n` bytes that nothing else accesses until this returns; destinations overlap
///    neither each other nor any source.
pub(crate) unsafe fn host_pieces(pieces: &[(usize, usize, usize)]) -> Result<()> {
    let total: usize = pieces.iter().map(|p| p.2).sum();
    let lanes = (total >> 20).clamp(1, 8).min(pieces.len().max(1));
    threads::parallel(lanes, &|lane| {
        for &(src, dst, n) in pieces.iter().skip(lane).step_by(lanes) {
            // SAFETY: item 1.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        }
        Ok(())
    })
}

/// Uploads each part to a device buffer on `device` (bound by the caller), after the work
/// queued on `stream`, and waits. Parts for which `shares(i)` holds and that go through
/// the staging buffer get slices of one new block from the device's default resource (one
/// copy fills them all); every other part gets `own(i)`, a buffer of at least its size,
/// filled by the driver's batch. Returns each part's buffer, complete.
pub(crate) fn upload_many(
    parts: &[HostPart<'_>],
    device: &Arc<Device>,
    stream: StreamRef,
    shares: &dyn Fn(usize) -> bool,
    own: &mut dyn FnMut(usize) -> Result<Arc<DeviceBuffer>>,
) -> Result<Vec<Arc<DeviceBuffer>>> {
    // Host threads pack the parts now and the call waits: nothing a graph could replay
    // (refused before any work, the capture left valid).
    stream.refuse_under_capture(device, BATCH_UNDER_CAPTURE)?;
    let mut prof = BatchProfile {
        arrays: parts.len(),
        ..Default::default()
    };
    let t = std::time::Instant::now();
    let (sides, stage) = stage(parts, device)?;
    let stage_base = stage.as_ref().map_or(0, |s| s.as_ptr() as usize);
    let mut pieces: Vec<(usize, usize, usize)> = Vec::new();
    let srcs: Vec<u64> = parts
        .iter()
        .zip(&sides)
        .map(|((h, n), side)| match side {
            HostSide::Direct(p) => *p,
            HostSide::Staged(off) => {
                pieces.push((h.as_ptr() as usize, stage_base + off, *n));
                (stage_base + off) as u64
            }
        })
        .collect();
    // SAFETY: the parts are live host buffers of `n` bytes (checked by `stage`, borrowed
    // for this call), the destinations disjoint ranges of the new staging buffer.
    unsafe { host_pieces(&pieces)? };
    prof.stage_us = us(t);
    let t = std::time::Instant::now();
    let slots: Vec<Option<usize>> = sides
        .iter()
        .enumerate()
        .map(|(i, side)| match side {
            HostSide::Staged(off) if shares(i) => Some(*off),
            _ => None,
        })
        .collect();
    let block = match &stage {
        Some(st) if slots.iter().any(Option::is_some) => {
            // SAFETY: written in full by the copy of the staging buffer below before any read.
            let mut b = unsafe {
                DeviceBuffer::uninit(device, st.len(), default_resource(device)?, stream)?
            };
            b.set_free_stream(StreamRef::legacy());
            Some(Arc::new(b))
        }
        _ => None,
    };
    let mut rest_srcs = Vec::with_capacity(parts.len());
    let mut rest_dsts = Vec::with_capacity(parts.len());
    let mut rest_sizes = Vec::with_capacity(parts.len());
    let mut buffers = Vec::with_capacity(parts.len());
    for (i, ((slot, src), (_, n))) in slots.iter().zip(&srcs).zip(parts).enumerate() {
        let b = match (slot, &block) {
            (Some(off), Some(block)) => Arc::new(DeviceBuffer::slice_of(block, *off, *n)?),
            _ => {
                let b = own(i)?;
                b.range(0, *n)?;
                rest_dsts.push(b.device_ptr());
                rest_srcs.push(*src);
                rest_sizes.push(*n);
                b
            }
        };
        buffers.push(b);
    }
    prof.prepare_us = us(t);
    let t = std::time::Instant::now();
    if let (Some(block), Some(st)) = (&block, &stage) {
        // SAFETY: the staging buffer is pinned, packed above and alive until the wait
        // below; the block is new and as long; the stream is live and of the bound device.
        let op = unsafe { direct::copy_htod_raw(block, 0, st.as_ptr(), st.len(), stream) }?;
        drop(op); // waited for below, with the batch
    }
    if !rest_dsts.is_empty() {
        // SAFETY: sources are pinned (the parts' own or the staging buffer, both alive
        // until the wait below); destinations are buffers of at least `n` bytes each
        // (checked above); the stream is live and of the bound device.
        unsafe {
            driver::memcpy_batch_async(
                &mut rest_dsts,
                &mut rest_srcs,
                &mut rest_sizes,
                driver::BatchWay::ToDevice,
                device.id() as i32,
                stream.cu(),
            )?
        };
    }
    prof.enqueue_us = us(t);
    let t = std::time::Instant::now();
    let done = Event::new(device)?;
    done.record(stream)?;
    done.synchronize()?;
    prof.wait_us = us(t);
    *PROFILE.lock().unwrap_or_else(|e| e.into_inner()) = prof;
    drop(stage);
    Ok(buffers)
}

/// Downloads `srcs[i]` (device buffers on `device`, bound by the caller) into the first
/// `n` bytes of part `i`, after the work queued on `stream`, and waits.
///
/// # Safety
/// 1. Nothing else reads or writes the parts' host buffers until this returns.
pub(crate) unsafe fn download_many(
    parts: &[HostPart<'_>],
    srcs: &[Arc<DeviceBuffer>],
    device: &Arc<Device>,
    stream: StreamRef,
) -> Result<()> {
    stream.refuse_under_capture(device, BATCH_UNDER_CAPTURE)?;
    for ((_, n), s) in parts.iter().zip(srcs) {
        s.range(0, *n)?;
    }
    let (sides, stage) = stage(parts, device)?;
    let stage_base = stage.as_ref().map_or(0, |s| s.as_ptr() as usize);
    let mut dsts: Vec<u64> = sides
        .iter()
        .map(|side| match side {
            HostSide::Direct(p) => *p,
            HostSide::Staged(off) => (stage_base + off) as u64,
        })
        .collect();
    let mut src_ptrs: Vec<u64> = srcs.iter().map(|s| s.device_ptr()).collect();
    let mut sizes: Vec<usize> = parts.iter().map(|(_, n)| *n).collect();
    // SAFETY: destinations are pinned host memory (the parts' own, untouched until the
    // wait below (item 1), or the staging buffer); sources are live device buffers of at
    // least `n` bytes (checked above), kept by `srcs`; live stream of the bound device.
    unsafe {
        driver::memcpy_batch_async(
            &mut dsts,
            &mut src_ptrs,
            &mut sizes,
            driver::BatchWay::ToHost,
            device.id() as i32,
            stream.cu(),
        )?
    };
    let done = Event::new(device)?;
    done.record(stream)?;
    done.synchronize()?;
    let pieces: Vec<(usize, usize, usize)> = parts
        .iter()
        .zip(&sides)
        .filter_map(|((h, n), side)| match side {
            HostSide::Staged(off) => Some((stage_base + off, h.as_mut_ptr() as usize, *n)),
            HostSide::Direct(_) => None,
        })
        .collect();
    // SAFETY: the copies into the staging buffer are complete (waited above); each part's
    // host buffer holds at least `n` bytes (checked by `stage`) and nothing else accesses
    // it (item 1).
    unsafe { host_pieces(&pieces) }
}
