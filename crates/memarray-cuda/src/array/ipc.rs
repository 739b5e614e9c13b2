//! Arrays across processes: [`RawArray::ipc_handle`] and [`RawArray::from_ipc_handle`].

use memarray_core::{CoreError, DType, Location, LockToken, shape};

use super::device_side::DeviceSide;
use super::raw::RawArray;
use crate::error::{CudaError, IpcError, Result};
use crate::ipc::{IpcHandle, open_with_event};

impl RawArray {
    /// A handle another process opens with [`RawArray::from_ipc_handle`] to share this
    /// array's device memory. The data must be on a device. The handle carries an
    /// interprocess event recorded after the array's pending work (the host does not
    /// wait): the importer's work is ordered after it. Keep the array alive, on the
    /// device and unwritten while importers use the memory. The allocation's handle and
    /// the event are made on the first call and reused. A spilled array is restored first
    /// (the handle then pins it on the device: its buffer is shared).
    pub fn ipc_handle(&mut self, token: Option<LockToken>) -> Result<IpcHandle> {
        self.check(token)?;
        self.restore(None, false, token)?;
        let Location::Device(_) = self.location else {
            return Err(CudaError::from(IpcError::Export {
                reason: format!(
                    "the data is on {}; move it to a device before sharing it",
                    self.location
                ),
            }));
        };
        let buffer = self.dev.device_buffer()?;
        buffer.ipc_handle_with(|event| self.dev.record_shared(event))
    }

    /// An array of `dtype` and `shape` over the device memory `h` names (made by another
    /// process), shared without a copy, its work ordered after the exporter's event.
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
        let (buffer, event) = open_with_event(h)?;
        let device_id = buffer.device().id();
        let dev = DeviceSide::adopt_after(buffer, event);
        Ok(Self::on_device_only(dtype, shape, nbytes, device_id, dev))
    }
}
