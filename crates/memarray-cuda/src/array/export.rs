//! Exports of a [`RawArray`]'s current data: the buffer and its owner, and how the
//! consumer is ordered after pending work.

use std::sync::Arc;

use memarray_core::foreign::ExportBuffer;
use memarray_core::{HostBuffer, Location, LockToken};

use super::device_side::Consumer;
use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::error::Result;
use crate::stream::StreamRef;

impl RawArray {
    /// The buffer to hand to a zero-copy export of the current data, or with `copy` a
    /// fresh copy of it. The returned owner keeps the memory alive; `consumer` is the
    /// stream the consumer will use (device data: it waits on pending work; host data:
    /// the host waits). A spilled array is restored first, on the consumer's stream.
    pub fn export_buffer(
        &mut self,
        token: Option<LockToken>,
        copy: bool,
        consumer: Consumer,
    ) -> Result<ExportBuffer> {
        self.check(token)?;
        if self.spilled {
            let stream = match consumer {
                Consumer::Stream(s) => Some(s),
                _ => None,
            };
            self.restore(stream, false, token)?;
        }
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                let buf = if copy {
                    Arc::new(self.host_buf()?.try_clone()?)
                } else {
                    self.host_buf()?.clone()
                };
                Ok(ExportBuffer {
                    ptr: buf.as_mut_ptr().cast(),
                    location: Location::Host,
                    dtype: self.dtype,
                    shape: self.shape.clone(),
                    is_copied: copy,
                    owner: Box::new(buf),
                })
            }
            Location::Device(id) => {
                let (ptr, owner) = self.dev.export(self.nbytes, copy, consumer)?;
                Ok(ExportBuffer {
                    ptr: ptr as *mut std::ffi::c_void,
                    location: Location::Device(id),
                    dtype: self.dtype,
                    shape: self.shape.clone(),
                    is_copied: copy,
                    owner,
                })
            }
        }
    }

    /// A shared handle to the host buffer for a zero-copy export. The export keeps the
    /// buffer alive even if the array is dropped.
    pub fn host_export(&self, token: Option<LockToken>) -> Result<Arc<HostBuffer>> {
        self.host_ready(token)?;
        Ok(self.host_buf()?.clone())
    }

    /// Address of the device copy (for the CUDA Array Interface and kernels). It is a
    /// device address: never dereference it on the host. Fails without a device copy, and
    /// for a spilled array ([`Self::restore`] it first).
    pub fn device_ptr(&self, token: Option<LockToken>) -> Result<u64> {
        self.check(token)?;
        self.not_spilled()?;
        self.dev.device_addr()
    }

    /// The device buffer holding the current data, shared: an export that hands out its
    /// address without an owner of its own (the CUDA Array Interface) keeps this to pin
    /// the memory.
    /// Fails for a spilled array ([`Self::restore`] it first).
    pub fn device_buffer(&self, token: Option<LockToken>) -> Result<Arc<DeviceBuffer>> {
        self.check(token)?;
        self.not_spilled()?;
        self.dev.device_buffer()
    }

    /// The stream that pending device work runs on, if any (the CUDA Array Interface's
    /// `stream`). Work pending on a foreign stream is waited for instead: `None`.
    pub fn pending_stream(&self) -> Result<Option<StreamRef>> {
        self.dev.pending_stream()
    }
}
