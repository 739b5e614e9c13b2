//! Many device arrays as one allocation and back, so one transfer (CUDA IPC, NCCL, a peer
//! copy) carries them all: [`RawArray::pack`] copies arrays of one device into one new
//! byte array, each at an aligned offset, in one call ([`copy::many`](crate::copy::many): an SM copy kernel
//! for the small ones); [`RawArray::unpack`]
//! makes arrays that are slices of a packed array's device memory, with no copy.

use memarray_core::{DType, Location, LockToken, shape};

use super::device_side::DeviceSide;
use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::copy;
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::event::Event;
use crate::stream::Stream;

/// Each part of a pack starts at a multiple of this many bytes (what `cudaMalloc` aligns
/// to), so every unpacked array is as aligned as a fresh one.
pub const PACK_ALIGN: usize = 256;

/// The offset of each of `sizes` in a pack, and the pack's length in bytes.
pub fn pack_layout(sizes: &[usize]) -> (Vec<usize>, usize) {
    let mut total = 0usize;
    let offsets = sizes
        .iter()
        .map(|&n| {
            let at = total;
            total = (total + n).next_multiple_of(PACK_ALIGN);
            at
        })
        .collect();
    (offsets, total)
}

/// One array of a pack: its dtype, shape and byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// The array's element type.
    pub dtype: DType,
    /// The array's shape.
    pub shape: Vec<usize>,
    /// Where its bytes start in the pack.
    pub offset: usize,
}

impl RawArray {
    /// A new 1-d `u8` array on device `device` holding every part's bytes at the offsets
    /// [`pack_layout`] gives (returned with it as [`Packed`] entries), filled by
    /// [`copy::many`](crate::copy::many)'s one call after each part's pending work. Every part's data must be on
    /// `device`. Returns once the copies are done: the parts may be written or freed at
    /// once, and the pack has no pending work.
    pub fn pack(parts: &[&RawArray], device: u32) -> Result<(RawArray, Vec<Packed>)> {
        for (i, p) in parts.iter().enumerate() {
            p.check(None)?;
            if p.location != Location::Device(device) || p.spilled {
                return Err(CudaError::InvalidArgument {
                    what: "pack",
                    detail: format!(
                        "part {i} is on {}{}; every part must be on cuda:{device}",
                        p.location,
                        if p.spilled { " (spilled)" } else { "" }
                    ),
                });
            }
        }
        let sizes: Vec<usize> = parts.iter().map(|p| p.nbytes).collect();
        let (offsets, total) = pack_layout(&sizes);
        let dev = Device::get(device)?;
        let _ctx = dev.bind()?;
        let stream = Stream::new(&dev)?;
        let s = stream.as_ref();
        let out = RawArray::empty_on(DType::U8, &[total], Location::Device(device), None, Some(s))?;
        let block = out.dev.current()?;
        let mut dsts = Vec::with_capacity(parts.len());
        let mut srcs = Vec::with_capacity(parts.len());
        let mut lens = Vec::with_capacity(parts.len());
        let mut keep: Vec<std::sync::Arc<DeviceBuffer>> = Vec::with_capacity(parts.len());
        for ((p, &off), &n) in parts.iter().zip(&offsets).zip(&sizes) {
            if n == 0 {
                continue;
            }
            p.dev.order(s, device)?;
            let src = p.dev.current()?;
            dsts.push(block.device_ptr() + off as u64);
            srcs.push(src.device_ptr());
            lens.push(n);
            keep.push(src);
        }
        // SAFETY: sources are the parts' live device buffers on `device` (kept by `keep`
        // until the wait below), ordered after their pending work; destinations are
        // disjoint ranges of the new block (`pack_layout` places each inside `total`);
        // the stream is a live non-default stream of the bound device.
        unsafe { copy::many::copy_many(&dev, s, &dsts, &srcs, &lens)? };
        let done = Event::new(&dev)?;
        done.record(s)?;
        done.synchronize()?;
        drop(keep);
        // The copies are complete: the pack's data needs no ordering.
        out.dev.wait_host()?;
        let packed = parts
            .iter()
            .zip(offsets)
            .map(|(p, offset)| Packed {
                dtype: p.dtype,
                shape: p.shape.clone(),
                offset,
            })
            .collect();
        Ok((out, packed))
    }

    /// Arrays that are slices of this array's device memory, one per entry (dtype, shape,
    /// byte offset; as [`RawArray::pack`] returns them), with no copy. Waits for this
    /// array's pending work first. The slices share its memory, which is freed when it and
    /// every slice are gone: write neither while the other is used (a pack is usually
    /// dropped at once).
    pub fn unpack(&self, entries: &[Packed], token: Option<LockToken>) -> Result<Vec<RawArray>> {
        self.check(token)?;
        let Location::Device(device) = self.location else {
            return Err(CudaError::InvalidArgument {
                what: "unpack",
                detail: format!("the pack is on {}; it must be on a device", self.location),
            });
        };
        if self.spilled {
            return Err(CudaError::InvalidArgument {
                what: "unpack",
                detail: "the pack is spilled; move it back to its device first".into(),
            });
        }
        self.dev.wait_host()?;
        let block = self.dev.current()?;
        entries
            .iter()
            .map(|e| {
                let nbytes = shape::validate(&e.shape, e.dtype.size())?;
                if e.offset % e.dtype.size() != 0 {
                    return Err(CudaError::InvalidArgument {
                        what: "unpack",
                        detail: format!(
                            "offset {} is not a multiple of {}'s size {}",
                            e.offset,
                            e.dtype,
                            e.dtype.size()
                        ),
                    });
                }
                if nbytes == 0 {
                    // Nothing to share: an empty array as any other is made.
                    return RawArray::empty_on(
                        e.dtype,
                        &e.shape,
                        Location::Device(device),
                        None,
                        None,
                    );
                }
                // `slice_of` refuses a range outside the pack.
                let side = DeviceSide::holding(std::sync::Arc::new(DeviceBuffer::slice_of(
                    &block, e.offset, nbytes,
                )?));
                Ok(RawArray::on_device_only(
                    e.dtype, &e.shape, nbytes, device, side,
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_part_and_covers_them() {
        let (offsets, total) = pack_layout(&[4096, 1, 0, 300, 256]);
        assert_eq!(offsets, vec![0, 4096, 4352, 4352, 4864]);
        assert_eq!(total, 5120);
        for (off, n) in offsets.iter().zip([4096, 1, 0, 300, 256]) {
            assert_eq!(off % PACK_ALIGN, 0);
            assert!(off + n <= total);
        }
        assert_eq!(pack_layout(&[]), (vec![], 0));
    }

    #[test]
    fn host_arrays_are_refused_by_pack_and_unpack() {
        let a = RawArray::from_bytes(DType::U8, &[3], &[1, 2, 3], 0).unwrap();
        let e = RawArray::pack(&[&a], 0).unwrap_err();
        assert!(e.to_string().contains("part 0 is on host"), "{e}");
        let e = a
            .unpack(
                &[Packed {
                    dtype: DType::U8,
                    shape: vec![3],
                    offset: 0,
                }],
                None,
            )
            .unwrap_err();
        assert!(e.to_string().contains("must be on a device"), "{e}");
    }
}
