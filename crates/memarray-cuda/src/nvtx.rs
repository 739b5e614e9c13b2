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
//! refusing) every call is one atomic load and a branch; `MEMARRAY_NVTX=0` (or `off`,
//! `false`, `no`) turns NVTX off even under a tool.
//!
//! With a tool that also takes NVTX's memory extension (`InitializeInjectionNvtxExtension`),
//! [`heap_register`] / [`region_register`] and their inverses describe a sub-allocator's
//! memory: each upstream allocation of memarray's caching pools is a heap, each block it
//! hands out a region in it, so the tool attributes pool memory.
//!
//! [`range`] pushes a named range (with a byte count as its payload, for moves and
//! allocations) that the returned guard pops; ranges nest per thread, as NVTX's push/pop
//! ranges do. [`mark`] records an instant.
//!
//! # Example
//!
//! ```
//! use memarray_cuda::nvtx;
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
/// `MEMARRAY_NVTX=0` (or any off word of [`memarray_core::env`]) keeps NVTX off under a tool.
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
    mem: Option<Mem>,
}

// NVTX's memory extension (nvToolsExtMem.h, compatibility id 0x0102): module 1, one
// segment of 16 function slots. The segment starts at callback id 1
// (`NVTX3EXT_MEM_FN_IDX_FIRST`, nvtxExtImplMem_v1.h), so callback id `i` is slot `i - 1`:
// a tool (compute-sanitizer) fills them so, and reading slot `i` calls the next function
// (nvtxMemHeapUnregister where nvtxMemHeapRegister was meant).
const MEM_MODULE: u16 = 1;
const MEM_COMPAT: u16 = 0x0102;
const MEM_SLOTS: usize = 16;
const MEM_FIRST_CALLBACK: usize = 1;
const MEM_HEAP_REGISTER: usize = mem_slot(1);
const MEM_HEAP_UNREGISTER: usize = mem_slot(2);
const MEM_REGIONS_REGISTER: usize = mem_slot(4);
const MEM_REGIONS_UNREGISTER: usize = mem_slot(6);

/// The segment slot of the memory extension's callback id `id`.
const fn mem_slot(id: usize) -> usize {
    id - MEM_FIRST_CALLBACK
}
const MEM_HEAP_USAGE_SUB_ALLOCATOR: u32 = 1;
/// `NVTX_MEM_HEAP_HANDLE_NO_TOOL`.
const MEM_HEAP_NO_TOOL: usize = usize::MAX;
const MEM_TYPE_VIRTUAL_ADDRESS: u32 = 1;
const MEM_REGION_REF_POINTER: u32 = 1;

#[repr(C)]
struct ExtSegment {
    segment_id: usize,
    slot_count: usize,
    slots: *mut usize,
}

#[repr(C)]
struct ExtModuleInfo {
    nvtx_version: u16,
    struct_size: u16,
    module_id: u16,
    compat_id: u16,
    segments_count: usize,
    segments: *mut ExtSegment,
    get_export_function: *const c_void,
    ext_info: *const c_void,
}

/// `nvtxMemVirtualRangeDesc_t`.
#[repr(C)]
struct VirtualRange {
    size: usize,
    ptr: *const c_void,
}

/// `nvtxMemHeapDesc_t` (48 bytes).
#[repr(C)]
struct HeapDesc {
    compat_id: u16,
    struct_size: u16,
    reserved0: u32,
    usage: u32,
    kind: u32,
    desc_size: usize,
    desc: *const c_void,
    category: u32,
    message_type: u32,
    message: *const c_char,
}

/// `nvtxMemRegionsRegisterBatch_t`.
#[repr(C)]
struct RegionsRegister {
    compat_id: u16,
    struct_size: u16,
    region_type: u32,
    heap: *mut c_void,
    count: usize,
    element_size: usize,
    elements: *const VirtualRange,
    handles_out: *mut *mut c_void,
}

/// `nvtxMemRegionsUnregisterBatch_t` (its references are pointers).
#[repr(C)]
struct RegionsUnregister {
    compat_id: u16,
    struct_size: u16,
    ref_type: u32,
    count: usize,
    element_size: usize,
    elements: *const *const c_void,
}

type ExtInitialize = unsafe extern "C" fn(*mut ExtModuleInfo) -> c_int;
type HeapRegister = unsafe extern "C" fn(*mut c_void, *const HeapDesc) -> *mut c_void;
type HeapUnregister = unsafe extern "C" fn(*mut c_void, *mut c_void);
type RegionsRegisterFn = unsafe extern "C" fn(*mut c_void, *const RegionsRegister);
type RegionsUnregisterFn = unsafe extern "C" fn(*mut c_void, *const RegionsUnregister);

/// The memory extension's functions memarray calls (all four, or none).
struct Mem {
    heap_register: HeapRegister,
    heap_unregister: HeapUnregister,
    regions_register: RegionsRegisterFn,
    regions_unregister: RegionsUnregisterFn,
}

/// Offers the tool NVTX's memory extension; its functions when it takes all four.
///
/// # Safety
/// `lib` is the tool's loaded library handle.
#[cfg(unix)]
unsafe fn load_mem(lib: *mut c_void) -> Option<Mem> {
    // SAFETY: dlsym on the tool's handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(lib, c"InitializeInjectionNvtxExtension".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    // SAFETY: NVTX's documented signature for this entry point.
    let init = unsafe { std::mem::transmute::<*mut c_void, ExtInitialize>(sym) };
    // The tool may keep pointers into these: they live for the process.
    let slots: &'static mut [usize] = Box::leak(vec![0usize; MEM_SLOTS].into_boxed_slice());
    let segment = Box::leak(Box::new(ExtSegment {
        segment_id: 1,
        slot_count: MEM_SLOTS,
        slots: slots.as_mut_ptr(),
    }));
    let mut module = ExtModuleInfo {
        nvtx_version: NVTX_VERSION as u16,
        struct_size: std::mem::size_of::<ExtModuleInfo>() as u16,
        module_id: MEM_MODULE,
        compat_id: MEM_COMPAT,
        segments_count: 1,
        segments: segment,
        get_export_function: std::ptr::null(),
        ext_info: std::ptr::null(),
    };
    // SAFETY: a module description whose slots stay valid for the process.
    if unsafe { init(&mut module) } == 0 {
        return None;
    }
    // SAFETY: the tool wrote its functions (of the slots' types) into these slots; a
    // plain read after its initialisation returned, on this thread.
    let read = |i: usize| unsafe { std::ptr::read_volatile(segment.slots.add(i)) };
    let (hr, hu, rr, ru) = (
        read(MEM_HEAP_REGISTER),
        read(MEM_HEAP_UNREGISTER),
        read(MEM_REGIONS_REGISTER),
        read(MEM_REGIONS_UNREGISTER),
    );
    // NVTX's "no function" markers are 0 and small sentinels, never a function's address.
    if [hr, hu, rr, ru].iter().any(|&f| f < 4096) {
        return None;
    }
    // SAFETY: each is the tool's function of the slot's type (checked present above).
    unsafe {
        Some(Mem {
            heap_register: std::mem::transmute::<usize, HeapRegister>(hr),
            heap_unregister: std::mem::transmute::<usize, HeapUnregister>(hu),
            regions_register: std::mem::transmute::<usize, RegionsRegisterFn>(rr),
            regions_unregister: std::mem::transmute::<usize, RegionsUnregisterFn>(ru),
        })
    }
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

/// Whether [`ENV`] lets a tool load: unset, empty or an on word ([`memarray_core::env`]). An off
/// word turns NVTX off, and so does a value not understood (not UTF-8 included), which a
/// front end refuses when it starts (memarray-cuda's `check_env`).
fn enabled() -> bool {
    match std::env::var(ENV) {
        Err(std::env::VarError::NotPresent) => true,
        Ok(v) => matches!(memarray_core::env::parse_switch(&v), Ok(None | Some(true))),
        Err(std::env::VarError::NotUnicode(_)) => false,
    }
}

/// Loads the tool named by [`INJECTION_ENV`] and lets it fill the slots; None without one.
#[cfg(unix)]
fn load() -> Option<Tool> {
    if !enabled() {
        return None;
    }
    let path = std::env::var_os(INJECTION_ENV)?;
    let path =
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    // SAFETY: dlopen/dlsym with a NUL-terminated path and symbol name; the library stays
    // loaded for the process (never dlclosed), so the functions it gave stay valid.
    let (lib, init): (*mut c_void, Initialize) = unsafe {
        let lib = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY);
        if lib.is_null() {
            return None;
        }
        let sym = libc::dlsym(lib, c"InitializeInjectionNvtx2".as_ptr());
        if sym.is_null() {
            return None;
        }
        (lib, std::mem::transmute::<*mut c_void, Initialize>(sym))
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
    let func = |i: usize| Some(slot(i)).filter(|&f| f != 0);
    // SAFETY: the tool's library handle, loaded above and never closed.
    let mem = unsafe { load_mem(lib) };
    Some(Tool {
        domain,
        mem,
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

fn mem() -> Option<(&'static Mem, *mut c_void)> {
    if off() {
        return None;
    }
    tool().and_then(|t| t.mem.as_ref().map(|m| (m, t.domain as *mut c_void)))
}

/// Whether the tool took NVTX's memory extension (heaps and regions are then described).
#[inline]
pub fn mem_active() -> bool {
    !off() && mem().is_some()
}

/// Describes `[ptr, ptr + size)` as a sub-allocator's heap; returns its handle for
/// [`region_register`] and [`heap_unregister`] (0 without a tool that takes heaps, or when
/// the tool refused the heap).
///
/// compute-sanitizer refuses a heap ("the object is not ready") unless a CUDA context is
/// current on the calling thread: callers bind the memory's device first.
pub fn heap_register(ptr: usize, size: usize) -> usize {
    let Some((m, domain)) = mem() else {
        return 0;
    };
    let range = VirtualRange {
        size,
        ptr: ptr as *const c_void,
    };
    let desc = HeapDesc {
        compat_id: MEM_COMPAT,
        struct_size: std::mem::size_of::<HeapDesc>() as u16,
        reserved0: 0,
        usage: MEM_HEAP_USAGE_SUB_ALLOCATOR,
        kind: MEM_TYPE_VIRTUAL_ADDRESS,
        desc_size: std::mem::size_of::<VirtualRange>(),
        desc: &range as *const VirtualRange as *const c_void,
        category: 0,
        message_type: MESSAGE_ASCII as u32,
        message: c"memarray pool".as_ptr(),
    };
    // SAFETY: the tool's nvtxMemHeapRegister with its domain and a valid description.
    let heap = unsafe { (m.heap_register)(domain, &desc) as usize };
    // A refusal comes back as null, or as NVTX's "no tool" handle (-1).
    if heap == MEM_HEAP_NO_TOOL { 0 } else { heap }
}

/// Ends a heap from [`heap_register`] (nothing for 0).
pub fn heap_unregister(heap: usize) {
    if heap == 0 {
        return;
    }
    if let Some((m, domain)) = mem() {
        // SAFETY: the tool's nvtxMemHeapUnregister with a heap it returned.
        unsafe { (m.heap_unregister)(domain, heap as *mut c_void) };
    }
}

/// Describes the block `[ptr, ptr + size)` handed out from `heap` (a handle from
/// [`heap_register`]; nothing for 0) as a region.
#[inline]
pub fn region_register(heap: usize, ptr: usize, size: usize) {
    if !off() && heap != 0 {
        register_region(heap, ptr, size);
    }
}

#[cold]
fn register_region(heap: usize, ptr: usize, size: usize) {
    let Some((m, domain)) = mem() else {
        return;
    };
    let range = VirtualRange {
        size,
        ptr: ptr as *const c_void,
    };
    let batch = RegionsRegister {
        compat_id: MEM_COMPAT,
        struct_size: std::mem::size_of::<RegionsRegister>() as u16,
        region_type: MEM_TYPE_VIRTUAL_ADDRESS,
        heap: heap as *mut c_void,
        count: 1,
        element_size: std::mem::size_of::<VirtualRange>(),
        elements: &range,
        handles_out: std::ptr::null_mut(),
    };
    // SAFETY: the tool's nvtxMemRegionsRegister with a valid one-element batch.
    unsafe { (m.regions_register)(domain, &batch) };
}

/// Ends the region that starts at `ptr`.
#[inline]
pub fn region_unregister(ptr: usize) {
    if !off() {
        unregister_region(ptr);
    }
}

#[cold]
fn unregister_region(ptr: usize) {
    let Some((m, domain)) = mem() else {
        return;
    };
    let pointer = ptr as *const c_void;
    let batch = RegionsUnregister {
        compat_id: MEM_COMPAT,
        struct_size: std::mem::size_of::<RegionsUnregister>() as u16,
        ref_type: MEM_REGION_REF_POINTER,
        count: 1,
        element_size: std::mem::size_of::<*const c_void>(),
        elements: &pointer,
    };
    // SAFETY: the tool's nvtxMemRegionsUnregister with a valid one-element batch.
    unsafe { (m.regions_unregister)(domain, &batch) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_struct_is_nvtx_version_three() {
        assert_eq!(std::mem::size_of::<HeapDesc>(), 48);
        assert_eq!(std::mem::offset_of!(HeapDesc, desc), 24);
        assert_eq!(std::mem::size_of::<RegionsRegister>(), 48);
        assert_eq!(std::mem::size_of::<ExtModuleInfo>(), 40);
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
