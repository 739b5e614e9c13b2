//! [`Module`] and [`Function`]: a loaded kernel image (PTX text, a cubin or a fatbin, or
//! CUDA C++ through NVRTC, `nvrtc.rs`) and a kernel in it with its occupancy-derived
//! launch shapes. The one way memarray loads kernels, low enough for every user: the copy
//! wing's small-copy kernel (`copy`), users' kernels (`launch`, which re-exports these)
//! and the seed's demo kernel (the memarray-seed crate, through `launch`).

mod nvrtc;

use std::ffi::{CString, c_void};
use std::sync::Arc;

use crate::device::Device;
use crate::driver::{self, CUfunction, CUmodule};
use crate::error::{CudaError, LaunchError, Result};
use crate::event::Enqueued;
use crate::stream::StreamRef;

/// A loaded module (PTX, cubin or fatbin) of one device; unloaded when the last
/// [`Function`] of it and the module itself are gone.
#[derive(Debug)]
pub struct Module {
    pub(crate) device: Arc<Device>,
    raw: CUmodule,
}

// SAFETY: a CUmodule is a driver handle usable from any thread with its context bound;
// every use here binds it.
unsafe impl Send for Module {}
// SAFETY: as above; the handle is never mutated after loading.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.device.bind() {
            // SAFETY: no Function of this module outlives it (each holds an Arc of it).
            let done = unsafe { driver::module_unload(self.raw) };
            crate::parked::park_err("unloading a kernel module", done);
        }
    }
}

impl Module {
    /// Loads `image` on `device`: PTX text (with or without its closing NUL), a cubin or a
    /// fatbin. A driver's refusal (bad PTX, an image for another architecture) is
    /// [`LaunchError::Module`] with the driver's error, naming `cuModuleLoadData`.
    pub fn load(device: &Arc<Device>, image: &[u8]) -> Result<Arc<Module>> {
        if image.is_empty() {
            return Err(CudaError::from(LaunchError::Module {
                detail: "the image is empty (expected PTX text, a cubin or a fatbin)".into(),
            }));
        }
        // PTX is text the driver reads up to a NUL: make sure there is one. (Binary images,
        // ELF cubins and fatbins, start with their magic numbers and carry their length.)
        let is_text =
            !image.starts_with(b"\x7fELF") && !image.starts_with(&[0x50, 0xed, 0x55, 0xba]);
        let owned;
        let bytes = if is_text && image.last() != Some(&0) {
            if image.contains(&0) {
                return Err(CudaError::from(LaunchError::Module {
                    detail: "PTX text with a NUL byte inside".into(),
                }));
            }
            owned = [image, &[0]].concat();
            &owned[..]
        } else {
            image
        };
        let _ctx = device.bind()?;
        // SAFETY: the context is bound; `bytes` is a whole image (PTX NUL-terminated).
        let raw = unsafe { driver::module_load_image(bytes) }.map_err(|e| match e {
            // The image is the caller's input: the driver's refusal of it is a bad
            // argument, not a device failure.
            CudaError::Driver { .. } if !e.is_out_of_memory() => {
                CudaError::from(LaunchError::Module {
                    detail: format!("the driver refused the image ({e})"),
                })
            }
            e => e,
        })?;
        Ok(Arc::new(Module {
            device: device.clone(),
            raw,
        }))
    }

    /// Compiles CUDA C++ `source` with NVRTC for `device`'s architecture (options such as
    /// `-I<dir>` for `memarray/indexer.cuh`, `-DNAME=...`, `--std=c++17`) and loads it.
    /// Kernels meant for [`Module::function`] are declared `extern "C"`. Without NVRTC:
    /// [`CudaError::Unavailable`] naming what was tried; a compile error:
    /// [`LaunchError::Compile`] with NVRTC's log.
    pub fn from_cuda_source(
        device: &Arc<Device>,
        source: &str,
        name: &str,
        options: &[&str],
    ) -> Result<Arc<Module>> {
        let ptx = nvrtc::compile_to_ptx(source, name, options, device.compute_capability())?;
        Module::load(device, &ptx)
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The kernel `name` (its `extern "C"` name); an error naming it when the module has
    /// none.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function> {
        let c = CString::new(name).map_err(|_| {
            CudaError::from(LaunchError::Kernel {
                detail: format!("{name:?} contains a NUL byte"),
            })
        })?;
        let _ctx = self.device.bind()?;
        // SAFETY: the module is live (self) and its context bound.
        let f = unsafe { driver::module_get_function(self.raw, &c) }.map_err(|e| {
            CudaError::from(LaunchError::Kernel {
                detail: format!("the module has no kernel {name:?} ({e})"),
            })
        })?;
        // SAFETY: f is a function of this live module; the context is bound.
        let (params, block, blocks_per_sm) = unsafe {
            let params = driver::param_sizes(f)?;
            let block = driver::occupancy_block_size(f)?;
            (params, block, driver::occupancy_blocks_per_sm(f, block)?)
        };
        Ok(Function {
            module: self.clone(),
            raw: f,
            name: name.to_string(),
            params,
            block,
            blocks_per_sm,
        })
    }
}

/// A kernel of a [`Module`], with its parameter sizes and occupancy.
#[derive(Debug, Clone)]
pub struct Function {
    pub(crate) module: Arc<Module>,
    pub(crate) raw: CUfunction,
    pub(crate) name: String,
    pub(crate) params: Vec<usize>,
    block: u32,
    blocks_per_sm: u32,
}

// SAFETY: as Module: a driver handle, used with its context bound.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sizes in bytes of its parameters, in order.
    pub fn param_sizes(&self) -> &[usize] {
        &self.params
    }

    /// One thread per element of `n` (the default when no grid is given): `n` rounded up
    /// to whole blocks of the size that maximises occupancy, so a kernel written as
    /// `if (i < n) ...` touches every element. The x-dimension holds up to 2^31 - 1
    /// blocks: with blocks of at least 32 threads that is 68 billion elements, more than
    /// any device's memory holds of the smallest element.
    pub fn config_for(&self, n: u64) -> LaunchConfig {
        covering(n, self.block)
    }

    /// A grid-stride configuration: blocks of the occupancy-maximising size, the grid
    /// capped at the blocks the device holds at once. Only for kernels that loop
    /// (`for (i = ...; i < n; i += gridDim.x * blockDim.x)`, as the seed's kernel does):
    /// a one-thread-per-element kernel launched this way skips every element past the
    /// grid.
    pub fn config_grid_stride(&self, n: u64) -> LaunchConfig {
        let resident = u64::from(self.module.device.multiprocessor_count().max(1))
            * u64::from(self.blocks_per_sm.max(1));
        grid_stride(n, self.block, resident)
    }

    /// Launches the kernel with `cfg` on `stream` with `params` (one pointer to each
    /// argument's bytes, as `cuLaunchKernel` takes them), binding its device for the call;
    /// returns the launch as an operation to record or wait for. No array is ordered or
    /// recorded: for arrays, [`launch`](crate::launch::launch) does that, or
    /// `RawArray::kernel_operand` and `RawArray::wrote` around this call.
    ///
    /// # Safety
    /// 1. `params` has one pointer per kernel parameter, each to a live value laid out as
    ///    that parameter (the driver copies them during the call).
    /// 2. Every address the arguments carry is valid for what the kernel does with it until
    ///    the kernel has run; `stream` is a live stream of the function's device.
    pub unsafe fn launch_raw(
        &self,
        cfg: LaunchConfig,
        stream: StreamRef,
        params: &mut [*mut c_void],
    ) -> Result<Enqueued> {
        if params.len() != self.params.len() {
            return Err(CudaError::from(LaunchError::Arguments {
                detail: format!(
                    "{} takes {} parameters, {} given",
                    self.name,
                    self.params.len(),
                    params.len()
                ),
            }));
        }
        let _ctx = self.module.device.bind()?;
        // SAFETY: items 1 and 2; the function is of this live module, its context bound.
        unsafe {
            driver::launch_kernel_3d(
                self.raw,
                cfg.grid,
                cfg.block,
                cfg.shared_bytes,
                stream.cu(),
                params,
            )
        }?;
        Ok(Enqueued::new(stream, self.module.device.clone()))
    }
}

/// The largest grid x-dimension CUDA launches.
pub(crate) const MAX_GRID_X: u64 = (1 << 31) - 1;

/// `n` threads in blocks of `block` (one thread per element).
pub(crate) fn covering(n: u64, block: u32) -> LaunchConfig {
    let block = block.max(1);
    let blocks = n.div_ceil(u64::from(block)).clamp(1, MAX_GRID_X);
    LaunchConfig {
        grid: [blocks as u32, 1, 1],
        block: [block, 1, 1],
        shared_bytes: 0,
    }
}

/// As [`covering`], the grid capped at `resident` blocks (grid-stride kernels).
pub(crate) fn grid_stride(n: u64, block: u32, resident: u64) -> LaunchConfig {
    let mut c = covering(n, block);
    c.grid[0] = c.grid[0].min(resident.clamp(1, MAX_GRID_X) as u32);
    c
}

/// A launch's grid and block (x, y, z) and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in each dimension.
    pub grid: [u32; 3],
    /// Threads per block in each dimension.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed kernel's shape for `n` elements: covering `n`, capped at the blocks
    /// resident at once (`Function::config_grid_stride` with these numbers).
    fn launch_config(n: u64, block: u32, sms: u32, blocks_per_sm: u32) -> (u32, u32) {
        let resident = u64::from(sms.max(1)) * u64::from(blocks_per_sm.max(1));
        let c = grid_stride(n, block, resident);
        (c.grid[0], c.block[0])
    }

    #[test]
    fn launch_config_caps_the_grid_at_resident_blocks() {
        assert_eq!(launch_config(1, 256, 132, 8), (1, 256));
        assert_eq!(launch_config(256 * 10 + 1, 256, 132, 8), (11, 256));
        assert_eq!(launch_config(1 << 40, 256, 132, 8), (132 * 8, 256));
        assert_eq!(launch_config((1 << 31) + 1000, 1024, 132, 2), (264, 1024));
    }
}
