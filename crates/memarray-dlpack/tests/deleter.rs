//! Export deleters: the owner is dropped exactly once, whoever calls the deleter, however
//! often (within the quarantine), on whichever thread; export errors drop the owner too.

mod common;

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;

use common::{counted, host_buffer};
use memarray_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use memarray_dlpack::{
    CoreError, DType, Device, DlpackError, ExportSpec, ImportedTensor, LayoutError,
    call_deleter_unversioned, call_deleter_versioned, export_unversioned, export_versioned,
};

fn spec(shape: Vec<usize>) -> ExportSpec {
    // Never dereferenced by this crate, but imports check that host memory is mapped
    //: 64 KiB that live for the whole test run.
    static BUF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let data =
        *BUF.get_or_init(|| Box::leak(vec![0u64; 8192].into_boxed_slice()).as_mut_ptr() as usize);
    ExportSpec::contiguous(
        data as *mut std::ffi::c_void,
        Device::CPU,
        DType::F32,
        shape,
    )
}

/// Reads the raw struct of an export whose deleter already ran (still pooled memory).
fn read_v(p: NonNull<DLManagedTensorVersioned>) -> DLManagedTensorVersioned {
    // SAFETY: deleted slots stay allocated while in quarantine; the struct is Copy.
    unsafe { *p.as_ptr() }
}

#[test]
fn never_consumed_export_drops_owner_once_and_second_call_is_harmless() {
    let (drops, owner) = counted();
    let p = export_versioned(spec(vec![2, 3]), owner).unwrap();
    // SAFETY: a live export we own.
    unsafe { call_deleter_versioned(p) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    let dead = read_v(p);
    assert!(dead.manager_ctx.is_null(), "dead mark");
    assert!(dead.dl_tensor.shape.is_null() && dead.dl_tensor.strides.is_null());
    assert!(dead.dl_tensor.data.is_null());
    assert!(dead.deleter.is_some(), "deleter stays callable");
    // SAFETY: deleted once, still in quarantine: the repeat is a documented no-op.
    unsafe { call_deleter_versioned(p) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    let (drops, owner) = counted();
    let p = export_unversioned(spec(vec![4]), owner).unwrap();
    // SAFETY: as above.
    unsafe { call_deleter_unversioned(p) };
    // SAFETY: as above.
    unsafe { call_deleter_unversioned(p) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn raw_deleter_field_is_idempotent() {
    // Call through the struct's own function pointer, as a C consumer does.
    let (drops, owner) = counted();
    let p: NonNull<DLManagedTensor> = export_unversioned(spec(vec![]), owner).unwrap();
    // SAFETY: live export.
    let deleter = unsafe { (*p.as_ptr()).deleter }.unwrap();
    for _ in 0..3 {
        // SAFETY: first call ends it, the rest are no-ops within the quarantine.
        unsafe { deleter(p.as_ptr()) };
    }
    // SAFETY: a null pointer is ignored.
    unsafe { deleter(std::ptr::null_mut()) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn import_drop_runs_deleter_once() {
    let (drops, owner) = counted();
    let p = export_versioned(spec(vec![3]), owner).unwrap();
    // SAFETY: fresh export, handed over.
    let t = unsafe { ImportedTensor::from_versioned(p) }.unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(t);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // A late capsule destructor calling again changes nothing.
    // SAFETY: deleted, in quarantine.
    unsafe { call_deleter_versioned(p) };
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn deleter_runs_on_another_thread() {
    let (drops, owner) = counted();
    let p = export_versioned(spec(vec![2, 2]), owner).unwrap();
    // SAFETY: fresh export, handed over.
    let t = unsafe { ImportedTensor::from_versioned(p) }.unwrap();
    thread::spawn(move || drop(t)).join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn concurrent_double_calls_drop_owner_once() {
    struct SendPtr(NonNull<DLManagedTensorVersioned>);
    // SAFETY: the test only passes the address to the thread-safe deleter.
    unsafe impl Send for SendPtr {}
    for _ in 0..200 {
        let (drops, owner) = counted();
        let p = export_versioned(spec(vec![8]), owner).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let b = barrier.clone();
                let sp = SendPtr(p);
                thread::spawn(move || {
                    let sp = sp;
                    b.wait();
                    // SAFETY: four racing calls on a live export: one wins the swap.
                    unsafe { call_deleter_versioned(sp.0) };
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn owner_lives_until_the_deleter_even_if_the_exporter_forgets_it() {
    // The owner holds the memory: dropping every other handle must not free it.
    let (buf, data) = host_buffer(16);
    let drops = Arc::new(());
    let owner = (buf, drops.clone());
    let p = export_versioned(
        ExportSpec::contiguous(data, Device::CPU, DType::U8, vec![16]),
        Box::new(owner),
    )
    .unwrap();
    assert_eq!(Arc::strong_count(&drops), 2);
    // SAFETY: 16 bytes of host memory kept alive by the owner.
    let last = unsafe { *(*p.as_ptr()).dl_tensor.data.cast::<u8>().add(15) };
    assert_eq!(last, 15);
    // SAFETY: live export we own.
    unsafe { call_deleter_versioned(p) };
    assert_eq!(Arc::strong_count(&drops), 1);
}

#[test]
fn panicking_owner_does_not_unwind_into_the_consumer() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("owner drop panics (expected in this test)");
        }
    }
    let p = export_versioned(spec(vec![1]), Box::new(Bomb)).unwrap();
    // SAFETY: live export we own; the panic is caught inside the deleter.
    unsafe { call_deleter_versioned(p) };
    assert!(read_v(p).manager_ctx.is_null());
}

#[test]
fn zero_d_exports_have_valid_non_null_shape_and_strides() {
    let p = export_versioned(spec(vec![]), Box::new(())).unwrap();
    let live = read_v(p);
    assert_eq!(live.dl_tensor.ndim, 0);
    assert!(!live.dl_tensor.shape.is_null() && !live.dl_tensor.strides.is_null());
    // SAFETY: live export we own.
    unsafe { call_deleter_versioned(p) };
}

#[test]
fn exported_struct_fields() {
    let mut s = spec(vec![2, 3]);
    s.read_only = true;
    s.is_copied = true;
    s.byte_offset = 4;
    let p = export_versioned(s, Box::new(())).unwrap();
    let v = read_v(p);
    assert_eq!((v.version.major, v.version.minor), (1, 3));
    assert_eq!(v.flags, 0b11);
    assert_eq!(
        v.manager_ctx,
        p.as_ptr().cast(),
        "context is the pooled slot"
    );
    let t = v.dl_tensor;
    assert_eq!((t.device.device_type, t.device.device_id), (1, 0));
    assert_eq!((t.dtype.code, t.dtype.bits, t.dtype.lanes), (2, 32, 1));
    assert_eq!(t.ndim, 2);
    assert_eq!(t.byte_offset, 4);
    // SAFETY: live export: shape and strides hold ndim entries.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(t.shape, 2),
            std::slice::from_raw_parts(t.strides, 2),
        )
    };
    assert_eq!(shape, &[2, 3]);
    assert_eq!(strides, &[3, 1]);
    // SAFETY: live export we own.
    unsafe { call_deleter_versioned(p) };
}

/// The export must fail with an error matching `check`, and drop the owner.
fn export_fails(s: ExportSpec, versioned: bool, check: impl Fn(&DlpackError) -> bool) {
    let (drops, owner) = counted();
    let e = if versioned {
        export_versioned(s, owner).map(|_| ()).unwrap_err()
    } else {
        export_unversioned(s, owner).map(|_| ()).unwrap_err()
    };
    assert!(check(&e), "unexpected error: {e}");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "owner not dropped on error: {e}"
    );
}

#[test]
fn export_validation_errors_drop_the_owner() {
    let mut s = spec(vec![2, 3]);
    s.read_only = true;
    export_fails(s, false, |e| matches!(e, DlpackError::ReadOnlyUnversioned));

    export_fails(spec(vec![1; 33]), true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::TooManyDims { ndim: 33, max: 32 })
        )
    });
    export_fails(spec(vec![1 << 40, 1 << 40]), true, |e| {
        matches!(e, DlpackError::Core(CoreError::ShapeOverflow { .. }))
    });

    let mut s = spec(vec![2, 3]);
    s.strides = Some(vec![1]);
    export_fails(s, true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::StridesLength {
                ndim: 2,
                strides: 1
            }))
        )
    });

    let mut s = spec(vec![2, 3]);
    s.strides = Some(vec![3, -1]);
    export_fails(s, true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::NegativeStride {
                dim: 1,
                ..
            }))
        )
    });

    let mut s = spec(vec![2, 3]);
    s.strides = Some(vec![0, 1]);
    export_fails(s, true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::OverlappingStrides { .. }))
        )
    });

    let mut s = spec(vec![2, 3]);
    s.data = std::ptr::null_mut();
    export_fails(s, true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::NullData { .. }))
        )
    });

    let mut s = spec(vec![2, 3]);
    s.byte_offset = 1;
    export_fails(s, true, |e| {
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::Misaligned { align: 4, .. }))
        )
    });

    let mut s = spec(vec![2, 3]);
    s.device = Device::cuda(-2);
    export_fails(s, true, |e| {
        matches!(e, DlpackError::NegativeDeviceId { id: -2, .. })
    });
}

#[test]
fn empty_exports_may_have_null_data() {
    let mut s = spec(vec![0, 3]);
    s.data = std::ptr::null_mut();
    let p = export_unversioned(s, Box::new(())).unwrap();
    // SAFETY: fresh export, handed over.
    let t = unsafe { ImportedTensor::from_unversioned(p) }.unwrap();
    assert!(t.is_empty() && t.data().is_null());
}
