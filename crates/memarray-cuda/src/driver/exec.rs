//! Modules, occupancy and kernel launch.

use std::ffi::{CStr, c_int, c_void};

use cudarc::driver::sys;

use super::{CUfunction, CUmodule, CUstream, check, init};
use crate::error::Result;

/// Loads a module from an image in memory: PTX text (NUL-terminated), a cubin or a
/// fatbin; the driver tells them apart.
///
/// # Safety
/// 1. A live context is current on the calling thread; the module belongs to it.
/// 2. `image` is a complete image of one of those kinds (PTX text ends with its NUL).
pub(crate) unsafe fn module_load_image(image: &[u8]) -> Result<CUmodule> {
    init()?;
    let mut m: CUmodule = std::ptr::null_mut();
    // SAFETY: items 1 and 2; the driver reads the image during the call.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, image.as_ptr().cast::<c_void>())
    })?;
    Ok(m)
}

/// The sizes in bytes of `f`'s parameters, in order.
///
/// # Safety
/// 1. `f` is a function of a live module.
pub(crate) unsafe fn param_sizes(f: CUfunction) -> Result<Vec<usize>> {
    init()?;
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: item 1; out pointers valid. An index past the last parameter is
        // CUDA_ERROR_INVALID_VALUE, which ends the list.
        let r = unsafe { sys::cuFuncGetParamInfo(f, sizes.len(), &mut offset, &mut size) };
        if r == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
            return Ok(sizes);
        }
        check("cuFuncGetParamInfo", r)?;
        sizes.push(size);
    }
}

/// Launches `f` on `grid` x `block` with `shared` bytes of dynamic shared memory on `s`.
///
/// # Safety
/// As [`launch_kernel`].
pub(crate) unsafe fn launch_kernel_3d(
    f: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    s: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    init()?;
    // SAFETY: as launch_kernel's items 1 to 3; no `extra` array.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// Unloads a module.
///
/// # Safety
/// 1. `m` is a live module whose functions are not launched after this call.
pub(crate) unsafe fn module_unload(m: CUmodule) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuModuleUnload", unsafe { sys::cuModuleUnload(m) })
}

/// Looks up a kernel by its `extern "C"` name.
///
/// # Safety
/// 1. `m` is a live module.
pub(crate) unsafe fn module_get_function(m: CUmodule, name: &CStr) -> Result<CUfunction> {
    init()?;
    let mut f: CUfunction = std::ptr::null_mut();
    // SAFETY: item 1; `name` is NUL-terminated.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// The block size that maximises occupancy for `f` (no dynamic shared memory).
///
/// # Safety
/// 1. `f` is a function of a live module; its context is current.
pub(crate) unsafe fn occupancy_block_size(f: CUfunction) -> Result<u32> {
    init()?;
    let (mut min_grid, mut block): (c_int, c_int) = (0, 0);
    // SAFETY: item 1; out pointers valid; no shared-memory callback, 0 bytes, no limit.
    check("cuOccupancyMaxPotentialBlockSize", unsafe {
        sys::cuOccupancyMaxPotentialBlockSize(&mut min_grid, &mut block, f, None, 0, 0)
    })?;
    Ok(block.max(1) as u32)
}

/// How many blocks of `block` threads of `f` fit on one multiprocessor at once.
///
/// # Safety
/// 1. `f` is a function of a live module; its context is current.
pub(crate) unsafe fn occupancy_blocks_per_sm(f: CUfunction, block: u32) -> Result<u32> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: item 1; the out pointer is valid.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as c_int, 0)
    })?;
    Ok(n.max(1) as u32)
}

/// Launches `f` on a 1-D grid on `s`.
///
/// # Safety
/// 1. `f` is a function of a live module of the current context; `s` is a live stream
///    (or 1/2) of that context.
/// 2. `params` holds one pointer per kernel parameter, each to a value of exactly the
///    parameter's type and layout; the driver copies them during the call.
/// 3. Every address the parameters hold stays valid until the kernel has run.
pub(crate) unsafe fn launch_kernel(
    f: CUfunction,
    grid: u32,
    block: u32,
    s: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: items 1 to 3, passed on; no dynamic shared memory.
    unsafe { launch_kernel_3d(f, [grid, 1, 1], [block, 1, 1], 0, s, params) }
}
