//! Many arrays moved in one call: one staging pass, one batch of copies, one wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memarray_core::{HostBuffer, Location};

use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::copy::direct;
use crate::copy::route;
use crate::device::Device;
use crate::driver;
use crate::error::Result;
use crate::event::Event;
use crate::resource::default_resource;
use crate::stream::{Stream, StreamRef};

/// Staged pieces are placed at this alignment in the shared pinned buffer.
const PIECE_ALIGN: usize = 256;

/// Where the last [`RawArray::move_many`] batch spent its time, for benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchProfile {
    /// Arrays in the batch.
    pub arrays: usize,
    /// Microseconds packing (or, down, unpacking) pageable data through pinned memory.
    pub stage_us: f64,
    /// Microseconds allocating device buffers and ordering after pending work.
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

/// The profile of the last batch moved by [`RawArray::move_many`].
pub fn last_batch_profile() -> BatchProfile {
    let mut p = *PROFILE.lock().unwrap_or_else(|e| e.into_inner());
    p.batched = driver::BATCHED.load(std::sync::atomic::Ordering::Relaxed);
    p.refused = driver::BATCH_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
    p
}

fn us(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// `move_many` packs arrays below this size into one batch (the staged pipeline's
/// direct-copy size when the batch was measured; larger arrays are
/// bandwidth-bound and move on their own).
pub const BATCH_BELOW: usize = 1 << 20;

impl RawArray {
    /// Moves every array to `target` (the host or a device) in one pass: pageable host
    /// data of small arrays is packed into one pinned buffer from the pinned pool; arrays
    /// that need a new device buffer from the default resource get slices of one device
    /// block laid out like that buffer, filled by one copy (the block is freed when the
    /// last of them drops or moves elsewhere); the remaining copies go to the driver as
    /// one batch (`cuMemcpyBatchAsync` where the driver has it), and the call waits once,
    /// at the end. When it returns every array is at
    /// `target` with its data complete. Arrays already there are left alone; arrays of
    /// [`BATCH_BELOW`] bytes or more, and moves between devices, take
    /// [`RawArray::move_memory`]'s path (bandwidth-bound anyway). `stream` orders the
    /// copies after work queued on it (a memarray stream when `None`).
    ///
    /// Every array is checked first (locks): if one is locked nothing moves.
    pub fn move_many(
        arrays: &mut [&mut RawArray],
        target: Location,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        Self::move_many_counted(arrays, target, stream, &AtomicU64::new(0))
    }

    /// [`RawArray::move_many`], adding to `done` the bytes of each array once it is at
    /// `target` (large arrays one by one as each arrives, the packed batch at its end; a
    /// front end's progress bar reads the counter from another thread).
    pub fn move_many_counted(
        arrays: &mut [&mut RawArray],
        target: Location,
        stream: Option<StreamRef>,
        done: &AtomicU64,
    ) -> Result<()> {
        for a in arrays.iter() {
            a.check(None)?;
        }
        let mut batch: Vec<&mut RawArray> = Vec::new();
        for a in arrays.iter_mut() {
            if a.spilled {
                // Back to its device, or (to the host) no copy at all: move_memory knows.
                a.move_memory(target, stream, true, None)?;
                done.fetch_add(a.nbytes as u64, Ordering::Relaxed);
                continue;
            }
            if a.location == target {
                done.fetch_add(a.nbytes as u64, Ordering::Relaxed);
                continue;
            }
            let batchable = a.nbytes > 0
                && a.nbytes < BATCH_BELOW
                && match (a.location, target) {
                    (Location::Host, Location::Device(_)) => true,
                    (Location::Device(d), Location::Host) => match batch.first() {
                        Some(first) => first.location == Location::Device(d),
                        None => true,
                    },
                    _ => false,
                };
            if batchable {
                batch.push(&mut **a);
            } else {
                a.move_memory(target, stream, true, None)?;
                done.fetch_add(a.nbytes as u64, Ordering::Relaxed);
            }
        }
        let Some(first) = batch.first() else {
            return Ok(());
        };
        let device_id = match (first.location, target) {
            (_, Location::Device(id)) | (Location::Device(id), _) => id,
            _ => return Ok(()),
        };
        let device = Device::get(device_id)?;
        let _ctx = device.bind()?;
        let own;
        let stream = match stream {
            Some(s) => s,
            None => {
                own = Stream::new(&device)?;
                own.as_ref()
            }
        };
        let bytes: usize = batch.iter().map(|a| a.nbytes).sum();
        match target {
            Location::Device(_) => upload_batch(&mut batch, &device, stream)?,
            Location::Host => download_batch(&mut batch, &device, stream)?,
        }
        done.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Where each array's bytes sit on the host side: its own pinned buffer, or an offset in
/// the shared staging buffer.
enum HostSide {
    Direct(u64),
    Staged(usize),
}

/// Plans the host side of each array: pinned buffers are used in place, the rest get
/// aligned offsets in one pinned staging buffer, returned with its size.
fn plan(hosts: &[(&Arc<HostBuffer>, usize)]) -> (Vec<HostSide>, usize) {
    let mut total = 0usize;
    let sides = hosts
        .iter()
        .map(|(h, n)| {
            if route::kind_is_direct(h.kind()) {
                HostSide::Direct(h.as_ptr() as u64)
            } else {
                let off = total;
                total = (total + n).next_multiple_of(PIECE_ALIGN);
                HostSide::Staged(off)
            }
        })
        .collect();
    (sides, total)
}

/// Copies every (source, destination, bytes) piece, on up to 8 staging threads when
/// there is enough to share (more than 1 MiB).
fn pack(pieces: &[(usize, usize, usize)]) -> Result<()> {
    let total: usize = pieces.iter().map(|p| p.2).sum();
    let lanes = (total >> 20).clamp(1, 8).min(pieces.len().max(1));
    crate::copy::threads::parallel(lanes, &|lane| {
        for &(src, dst, n) in pieces.iter().skip(lane).step_by(lanes) {
            // SAFETY: each piece is a live source of `n` bytes (an array's host buffer,
            // its array borrowed exclusively by the caller) and its own range of the
            // staging buffer; pieces do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        }
        Ok(())
    })
}

/// Each array's host buffer and size, where its bytes sit on the pinned side, and the
/// staging buffer for the pageable ones (none when every host buffer is pinned).
#[allow(clippy::type_complexity)]
fn host_sides<'a>(
    batch: &'a [&mut RawArray],
    device: &Arc<Device>,
) -> Result<(
    Vec<(&'a Arc<HostBuffer>, usize)>,
    Vec<HostSide>,
    Option<HostBuffer>,
)> {
    let hosts: Vec<(&Arc<HostBuffer>, usize)> = batch
        .iter()
        .map(|a| Ok((a.host_buf()?, a.nbytes)))
        .collect::<Result<_>>()?;
    let (sides, total) = plan(&hosts);
    let stage = staging_buffer(device, total)?;
    Ok((hosts, sides, stage))
}

fn staging_buffer(device: &Arc<Device>, bytes: usize) -> Result<Option<HostBuffer>> {
    if bytes == 0 {
        return Ok(None);
    }
    // SAFETY: every byte the copies read is written by the packing below first.
    Ok(Some(unsafe {
        crate::resource::staging_host_buffer(device, bytes)?
    }))
}

fn upload_batch(
    batch: &mut [&mut RawArray],
    device: &Arc<Device>,
    stream: StreamRef,
) -> Result<()> {
    let mut prof = BatchProfile {
        arrays: batch.len(),
        ..Default::default()
    };
    let t = std::time::Instant::now();
    for a in batch.iter() {
        // Earlier work may still write the host copies (a download in flight).
        a.dev.wait_host()?;
    }
    let (hosts, sides, stage) = host_sides(batch, device)?;
    // (source, staging destination, bytes) of every piece to pack, as addresses.
    let stage_base = stage.as_ref().map_or(0, |s| s.as_ptr() as usize);
    let mut pieces: Vec<(usize, usize, usize)> = Vec::new();
    let srcs: Vec<u64> = hosts
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
    pack(&pieces)?;
    prof.stage_us = us(t);
    let t = std::time::Instant::now();
    // Staged arrays whose device copy is new and from the default resource get slices of
    // one device block laid out as the staging buffer: one copy moves all of them.
    let slots: Vec<Option<usize>> = batch
        .iter()
        .zip(&sides)
        .map(|(a, side)| match side {
            HostSide::Staged(off) if a.dev.takes_default_buffer_on(device.id()) => Some(*off),
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
    let mut srcs_rest = Vec::with_capacity(batch.len());
    let mut dsts = Vec::with_capacity(batch.len());
    let mut sizes = Vec::with_capacity(batch.len());
    let mut buffers: Vec<Arc<DeviceBuffer>> = Vec::with_capacity(batch.len());
    for ((a, slot), src) in batch.iter().zip(&slots).zip(&srcs) {
        a.dev.order(stream, device.id())?;
        let b = match (slot, &block) {
            (Some(off), Some(block)) => Arc::new(DeviceBuffer::slice_of(block, *off, a.nbytes)?),
            _ => {
                // SAFETY: written in full by the batch below before any read.
                let b = unsafe { a.dev.buffer_on(device.id(), a.nbytes, stream)? };
                dsts.push(b.device_ptr());
                srcs_rest.push(*src);
                sizes.push(a.nbytes);
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
    if !dsts.is_empty() {
        // SAFETY: sources are pinned (the arrays' own or the staging buffer, both alive
        // until the wait below); destinations are the arrays' buffers of `nbytes` each;
        // the stream is live and of the bound device.
        unsafe {
            driver::memcpy_batch_async(
                &mut dsts,
                &mut srcs_rest,
                &mut sizes,
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
    for (a, b) in batch.iter_mut().zip(buffers) {
        a.dev.install(b);
        a.location = Location::Device(device.id());
        a.device_id = device.id();
    }
    Ok(())
}

fn download_batch(
    batch: &mut [&mut RawArray],
    device: &Arc<Device>,
    stream: StreamRef,
) -> Result<()> {
    let mut srcs = Vec::with_capacity(batch.len());
    for a in batch.iter_mut() {
        a.ensure_host()?;
        a.dev.order(stream, device.id())?;
        srcs.push(a.dev.current()?.device_ptr());
    }
    let (hosts, sides, stage) = host_sides(batch, device)?;
    let stage_base = stage.as_ref().map_or(0, |s| s.as_ptr() as usize);
    let mut dsts: Vec<u64> = sides
        .iter()
        .map(|side| match side {
            HostSide::Direct(p) => *p,
            HostSide::Staged(off) => (stage_base + off) as u64,
        })
        .collect();
    let mut sizes: Vec<usize> = hosts.iter().map(|(_, n)| *n).collect();
    // SAFETY: destinations are pinned host memory (the arrays' own, untouched by the host
    // until the wait below, or the staging buffer); sources are the arrays' device
    // buffers, ordered after their pending work; live stream of the bound device.
    unsafe {
        driver::memcpy_batch_async(
            &mut dsts,
            &mut srcs,
            &mut sizes,
            driver::BatchWay::ToHost,
            device.id() as i32,
            stream.cu(),
        )?
    };
    let done = Event::new(device)?;
    done.record(stream)?;
    done.synchronize()?;
    // The copies into the staging buffer are complete (waited above); each array's host
    // buffer holds its `n` bytes and nothing else accesses it (borrowed exclusively).
    let stage_base = stage.as_ref().map_or(0, |s| s.as_ptr() as usize);
    let pieces: Vec<(usize, usize, usize)> = hosts
        .iter()
        .zip(&sides)
        .filter_map(|((h, n), side)| match side {
            HostSide::Staged(off) => Some((stage_base + off, h.as_mut_ptr() as usize, *n)),
            HostSide::Direct(_) => None,
        })
        .collect();
    pack(&pieces)?;
    drop(hosts);
    for a in batch.iter_mut() {
        // The data on the host is now current; the device copy is kept, as a move does.
        a.dev.wait_host()?;
        a.location = Location::Host;
    }
    Ok(())
}
