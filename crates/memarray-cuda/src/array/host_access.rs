//! [`RawArray`]'s host side: elements and whole-array bytes read and written on the host
//! (waiting for pending device work first), the host copy made on first need, and the
//! host pointers exports and kernels take.

use std::sync::Arc;

use memarray_core::{CoreError, HostBuffer, Location, LockToken, shape};

use super::host_kind::host_buffer;
use super::raw::RawArray;
use crate::error::{ArrayError, CudaError, Result};

impl RawArray {
    /// Copies the bytes `[offset, offset + out.len())` of the current data into `out`,
    /// wherever the data lives (a device range is read after pending work, staged or
    /// direct as the route decides; done when this returns). Pieces of one array moved
    /// through a reused host buffer (an MPI send in chunks) take no host copy of the whole.
    pub fn read_range(
        &self,
        offset: usize,
        out: &mut [u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        self.check_range(offset, out.len())?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                out.copy_from_slice(&self.host_buf()?.as_slice()[offset..offset + out.len()]);
                Ok(())
            }
            Location::Device(_) => self.dev.read_bytes(offset, out),
        }
    }

    /// Writes `bytes` at `[offset, offset + bytes.len())` of the current data, wherever it
    /// lives (the host copy of a spilled array; a device range after pending work; the copy becomes the array's pending
    /// work, and `bytes` has been read when this returns).
    pub fn write_range(
        &mut self,
        offset: usize,
        bytes: &[u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        self.check_range(offset, bytes.len())?;
        match self.location {
            Location::Host => {
                // The host copy is current, spilled or not: a spilled array is written
                // there, as its element writes are, and restored with the new bytes.
                self.dev.wait_host()?;
                let host = self.host_buf()?;
                // SAFETY: the range is inside the host buffer (checked above), pending work
                // is done (wait_host) and the array is borrowed exclusively.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(host.as_mut_ptr().add(offset), bytes.len())
                };
                dst.copy_from_slice(bytes);
                Ok(())
            }
            Location::Device(_) => self.dev.write_bytes(offset, bytes),
        }
    }

    /// `[offset, offset + len)` inside the array's bytes: [`CoreError::CopyOutOfRange`]
    /// otherwise.
    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.nbytes) {
            return Err(CoreError::CopyOutOfRange {
                offset,
                len,
                capacity: self.nbytes,
            }
            .into());
        }
        Ok(())
    }

    /// Reads the element at `index` into `out` (`dtype().size()` bytes). Device-resident
    /// data is read with a small synchronous copy after pending work.
    pub fn read_element(
        &self,
        index: &[u64],
        out: &mut [u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        let off = self.element_offset(index, out.len())?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                out.copy_from_slice(&self.host_buf()?.as_slice()[off..off + out.len()]);
                Ok(())
            }
            Location::Device(_) => self.dev.read_bytes(off, out),
        }
    }

    /// Writes `value` (`dtype().size()` bytes) to the element at `index`, wherever the
    /// current data lives.
    pub fn write_element(
        &mut self,
        index: &[u64],
        value: &[u8],
        token: Option<LockToken>,
    ) -> Result<()> {
        self.check(token)?;
        let off = self.element_offset(index, value.len())?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                // SAFETY: off + size <= nbytes (element_offset checked); host exports may
                // alias these bytes, which is the point of a zero-copy view; no Rust
                // reference to them is live across this write.
                unsafe {
                    let dst = self.host_buf()?.as_mut_ptr().add(off);
                    std::ptr::copy_nonoverlapping(value.as_ptr(), dst, value.len());
                }
                Ok(())
            }
            Location::Device(_) => self.dev.write_bytes(off, value),
        }
    }

    fn element_offset(&self, index: &[u64], size: usize) -> Result<usize> {
        if size != self.dtype.size() {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: size,
                capacity: self.dtype.size(),
            }
            .into());
        }
        let linear = shape::offset_of(&self.shape, index)?;
        Ok(linear as usize * size)
    }

    /// The host buffer's first byte, if there is a host buffer.
    pub fn host_addr(&self) -> Option<usize> {
        self.host.as_ref().map(|h| h.as_ptr() as usize)
    }

    /// Whether `[addr, addr + len)` overlaps this array's host buffer (a destination
    /// that aliases the array must not be written through a separate slice).
    pub fn host_overlaps(&self, addr: usize, len: usize) -> bool {
        self.host.as_ref().is_some_and(|h| {
            let start = h.as_ptr() as usize;
            addr < start + h.len() && start < addr + len
        })
    }

    /// Copies the whole current data, wherever it lives, into `out` (exactly `nbytes`).
    pub fn read_all(&self, out: &mut [u8], token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if out.len() != self.nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: out.len(),
                capacity: self.nbytes,
            }
            .into());
        }
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                crate::copy::host_to_host(out, self.host_buf()?.as_slice())?;
                Ok(())
            }
            Location::Device(_) => self.dev.read_bytes(0, out),
        }
    }

    /// Takes the host copy out of an array whose current data is on a device after a
    /// synchronous move (nothing pending reads it), so the array stops holding that memory:
    /// `move_many` lets go of the NumPy arrays it imported. `None` when the data is on the
    /// host or spilled. A later move to the host makes a new host buffer.
    pub fn take_host_copy(&mut self) -> Option<Arc<HostBuffer>> {
        if self.spilled || self.location == Location::Host {
            return None;
        }
        self.host.take()
    }

    /// The host bytes, after pending work. Fails unless the current data is on the host.
    pub fn host_bytes(&self, token: Option<LockToken>) -> Result<&[u8]> {
        self.host_ready(token)?;
        Ok(self.host_buf()?.as_slice())
    }

    /// The host bytes, writable, after pending work. Fails unless the data is on the host.
    pub fn host_bytes_mut(&mut self, token: Option<LockToken>) -> Result<&mut [u8]> {
        self.host_ready(token)?;
        // SAFETY: &mut self excludes every other Rust access to the buffer; zero-copy
        // exports (NumPy views, DLPack) may alias it, as they are meant to.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.host_buf()?.as_mut_ptr(), self.nbytes) })
    }

    pub(super) fn host_ready(&self, token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if self.location() != Location::Host {
            return Err(ArrayError::NotOnHost {
                location: self.location(),
            }
            .into());
        }
        self.dev.wait_host()
    }

    /// Overwrites the whole array with `bytes` (C order, exactly `nbytes`) where the data
    /// lives: on the host a memcpy, on a device a staged copy (pageable `bytes` at the
    /// pinned rate; the copy wing's staged pipeline) after pending work. Returns once `bytes` has
    /// been read. A wrong length changes nothing.
    pub fn write_all(&mut self, bytes: &[u8], token: Option<LockToken>) -> Result<()> {
        self.check(token)?;
        if bytes.len() != self.nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: bytes.len(),
                capacity: self.nbytes,
            }
            .into());
        }
        if let Location::Device(_) = self.location {
            return self.dev.write_bytes(0, bytes);
        }
        self.dev.wait_host()?;
        self.ensure_host()?;
        self.location = Location::Host;
        // The host copy is current (a spilled array's too: it stays spilled, its new
        // bytes go back with it).
        let host = self.host_buf()?;
        // SAFETY: &mut self excludes every other Rust access to the buffer, which holds
        // nbytes bytes; zero-copy exports may alias it, as they are meant to.
        let dst = unsafe { std::slice::from_raw_parts_mut(host.as_mut_ptr(), self.nbytes) };
        crate::copy::host_to_host(dst, bytes)?;
        Ok(())
    }

    /// The host buffer; present whenever the data is on the host.
    pub(super) fn host_buf(&self) -> Result<&Arc<HostBuffer>> {
        self.host
            .as_ref()
            .ok_or(CudaError::Array(ArrayError::NoHostCopy))
    }

    /// Allocates the host copy of an array born on a device, on first need.
    pub(super) fn ensure_host(&mut self) -> Result<()> {
        if self.host.is_none() {
            let (host, kind) =
                host_buffer(self.host_kind, self.device_id, self.nbytes, true, true)?;
            self.host = Some(Arc::new(host));
            self.host_kind = kind;
        }
        Ok(())
    }

    /// Raw host address, after the lock check and pending work; an error off the host.
    pub(crate) fn host_ptr(&self, token: Option<LockToken>) -> Result<*mut u8> {
        self.host_ready(token)?;
        Ok(self.host_buf()?.as_mut_ptr())
    }

    /// The host address without any check: the sharp knife.
    pub(crate) fn host_ptr_unchecked(&self) -> *mut u8 {
        self.host
            .as_ref()
            .map_or(std::ptr::null_mut(), |h| h.as_mut_ptr())
    }
}
