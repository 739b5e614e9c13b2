//! Users' kernels: modules (PTX, cubin, fatbin, CUDA C++ through NVRTC), functions and
//! launches with arrays among the arguments, ordered by memarray.

use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;

use memarray_cuda::launch::{Function, LaunchConfig, Module, SharedArg, launch_shared};

use crate::array::{memarray_array, token_of};
use crate::error::{Error, Result, check_out, guard, memarray_status, non_null, write_out};
use crate::handle::Handle;
use crate::stream::{memarray_stream, stream_arg};

/// A loaded module of one device (opaque).
pub struct memarray_module {
    inner: Arc<Module>,
}

impl Handle for memarray_module {}

/// A kernel of a module (opaque); keeps its module loaded.
pub struct memarray_function {
    inner: Function,
}

impl Handle for memarray_function {}

/// A launch's grid and block (x, y, z) and dynamic shared memory per block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct memarray_launch_config {
    /// Blocks in each dimension (each at least 1).
    pub grid: [u32; 3],
    /// Threads per block in each dimension (each at least 1).
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

/// What a kernel argument is (`memarray_kernel_arg::kind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memarray_arg_kind {
    /// An array the kernel only reads, passed as its indexer.
    Read = 0,
    /// An array the kernel writes, passed as its indexer.
    Write = 1,
    /// `size` bytes at `value`, passed by value.
    Value = 2,
}

impl memarray_arg_kind {
    /// The kind C passed as an `int`, if it is one.
    fn from_c(k: i32) -> Option<Self> {
        [Self::Read, Self::Write, Self::Value]
            .into_iter()
            .find(|&v| v as i32 == k)
    }
}

/// One kernel argument: an array (`kind` READ or WRITE, `array`, `token` when the caller
/// holds its lock, else 0) or a value (`kind` VALUE, `value`, `size`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct memarray_kernel_arg {
    /// A `memarray_arg_kind` value.
    pub kind: i32,
    /// The array (READ / WRITE).
    pub array: *const memarray_array,
    /// The array's lock token, or 0.
    pub token: u64,
    /// The value's bytes (VALUE).
    pub value: *const c_void,
    /// The value's size in bytes (VALUE).
    pub size: usize,
}

/// A NUL-terminated string argument.
///
/// # Safety
/// A non-null `s` is a NUL-terminated string.
unsafe fn text<'a>(s: *const c_char, name: &str) -> Result<&'a str> {
    if s.is_null() {
        return Err(Error::arg(format!("{name} is NULL")));
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| Error::arg(format!("{name} is not UTF-8")))
}

fn module_handle(m: Arc<Module>) -> *mut memarray_module {
    memarray_module { inner: m }.into_raw()
}

/// Loads `image` (`size` bytes: PTX text, a cubin or a fatbin) on `device`. On success
/// `*out` is a new module: release it with [`memarray_module_free`].
///
/// # Safety
/// `image` holds `size` readable bytes; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_module_load(
    device: i32,
    image: *const c_void,
    size: usize,
    out: *mut *mut memarray_module,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { crate::array::bytes_arg(image, size, "image") }?;
        let d = crate::device::device(device)?;
        let m = Module::load(&d, bytes)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", module_handle(m)) }
    })
}

/// Compiles CUDA C++ `source` (named `name` in messages) with NVRTC for `device` and
/// loads it; `options` holds `noptions` NVRTC options (`-I<dir>` for
/// `memarray/indexer.cuh`). Kernels are declared `extern "C"`. Without NVRTC:
/// `MEMARRAY_STATUS_CUDA_UNAVAILABLE`; a compile error: `MEMARRAY_STATUS_INVALID_ARGUMENT`
/// with NVRTC's log.
///
/// # Safety
/// Strings are NUL-terminated; `options` holds `noptions` of them; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_module_from_source(
    device: i32,
    source: *const c_char,
    name: *const c_char,
    options: *const *const c_char,
    noptions: usize,
    out: *mut *mut memarray_module,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let (source, name) = unsafe { (text(source, "source")?, text(name, "name")?) };
        if options.is_null() && noptions > 0 {
            return Err(Error::arg(format!(
                "options is NULL with {noptions} options"
            )));
        }
        let opts: Vec<&str> = (0..noptions)
            // SAFETY: the caller's contract: `noptions` strings.
            .map(|i| unsafe { text(*options.add(i), "an option") })
            .collect::<Result<_>>()?;
        let d = crate::device::device(device)?;
        let m = Module::from_cuda_source(&d, source, name, &opts)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", module_handle(m)) }
    })
}

/// Releases a module handle (NULL: nothing); functions taken from it keep it loaded.
///
/// # Safety
/// `m` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_module_free(m: *mut memarray_module) {
    // SAFETY: the caller's contract (NULL or a live handle, not used afterwards).
    unsafe { memarray_module::free(m) }
}

/// The kernel `name` (its `extern "C"` name) of module `m`. On success `*out` is a new
/// function: release it with [`memarray_function_free`].
///
/// # Safety
/// `m` is live; `name` is NUL-terminated; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_module_function(
    m: *const memarray_module,
    name: *const c_char,
    out: *mut *mut memarray_function,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { memarray_module::arg(m, "module") }?;
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let name = unsafe { text(name, "name") }?;
        let f = m.inner.function(name)?;
        let h = memarray_function { inner: f }.into_raw();
        // SAFETY: checked above.
        unsafe { write_out(out, "out", h) }
    })
}

/// Releases a function handle (NULL: nothing).
///
/// # Safety
/// `f` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_function_free(f: *mut memarray_function) {
    // SAFETY: the caller's contract (NULL or a live handle, not used afterwards).
    unsafe { memarray_function::free(f) }
}

/// The number of the kernel's parameters (into `*count`) and, when `sizes` is not NULL,
/// their sizes in bytes (the first `capacity` of them).
///
/// # Safety
/// `f` is live; `count` is writable; `sizes` is NULL or holds `capacity` writable values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_function_params(
    f: *const memarray_function,
    count: *mut usize,
    sizes: *mut usize,
    capacity: usize,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let f = unsafe { memarray_function::arg(f, "function") }?;
        let p = f.inner.param_sizes();
        if !sizes.is_null() {
            for (i, &s) in p.iter().take(capacity).enumerate() {
                // SAFETY: the caller's contract: `capacity` writable values.
                unsafe { sizes.add(i).write(s) };
            }
        }
        // SAFETY: the caller's contract.
        unsafe { write_out(count, "count", p.len()) }
    })
}

/// One thread per element of `n`, in blocks of the size that maximises occupancy: every
/// element gets a thread (kernels written as `if (i < n) ...`).
///
/// # Safety
/// `f` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_function_config_for(
    f: *const memarray_function,
    n: u64,
    out: *mut memarray_launch_config,
) -> memarray_status {
    // SAFETY: the caller's contract.
    unsafe { config_out(f, out, |f| f.config_for(n)) }
}

/// A grid-stride configuration for `n` elements: the grid capped at the blocks the device
/// holds at once. Only for kernels that loop (`i += gridDim.x * blockDim.x`): a
/// one-thread-per-element kernel launched this way skips the elements past the grid.
///
/// # Safety
/// `f` is live; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_function_config_grid_stride(
    f: *const memarray_function,
    n: u64,
    out: *mut memarray_launch_config,
) -> memarray_status {
    // SAFETY: the caller's contract.
    unsafe { config_out(f, out, |f| f.config_grid_stride(n)) }
}

/// Writes `pick(f)` to `out`.
///
/// # Safety
/// `f` is NULL or live; `out` is NULL or writable.
unsafe fn config_out(
    f: *const memarray_function,
    out: *mut memarray_launch_config,
    pick: impl Fn(&memarray_cuda::launch::Function) -> memarray_cuda::launch::LaunchConfig,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let f = unsafe { memarray_function::arg(f, "function") }?;
        let c = pick(&f.inner);
        let cfg = memarray_launch_config {
            grid: c.grid,
            block: c.block,
            shared_bytes: c.shared_bytes,
        };
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", cfg) }
    })
}

/// Launches `f` with `*config` on `stream` (NULL: the legacy default stream) with
/// `args[0..nargs)`. Each array argument moves to the kernel's device, the stream waits
/// on its pending work, and after the launch its event records it (a write for WRITE, a
/// read for READ): no manual synchronisation is needed. The arguments must match the
/// kernel's parameters in number and size (an array is an indexer: 8 + 8 * ndim bytes);
/// nothing moves when they do not. One array may appear in several arguments.
///
/// # Safety
/// Handles are live; `config` is readable; `args` holds `nargs` readable arguments whose
/// values hold `size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_launch(
    f: *const memarray_function,
    config: *const memarray_launch_config,
    stream: *const memarray_stream,
    args: *const memarray_kernel_arg,
    nargs: usize,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let f = unsafe { memarray_function::arg(f, "function") }?;
        // SAFETY: the caller's contract.
        let c = *unsafe { non_null(config, "config") }?;
        if args.is_null() && nargs > 0 {
            return Err(Error::arg(format!("args is NULL with nargs {nargs}")));
        }
        let args: &[memarray_kernel_arg] = if nargs == 0 {
            &[]
        } else {
            // SAFETY: the caller's contract.
            unsafe { std::slice::from_raw_parts(args, nargs) }
        };
        // SAFETY: the caller's contract.
        let stream = unsafe { stream_arg(stream) };
        let mut list: Vec<SharedArg<'_>> = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let write = match memarray_arg_kind::from_c(a.kind) {
                Some(memarray_arg_kind::Read) => false,
                Some(memarray_arg_kind::Write) => true,
                Some(memarray_arg_kind::Value) => {
                    if a.value.is_null() && a.size > 0 {
                        return Err(Error::arg(format!(
                            "argument {i}: value is NULL with {} bytes",
                            a.size
                        )));
                    }
                    // SAFETY: the caller's contract; not NULL when there are bytes (the
                    // message is built only on that error, not on every launch).
                    let v = unsafe { crate::array::bytes_arg(a.value, a.size, "value") }?;
                    list.push(SharedArg::Value(v.to_vec()));
                    continue;
                }
                None => {
                    return Err(Error::arg(format!(
                        "argument {i}: kind {} is not a memarray_arg_kind (0 to 2)",
                        a.kind
                    )));
                }
            };
            // SAFETY: the caller's contract.
            // (Not `Handle::arg`: the message is built only on the error, not per launch.)
            let array = unsafe { a.array.as_ref() }
                .ok_or_else(|| Error::arg(format!("argument {i}: array is NULL")))?
                .inner
                .as_ref();
            list.push(SharedArg::Array {
                array,
                write,
                token: token_of(a.token),
            });
        }
        let cfg = LaunchConfig {
            grid: c.grid,
            block: c.block,
            shared_bytes: c.shared_bytes,
        };
        launch_shared(&f.inner, cfg, stream, &list)?;
        Ok(())
    })
}
