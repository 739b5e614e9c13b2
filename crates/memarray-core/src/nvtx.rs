//! NVTX ranges in a `memarray` domain, for Nsight Systems and any other NVTX tool.
//!
//! NVTX has no library to link: a tool injects itself by naming its library in
//! `NVTX_INJECTION64_PATH` (Nsight does this for the programs it launches), and the
//! program hands the library tables of function-pointer slots for it to fill
//! (`InitializeInjectionNvtx2`, given a `GetExportTable` function). This module is that
//! program side, written against NVTX's documented binary interface (export table ids,
//! callback modules and ids, `nvtxEventAttributes_t` version 3): on first use it reads the
//! variable, loads the library and lets it fill the slots, then creates the `memarray`
//! domain. With no tool (the variable unset, the library missing, or its initialisation
//! refusing) every call is one atomic load and a branch; `MEMARRAY_NVTX=0` turns NVTX off
//! even under a tool.
//!
//! [`range`] pushes a named range (with a byte count as its payload, for moves and
//! allocations) that the returned guard pops; ranges nest per thread, as NVTX's push/pop
//! ranges do. [`mark`] records an instant.
//!
//! # Example
//!
//! ```
//! use memarray_core::nvtx;
//!
//! {
//!     let _r = nvtx::range(c"memarray.example", Some(4096));
//!     // ... work shown in Nsight's timeline under the memarray domain ...
//! }
//! nvtx::mark(c"memarray.example.done", None);
//! ```

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// The environment variable naming the tool's library (NVTX's own name).
pub const INJECTION_ENV: &str = "NVTX_INJECTION64_PATH";
/// `MEMARRAY_NVTX=0` keeps NVTX off under a tool.
pub const ENV: &str = "MEMARRAY_NVTX";

// NVTX's binary interface (nvToolsExt.h, nvtxDetail/nvtxTypes.h, version 3).
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;
const NVTX_VERSION: u32 = 3;
/// Callback modules 1..=6 (CORE, CUDA, OPENCL, CUDART, CORE2, SYNC) and the number of ids
/// each has, index 0 included.
const MODULE_SIZES: [usize; 7] = [0, 16, 9, 15, 7, 16, 7];
const MODULE_CORE2: usize = 5;
const CORE2_MARK_EX: usize = 1;
const CORE2_RANGE_PUSH_EX: usize = 4;
const CORE2_RANGE_POP: usize = 5;
const CORE2_DOMAIN_CREATE_A: usize = 12;
const COLOR_ARGB: i32 = 1;
const PAYLOAD_U64: i32 = 1;
const MESSAGE_ASCII: i32 = 1;

/// `nvtxEventAttributes_t` (version 3, 48 bytes).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}

#[repr(C)]
struct CallbacksTable {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(
        module: c_int,
        out_table: *mut *mut *mut AtomicUsize,
        out_size: *mut u32,
    ) -> c_int,
}

#[repr(C)]
struct VersionTable {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(u32),
}

type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type Initialize = unsafe extern "C" fn(GetExportTable) -> c_int;
type DomainCreate = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type PushEx = unsafe extern "C" fn(*mut c_void, *const EventAttributes) -> c_int;
type Pop = unsafe extern "C" fn(*mut c_void) -> c_int;
type MarkEx = unsafe extern "C" fn(*mut c_void, *const EventAttributes);

/// Each module's slots (what the tool writes its functions into) and the tables of
/// pointers to them NVTX's interface hands out, made once.
struct Slots {
    slots: Vec<Box<[AtomicUsize]>>,
    tables: Vec<Box<[*mut AtomicUsize]>>,
}

// SAFETY: the tables only point into `slots`, which live as long as the Slots (leaked:
// 'static) and are atomics; nothing else is shared.
unsafe impl Send for Slots {}
// SAFETY: as above.
unsafe impl Sync for Slots {}

fn slots() -> &'static Slots {
    static SLOTS: OnceLock<Slots> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let slots: Vec<Box<[AtomicUsize]>> = MODULE_SIZES
            .iter()
            .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
            .collect();
        let tables = slots
            .iter()
            .map(|s| {
                s.iter()
                    .map(|a| a as *const AtomicUsize as *mut AtomicUsize)
                    .collect()
            })
            .collect();
        Slots { slots, tables }
    })
}

unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut *mut *mut AtomicUsize,
    out_size: *mut u32,
) -> c_int {
    let Some(&n) = usize::try_from(module)
        .ok()
        .and_then(|m| MODULE_SIZES.get(m))
    else {
        return 0;
    };
    if n == 0 || out_table.is_null() || out_size.is_null() {
        return 0;
    }
    let s = slots();
    // SAFETY: both out pointers are the tool's, checked non-null; the table lives for the
    // process (Slots is 'static) and its entries point at atomics the tool may write.
    unsafe {
        *out_table = s.tables[module as usize].as_ptr() as *mut *mut AtomicUsize;
        *out_size = n as u32;
    }
    1
}

extern "C" fn set_injection_nvtx_version(_: u32) {}

static CALLBACKS: CallbacksTable = CallbacksTable {
    struct_size: std::mem::size_of::<CallbacksTable>(),
    get_module_function_table,
};

static VERSION: VersionTable = VersionTable {
    struct_size: std::mem::size_of::<VersionTable>(),
    version: NVTX_VERSION,
    reserved0: 0,
    set_injection_nvtx_version,
};

unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => &CALLBACKS as *const CallbacksTable as *const c_void,
        ETID_VERSIONINFO => &VERSION as *const VersionTable as *const c_void,
        _ => std::ptr::null(),
    }
}

/// A tool that took the slots: the `memarray` domain and the functions memarray calls.
struct Tool {
    domain: usize,
    push: Option<PushEx>,
    pop: Option<Pop>,
    mark: Option<MarkEx>,
}

fn slot(index: usize) -> usize {
    slots().slots[MODULE_CORE2][index].load(Ordering::Acquire)
}

static TOOL: OnceLock<Option<Tool>> = OnceLock::new();

/// 0: not looked for yet; 1: no tool; 2: a tool (in `TOOL`).
static STATE: AtomicU8 = AtomicU8::new(0);

/// True when no tool is attached and that is known: the one check on memarray's paths.
#[inline(always)]
fn off() -> bool {
    STATE.load(Ordering::Relaxed) == 1
}

#[cold]
fn tool() -> Option<&'static Tool> {
    let t = TOOL.get_or_init(load).as_ref();
    STATE.store(if t.is_some() { 2 } else { 1 }, Ordering::Relaxed);
    t
}

#[cfg(not(unix))]
fn load() -> Option<Tool> {
    None
}

/// Loads the tool named by [`INJECTION_ENV`] and lets it fill the slots; None without one.
#[cfg(unix)]
fn load() -> Option<Tool> {
    if std::env::var_os(ENV).is_some_and(|v| v == "0") {
        return None;
    }
    let path = std::env::var_os(INJECTION_ENV)?;
    let path =
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    // SAFETY: dlopen/dlsym with a NUL-terminated path and symbol name; the library stays
    // loaded for the process (never dlclosed), so the functions it gave stay valid.
    let init: Initialize = unsafe {
        let lib = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY);
        if lib.is_null() {
            return None;
        }
        let sym = libc::dlsym(lib, c"InitializeInjectionNvtx2".as_ptr());
        if sym.is_null() {
            return None;
        }
        std::mem::transmute::<*mut c_void, Initialize>(sym)
    };
    // SAFETY: the tool's documented entry point, given NVTX's export-table function.
    if unsafe { init(get_export_table) } == 0 {
        return None;
    }
    let create = slot(CORE2_DOMAIN_CREATE_A);
    let domain = if create == 0 {
        0
    } else {
        // SAFETY: the tool wrote a DomainCreateA function into this slot.
        let create: DomainCreate = unsafe { std::mem::transmute::<usize, DomainCreate>(create) };
        // SAFETY: a NUL-terminated name.
        unsafe { create(c"memarray".as_ptr()) as usize }
    };
    let func = |i: usize| (slot(i) != 0).then(|| slot(i));
    Some(Tool {
        domain,
        push: func(CORE2_RANGE_PUSH_EX).map(|f| {
            // SAFETY: a non-zero slot holds the tool's function of the slot's type.
            unsafe { std::mem::transmute::<usize, PushEx>(f) }
        }),
        pop: func(CORE2_RANGE_POP).map(|f| {
            // SAFETY: as above.
            unsafe { std::mem::transmute::<usize, Pop>(f) }
        }),
        mark: func(CORE2_MARK_EX).map(|f| {
            // SAFETY: as above.
            unsafe { std::mem::transmute::<usize, MarkEx>(f) }
        }),
    })
}

/// Whether a tool is attached (loads it on the first call).
pub fn active() -> bool {
    !off() && tool().is_some()
}

fn attributes(name: &'static CStr, bytes: Option<u64>) -> EventAttributes {
    EventAttributes {
        version: NVTX_VERSION as u16,
        size: std::mem::size_of::<EventAttributes>() as u16,
        category: 0,
        color_type: COLOR_ARGB,
        color: 0xff76_b900,
        payload_type: if bytes.is_some() { PAYLOAD_U64 } else { 0 },
        reserved0: 0,
        payload: bytes.unwrap_or(0),
        message_type: MESSAGE_ASCII,
        message: name.as_ptr(),
    }
}

/// A pushed range, popped when dropped (nothing when no tool is attached).
#[must_use = "the range ends when this guard is dropped"]
pub struct Range {
    pop: Option<(Pop, usize)>,
}

impl Drop for Range {
    #[inline]
    fn drop(&mut self) {
        if let Some((pop, domain)) = self.pop {
            // SAFETY: the tool's DomainRangePop, with the domain it made.
            unsafe { pop(domain as *mut c_void) };
        }
    }
}

/// Pushes the range `name` in the `memarray` domain (with `bytes` as its unsigned 64-bit
/// payload) until the guard drops. One atomic load when no tool is attached.
#[inline]
pub fn range(name: &'static CStr, bytes: Option<u64>) -> Range {
    if off() {
        return Range { pop: None };
    }
    push(name, bytes)
}

#[cold]
fn push(name: &'static CStr, bytes: Option<u64>) -> Range {
    let Some(t) = tool() else {
        return Range { pop: None };
    };
    let (Some(push), Some(pop)) = (t.push, t.pop) else {
        return Range { pop: None };
    };
    let attrs = attributes(name, bytes);
    // SAFETY: the tool's DomainRangePushEx with its domain and a valid version-3 struct.
    unsafe { push(t.domain as *mut c_void, &attrs) };
    Range {
        pop: Some((pop, t.domain)),
    }
}

/// Records the instant `name` (with `bytes` as its payload).
#[inline]
pub fn mark(name: &'static CStr, bytes: Option<u64>) {
    if off() {
        return;
    }
    if let Some(mark) = tool().and_then(|t| t.mark.map(|m| (m, t.domain))) {
        let attrs = attributes(name, bytes);
        // SAFETY: the tool's DomainMarkEx with its domain and a valid struct.
        unsafe { mark.0(mark.1 as *mut c_void, &attrs) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_struct_is_nvtx_version_three() {
        assert_eq!(std::mem::size_of::<EventAttributes>(), 48);
        assert_eq!(std::mem::offset_of!(EventAttributes, payload), 24);
        assert_eq!(std::mem::offset_of!(EventAttributes, message), 40);
    }

    #[test]
    fn module_tables_have_nvtxs_sizes_and_refuse_unknown_modules() {
        let mut table = std::ptr::null_mut();
        let mut size = 0;
        let mut ask = |module: c_int| {
            // SAFETY: valid out pointers, as a tool passes them.
            unsafe { get_module_function_table(module, &mut table, &mut size) }
        };
        assert_eq!(ask(5), 1);
        assert_eq!(ask(7), 0);
        assert_eq!(ask(-1), 0);
        assert_eq!(size, 16);
        assert!(!table.is_null());
        // SAFETY: an id NVTX does not define.
        assert!(unsafe { get_export_table(2) }.is_null());
    }
}
