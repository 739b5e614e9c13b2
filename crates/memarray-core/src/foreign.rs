//! [`ForeignTensor`]: another library's tensor as memarray takes it in, whichever road it
//! came by (a DLPack managed tensor, the CUDA Array Interface, a NumPy array's fields).
//! Each road fills one; memarray-cuda's `RawArray::import` is the one place that turns it
//! into an array (span check, share or copy, strided gather). [`ExportBuffer`] is the
//! other direction: memarray's data as every exporter hands it on.

use std::any::Any;
use std::fmt;

use crate::error::CoreError;
use crate::{DType, Location, layout, shape};

/// Where a foreign tensor's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// Ordinary host memory (DLPack `kDLCPU`).
    Host,
    /// Page-locked host memory (`kDLCUDAHost`).
    Pinned,
    /// CUDA managed memory, read and written from the host (`kDLCUDAManaged`).
    Managed,
    /// Memory of one CUDA device (`kDLCUDA`, or a CUDA Array Interface pointer).
    Device(u32),
}

/// A producer's strided tensor, its layout checked ([`layout::check_shape`] and
/// [`layout::check`]), and the owner that keeps its memory alive until this drops (a
/// DLPack tensor whose deleter then runs, or a reference to the Python producer).
///
/// The memory is described, never read here: `data` is a host or device address as
/// [`place`](Self::place) says.
///
/// # Example
///
/// ```
/// use memarray_core::foreign::{ForeignTensor, Place};
/// use memarray_core::DType;
///
/// // Every other column of a 2x4 f32 matrix the producer owns.
/// let data = vec![0f32, 1., 2., 3., 4., 5., 6., 7.];
/// let addr = data.as_ptr() as u64;
/// // SAFETY: `data` holds the layout's span and outlives `t` (the owner keeps it).
/// let t = unsafe {
///     ForeignTensor::new(Place::Host, addr, 0, DType::F32, vec![2, 2], vec![4, 2], false, Box::new(data))
/// }?;
/// assert!(!t.is_c_contiguous());
/// assert_eq!((t.nbytes(), t.span_bytes()), (16, 28));
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
pub struct ForeignTensor {
    place: Place,
    data: u64,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<i64>,
    read_only: bool,
    owner: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for ForeignTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignTensor")
            .field("place", &self.place)
            .field("data", &format_args!("{:#x}", self.data))
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl ForeignTensor {
    /// Describes `shape` elements of `dtype` at `data + byte_offset`, `strides` apart (in
    /// elements), checking the layout: the element count and byte size fit, strides are
    /// non-negative and never let two indices meet, the first element is aligned and not
    /// null (unless the tensor is empty), and the span stays inside the address space.
    ///
    /// # Errors
    /// `CoreError::TooManyDims`, `CoreError::ShapeOverflow`, or `CoreError::Layout` with
    /// the rule broken. `owner` is dropped before the error returns.
    ///
    /// # Safety
    /// 1. `data + byte_offset` holds the layout's [`span_bytes`](Self::span_bytes) at
    ///    `place`, readable (and writable unless `read_only`) while `owner` lives.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        place: Place,
        data: u64,
        byte_offset: u64,
        dtype: DType,
        shape: Vec<usize>,
        strides: Vec<i64>,
        read_only: bool,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<Self, CoreError> {
        layout::check_shape(&shape, dtype)?;
        layout::check(&shape, &strides, dtype, data, byte_offset)?;
        Ok(ForeignTensor {
            place,
            // `check` refused a sum that overflows, unless the tensor is empty.
            data: data.wrapping_add(byte_offset),
            dtype,
            shape,
            strides,
            read_only,
            owner,
        })
    }

    /// Where the memory lives.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Address of the first element (host or device, as [`place`](Self::place) says);
    /// 0 only for an empty tensor.
    pub fn data(&self) -> u64 {
        self.data
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extents.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements, one per dimension.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Whether the producer forbids writes.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the elements are dense in C order (extent-1 strides and empty tensors aside).
    pub fn is_c_contiguous(&self) -> bool {
        shape::is_c_contiguous(&self.shape, &self.strides)
    }

    /// Whether some extent is 0.
    pub fn is_empty(&self) -> bool {
        self.shape.contains(&0)
    }

    /// Bytes of the elements (checked to fit at [`new`](Self::new)).
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    /// Bytes from the first element to the end of the last one: [`nbytes`](Self::nbytes)
    /// for a contiguous tensor, more for a strided view, 0 for an empty one.
    pub fn span_bytes(&self) -> usize {
        layout::span_bytes(&self.shape, &self.strides, self.dtype.size())
    }

    /// Whether the tensor can become an array as it is: C-contiguous, writable and with
    /// elements. The reason it cannot otherwise, in words.
    pub fn shareable(&self) -> Result<(), &'static str> {
        if self.is_empty() {
            Err("it is empty")
        } else if self.read_only {
            Err("it is read-only")
        } else if !self.is_c_contiguous() {
            Err("it is not C-contiguous")
        } else {
            Ok(())
        }
    }

    /// Copies the elements, in C order, into `out` (exactly [`nbytes`](Self::nbytes)).
    ///
    /// # Panics
    /// If `out` is not `nbytes()` long.
    ///
    /// # Safety
    /// 1. The memory is readable from the host (any [`Place`] but `Device`, or device
    ///    memory the caller has mapped), as [`new`](Self::new)'s contract promised.
    pub unsafe fn gather_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.nbytes(), "gather_into needs nbytes() bytes");
        if self.is_empty() {
            return;
        }
        // SAFETY: the layout passed `layout::check` and its span is readable (item 1).
        unsafe {
            layout::gather(
                self.data as *const u8,
                &self.shape,
                &self.strides,
                self.dtype.size(),
                out,
            )
        }
    }

    /// The owner, for a caller that keeps the memory alive some other way from here on
    /// (an array sharing it).
    pub fn into_owner(self) -> Box<dyn Any + Send + Sync> {
        self.owner
    }
}

/// memarray's data handed to an exporter (DLPack in Python or C, the exchange API's
/// allocator): C-contiguous and writable, at `ptr` where `location` says, kept alive by
/// `owner` until it drops. memarray-cuda's `RawArray::export_buffer` makes one;
/// memarray-dlpack's `ExportSpec::from_buffer` turns it into a managed tensor's fields.
#[derive(Debug)]
pub struct ExportBuffer {
    /// First byte of the data (a device address when `location` is a device).
    pub ptr: *mut std::ffi::c_void,
    /// Where `ptr` points.
    pub location: Location,
    /// The element type.
    pub dtype: DType,
    /// Extents (C order, dense).
    pub shape: Vec<usize>,
    /// The data is a fresh copy made for this export.
    pub is_copied: bool,
    /// Keeps the memory alive; drop it when the export ends. Never touches Python.
    pub owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: `ptr` is only an address handed to the exporter; ExportBuffer never
// dereferences it, and `owner` (which keeps the memory alive) is Send + Sync itself.
unsafe impl Send for ExportBuffer {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LayoutError;
    use std::sync::Arc;

    #[test]
    fn the_owner_lives_as_long_as_the_tensor_and_drops_on_refusal() {
        let data = Arc::new(vec![1u32, 2, 3, 4, 5, 6]);
        let addr = data.as_ptr() as u64;
        // SAFETY: `data` holds 6 elements and outlives the tensor through its owner.
        let t = unsafe {
            ForeignTensor::new(
                Place::Host,
                addr,
                4,
                DType::U32,
                vec![5],
                vec![1],
                false,
                Box::new(data.clone()),
            )
        }
        .unwrap();
        assert_eq!(Arc::strong_count(&data), 2);
        assert_eq!(t.data(), addr + 4);
        let mut out = vec![0u8; 20];
        // SAFETY: host memory of the checked layout.
        unsafe { t.gather_into(&mut out) };
        assert_eq!(&out[..4], &2u32.to_ne_bytes());
        assert_eq!(t.shareable(), Ok(()));
        drop(t);
        assert_eq!(Arc::strong_count(&data), 1);

        // Overlapping strides: refused, and the owner has already gone.
        // SAFETY: as above (the call refuses before anything is read).
        let e = unsafe {
            ForeignTensor::new(
                Place::Device(0),
                addr,
                0,
                DType::U32,
                vec![3, 2],
                vec![1, 1],
                false,
                Box::new(data.clone()),
            )
        }
        .unwrap_err();
        assert!(matches!(
            e,
            CoreError::Layout(LayoutError::OverlappingStrides { .. })
        ));
        assert_eq!(Arc::strong_count(&data), 1);
    }

    #[test]
    fn shareable_names_the_reason() {
        let data = [0u8; 8];
        let t = |shape: Vec<usize>, strides: Vec<i64>, ro: bool| {
            // SAFETY: 8 bytes cover every layout below.
            unsafe {
                ForeignTensor::new(
                    Place::Host,
                    data.as_ptr() as u64,
                    0,
                    DType::U8,
                    shape,
                    strides,
                    ro,
                    Box::new(()),
                )
            }
            .unwrap()
        };
        assert_eq!(t(vec![0], vec![1], false).shareable(), Err("it is empty"));
        assert_eq!(
            t(vec![4], vec![1], true).shareable(),
            Err("it is read-only")
        );
        assert_eq!(
            t(vec![4], vec![2], false).shareable(),
            Err("it is not C-contiguous")
        );
    }
}
