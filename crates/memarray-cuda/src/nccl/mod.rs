//! NCCL collectives on device arrays (feature `nccl`).
//!
//! memarray does not grow collectives of its own: [`Comm`] feeds [`RawArray`] device data
//! to NCCL, loaded at run time ([`load`]), with the mirror's ordering. Each call runs on
//! the caller's stream (else the array's last stream, else the legacy default stream),
//! first making that stream wait on every operand's pending event (no host block), and
//! records the output's event after the call (and a read on the input), so host access and
//! work on other streams wait for the result.
//!
//! Two ways to make communicators:
//! - several processes, one rank each: rank 0 makes a [`UniqueId`], every rank gets it
//!   (a file: [`UniqueId::exchange_file`]; an environment variable: [`UniqueId::from_hex`])
//!   and calls [`Comm::init_rank`];
//! - one process driving several GPUs: [`Comm::init_all`], then issue each collective on
//!   every communicator inside one [`group`] (NCCL waits for all ranks of a collective,
//!   so one thread must enqueue them together).
//!
//! Operands must be on the communicator's device and not locked. Reductions take numeric
//! dtypes NCCL has (i8, u8, i32, u32, i64, u64, f16, bf16, f32, f64); broadcast, gather and
//! send / receive move bytes and take any dtype.
//!
//! ```no_run
//! use memarray_core::{DType, Location};
//! use memarray_cuda::nccl::{Comm, ReduceOp, group};
//! use memarray_cuda::RawArray;
//!
//! let comms = Comm::init_all(&[0, 1])?;
//! let mut parts = Vec::new();
//! for c in &comms {
//!     let one = 1i32.to_ne_bytes();
//!     parts.push(RawArray::full_on(DType::I32, &[1024], Location::Device(c.device_id()), &one, None, None)?);
//! }
//! group(|| {
//!     for (c, a) in comms.iter().zip(parts.iter_mut()) {
//!         c.all_reduce_in_place(a, ReduceOp::Sum, None)?;
//!     }
//!     Ok(())
//! })?;
//! # Ok::<(), memarray_cuda::nccl::NcclError>(())
//! ```

mod error;
mod id;
mod lib;

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t};
use memarray_core::DType;

use crate::array::RawArray;
use crate::device::{Device, device_count};
use crate::error::CudaError;
use crate::event::Enqueued;
use crate::stream::StreamRef;
pub use error::{NcclError, Result};
pub use id::UniqueId;

/// Bytes of an NCCL unique id.
pub const UNIQUE_ID_BYTES: usize = 128;

/// What [`load`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclInfo {
    /// The library file loaded.
    pub path: PathBuf,
    /// NCCL's version, `(major, minor, patch)`.
    pub version: (u32, u32, u32),
}

/// Loads libnccl: from `path` when given, else `MEMARRAY_NCCL_LIBRARY`, else
/// `libnccl.so.2` / `libnccl.so` on the loader path. Every other function here loads it
/// on first use the same way; call this first to name a path (Python passes the
/// `nvidia-nccl` wheel's). Once loaded, later calls return the loaded library. Without
/// one: [`NcclError::Unavailable`].
pub fn load(path: Option<&Path>) -> Result<NcclInfo> {
    let lib = lib::load(path)?;
    Ok(NcclInfo {
        path: lib.path.clone(),
        version: lib.version()?,
    })
}

/// Whether libnccl is loaded already (nothing is loaded by asking).
pub fn is_loaded() -> bool {
    lib::loaded().is_some()
}

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Mean (sum divided by the number of ranks; NCCL >= 2.10).
    Avg,
}

impl ReduceOp {
    /// Parses `sum`, `prod`, `max`, `min`, `avg` (case-insensitive).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sum" => Self::Sum,
            "prod" | "product" => Self::Prod,
            "max" => Self::Max,
            "min" => Self::Min,
            "avg" | "mean" => Self::Avg,
            _ => {
                return Err(CudaError::InvalidArgument {
                    what: "reduction",
                    detail: format!("{name:?} is not one of sum, prod, max, min, avg"),
                }
                .into());
            }
        })
    }

    fn raw(self) -> ncclRedOp_t {
        match self {
            Self::Sum => ncclRedOp_t::ncclSum,
            Self::Prod => ncclRedOp_t::ncclProd,
            Self::Max => ncclRedOp_t::ncclMax,
            Self::Min => ncclRedOp_t::ncclMin,
            Self::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

/// NCCL's element type for a reduction over `dtype`, or an error naming the dtype.
fn reduce_type(dtype: DType, call: &'static str) -> Result<ncclDataType_t> {
    use ncclDataType_t::*;
    Ok(match dtype {
        DType::I8 => ncclInt8,
        DType::U8 => ncclUint8,
        DType::I32 => ncclInt32,
        DType::U32 => ncclUint32,
        DType::I64 => ncclInt64,
        DType::U64 => ncclUint64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        other => {
            return Err(NcclError::Call {
                call,
                reason: format!(
                    "NCCL cannot reduce {other} (it reduces i8, u8, i32, u32, i64, u64, f16, \
                     bf16, f32, f64); broadcast, gather and send/recv take any dtype"
                ),
            });
        }
    })
}

/// One rank of an NCCL communicator, on one device. Calls on it are serialised (NCCL
/// forbids concurrent calls on one communicator); it is destroyed on drop, or aborted
/// ([`Comm::abort`]) from any thread to free a rank waiting for a peer that will not come.
pub struct Comm {
    /// Null once aborted.
    raw: Mutex<ncclComm_t>,
    aborted: AtomicBool,
    device: Arc<Device>,
    rank: usize,
    size: usize,
}

// SAFETY: the communicator handle is used only under the mutex (one thread at a time, as
// NCCL requires) and NCCL communicators may move between threads.
unsafe impl Send for Comm {}
// SAFETY: as above: every use locks the mutex.
unsafe impl Sync for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device.id())
            .finish()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let raw = *self.raw.get_mut().unwrap_or_else(PoisonError::into_inner);
        if raw.is_null() {
            return; // aborted: NCCL freed it then
        }
        if let (Some(lib), Ok(_ctx)) = (lib::loaded(), self.device.bind()) {
            // SAFETY: the handle is live and this is its only destroyer.
            let r = unsafe { (lib.comm_destroy)(raw) };
            // Drop cannot return it: parked (`crate::parked`), as a CUDA-layer error.
            if let Err(e) = lib.check("ncclCommDestroy", r, std::ptr::null_mut()) {
                let e = match e {
                    NcclError::Cuda(c) => c,
                    other => CudaError::Driver {
                        call: "ncclCommDestroy",
                        code: r,
                        name: "ncclResult_t".into(),
                        message: other.to_string(),
                    },
                };
                crate::parked::park("destroying an NCCL communicator", e);
            }
        }
    }
}

impl Comm {
    /// Rank `rank` of `size` ranks (one per process, usually), on `device`. Every rank
    /// calls this with the same id; it returns once all have joined. `size` 1 is allowed
    /// (collectives then copy). Two ranks on one device are refused by NCCL.
    pub fn init_rank(device: u32, size: usize, rank: usize, id: &UniqueId) -> Result<Self> {
        if size == 0 || rank >= size {
            return Err(NcclError::Call {
                call: "ncclCommInitRank",
                reason: format!("rank {rank} of {size}: ranks are 0..size and size >= 1"),
            });
        }
        let lib = lib::load(None)?;
        let dev = Device::get(device)?;
        let n = to_int(size, "ncclCommInitRank")?;
        let r = to_int(rank, "ncclCommInitRank")?;
        let _ctx = dev.bind()?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: the out pointer is valid; the device's context is current (NCCL uses
        // the runtime's current device, which is the current primary context's).
        let res = unsafe { (lib.comm_init_rank)(&mut comm, n, id.raw(), r) };
        lib.check("ncclCommInitRank", res, comm)?;
        Ok(Self {
            raw: Mutex::new(comm),
            aborted: AtomicBool::new(false),
            device: dev,
            rank,
            size,
        })
    }

    /// One communicator per device in `devices` (rank i on `devices[i]`), for one process
    /// driving several GPUs. Issue collectives on all of them inside one [`group`].
    pub fn init_all(devices: &[u32]) -> Result<Vec<Self>> {
        let mut seen = devices.to_vec();
        seen.sort_unstable();
        seen.dedup();
        if devices.is_empty() || seen.len() != devices.len() {
            return Err(NcclError::Call {
                call: "ncclCommInitAll",
                reason: format!("devices {devices:?}: give each device once, at least one"),
            });
        }
        let visible = device_count()?;
        if let Some(&missing) = devices.iter().find(|&&d| d >= visible) {
            return Err(NcclError::Call {
                call: "ncclCommInitAll",
                reason: format!(
                    "a communicator over {} devices needs cuda:{missing}, but this process \
                     sees {visible} device(s) (CUDA_VISIBLE_DEVICES)",
                    devices.len()
                ),
            });
        }
        let lib = lib::load(None)?;
        let devs = devices
            .iter()
            .map(|&d| Device::get(d))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let ids = devices
            .iter()
            .map(|&d| to_int(d as usize, "ncclCommInitAll"))
            .collect::<Result<Vec<c_int>>>()?;
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        let n = to_int(devices.len(), "ncclCommInitAll")?;
        // SAFETY: `comms` and `ids` hold `n` elements each.
        let res = unsafe { (lib.comm_init_all)(comms.as_mut_ptr(), n, ids.as_ptr()) };
        lib.check("ncclCommInitAll", res, std::ptr::null_mut())?;
        Ok(comms
            .into_iter()
            .zip(devs)
            .enumerate()
            .map(|(rank, (raw, device))| Self {
                raw: Mutex::new(raw),
                aborted: AtomicBool::new(false),
                device,
                rank,
                size: devices.len(),
            })
            .collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device ordinal this rank runs on.
    pub fn device_id(&self) -> u32 {
        self.device.id()
    }

    /// Aborts the communicator (`ncclCommAbort`): NCCL work it has queued stops, so a
    /// stream or an array waiting on a send or receive whose peer died or never calls
    /// completes, and every later call on it fails with [`NcclError::Aborted`]. Safe from
    /// any thread, also while another waits on this communicator's work; a second call
    /// does nothing. The arrays its unfinished operations were writing hold garbage: check
    /// [`Comm::is_aborted`] after a wait before trusting what arrived. The other ranks
    /// must abort theirs too (their work on it can no longer complete).
    pub fn abort(&self) -> Result<()> {
        let lib = lib::load(None)?;
        let _ctx = self.device.bind()?;
        let mut raw = self.raw.lock().unwrap_or_else(PoisonError::into_inner);
        if raw.is_null() {
            return Ok(());
        }
        self.aborted.store(true, Ordering::Release);
        let comm = std::mem::replace(&mut *raw, std::ptr::null_mut());
        // SAFETY: the handle is live, and null afterwards: no call uses it again (every
        // use holds this lock and checks for null).
        let r = unsafe { (lib.comm_abort)(comm) };
        lib.check("ncclCommAbort", r, std::ptr::null_mut())
    }

    /// Whether [`Comm::abort`] ran (from any thread).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// `recv` = the reduction over ranks of `send` (same dtype and size on every rank).
    pub fn all_reduce(
        &self,
        send: &RawArray,
        recv: &mut RawArray,
        op: ReduceOp,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let call = "ncclAllReduce";
        let ty = reduce_type(send.dtype(), call)?;
        same_layout(call, send, recv, 1, 1)?;
        self.two(call, send, recv, stream, |lib, s, r, comm, st| {
            let count = send.len() as usize;
            // SAFETY: both buffers hold `count` elements of `ty` on this device.
            unsafe { (lib.all_reduce)(s, r, count, ty, op.raw(), comm, st) }
        })
    }

    /// Reduces `a` over ranks in place.
    pub fn all_reduce_in_place(
        &self,
        a: &mut RawArray,
        op: ReduceOp,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let call = "ncclAllReduce";
        let ty = reduce_type(a.dtype(), call)?;
        let count = a.len() as usize;
        self.one(call, a, stream, |lib, p, comm, st| {
            // SAFETY: the buffer holds `count` elements of `ty`; in place is allowed.
            unsafe { (lib.all_reduce)(p, p, count, ty, op.raw(), comm, st) }
        })
    }

    /// `recv` = every rank's `send`, concatenated in rank order (`recv` holds
    /// `size` times `send`'s bytes).
    pub fn all_gather(
        &self,
        send: &RawArray,
        recv: &mut RawArray,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let call = "ncclAllGather";
        same_layout(call, send, recv, 1, self.size)?;
        let bytes = send.nbytes();
        self.two(call, send, recv, stream, |lib, s, r, comm, st| {
            // SAFETY: `send` holds `bytes` bytes, `recv` size times that (checked).
            unsafe { (lib.all_gather)(s, r, bytes, ncclDataType_t::ncclUint8, comm, st) }
        })
    }

    /// `recv` = this rank's block of the reduction over ranks of `send` (`send` holds
    /// `size` blocks the size of `recv`).
    pub fn reduce_scatter(
        &self,
        send: &RawArray,
        recv: &mut RawArray,
        op: ReduceOp,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let call = "ncclReduceScatter";
        let ty = reduce_type(send.dtype(), call)?;
        same_layout(call, send, recv, self.size, 1)?;
        let count = recv.len() as usize;
        self.two(call, send, recv, stream, |lib, s, r, comm, st| {
            // SAFETY: `recv` holds `count` elements, `send` size times that (checked).
            unsafe { (lib.reduce_scatter)(s, r, count, ty, op.raw(), comm, st) }
        })
    }

    /// Copies `a` of rank `root` into `a` of every other rank.
    pub fn broadcast(
        &self,
        a: &mut RawArray,
        root: usize,
        stream: Option<StreamRef>,
    ) -> Result<()> {
        let call = "ncclBroadcast";
        let root = self.peer(call, root)?;
        let bytes = a.nbytes();
        self.one(call, a, stream, |lib, p, comm, st| {
            // SAFETY: the buffer holds `bytes` bytes; in place is allowed.
            unsafe { (lib.broadcast)(p, p, bytes, ncclDataType_t::ncclUint8, root, comm, st) }
        })
    }

    /// Sends `a` to rank `peer`, which calls [`recv`](Self::recv) with an array of the same
    /// size. Pair sends and receives between two ranks inside a [`group`] when both
    /// directions run at once.
    pub fn send(&self, a: &RawArray, peer: usize, stream: Option<StreamRef>) -> Result<()> {
        let call = "ncclSend";
        let peer = self.peer(call, peer)?;
        let bytes = a.nbytes();
        let op = self.on(call, a, stream, |lib, p, comm, st| {
            // SAFETY: the buffer holds `bytes` bytes on this device; NCCL only reads it.
            unsafe { (lib.send)(p, bytes, ncclDataType_t::ncclUint8, peer, comm, st) }
        })?;
        Ok(a.was_read(&op)?)
    }

    /// Receives into `a` what rank `peer` sends.
    pub fn recv(&self, a: &mut RawArray, peer: usize, stream: Option<StreamRef>) -> Result<()> {
        let call = "ncclRecv";
        let peer = self.peer(call, peer)?;
        let bytes = a.nbytes();
        self.one(call, a, stream, |lib, p, comm, st| {
            // SAFETY: the buffer holds `bytes` bytes on this device.
            unsafe { (lib.recv)(p, bytes, ncclDataType_t::ncclUint8, peer, comm, st) }
        })
    }

    fn peer(&self, call: &'static str, peer: usize) -> Result<c_int> {
        if peer >= self.size {
            return Err(NcclError::Call {
                call,
                reason: format!(
                    "rank {peer} is not in this communicator of {} ranks",
                    self.size
                ),
            });
        }
        to_int(peer, call)
    }

    /// Runs `f` with the communicator and the device bound, checking its result.
    fn enqueue(
        &self,
        call: &'static str,
        f: impl FnOnce(&lib::Lib, ncclComm_t) -> c_int,
    ) -> Result<()> {
        let _nvtx = crate::nvtx::range(nvtx_name(call), None);
        let lib = lib::load(None)?;
        let _ctx = self.device.bind()?;
        let comm = self.raw.lock().unwrap_or_else(PoisonError::into_inner);
        if comm.is_null() {
            return Err(NcclError::Aborted { call });
        }
        let r = f(lib, *comm);
        lib.check(call, r, *comm)
    }

    /// Enqueues `f` on `a`'s device buffer after its pending work; the caller records
    /// the returned operation as a read or a write of `a`.
    fn on(
        &self,
        call: &'static str,
        a: &RawArray,
        stream: Option<StreamRef>,
        f: impl FnOnce(&lib::Lib, *mut std::ffi::c_void, ncclComm_t, lib::RawStream) -> c_int,
    ) -> Result<Enqueued> {
        let device = self.device.id();
        let st = a.stream_for(stream, device);
        let buf = a.operand_on(call, device, st, None)?;
        self.enqueue(call, |lib, comm| {
            f(lib, buf.device_ptr() as *mut _, comm, st.cu() as _)
        })?;
        Ok(Enqueued::new(st, self.device.clone()))
    }

    /// A collective writing one array in place.
    fn one(
        &self,
        call: &'static str,
        a: &mut RawArray,
        stream: Option<StreamRef>,
        f: impl FnOnce(&lib::Lib, *mut std::ffi::c_void, ncclComm_t, lib::RawStream) -> c_int,
    ) -> Result<()> {
        let op = self.on(call, a, stream, f)?;
        Ok(a.wrote(op)?)
    }

    /// A collective reading `send` and writing `recv`.
    fn two(
        &self,
        call: &'static str,
        send: &RawArray,
        recv: &mut RawArray,
        stream: Option<StreamRef>,
        f: impl FnOnce(
            &lib::Lib,
            *const std::ffi::c_void,
            *mut std::ffi::c_void,
            ncclComm_t,
            lib::RawStream,
        ) -> c_int,
    ) -> Result<()> {
        let device = self.device.id();
        let st = recv.stream_for(stream, device);
        let s = send.operand_on(call, device, st, None)?;
        let r = recv.operand_on(call, device, st, None)?;
        self.enqueue(call, |lib, comm| {
            f(
                lib,
                s.device_ptr() as *const _,
                r.device_ptr() as *mut _,
                comm,
                st.cu() as _,
            )
        })?;
        send.was_read(&Enqueued::new(st, self.device.clone()))?;
        Ok(recv.wrote(Enqueued::new(st, self.device.clone()))?)
    }
}

/// The NVTX range name of an NCCL call.
fn nvtx_name(call: &str) -> &'static std::ffi::CStr {
    match call {
        "ncclAllReduce" => c"memarray.nccl.all_reduce",
        "ncclAllGather" => c"memarray.nccl.all_gather",
        "ncclReduceScatter" => c"memarray.nccl.reduce_scatter",
        "ncclBroadcast" => c"memarray.nccl.broadcast",
        "ncclSend" => c"memarray.nccl.send",
        "ncclRecv" => c"memarray.nccl.recv",
        _ => c"memarray.nccl",
    }
}

/// Runs `f` between `ncclGroupStart` and `ncclGroupEnd`: the collectives it issues (on
/// several communicators of one process, or paired sends and receives) are launched
/// together when it returns. The group is ended even when `f` fails.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    group_start()?;
    let out = f();
    let end = group_end();
    let out = out?;
    end?;
    Ok(out)
}

/// `ncclGroupStart` (groups nest; per thread). Pair it with [`group_end`] on the same
/// thread; prefer [`group`], which cannot miss the end.
pub fn group_start() -> Result<()> {
    let lib = lib::load(None)?;
    // SAFETY: no arguments.
    lib.check(
        "ncclGroupStart",
        unsafe { (lib.group_start)() },
        std::ptr::null_mut(),
    )
}

/// `ncclGroupEnd`: launches what was issued since the matching [`group_start`].
pub fn group_end() -> Result<()> {
    let lib = lib::load(None)?;
    // SAFETY: no arguments; NCCL reports an unmatched end as an error.
    lib.check(
        "ncclGroupEnd",
        unsafe { (lib.group_end)() },
        std::ptr::null_mut(),
    )
}

/// Checks that `send` and `recv` have one dtype and `recv` holds `send`'s elements times
/// `recv_blocks / send_blocks`, and are distinct arrays.
fn same_layout(
    call: &'static str,
    send: &RawArray,
    recv: &RawArray,
    send_blocks: usize,
    recv_blocks: usize,
) -> Result<()> {
    if send.dtype() != recv.dtype() {
        return Err(NcclError::Call {
            call,
            reason: format!("send is {} but recv is {}", send.dtype(), recv.dtype()),
        });
    }
    let (s, r) = (send.len() as u128, recv.len() as u128);
    if s * recv_blocks as u128 != r * send_blocks as u128 {
        return Err(NcclError::Call {
            call,
            reason: format!(
                "send has {s} elements and recv {r}; {call} needs recv = send{}",
                match (send_blocks, recv_blocks) {
                    (1, 1) => String::new(),
                    (1, n) => format!(" x {n} ranks"),
                    (n, _) => format!(" / {n} ranks"),
                }
            ),
        });
    }
    Ok(())
}

fn to_int(v: usize, call: &'static str) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| NcclError::Call {
        call,
        reason: format!("{v} does not fit NCCL's int"),
    })
}

#[cfg(test)]
mod tests;
