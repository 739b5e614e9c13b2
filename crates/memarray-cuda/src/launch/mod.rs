//! Your own kernels on memarray arrays: a [`Module`] from PTX text,
//! a cubin or a fatbin, a [`Function`] in it, and [`launch`] with arrays among the
//! arguments. Each array argument says whether the kernel reads or writes it; it is moved
//! to the function's device (restored if spilled), the launch stream waits on its pending
//! work (stream-wait-event, no host block), and after the launch its event is recorded: a
//! write for written arrays, a read (that the next writer waits for) for read ones. No
//! manual `record_stream` or event call is needed for correctness.
//!
//! A kernel receives an array as its [`memarray_core::Indexer`] by value (`void* data;
//! uint64_t shape[ndim];`, `kernels-cuda/include/memarray/indexer.cuh`); plain scalars pass
//! by value. The argument list is checked against the function's parameter sizes
//! (`cuFuncGetParamInfo`) before anything moves.
//!
//! ```no_run
//! use memarray_core::{DType, Location};
//! use memarray_cuda::launch::{Arg, Module, launch};
//! use memarray_cuda::{Device, RawArray, Stream};
//!
//! # fn main() -> memarray_cuda::Result<()> {
//! let device = Device::get(0)?;
//! let ptx = std::fs::read("my_kernels.ptx").expect("a PTX file");
//! let f = Module::load(&device, &ptx)?.function("scale_f32_n1")?;
//! let mut a = RawArray::from_bytes(DType::F32, &[1024], &[0u8; 4096], 0)?;
//! let stream = Stream::new(&device)?;
//! // One thread per element: every element of `a` gets a thread (`if (i < n)` kernels).
//! // A kernel that loops grid-stride can take `f.config_grid_stride(a.len())` instead.
//! let cfg = f.config_for(a.len());
//! launch(&f, cfg, Some(stream.as_ref()), &mut [Arg::Write(&mut a), Arg::value(2.0f32)])?;
//! assert_eq!(a.location(), Location::Device(0));
//! # Ok(())
//! # }
//! ```

use std::ffi::c_void;
use std::sync::Arc;

use memarray_core::LockToken;

// The loader sits lower (`crate::module`), where the copy wing reaches it too.
pub use crate::module::{Function, LaunchConfig, Module};

use crate::array::{RawArray, SharedArray};
use crate::device::Device;
use crate::driver;
use crate::error::{CudaError, LaunchError, Result};
use crate::event::Enqueued;
use crate::stream::StreamRef;

/// One kernel argument.
#[derive(Debug)]
pub enum Arg<'a> {
    /// An array the kernel only reads (passed as its `Indexer`).
    Read(&'a mut RawArray),
    /// An array the kernel writes (passed as its `Indexer`).
    Write(&'a mut RawArray),
    /// A plain value's bytes, passed by value.
    Value(Vec<u8>),
}

impl Arg<'_> {
    /// A plain scalar (`f32`, `u64`, a `#[repr(C)]` struct of them without padding),
    /// passed by value.
    pub fn value<T: Copy + 'static>(v: T) -> Arg<'static> {
        // SAFETY: `v` is a live value of `size_of::<T>()` bytes; the bytes are copied.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const v).cast::<u8>(), std::mem::size_of::<T>())
        };
        Arg::Value(bytes.to_vec())
    }
}

/// Launches `f` with `cfg` on `stream` (the legacy default stream when `None`) with
/// `args`, ordered after the arrays' pending work and recorded as their pending work
/// (see the module docs). The argument list must match the kernel's parameters in number
/// and size; nothing moves when it does not.
pub fn launch(
    f: &Function,
    cfg: LaunchConfig,
    stream: Option<StreamRef>,
    args: &mut [Arg<'_>],
) -> Result<()> {
    let _nvtx = crate::nvtx::range(c"memarray.launch", None);
    let mut operands = Vec::with_capacity(args.len());
    let mut params = Vec::with_capacity(args.len());
    for a in args.iter_mut() {
        let (array, write) = match a {
            Arg::Read(x) => (&mut **x, false),
            Arg::Write(x) => (&mut **x, true),
            Arg::Value(v) => {
                params.push(Param::Value(v.clone()));
                continue;
            }
        };
        params.push(Param::Array(operands.len()));
        operands.push(Operand {
            array,
            write,
            token: None,
        });
    }
    launch_indexed(f, cfg, stream, &mut operands, &params)
}

/// An array operand of [`launch_indexed`]: the array, whether the kernel writes it, and
/// the token of its lock when the caller holds one.
#[derive(Debug)]
pub struct Operand<'a> {
    /// The array.
    pub array: &'a mut RawArray,
    /// Whether the kernel writes it (else it only reads it).
    pub write: bool,
    /// The caller's token when the array is locked by it.
    pub token: Option<LockToken>,
}

/// One kernel parameter of [`launch_indexed`]: an operand (by its index; one array may
/// fill several parameters) or a plain value's bytes.
#[derive(Clone, Debug)]
pub enum Param {
    /// The `Indexer` of `operands[i]`.
    Array(usize),
    /// A value's bytes, passed by value.
    Value(Vec<u8>),
}

/// [`launch`] for bindings, where one array may appear in several parameters (`out = a +
/// a`): each distinct array is one [`Operand`] (written if any use writes it) and
/// `params` name them by index. Checks as [`launch`] does, plus each operand's lock
/// against its token.
pub fn launch_indexed(
    f: &Function,
    cfg: LaunchConfig,
    stream: Option<StreamRef>,
    operands: &mut [Operand<'_>],
    params: &[Param],
) -> Result<()> {
    let bad = |detail: String| CudaError::from(LaunchError::Arguments { detail });
    if params.len() != f.params.len() {
        return Err(bad(format!(
            "{} takes {} parameters, {} given",
            f.name,
            f.params.len(),
            params.len()
        )));
    }
    for (i, (p, &size)) in params.iter().zip(&f.params).enumerate() {
        let (given, what) = match p {
            Param::Array(j) => {
                let Some(op) = operands.get(*j) else {
                    return Err(bad(format!(
                        "parameter {i} names operand {j} of {}",
                        operands.len()
                    )));
                };
                let n = op.array.ndim();
                (
                    8 + 8 * n,
                    format!("an array of ndim {n} (an Indexer of {} bytes)", 8 + 8 * n),
                )
            }
            Param::Value(v) => (v.len(), format!("a value of {} bytes", v.len())),
        };
        if given != size {
            return Err(bad(format!(
                "{} parameter {i} is {size} bytes, given {what}",
                f.name
            )));
        }
    }
    for op in operands.iter() {
        op.array.check(op.token)?;
    }
    if cfg.grid.contains(&0) || cfg.block.contains(&0) {
        return Err(CudaError::from(LaunchError::Configuration {
            detail: format!(
                "grid {:?} and block {:?} must be at least 1 each",
                cfg.grid, cfg.block
            ),
        }));
    }
    let device = f.module.device.clone();
    let stream = stream.unwrap_or(StreamRef::legacy());
    let mut indexers: Vec<Vec<u8>> = Vec::with_capacity(operands.len());
    for op in operands.iter_mut() {
        let buf = op.array.kernel_operand(device.id(), stream, op.token)?;
        // The seed kernel's struct, as memarray-core lays it out.
        let data = buf.device_ptr() as usize as *mut c_void;
        indexers.push(memarray_core::indexer_bytes(data, op.array.shape())?);
    }
    let mut raw: Vec<*mut c_void> = params
        .iter()
        .map(|p| match p {
            Param::Array(j) => indexers[*j].as_ptr().cast_mut().cast::<c_void>(),
            Param::Value(v) => v.as_ptr().cast_mut().cast::<c_void>(),
        })
        .collect();
    {
        let _ctx = device.bind()?;
        // SAFETY: f belongs to this device's live module (held by f); the stream is the
        // caller's live stream or the legacy one; each parameter buffer holds exactly the
        // parameter's size (checked above) and the driver only reads them, during the
        // call; the arrays' device buffers are the arrays' current data, kept alive by the
        // arrays whose events record this launch below.
        unsafe {
            driver::launch_kernel_3d(
                f.raw,
                cfg.grid,
                cfg.block,
                cfg.shared_bytes,
                stream.cu(),
                &mut raw,
            )?
        };
    }
    let op = Enqueued::new(stream, device);
    for o in operands.iter_mut() {
        if o.write {
            o.array.wrote(Enqueued::new(stream, op.device().clone()))?;
        } else {
            o.array.was_read(&op)?;
        }
    }
    Ok(())
}

/// One argument of [`launch_shared`].
#[derive(Debug)]
pub enum SharedArg<'a> {
    /// An array the kernel reads or writes, with the token of its lock when the caller
    /// holds one.
    Array {
        /// The array.
        array: &'a SharedArray,
        /// Whether the kernel writes it.
        write: bool,
        /// The caller's lock token, if the array is locked by the caller.
        token: Option<LockToken>,
    },
    /// A value's bytes, passed by value.
    Value(Vec<u8>),
}

/// [`launch`] over shared arrays, as the bindings hold them: one array may appear in
/// several arguments (it is written if any use writes it); each distinct array's state is
/// locked once, in id order ([`SharedArray::spill_id`], as graphs and swaps lock theirs),
/// so launches over overlapping sets cannot deadlock.
/// The same array passed with two different tokens is refused.
pub fn launch_shared(
    f: &Function,
    cfg: LaunchConfig,
    stream: Option<StreamRef>,
    args: &[SharedArg<'_>],
) -> Result<()> {
    let _nvtx = crate::nvtx::range(c"memarray.launch", None);
    struct Use<'a> {
        array: &'a SharedArray,
        write: bool,
        token: Option<LockToken>,
    }
    let mut uses: Vec<Use<'_>> = Vec::new();
    let mut params: Vec<Param> = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        let &SharedArg::Array {
            array,
            write,
            token,
        } = a
        else {
            if let SharedArg::Value(v) = a {
                params.push(Param::Value(v.clone()));
            }
            continue;
        };
        let at = match uses.iter().position(|u| std::ptr::eq(u.array, array)) {
            Some(j) => {
                if token.is_some() && uses[j].token.is_some() && token != uses[j].token {
                    return Err(CudaError::from(LaunchError::Arguments {
                        detail: format!(
                            "argument {i}: the array is passed twice with different tokens"
                        ),
                    }));
                }
                uses[j].token = uses[j].token.or(token);
                j
            }
            None => {
                uses.push(Use {
                    array,
                    write: false,
                    token,
                });
                uses.len() - 1
            }
        };
        uses[at].write |= write;
        params.push(Param::Array(at));
    }
    let mut order: Vec<usize> = (0..uses.len()).collect();
    order.sort_by_key(|&j| uses[j].array.spill_id());
    let mut rank = vec![0; uses.len()];
    for (r, &j) in order.iter().enumerate() {
        rank[j] = r;
    }
    for p in &mut params {
        if let Param::Array(j) = p {
            *j = rank[*j];
        }
    }
    let mut states: Vec<_> = order.iter().map(|&j| uses[j].array.state()).collect();
    let mut operands: Vec<Operand<'_>> = states
        .iter_mut()
        .zip(&order)
        .map(|(state, &j)| Operand {
            array: state,
            write: uses[j].write,
            token: uses[j].token,
        })
        .collect();
    launch_indexed(f, cfg, stream, &mut operands, &params)
}

/// Device access for work memarray does not launch (a CUDA C++ `<<<...>>>` launch, a
/// library call on the array's memory): the array moves to `device` (restored if
/// spilled), `stream` waits on its pending work, and the returned buffer holds the data.
/// Hold the array still (a lock, or `&mut` for the duration) until [`end_access`].
pub fn begin_access(
    array: &mut RawArray,
    device: &Device,
    stream: StreamRef,
    token: Option<LockToken>,
) -> Result<Arc<crate::DeviceBuffer>> {
    array.kernel_operand(device.id(), stream, token)
}

/// Ends a [`begin_access`]: the work enqueued on `stream` becomes the array's pending
/// work, as a write (later reads and writes wait for it) or a read (later writes wait).
pub fn end_access(
    array: &mut RawArray,
    device: Arc<Device>,
    stream: StreamRef,
    write: bool,
) -> Result<()> {
    let op = Enqueued::new(stream, device);
    if write {
        array.wrote(op)
    } else {
        array.was_read(&op)
    }
}

#[cfg(test)]
mod tests {
    use crate::module::{MAX_GRID_X, covering, grid_stride};

    #[test]
    fn the_default_grid_gives_every_element_a_thread() {
        // The H100 case: 2,100,000 elements, blocks of 1024, 132 SMs x 2 resident blocks.
        for (n, block) in [
            (2_100_000u64, 1024u32),
            (1, 256),
            (1 << 35, 32),
            (1023, 1024),
        ] {
            let c = covering(n, block);
            let threads = u64::from(c.grid[0]) * u64::from(c.block[0]);
            assert!(threads >= n, "{n} elements, {threads} threads");
            assert!(threads - n < u64::from(block), "one partial block at most");
            assert_eq!((c.grid[1], c.grid[2], c.block[1], c.block[2]), (1, 1, 1, 1));
        }
        assert_eq!(covering(2_100_000, 1024).grid[0], 2051);
        assert_eq!(covering(0, 128).grid[0], 1); // a grid is at least one block
        // Grid-stride: capped at the resident blocks, and never above the covering grid.
        assert_eq!(grid_stride(2_100_000, 1024, 264).grid[0], 264);
        assert_eq!(grid_stride(1000, 1024, 264).grid[0], 1);
        assert_eq!(
            grid_stride(u64::MAX, 1, u64::MAX).grid[0] as u64,
            MAX_GRID_X
        );
    }
}
