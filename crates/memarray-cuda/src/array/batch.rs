//! Many arrays moved in one call: the locks, the ordering and where each array ends up;
//! the bytes move through the copy wing's one batch (`copy::upload_many` /
//! `download_many`: one staging pass, one batch of copies, one wait).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memarray_core::{HostBuffer, Location};

use super::raw::RawArray;
use crate::copy;
use crate::device::Device;
use crate::error::Result;
use crate::stream::{Stream, StreamRef};

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

fn upload_batch(
    batch: &mut [&mut RawArray],
    device: &Arc<Device>,
    stream: StreamRef,
) -> Result<()> {
    for a in batch.iter() {
        // Earlier work may still write the host copies (a download in flight).
        a.dev.wait_host()?;
        a.dev.order(stream, device.id())?;
    }
    let id = device.id();
    let buffers = {
        let parts: Vec<(&HostBuffer, usize)> = batch
            .iter()
            .map(|a| Ok((&**a.host_buf()?, a.nbytes)))
            .collect::<Result<_>>()?;
        let arrays: &[&mut RawArray] = batch;
        copy::upload_many(
            &parts,
            device,
            stream,
            &|i| arrays[i].dev.takes_default_buffer_on(id),
            // SAFETY: written in full by upload_many before it returns, and installed only then.
            &mut |i| unsafe { arrays[i].dev.buffer_on(id, arrays[i].nbytes, stream) },
        )?
    };
    for (a, b) in batch.iter_mut().zip(buffers) {
        a.dev.install(b);
        a.location = Location::Device(id);
        a.device_id = id;
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
        srcs.push(a.dev.current()?);
    }
    {
        let parts: Vec<(&HostBuffer, usize)> = batch
            .iter()
            .map(|a| Ok((&**a.host_buf()?, a.nbytes)))
            .collect::<Result<_>>()?;
        // SAFETY: the arrays are borrowed exclusively: nothing else touches their host
        // buffers until the call returns.
        unsafe { copy::download_many(&parts, &srcs, device, stream)? };
    }
    for a in batch.iter_mut() {
        // The data on the host is now current; the device copy is kept, as a move does.
        a.dev.wait_host()?;
        a.location = Location::Host;
    }
    Ok(())
}
