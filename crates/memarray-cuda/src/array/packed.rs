//! Many arrays as one allocation and back, so one transfer (CUDA IPC, NCCL, a peer copy,
//! a pickle, a file) carries them all: [`RawArray::pack`] copies arrays of one device, or
//! of the host, into one new byte array there, each at the offset the copy wing's
//! `pack_layout` gives (on a device in one call of the many-copies engine: an SM copy
//! kernel for the small ones); [`RawArray::unpack`] makes arrays that are slices of a
//! pack's memory, with no copy.

use std::sync::Arc;

use memarray_core::{DType, HostBuffer, Location, LockToken, shape};

use super::device_side::DeviceSide;
use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::copy;
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::event::Event;
use crate::stream::Stream;

/// Where a shared pack ([`RawArray::share`]) starts, relative to its allocation: a pack's
/// own alignment ([`pack_layout`](crate::copy::pack_layout)'s).
const SHARE_ALIGN: usize = 256;

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
    /// A new 1-d `u8` array at `at` (a device, or the host) holding every part's bytes at
    /// the offsets [`pack_layout`](crate::copy::pack_layout) gives (returned with it as
    /// [`Packed`] entries). Every part's data must be at `at`. On a device the copy wing's
    /// one many-copies call fills it after each part's pending work; on the host the parts'
    /// bytes are copied after theirs. Returns once the copies are done: the parts may be
    /// written or freed at once, and the pack has no pending work.
    pub fn pack(parts: &[&RawArray], at: Location) -> Result<(RawArray, Vec<Packed>)> {
        for (i, p) in parts.iter().enumerate() {
            p.check(None)?;
            if p.location != at || p.spilled {
                return Err(CudaError::InvalidArgument {
                    what: "pack",
                    detail: format!(
                        "part {i} is on {}{}; every part must be on {at}",
                        p.location,
                        if p.spilled { " (spilled)" } else { "" }
                    ),
                });
            }
        }
        let sizes: Vec<usize> = parts.iter().map(|p| p.nbytes).collect();
        let (offsets, total) = copy::pack_layout(&sizes);
        let out = match at {
            Location::Device(device) => Self::pack_device(parts, device, &offsets, total)?,
            Location::Host => Self::pack_host(parts, &offsets, total)?,
        };
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

    fn pack_host(parts: &[&RawArray], offsets: &[usize], total: usize) -> Result<RawArray> {
        let mut out = RawArray::empty_on(DType::U8, &[total], Location::Host, None, None)?;
        let base = out.host_bytes_mut(None)?.as_mut_ptr() as usize;
        let mut pieces = Vec::with_capacity(parts.len());
        for (p, &off) in parts.iter().zip(offsets) {
            if p.nbytes > 0 {
                // A download in flight may still write the part's host copy.
                p.dev.wait_host()?;
                pieces.push((p.host_buf()?.as_ptr() as usize, base + off, p.nbytes));
            }
        }
        // SAFETY: sources are the parts' live host buffers of `nbytes` each (the parts are
        // borrowed for this call, their pending work waited for); destinations are
        // disjoint ranges of the new pack (`pack_layout` places each inside `total`).
        unsafe { copy::host_pieces(&pieces)? };
        Ok(out)
    }

    fn pack_device(
        parts: &[&RawArray],
        device: u32,
        offsets: &[usize],
        total: usize,
    ) -> Result<RawArray> {
        let dev = Device::get(device)?;
        let _ctx = dev.bind()?;
        let stream = Stream::new(&dev)?;
        let s = stream.as_ref();
        let out = RawArray::empty_on(DType::U8, &[total], Location::Device(device), None, Some(s))?;
        let block = out.dev.current()?;
        let mut dsts = Vec::with_capacity(parts.len());
        let mut srcs = Vec::with_capacity(parts.len());
        let mut lens = Vec::with_capacity(parts.len());
        let mut keep: Vec<Arc<DeviceBuffer>> = Vec::with_capacity(parts.len());
        for (p, &off) in parts.iter().zip(offsets) {
            let n = p.nbytes;
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
        unsafe { copy::copy_many(&dev, s, &dsts, &srcs, &lens)? };
        let done = Event::new(&dev)?;
        done.record(s)?;
        done.synchronize()?;
        drop(keep);
        // The copies are complete: the pack's data needs no ordering.
        out.dev.wait_host()?;
        Ok(out)
    }

    /// The pack of `parts` with no copy, where they are slices of one allocation at `at`
    /// (the arrays [`RawArray::unpack`] makes, in any order or any subset): a 1-d `u8`
    /// slice of that allocation spanning them, with each part's [`Packed`] entry in it.
    /// `None` (nothing done) when they are not, when one is empty, or when the span would
    /// be more than twice the pack [`RawArray::pack`] would make (a few arrays of a large
    /// pack: a copy is cheaper to carry). Waits for each part's pending work; the pack
    /// shares their memory: writing one writes the other.
    pub fn share(parts: &[&RawArray], at: Location) -> Result<Option<(RawArray, Vec<Packed>)>> {
        // Each part's offset in the allocation the first part is a slice of; a part that
        // is not a slice of that allocation ends the search.
        let mut first: Option<Block> = None;
        let mut offsets = Vec::with_capacity(parts.len());
        for p in parts {
            p.check(None)?;
            if p.location != at || p.spilled || p.nbytes == 0 {
                return Ok(None);
            }
            let Some((root, off)) = Block::of(p)?.root() else {
                return Ok(None);
            };
            match &first {
                None => first = Some(root),
                Some(f) if f.same(&root) => {}
                Some(_) => return Ok(None),
            }
            offsets.push(off);
        }
        let Some(root) = first else {
            return Ok(None); // no parts
        };
        // The span starts SHARE_ALIGN-aligned in the allocation, so each part keeps its
        // alignment at its offset in the pack.
        let lo = offsets
            .iter()
            .min()
            .map_or(0, |&off| off / SHARE_ALIGN * SHARE_ALIGN);
        let hi = parts
            .iter()
            .zip(&offsets)
            .map(|(p, &off)| off + p.nbytes)
            .max()
            .unwrap_or(lo);
        let sizes: Vec<usize> = parts.iter().map(|p| p.nbytes).collect();
        if hi - lo > 2 * copy::pack_layout(&sizes).1 {
            return Ok(None);
        }
        for p in parts {
            p.dev.wait_host()?;
        }
        let len = hi - lo;
        let pack = root.slice(DType::U8, &[len], lo, len)?;
        let entries = parts
            .iter()
            .zip(&offsets)
            .map(|(p, &off)| Packed {
                dtype: p.dtype,
                shape: p.shape.clone(),
                offset: off - lo,
            })
            .collect();
        Ok(Some((pack, entries)))
    }

    /// Arrays that are slices of this array's memory (a pack on a device or the host), one
    /// per entry (dtype, shape, byte offset; as [`RawArray::pack`] returns them), with no
    /// copy. Waits for this array's pending work first. The slices share its memory, which
    /// is freed when it and every slice are gone: write neither while the other is used (a
    /// pack is usually dropped at once).
    pub fn unpack(&self, entries: &[Packed], token: Option<LockToken>) -> Result<Vec<RawArray>> {
        self.check(token)?;
        if self.spilled {
            return Err(CudaError::InvalidArgument {
                what: "unpack",
                detail: "the pack is spilled; move it back to its device first".into(),
            });
        }
        self.dev.wait_host()?;
        let block = Block::of(self)?;
        // Sized once: a collected Result grows from nothing, moving every array made so
        // far (296 bytes each) at each doubling.
        let mut out = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let nbytes = entry_bytes(i, e, self.nbytes)?;
            out.push(if nbytes == 0 {
                // Nothing to share: an empty array as any other is made.
                RawArray::empty_on(e.dtype, &e.shape, self.location, None, None)?
            } else {
                block.slice(e.dtype, &e.shape, e.offset, nbytes)?
            });
        }
        Ok(out)
    }
}

/// An array's memory where it is: its device buffer (and device) or its host buffer.
enum Block {
    Device(Arc<DeviceBuffer>, u32),
    Host(Arc<HostBuffer>),
}

impl Block {
    /// `raw`'s memory at its location (the caller checked it is not spilled).
    fn of(raw: &RawArray) -> Result<Self> {
        Ok(match raw.location {
            Location::Device(d) => Block::Device(raw.dev.current()?, d),
            Location::Host => Block::Host(raw.host_buf()?.clone()),
        })
    }

    /// For a slice: the allocation it is a slice of, and its offset there.
    fn root(&self) -> Option<(Block, usize)> {
        match self {
            Block::Device(b, d) => b.root().map(|(r, off)| (Block::Device(r.clone(), *d), off)),
            Block::Host(b) => b.root().map(|(r, off)| (Block::Host(r.clone()), off)),
        }
    }

    /// Whether both are the same buffer.
    fn same(&self, other: &Block) -> bool {
        match (self, other) {
            (Block::Device(a, _), Block::Device(b, _)) => Arc::ptr_eq(a, b),
            (Block::Host(a), Block::Host(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// `nbytes` at `offset` of this memory as an array of `dtype` and `shape`, no copy.
    fn slice(
        &self,
        dtype: DType,
        shape: &[usize],
        offset: usize,
        nbytes: usize,
    ) -> Result<RawArray> {
        match self {
            Block::Device(block, device) => {
                let slice = DeviceBuffer::slice_of(block, offset, nbytes)?;
                let side = DeviceSide::holding(Arc::new(slice));
                Ok(RawArray::on_device_only(
                    dtype, shape, nbytes, *device, side,
                ))
            }
            Block::Host(block) => {
                let host = HostBuffer::slice_of(block, offset, nbytes)?;
                RawArray::from_host_buffer(dtype, shape, host, 0)
            }
        }
    }
}

/// The bytes of pack entry `i`'s array, after checking its offset suits its dtype and its
/// bytes lie inside the `pack_len`-byte pack.
fn entry_bytes(i: usize, e: &Packed, pack_len: usize) -> Result<usize> {
    let nbytes = shape::validate(&e.shape, e.dtype.size())?;
    if e.offset
        .checked_add(nbytes)
        .is_none_or(|end| end > pack_len)
    {
        return Err(CudaError::InvalidArgument {
            what: "unpack",
            detail: format!(
                "entry {i} ({} + {nbytes} bytes) lies outside the {pack_len}-byte pack",
                e.offset
            ),
        });
    }
    if !e.offset.is_multiple_of(e.dtype.size()) {
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
    Ok(nbytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_one_pack_share_it_again_without_a_copy() {
        let parts: Vec<RawArray> = (0..6u8)
            .map(|i| RawArray::from_bytes(DType::U8, &[3], &[i, i + 1, i + 2], 0).unwrap())
            .collect();
        let refs: Vec<&RawArray> = parts.iter().collect();
        let (pack, entries) = RawArray::pack(&refs, Location::Host).unwrap();
        let views = pack.unpack(&entries, None).unwrap();
        // Every view, in reverse order: one span, the pack's own memory.
        let rev: Vec<&RawArray> = views.iter().rev().collect();
        let (shared, e2) = RawArray::share(&rev, Location::Host).unwrap().unwrap();
        let base = pack.host_bytes(None).unwrap().as_ptr();
        assert_eq!(shared.host_bytes(None).unwrap().as_ptr(), base);
        let again = shared.unpack(&e2, None).unwrap();
        for (a, v) in again.iter().zip(&rev) {
            assert_eq!(a.host_bytes(None).unwrap(), v.host_bytes(None).unwrap());
            assert_eq!(
                a.host_bytes(None).unwrap().as_ptr(),
                v.host_bytes(None).unwrap().as_ptr(),
                "the same memory, not a copy"
            );
        }
        // Two neighbours: a span of just them (aligned down), still shared.
        let (two, e3) = RawArray::share(&[&views[2], &views[3]], Location::Host)
            .unwrap()
            .unwrap();
        assert!(two.nbytes <= 2 * 256 + 3, "{}", two.nbytes);
        let got = two.unpack(&e3, None).unwrap();
        assert_eq!(got[1].host_bytes(None).unwrap(), &[3, 4, 5]);
        // Far apart (first and last of six): the span is more than twice their bytes.
        assert!(
            RawArray::share(&[&views[0], &views[5]], Location::Host)
                .unwrap()
                .is_none()
        );
        // No parts, not slices, or slices of two packs: nothing shared.
        assert!(RawArray::share(&[], Location::Host).unwrap().is_none());
        assert!(RawArray::share(&refs, Location::Host).unwrap().is_none());
        let (other, oe) = RawArray::pack(&refs, Location::Host).unwrap();
        let others = other.unpack(&oe, None).unwrap();
        assert!(
            RawArray::share(&[&views[0], &others[1]], Location::Host)
                .unwrap()
                .is_none()
        );
        // A slice of a slice is a slice of the same allocation.
        let inner = HostBuffer::slice_of(views[1].host_buf().unwrap(), 1, 2).unwrap();
        assert_eq!(
            inner.root().map(|(_, off)| off),
            Some(entries[1].offset + 1)
        );
    }

    #[test]
    fn host_packs_hold_every_part_at_the_layout_and_unpack_without_a_copy() {
        let a = RawArray::from_bytes(DType::U8, &[3], &[1, 2, 3], 0).unwrap();
        let b = RawArray::from_bytes(DType::U16, &[2], &[4, 0, 5, 0], 0).unwrap();
        let empty = RawArray::from_bytes(DType::F32, &[0], &[], 0).unwrap();
        let (pack, entries) = RawArray::pack(&[&a, &empty, &b], Location::Host).unwrap();
        let (offsets, total) = copy::pack_layout(&[3, 0, 4]);
        assert_eq!(pack.nbytes, total);
        assert_eq!(
            entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
            offsets
        );
        let bytes = pack.host_bytes(None).unwrap();
        assert_eq!(&bytes[offsets[0]..offsets[0] + 3], &[1, 2, 3]);
        assert_eq!(&bytes[offsets[2]..offsets[2] + 4], &[4, 0, 5, 0]);
        let parts = pack.unpack(&entries, None).unwrap();
        assert_eq!(parts[0].host_bytes(None).unwrap(), &[1, 2, 3]);
        assert_eq!(parts[1].shape, vec![0]);
        assert_eq!(
            (parts[2].dtype, parts[2].host_bytes(None).unwrap()),
            (DType::U16, &[4, 0, 5, 0][..])
        );
        // No copy: the slice is the pack's memory.
        assert_eq!(
            parts[2].host_bytes(None).unwrap().as_ptr(),
            bytes[offsets[2]..].as_ptr()
        );
        drop(pack);
        assert_eq!(
            parts[0].host_bytes(None).unwrap(),
            &[1, 2, 3],
            "a slice keeps the pack alive"
        );
    }

    #[test]
    fn parts_elsewhere_and_entries_outside_the_pack_are_refused() {
        let a = RawArray::from_bytes(DType::U8, &[3], &[1, 2, 3], 0).unwrap();
        let e = RawArray::pack(&[&a], Location::Device(0)).unwrap_err();
        assert!(e.to_string().contains("part 0 is on host"), "{e}");
        let (pack, _) = RawArray::pack(&[&a], Location::Host).unwrap();
        let outside = Packed {
            dtype: DType::U8,
            shape: vec![4],
            offset: pack.nbytes - 1,
        };
        let e = pack.unpack(&[outside], None).unwrap_err().to_string();
        assert!(e.contains("entry 0") && e.contains("256-byte pack"), "{e}");
        let misaligned = Packed {
            dtype: DType::U16,
            shape: vec![1],
            offset: 1,
        };
        let e = pack.unpack(&[misaligned], None).unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
    }
}
