//! libnccl, loaded at run time: the one place raw NCCL calls live.
//!
//! The entry points are declared with cudarc's NCCL types (`cudarc::nccl::sys`), but loaded
//! here rather than through cudarc's loader: cudarc looks only for `libnccl.so` and
//! `libnccl.so.<cuda major>`, while NCCL ships as `libnccl.so.2` (pip's `nvidia-nccl-cu13`
//! puts it in `site-packages/nvidia/nccl/lib`, off the loader path), and cudarc panics when
//! it finds nothing. Results are read as plain integers, never as cudarc's Rust enum, so an
//! NCCL newer than the bindings cannot hand back an invalid enum value.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use super::error::{NcclError, Result};

/// `cudaStream_t` as NCCL takes it (the driver's `CUstream`, the same handle).
pub(crate) type RawStream = *mut c_void;

type Res = c_int;
type Coll = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    RawStream,
) -> Res;

/// The NCCL entry points memarray uses.
pub(crate) struct Lib {
    pub path: PathBuf,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    pub get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> Res,
    pub comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> Res,
    pub comm_init_all: unsafe extern "C" fn(*mut ncclComm_t, c_int, *const c_int) -> Res,
    pub comm_destroy: unsafe extern "C" fn(ncclComm_t) -> Res,
    pub comm_abort: unsafe extern "C" fn(ncclComm_t) -> Res,
    pub get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    pub get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    pub all_reduce: Coll,
    pub reduce_scatter: Coll,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        RawStream,
    ) -> Res,
    pub broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        RawStream,
    ) -> Res,
    pub send: unsafe extern "C" fn(
        *const c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        RawStream,
    ) -> Res,
    pub recv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        RawStream,
    ) -> Res,
    pub group_start: unsafe extern "C" fn() -> Res,
    pub group_end: unsafe extern "C" fn() -> Res,
    /// Keeps the symbols above valid: never unloaded (the table is a process-wide static).
    _lib: libloading::Library,
}

static LIB: OnceLock<Lib> = OnceLock::new();
/// Serialises loading, so two threads never load two copies.
static LOADING: Mutex<()> = Mutex::new(());

/// The names tried when no path is given, after `MEMARRAY_NCCL_LIBRARY`.
const DEFAULT_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Loads libnccl from `path` (or, when `None`, from `MEMARRAY_NCCL_LIBRARY`, then
/// `libnccl.so.2` and `libnccl.so` on the loader path). Once one is loaded, later calls
/// return it whatever they name. A failure is not remembered: a later call may name
/// another path.
pub(crate) fn load(path: Option<&Path>) -> Result<&'static Lib> {
    if let Some(lib) = LIB.get() {
        return Ok(lib);
    }
    let _guard = LOADING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(lib) = LIB.get() {
        return Ok(lib);
    }
    let candidates: Vec<PathBuf> = match (path, std::env::var_os("MEMARRAY_NCCL_LIBRARY")) {
        (Some(p), _) => vec![p.to_path_buf()],
        (None, Some(env)) if !env.is_empty() => vec![PathBuf::from(env)],
        _ => DEFAULT_NAMES.iter().map(PathBuf::from).collect(),
    };
    let mut tried = Vec::new();
    for c in &candidates {
        // SAFETY: loading libnccl runs its initialisers, as any program linking it does.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                // SAFETY: the symbols are NCCL's public C API with the signatures above
                // (nccl.h, stable since NCCL 2.0; ncclGetLastError since 2.13).
                let table = unsafe { resolve(lib, c.clone()) }?;
                return Ok(LIB.get_or_init(|| table));
            }
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(NcclError::Unavailable {
        reason: format!("could not load libnccl ({})", tried.join("; ")),
    })
}

/// The loaded library, if any (no load attempted).
pub(crate) fn loaded() -> Option<&'static Lib> {
    LIB.get()
}

/// # Safety
/// `lib` is an NCCL library whose symbols have the C signatures of nccl.h.
unsafe fn resolve(lib: libloading::Library, path: PathBuf) -> Result<Lib> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the caller promises nccl.h's signature for this symbol; the copied
            // function pointer stays valid while `lib` (moved into the table) is loaded.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                NcclError::Unavailable {
                    reason: format!(
                        "{} has no {} ({e}); memarray needs NCCL >= 2.13",
                        path.display(),
                        $name
                    ),
                }
            })?;
            *s
        }};
    }
    Ok(Lib {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_init_all: sym!("ncclCommInitAll"),
        comm_destroy: sym!("ncclCommDestroy"),
        comm_abort: sym!("ncclCommAbort"),
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: sym!("ncclGetLastError"),
        all_reduce: sym!("ncclAllReduce"),
        reduce_scatter: sym!("ncclReduceScatter"),
        all_gather: sym!("ncclAllGather"),
        broadcast: sym!("ncclBroadcast"),
        send: sym!("ncclSend"),
        recv: sym!("ncclRecv"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        path,
        _lib: lib,
    })
}

impl Lib {
    /// `Ok` for ncclSuccess; otherwise [`NcclError::Call`] with NCCL's error string and
    /// its last-error text (for `comm`, or the thread's last error when null).
    pub(crate) fn check(&self, call: &'static str, r: Res, comm: ncclComm_t) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated static or per-communicator strings,
                // read at once.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: both take any result code / a live or null communicator.
        let name = text(unsafe { (self.get_error_string)(r) });
        // SAFETY: as above.
        let last = text(unsafe { (self.get_last_error)(comm) });
        let mut reason = format!("error {r} ({name})");
        if !last.is_empty() {
            reason.push_str(": ");
            reason.push_str(&last);
        }
        Err(NcclError::Call { call, reason })
    }

    /// NCCL's version as `major.minor.patch`.
    pub(crate) fn version(&self) -> Result<(u32, u32, u32)> {
        let mut v: c_int = 0;
        // SAFETY: the out pointer is valid.
        let r = unsafe { (self.get_version)(&mut v) };
        self.check("ncclGetVersion", r, std::ptr::null_mut())?;
        let v = v as u32;
        // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
        Ok((v / 10000, (v % 10000) / 100, v % 100))
    }
}
