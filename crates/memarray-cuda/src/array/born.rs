//! Arrays born where they are used: `empty_on`, `zeros_on`, `full_on` (`copied_to`, in
//! `moves.rs`, makes a new array at a target through them: an
//! array's data born again elsewhere).
//!
//! An array born on a device has a device buffer only; its host buffer is made on its
//! first move to the host. `zeros_on` a device is a memset and `full_on` a memset or a
//! one-element seed doubled by device copies: never a host-to-device copy of the data.

use std::sync::Arc;

use memarray_core::{CoreError, DType, HostBuffer, Location, shape};

use super::device_side::DeviceSide;
use super::host_kind::{HostKind, host_buffer};
use super::raw::RawArray;
use crate::error::Result;
use crate::stream::StreamRef;

/// What a new array holds ([`RawArray::born_with`]).
#[derive(Clone, Copy, Debug)]
pub enum Fill<'a> {
    /// Unspecified bytes on a device (what the allocator hands out); zeros on the host.
    Unset,
    /// Zeros (a memset on a device).
    Zeros,
    /// Every element this value (`dtype.size()` bytes, native order).
    Value(&'a [u8]),
}

impl RawArray {
    /// An array whose data lives at `location` only, with unspecified contents on a
    /// device (the bytes the allocator hands out) and zeros on the host. The host kind
    /// (for the host copy, made when first needed) defaults to [`HostKind::auto`].
    pub fn empty_on(
        dtype: DType,
        shape: &[usize],
        location: Location,
        host_kind: Option<HostKind>,
        stream: Option<StreamRef>,
    ) -> Result<Self> {
        Self::born_with(dtype, shape, location, Fill::Unset, host_kind, None, stream)
    }

    /// A zero-filled array whose data lives at `location` only (a memset on a device,
    /// ordered on `stream`, not waited for).
    pub fn zeros_on(
        dtype: DType,
        shape: &[usize],
        location: Location,
        host_kind: Option<HostKind>,
        stream: Option<StreamRef>,
    ) -> Result<Self> {
        Self::born_with(dtype, shape, location, Fill::Zeros, host_kind, None, stream)
    }

    /// An array whose every element is `value` (`dtype.size()` bytes, native order),
    /// living at `location` only.
    pub fn full_on(
        dtype: DType,
        shape: &[usize],
        location: Location,
        value: &[u8],
        host_kind: Option<HostKind>,
        stream: Option<StreamRef>,
    ) -> Result<Self> {
        Self::born_with(
            dtype,
            shape,
            location,
            Fill::Value(value),
            host_kind,
            None,
            stream,
        )
    }

    /// The general form of [`empty_on`](Self::empty_on), [`zeros_on`](Self::zeros_on) and
    /// [`full_on`](Self::full_on): the buffer at `location` comes from `resource` when
    /// given (host-accessible for the host, device-usable for a device; it also serves the
    /// array's later device buffers), else from the default.
    #[allow(clippy::too_many_arguments)]
    pub fn born_with(
        dtype: DType,
        shape: &[usize],
        location: Location,
        init: Fill<'_>,
        host_kind: Option<HostKind>,
        resource: Option<Arc<dyn memarray_core::MemoryResource>>,
        stream: Option<StreamRef>,
    ) -> Result<Self> {
        if let Fill::Value(value) = init
            && value.len() != dtype.size()
        {
            return Err(CoreError::CopyOutOfRange {
                offset: 0,
                len: value.len(),
                capacity: dtype.size(),
            }
            .into());
        }
        let nbytes = shape::validate(shape, dtype.size())?;
        let kind = host_kind.unwrap_or(HostKind::auto(nbytes));
        match location {
            Location::Host => {
                let zero = !matches!(init, Fill::Unset);
                let host = match resource {
                    Some(r) => HostBuffer::zeroed_in(nbytes, r)?,
                    None => host_buffer(kind, 0, nbytes, zero, host_kind.is_none())?.0,
                };
                let mut a = Self::from_host_buffer(dtype, shape, host, 0)?;
                if let Fill::Value(v) = init {
                    for chunk in a.host_bytes_mut(None)?.chunks_exact_mut(v.len()) {
                        chunk.copy_from_slice(v);
                    }
                }
                Ok(a)
            }
            Location::Device(id) => {
                let mut dev = DeviceSide::new();
                if let Some(r) = resource {
                    if !r.is_accessible_from(location) {
                        return Err(crate::error::CudaError::Inaccessible {
                            resource: r.name().to_string(),
                            location,
                        });
                    }
                    dev.set_resource(Some(r));
                }
                let zeros = vec![0u8; dtype.size()];
                let fill = match init {
                    Fill::Unset => None,
                    Fill::Zeros => Some(&zeros[..]),
                    Fill::Value(v) => Some(v),
                };
                dev.born(id, nbytes, fill, stream)?;
                let mut a = RawArray::on_device_only(dtype, shape, nbytes, id, dev);
                a.host_kind = kind;
                Ok(a)
            }
        }
    }
}
