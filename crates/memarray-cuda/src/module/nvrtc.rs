//! NVRTC, loaded by memarray: CUDA C++ source to PTX at run time, for
//! [`crate::launch::Module::from_cuda_source`].
//!
//! The library is found as NCCL's is: `MEMARRAY_NVRTC_LIBRARY`, else `libnvrtc.so.13`,
//! `libnvrtc.so.12`, `libnvrtc.so` on the loader path and in `/usr/local/cuda/lib64`.
//! cudarc's loader tries other names and panics when none loads; without NVRTC memarray
//! returns [`CudaError::Unavailable`] naming what it tried.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::error::{CudaError, LaunchError, Result};

type Program = *mut std::ffi::c_void;
type Res = c_int;

struct Lib {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Res,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Res,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Res,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Res,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Res,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Res,
    destroy: unsafe extern "C" fn(*mut Program) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// Keeps the symbols valid: never unloaded (a process-wide static).
    _lib: libloading::Library,
}

static LIB: OnceLock<Lib> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

fn candidates() -> Vec<PathBuf> {
    match std::env::var_os("MEMARRAY_NVRTC_LIBRARY") {
        Some(p) if !p.is_empty() => vec![PathBuf::from(p)],
        _ => [
            "libnvrtc.so.13",
            "libnvrtc.so.12",
            "libnvrtc.so",
            "/usr/local/cuda/lib64/libnvrtc.so",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
    }
}

fn load() -> Result<&'static Lib> {
    if let Some(l) = LIB.get() {
        return Ok(l);
    }
    let _g = LOADING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(l) = LIB.get() {
        return Ok(l);
    }
    let lib = load_from(&candidates())?;
    Ok(LIB.get_or_init(|| lib))
}

fn load_from(paths: &[PathBuf]) -> Result<Lib> {
    let mut tried = Vec::new();
    for p in paths {
        // SAFETY: loading libnvrtc runs its initialisers, as linking it would.
        match unsafe { libloading::Library::new(p) } {
            // SAFETY: the symbols are NVRTC's public C API with nvrtc.h's signatures.
            Ok(lib) => return unsafe { resolve(lib, p) },
            Err(e) => tried.push(format!("{}: {e}", p.display())),
        }
    }
    Err(CudaError::Unavailable {
        reason: format!(
            "NVRTC (CUDA C++ compiled at run time) could not be loaded ({}); install the CUDA \
             toolkit's nvrtc or pip's nvidia-cuda-nvrtc, or set MEMARRAY_NVRTC_LIBRARY to \
             libnvrtc's path; PTX, cubin and fatbin images load without it",
            tried.join("; ")
        ),
    })
}

/// # Safety
/// `lib` is an NVRTC whose symbols have nvrtc.h's signatures.
unsafe fn resolve(lib: libloading::Library, path: &std::path::Path) -> Result<Lib> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the caller promises nvrtc.h's signature; the pointer stays valid
            // while `lib` (moved into the table) is loaded.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                CudaError::Unavailable {
                    reason: format!("{} has no {} ({e})", path.display(), $name),
                }
            })?;
            *s
        }};
    }
    Ok(Lib {
        create: sym!("nvrtcCreateProgram"),
        compile: sym!("nvrtcCompileProgram"),
        ptx_size: sym!("nvrtcGetPTXSize"),
        ptx: sym!("nvrtcGetPTX"),
        log_size: sym!("nvrtcGetProgramLogSize"),
        log: sym!("nvrtcGetProgramLog"),
        destroy: sym!("nvrtcDestroyProgram"),
        error_string: sym!("nvrtcGetErrorString"),
        _lib: lib,
    })
}

impl Lib {
    fn check(&self, call: &str, r: Res) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) }.to_string_lossy();
        Err(CudaError::from(LaunchError::Compile {
            what: "NVRTC",
            detail: format!("{call} failed: {msg}"),
        }))
    }
}

/// Compiles `source` (named `name` in messages) to PTX for compute capability
/// `(major, minor)` with NVRTC `options` (`-I...`, `-D...`, `--std=c++17` ...). A compile
/// error is [`LaunchError::Compile`](crate::LaunchError::Compile) carrying NVRTC's log.
pub(crate) fn compile_to_ptx(
    source: &str,
    name: &str,
    options: &[&str],
    arch: (u32, u32),
) -> Result<Vec<u8>> {
    let lib = load()?;
    let nul = |s: &str, what: &'static str| {
        CString::new(s).map_err(|_| CudaError::InvalidArgument {
            what,
            detail: "contains a NUL byte".into(),
        })
    };
    let src = nul(source, "CUDA source")?;
    let cname = nul(name, "CUDA source name")?;
    let mut opts = vec![nul(
        &format!("--gpu-architecture=compute_{}{}", arch.0, arch.1),
        "NVRTC option",
    )?];
    for o in options {
        opts.push(nul(o, "NVRTC option")?);
    }
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings alive for the call; no headers.
    lib.check("nvrtcCreateProgram", unsafe {
        (lib.create)(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    })?;
    let out = (|| -> Result<Vec<u8>> {
        // SAFETY: prog is live; the options are valid C strings for the call.
        let r = unsafe { (lib.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
        if r != 0 {
            let mut n = 0usize;
            // SAFETY: prog is live; the buffer holds n bytes.
            let log = unsafe {
                (lib.log_size)(prog, &mut n);
                let mut buf = vec![0u8; n.max(1)];
                (lib.log)(prog, buf.as_mut_ptr().cast());
                String::from_utf8_lossy(&buf[..n.saturating_sub(1)]).into_owned()
            };
            return Err(CudaError::from(LaunchError::Compile {
                what: "CUDA source",
                detail: format!("{name} does not compile:\n{log}"),
            }));
        }
        let mut n = 0usize;
        // SAFETY: prog compiled; the buffer holds n bytes (NUL included).
        lib.check("nvrtcGetPTXSize", unsafe { (lib.ptx_size)(prog, &mut n) })?;
        let mut ptx = vec![0u8; n];
        // SAFETY: as above.
        lib.check("nvrtcGetPTX", unsafe {
            (lib.ptx)(prog, ptx.as_mut_ptr().cast())
        })?;
        Ok(ptx)
    })();
    // SAFETY: prog is live and destroyed once.
    unsafe { (lib.destroy)(&mut prog) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_what_was_tried() {
        let err = load_from(&[PathBuf::from("/nonexistent/libnvrtc.so")])
            .err()
            .expect("no such library")
            .to_string();
        assert!(err.contains("/nonexistent/libnvrtc.so"), "{err}");
        assert!(err.contains("MEMARRAY_NVRTC_LIBRARY"), "{err}");
    }
}
