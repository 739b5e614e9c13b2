//! Arrays: creation, metadata, moves, locks, host access, reads and writes.

use std::ffi::c_void;
use std::sync::Arc;

use memarray_core::{DType, Location, LockToken};
use memarray_cuda::array::{Fill, SharedArray};
use memarray_cuda::{HostKind, RawArray};

use crate::MEMARRAY_MAX_NDIM;
use crate::error::{Error, Result, check_out, guard, memarray_status, write_out};
use crate::handle::Handle;
use crate::resource::memarray_resource;
use crate::stream::{memarray_stream, stream_arg};

/// An N-d array (opaque). Made by `memarray_array_zeros`, `memarray_array_from_data` or
/// `memarray_array_from_dlpack`; released by [`memarray_array_free`].
pub struct memarray_array {
    pub(crate) inner: Arc<SharedArray>,
}

impl Handle for memarray_array {}

/// Element types (the `dtype` arguments; NumPy's names in the comments).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memarray_dtype {
    /// bool
    Bool = 0,
    /// int8
    I8 = 1,
    /// int16
    I16 = 2,
    /// int32
    I32 = 3,
    /// int64
    I64 = 4,
    /// uint8
    U8 = 5,
    /// uint16
    U16 = 6,
    /// uint32
    U32 = 7,
    /// uint64
    U64 = 8,
    /// float16
    F16 = 9,
    /// bfloat16
    BF16 = 10,
    /// float32
    F32 = 11,
    /// float64
    F64 = 12,
    /// complex64
    C64 = 13,
    /// complex128
    C128 = 14,
}

/// The kind of host memory an array's host copy uses (the `host_kind` arguments).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memarray_host_kind {
    /// Pinned from 1 MiB up when a CUDA device is present, pageable otherwise.
    Auto = 0,
    /// Ordinary pageable memory.
    Pageable = 1,
    /// Page-locked memory (full-speed asynchronous copies).
    Pinned = 2,
    /// CUDA managed memory.
    Managed = 3,
}

/// A data pointer and a C-order shape: what a kernel receives (`memarray::Indexer<N>` in
/// `memarray/indexer.cuh` holds `data` and the first N extents).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct memarray_indexer {
    /// The first element (host or device memory, as the call that filled it says).
    pub data: *mut c_void,
    /// The number of dimensions.
    pub ndim: u64,
    /// The extents; entries past `ndim` are 0.
    pub shape: [u64; MEMARRAY_MAX_NDIM],
}

/// What an array is, read in one call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct memarray_array_info {
    /// A `memarray_dtype` value.
    pub dtype: i32,
    /// Bytes per element.
    pub itemsize: u64,
    /// The number of dimensions.
    pub ndim: u64,
    /// The extents; entries past `ndim` are 0.
    pub shape: [u64; MEMARRAY_MAX_NDIM],
    /// Elements.
    pub size: u64,
    /// Bytes.
    pub nbytes: u64,
    /// Where the current data is: `MEMARRAY_HOST` or a device ordinal.
    pub location: i32,
    /// The device the array moves to by default.
    pub device: i32,
    /// A `memarray_host_kind` value (never `Auto`).
    pub host_kind: i32,
    /// The id of the token holding the array's lock, 0 when unlocked.
    pub lock_holder: u64,
    /// Whether the array is spilled to the host under a device budget.
    pub spilled: bool,
}

const DTYPES: [(memarray_dtype, DType); 15] = [
    (memarray_dtype::Bool, DType::Bool),
    (memarray_dtype::I8, DType::I8),
    (memarray_dtype::I16, DType::I16),
    (memarray_dtype::I32, DType::I32),
    (memarray_dtype::I64, DType::I64),
    (memarray_dtype::U8, DType::U8),
    (memarray_dtype::U16, DType::U16),
    (memarray_dtype::U32, DType::U32),
    (memarray_dtype::U64, DType::U64),
    (memarray_dtype::F16, DType::F16),
    (memarray_dtype::BF16, DType::BF16),
    (memarray_dtype::F32, DType::F32),
    (memarray_dtype::F64, DType::F64),
    (memarray_dtype::C64, DType::Complex64),
    (memarray_dtype::C128, DType::Complex128),
];

pub(crate) fn dtype_of(code: i32) -> Result<DType> {
    DTYPES
        .iter()
        .find(|(c, _)| *c as i32 == code)
        .map(|&(_, d)| d)
        .ok_or_else(|| {
            Error::new(
                memarray_status::WrongDtype,
                format!("dtype {code} is not a memarray_dtype (0 to 14)"),
            )
        })
}

pub(crate) fn dtype_code(d: DType) -> i32 {
    DTYPES
        .iter()
        .find(|&&(_, x)| x == d)
        .map_or(-1, |(c, _)| *c as i32)
}

fn host_kind_of(code: i32) -> Result<Option<HostKind>> {
    Ok(match code {
        0 => None,
        1 => Some(HostKind::Pageable),
        2 => Some(HostKind::Pinned),
        3 => Some(HostKind::Managed),
        _ => {
            return Err(Error::arg(format!(
                "host_kind {code} is not a memarray_host_kind (0 to 3)"
            )));
        }
    })
}

/// `MEMARRAY_HOST` or a device ordinal as a Location.
pub(crate) fn location_of(code: i32) -> Result<Location> {
    match code {
        crate::MEMARRAY_HOST => Ok(Location::Host),
        id if id >= 0 => Ok(Location::Device(id as u32)),
        other => Err(Error::arg(format!(
            "location {other} is neither MEMARRAY_HOST (-1) nor a device ordinal"
        ))),
    }
}

fn location_code(l: Location) -> i32 {
    match l {
        Location::Host => crate::MEMARRAY_HOST,
        Location::Device(id) => id as i32,
    }
}

/// A token argument: 0 is none.
pub(crate) fn token_of(t: u64) -> Option<LockToken> {
    LockToken::from_id(t)
}

/// The shape `shape[0..ndim)` as usizes, checked.
///
/// # Safety
/// A non-null `shape` points to `ndim` readable u64s.
pub(crate) unsafe fn shape_of(ndim: usize, shape: *const u64) -> Result<Vec<usize>> {
    if ndim > MEMARRAY_MAX_NDIM {
        return Err(Error::arg(format!(
            "ndim {ndim} is above MEMARRAY_MAX_NDIM ({MEMARRAY_MAX_NDIM})"
        )));
    }
    if ndim == 0 {
        return Ok(Vec::new());
    }
    if shape.is_null() {
        return Err(Error::arg(format!("shape is NULL with ndim {ndim}")));
    }
    // SAFETY: the caller's contract: `shape` holds `ndim` u64s.
    let s = unsafe { std::slice::from_raw_parts(shape, ndim) };
    s.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| Error::arg(format!("extent {d} does not fit a size")))
        })
        .collect()
}

/// The array behind a handle.
///
/// # Safety
/// A non-null `a` is a live handle from this library.
pub(crate) unsafe fn array_arg<'a>(
    a: *const memarray_array,
    name: &str,
) -> Result<&'a SharedArray> {
    // SAFETY: the caller's contract.
    Ok(unsafe { memarray_array::arg(a, name) }?.inner.as_ref())
}

pub(crate) fn new_handle(raw: RawArray) -> *mut memarray_array {
    memarray_array {
        inner: Arc::new(SharedArray::new(raw)),
    }
    .into_raw()
}

/// Makes a zero-filled array of `dtype` and shape `shape[0..ndim)` whose data lives at
/// `location` (`MEMARRAY_HOST`, or a device ordinal: born there, the memset ordered on
/// `stream`, not waited for). `host_kind` picks the host copy's memory; `resource`
/// (nullable) serves the data at `location` and the array's later device buffers;
/// `stream` (nullable: the legacy default stream). On success `*out` is a new array:
/// release it with [`memarray_array_free`].
///
/// # Safety
/// `shape` holds `ndim` values; handles are live; `out` is writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn memarray_array_zeros(
    dtype: i32,
    ndim: usize,
    shape: *const u64,
    location: i32,
    host_kind: i32,
    resource: *const memarray_resource,
    stream: *const memarray_stream,
    out: *mut *mut memarray_array,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let dtype = dtype_of(dtype)?;
        // SAFETY: the caller's contract.
        let shape = unsafe { shape_of(ndim, shape) }?;
        let location = location_of(location)?;
        let host_kind = host_kind_of(host_kind)?;
        // SAFETY: the caller's contract.
        let resource = unsafe { resource.as_ref() }.map(|r| r.inner.clone());
        // SAFETY: the caller's contract.
        let stream = unsafe { stream_arg(stream) };
        let raw = RawArray::born_with(
            dtype,
            &shape,
            location,
            Fill::Zeros,
            host_kind,
            resource,
            stream,
        )?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", new_handle(raw)) }
    })
}

/// Makes a host array of `dtype` and shape `shape[0..ndim)` holding a copy of `data`
/// (C order; `nbytes` must be exactly the array's size). On success `*out` is a new
/// array: release it with [`memarray_array_free`].
///
/// # Safety
/// `shape` holds `ndim` values; `data` holds `nbytes` readable bytes; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_from_data(
    dtype: i32,
    ndim: usize,
    shape: *const u64,
    data: *const c_void,
    nbytes: usize,
    out: *mut *mut memarray_array,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        let dtype = dtype_of(dtype)?;
        // SAFETY: the caller's contract.
        let shape = unsafe { shape_of(ndim, shape) }?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { bytes_arg(data, nbytes, "data") }?;
        let raw = RawArray::from_bytes(dtype, &shape, bytes, 0)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", new_handle(raw)) }
    })
}

/// `data[0..nbytes)`, or an error naming `name` when it is NULL with bytes to read.
///
/// # Safety
/// A non-null `data` holds `nbytes` readable bytes for the returned lifetime.
pub(crate) unsafe fn bytes_arg<'a>(
    data: *const c_void,
    nbytes: usize,
    name: &str,
) -> Result<&'a [u8]> {
    if nbytes == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Error::arg(format!("{name} is NULL with {nbytes} bytes")));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), nbytes) })
}

/// Releases an array handle (NULL: nothing). The data is freed once nothing else uses it
/// (an open access, a DLPack export, a pending device operation).
///
/// # Safety
/// `a` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_free(a: *mut memarray_array) {
    // SAFETY: the caller's contract (NULL or a live handle, not used afterwards).
    unsafe { memarray_array::free(a) }
}

/// Fills `*out` with the array's dtype, shape, size, location, host kind and lock holder.
///
/// # Safety
/// `a` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_get_info(
    a: *const memarray_array,
    out: *mut memarray_array_info,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        check_out(out, "out")?;
        let raw = a.state();
        let mut shape = [0u64; MEMARRAY_MAX_NDIM];
        for (s, &d) in shape.iter_mut().zip(raw.shape()) {
            *s = d as u64;
        }
        let info = memarray_array_info {
            dtype: dtype_code(raw.dtype()),
            itemsize: raw.dtype().size() as u64,
            ndim: raw.ndim() as u64,
            shape,
            size: raw.len(),
            nbytes: raw.nbytes() as u64,
            location: location_code(raw.location()),
            device: raw.device_id() as i32,
            host_kind: match raw.host_kind() {
                HostKind::Pageable => memarray_host_kind::Pageable as i32,
                HostKind::Pinned => memarray_host_kind::Pinned as i32,
                HostKind::Managed => memarray_host_kind::Managed as i32,
            },
            lock_holder: raw.lock_holder().unwrap_or(0),
            spilled: raw.is_spilled(),
        };
        drop(raw);
        // SAFETY: checked above.
        unsafe { write_out(out, "out", info) }
    })
}

/// Moves the array's data to `location` (`MEMARRAY_HOST` or a device ordinal) on
/// `stream` (nullable: the array's last stream, else the legacy default stream). With
/// `sync` the call returns once the copy is done; without, later operations on the array
/// are ordered after it. `token`: the lock's token when the array is locked, else 0.
///
/// # Safety
/// Handles are live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_move(
    a: *const memarray_array,
    location: i32,
    stream: *const memarray_stream,
    sync: bool,
    token: u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        let location = location_of(location)?;
        // SAFETY: the caller's contract.
        let stream = unsafe { stream_arg(stream) };
        a.state()
            .move_memory(location, stream, sync, token_of(token))?;
        Ok(())
    })
}

/// Waits until the array's pending device work is done.
///
/// # Safety
/// `a` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_synchronize(
    a: *const memarray_array,
    token: u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        a.state().synchronize(token_of(token))?;
        Ok(())
    })
}

/// Locks the array: until [`memarray_array_unlock`], every call on it that does not
/// present `*token` fails with `MEMARRAY_STATUS_LOCKED`. Fails with that status when
/// the array is already locked.
///
/// # Safety
/// `a` is a live handle; `token` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_lock(
    a: *const memarray_array,
    token: *mut u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        check_out(token, "token")?;
        let t = a.try_lock()?;
        // SAFETY: checked above.
        unsafe { write_out(token, "token", t.id()) }
    })
}

/// Releases the lock `token` holds.
///
/// # Safety
/// `a` is a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_unlock(
    a: *const memarray_array,
    token: u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        let t = token_of(token).ok_or_else(|| Error::arg("token 0 holds no lock"))?;
        a.unlock(t)?;
        Ok(())
    })
}

/// The host data as an indexer (`data` is a host pointer), after the array's pending
/// work. Fails with `MEMARRAY_STATUS_WRONG_LOCATION` unless the data is on the host.
/// The pointer stays valid while the data stays on the host: lock the array to be sure
/// no other thread moves it.
///
/// # Safety
/// `a` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_host_indexer(
    a: *const memarray_array,
    token: u64,
    out: *mut memarray_indexer,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        check_out(out, "out")?;
        let mut raw = a.state();
        let data = raw
            .host_bytes_mut(token_of(token))?
            .as_mut_ptr()
            .cast::<c_void>();
        let ix = indexer(data, raw.shape());
        drop(raw);
        // SAFETY: checked above.
        unsafe { write_out(out, "out", ix) }
    })
}

pub(crate) fn indexer(data: *mut c_void, shape: &[usize]) -> memarray_indexer {
    let mut s = [0u64; MEMARRAY_MAX_NDIM];
    for (x, &d) in s.iter_mut().zip(shape) {
        *x = d as u64;
    }
    memarray_indexer {
        data,
        ndim: shape.len() as u64,
        shape: s,
    }
}

/// Copies the whole array, wherever its data lives, into `dst` (`nbytes` must be the
/// array's size exactly), after its pending work.
///
/// # Safety
/// `a` is a live handle; `dst` holds `nbytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_read(
    a: *const memarray_array,
    dst: *mut c_void,
    nbytes: usize,
    token: u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        if dst.is_null() && nbytes > 0 {
            return Err(Error::arg(format!("dst is NULL with {nbytes} bytes")));
        }
        let out: &mut [u8] = if nbytes == 0 {
            &mut []
        } else {
            // SAFETY: the caller's contract; not null.
            unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), nbytes) }
        };
        a.state().read_all(out, token_of(token))?;
        Ok(())
    })
}

/// Overwrites the whole array, where its data lives, with `src` (C order; `nbytes` must
/// be the array's size exactly). Returns once `src` has been read.
///
/// # Safety
/// `a` is a live handle; `src` holds `nbytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_array_write(
    a: *const memarray_array,
    src: *const c_void,
    nbytes: usize,
    token: u64,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let a = unsafe { array_arg(a, "array") }?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { bytes_arg(src, nbytes, "src") }?;
        a.state().write_all(bytes, token_of(token))?;
        Ok(())
    })
}
