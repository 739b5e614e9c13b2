//! Arrays across processes: [`RawArray::ipc_handle`] and [`RawArray::from_ipc_handle`].

use memarray_core::{CoreError, DType, Location, LockToken, shape};

use super::raw::RawArray;
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::ipc::{IpcHandle, open};

impl RawArray {
    /// A handle another process opens with [`RawArray::from_ipc_handle`] to share this
    /// array's device memory. The data must be on a device; queued work on it is waited
    /// for first, so the importer reads finished data. Keep the array alive (and do not
    /// move it off the device) while importers use the memory.
    pub fn ipc_handle(&self, token: Option<LockToken>) -> Result<IpcHandle> {
        self.check(token)?;
        let Location::Device(_) = self.location else {
            return Err(CudaError::Ipc {
                reason: format!(
                    "the data is on {}; move it to a device before sharing it",
                    self.location
                ),
            });
        };
        self.dev.wait_host()?;
        self.dev.device_buffer()?.ipc_handle()
    }

    /// An array of `dtype` and `shape` over the device memory `h` names (made by another
    /// process), shared without a copy.
    pub fn from_ipc_handle(h: &IpcHandle, dtype: DType, shape: &[usize]) -> Result<Self> {
        let nbytes = shape::validate(shape, dtype.size())?;
        if nbytes as u64 != h.nbytes {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: nbytes,
                capacity: h.nbytes as usize,
            }
            .into());
        }
        let buffer = open(h)?;
        let device = Device::get(h.device_id)?;
        let addr = buffer.device_ptr();
        // SAFETY: `buffer` maps exactly nbytes bytes of the exporter's allocation (checked
        // by `open`) and keeps the mapping alive; owning it keeps it alive for the array.
        // The exporter finished its writes before making the handle.
        unsafe {
            RawArray::from_device_memory(
                &device,
                dtype,
                shape,
                addr,
                nbytes,
                Box::new(buffer),
                true,
                None,
            )
        }
    }
}
