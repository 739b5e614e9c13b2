//! The small-copy kernel (`kernels-cuda/src/copy_many.cu`, its PTX committed in
//! `copy/ptx/`): loaded once per device through the crate's one kernel loader
//! ([`Module`](crate::module::Module)), and its launch over a table of copies passed by
//! value (no upload: a launch is one driver call).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use crate::device::Device;
use crate::driver;
use crate::error::Result;
use crate::module::{Function, Module};
use crate::per_device::PerDevice;
use crate::stream::StreamRef;

use super::TABLE_MAX;

/// The kernel's PTX text.
const PTX: &str = include_str!("../ptx/copy_many.ptx");

/// Threads per block: one block per copy, 16 bytes a thread per pass (4 KiB a pass).
const BLOCK: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Entry {
    dst: u64,
    src: u64,
    len: u64,
}

/// `CopyTable` in `copy_many.cu`: the kernel's one parameter.
#[repr(C)]
struct Table {
    n: u32,
    pad: u32,
    e: [Entry; TABLE_MAX],
}

static KERNELS: PerDevice<OnceLock<Option<Function>>> = PerDevice::new();

/// `device`'s kernel, loaded on first use and kept for the process; `None` where the
/// driver refuses it (the copies then go to the driver).
pub(super) fn kernel(device: &Arc<Device>) -> Option<&'static Function> {
    KERNELS
        .get(device.id())
        .get_or_init(|| {
            Module::load(device, PTX.as_bytes())
                .ok()?
                .function("copy_many")
                .ok()
        })
        .as_ref()
}

/// Launches the kernel over the copies `which` (at most [`TABLE_MAX`]).
///
/// # Safety
/// As `copy_many`'s items 1 and 2, for those copies.
pub(super) unsafe fn launch(
    f: &Function,
    stream: StreamRef,
    dsts: &[u64],
    srcs: &[u64],
    lens: &[usize],
    which: &[usize],
) -> Result<()> {
    let mut table = Box::new(Table {
        n: 0,
        pad: 0,
        e: [Entry::default(); TABLE_MAX],
    });
    for (slot, &i) in table.e.iter_mut().zip(which) {
        *slot = Entry {
            dst: dsts[i],
            src: srcs[i],
            len: lens[i] as u64,
        };
    }
    table.n = which.len().min(TABLE_MAX) as u32;
    let mut params = [std::ptr::from_mut(&mut *table).cast::<c_void>()];
    // SAFETY: the function takes one `CopyTable`, laid out as `Table` (repr(C), the same
    // fields; at most TABLE_MAX entries filled); the caller keeps every range live until
    // the kernel has run and made the context current. The driver copies the parameter
    // during the call.
    unsafe { driver::launch_kernel(f.raw, table.n, BLOCK, stream.cu(), &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_kernels_parameter() {
        // copy_many.cu's CopyTable: two u32, then COPY_MANY_MAX entries of three u64.
        assert_eq!(std::mem::size_of::<Table>(), 8 + TABLE_MAX * 24);
        let entry = format!(
            ".param .align 8 .b8 copy_many_param_0[{}]",
            8 + TABLE_MAX * 24
        );
        assert!(
            PTX.contains(&entry),
            "the committed PTX's parameter is not {entry}"
        );
        assert!(PTX.contains(".target sm_75"));
        assert!(PTX.contains(".version 9.0"), "PTX ISA 9.0 (driver 580)");
    }
}
