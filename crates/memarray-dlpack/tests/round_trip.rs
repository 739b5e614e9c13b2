//! Export, then import: shape, strides, dtype, device, offset and flags survive, and the
//! imported data pointer reads what the exporter's buffer holds.

mod common;

use std::sync::atomic::Ordering;

use common::{counted, host_buffer};
use memarray_dlpack::{
    DType, Device, DeviceType, ExportSpec, ImportedTensor, MAX_NDIM, export_unversioned,
    export_versioned,
};
use proptest::prelude::*;

/// Shapes of ndim 0, 1, 3 and 32 (the 32-d one mostly extent 1, to stay small).
fn shapes() -> Vec<Vec<usize>> {
    let mut s32 = vec![1usize; MAX_NDIM];
    s32[0] = 2;
    s32[17] = 3;
    s32[31] = 2;
    vec![vec![], vec![5], vec![2, 3, 4], s32]
}

/// Exports `spec` (versioned or not) with a counted owner, imports it, checks every field
/// against the spec, drops the import, and checks the owner was dropped exactly once.
fn round_trip(spec: &ExportSpec, versioned: bool) {
    let (drops, owner) = counted();
    let t = if versioned {
        let p = export_versioned(spec.clone(), owner).unwrap();
        // SAFETY: a fresh export, handed over.
        unsafe { ImportedTensor::from_versioned(p) }.unwrap()
    } else {
        let p = export_unversioned(spec.clone(), owner).unwrap();
        // SAFETY: as above.
        unsafe { ImportedTensor::from_unversioned(p) }.unwrap()
    };
    let ctx = format!("{:?} {:?} versioned={versioned}", spec.dtype, spec.shape);
    assert_eq!(t.shape(), spec.shape.as_slice(), "{ctx}");
    let expected_strides = spec
        .strides
        .clone()
        .unwrap_or_else(|| memarray_core::shape::c_strides(&spec.shape));
    assert_eq!(t.strides(), expected_strides.as_slice(), "{ctx}");
    assert_eq!(t.dtype(), spec.dtype, "{ctx}");
    assert_eq!(t.device(), spec.device, "{ctx}");
    assert_eq!(t.byte_offset(), spec.byte_offset, "{ctx}");
    assert_eq!(
        t.data() as usize,
        spec.data as usize + spec.byte_offset as usize,
        "{ctx}"
    );
    assert_eq!(t.read_only(), versioned && spec.read_only, "{ctx}");
    assert_eq!(t.is_copied(), versioned && spec.is_copied, "{ctx}");
    assert_eq!(t.is_versioned(), versioned);
    if versioned {
        assert_eq!(t.version(), Some((1, 3)));
    }
    let len: usize = spec.shape.iter().product();
    assert_eq!(t.len(), len, "{ctx}");
    assert_eq!(t.nbytes(), len * spec.dtype.size(), "{ctx}");
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "owner dropped early: {ctx}"
    );
    drop(t);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "owner drops: {ctx}");
}

#[test]
fn every_dtype_and_ndim_round_trips_both_kinds() {
    for dtype in DType::ALL {
        for shape in shapes() {
            let nbytes = shape.iter().product::<usize>() * dtype.size();
            let (_buf, data) = host_buffer(nbytes);
            for versioned in [false, true] {
                let mut spec = ExportSpec::contiguous(data, Device::CPU, dtype, shape.clone());
                round_trip(&spec, versioned);
                spec.device = Device::cuda(3); // a device is only a value here
                spec.is_copied = true;
                if versioned {
                    spec.read_only = true;
                }
                round_trip(&spec, versioned);
            }
        }
    }
}

#[test]
fn data_read_through_the_import_matches_the_buffer() {
    let (buf, data) = host_buffer(6 * 8);
    let spec = ExportSpec::contiguous(data, Device::CPU, DType::U64, vec![2, 3]);
    let p = export_versioned(spec, Box::new(buf)).unwrap();
    // SAFETY: a fresh export, handed over.
    let t = unsafe { ImportedTensor::from_versioned(p) }.unwrap();
    // The owner (the Vec) keeps the memory alive while the import lives.
    // SAFETY: 6 aligned u64 of host memory kept alive by the owner.
    let got = unsafe { std::slice::from_raw_parts(t.data().cast::<u64>(), 6) };
    let want: Vec<u64> = (0..6u64)
        .map(|i| u64::from_le_bytes(std::array::from_fn(|b| (i * 8 + b as u64) as u8)))
        .collect();
    assert_eq!(got, want.as_slice());
}

#[test]
fn strided_views_and_offsets_round_trip() {
    let (_buf, data) = host_buffer(1024);
    let mut spec = ExportSpec::contiguous(data, Device::CPU, DType::F64, vec![3, 4]);
    spec.strides = Some(vec![1, 3]); // Fortran order
    spec.byte_offset = 16;
    round_trip(&spec, true);
    round_trip(&spec, false);
    spec.strides = Some(vec![10, 2]); // a sliced view
    round_trip(&spec, true);
    let p = export_versioned(spec, Box::new(())).unwrap();
    // SAFETY: a fresh export, handed over.
    let t = unsafe { ImportedTensor::from_versioned(p) }.unwrap();
    assert!(!t.is_c_contiguous());
    assert_eq!(t.span_bytes(), (2 * 10 + 3 * 2 + 1) * 8);
}

#[test]
fn managed_and_pinned_devices_round_trip() {
    let (_buf, data) = host_buffer(64);
    for kind in [DeviceType::CudaHost, DeviceType::CudaManaged] {
        let spec = ExportSpec::contiguous(data, Device { kind, id: 0 }, DType::I32, vec![4]);
        round_trip(&spec, true);
    }
}

fn layout_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, u8)> {
    // A shape, a permutation of its axes (the physical order), and a padding factor.
    proptest::collection::vec(0usize..5, 0..7).prop_flat_map(|shape| {
        let n = shape.len();
        (
            Just(shape),
            Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
            1u8..3,
        )
    })
}

proptest! {
    #[test]
    fn random_layouts_round_trip(
        (shape, order, pad) in layout_strategy(),
        dtype_ix in 0usize..DType::ALL.len(),
        versioned in any::<bool>(),
    ) {
        let dtype = DType::ALL[dtype_ix];
        // Strides for the physical order `order` (last = fastest), padded by `pad`.
        let mut strides = vec![0i64; shape.len()];
        let mut acc = 1i64;
        for &axis in order.iter().rev() {
            strides[axis] = acc * i64::from(pad);
            acc *= (shape[axis].max(1) as i64) * i64::from(pad);
        }
        let (_buf, data) = host_buffer(acc as usize * dtype.size());
        let mut spec = ExportSpec::contiguous(data, Device::CPU, dtype, shape.clone());
        spec.strides = Some(strides);
        round_trip(&spec, versioned);
    }
}
