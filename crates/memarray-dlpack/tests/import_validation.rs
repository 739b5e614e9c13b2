//! Import validation: every bad field gives its own error, and the producer's deleter has
//! run exactly once afterwards, since ownership passed to the consumer.

mod common;

use common::{Fields, Foreign, unversioned, versioned};
use memarray_dlpack::ffi::DLManagedTensorVersioned;
use memarray_dlpack::{
    CoreError, DType, Device, DeviceType, DlpackError, ImportedTensor, LayoutError,
};

/// Imports `f` versioned (and, for major version 1, unversioned too) and returns the
/// error; checks that each import refused it and called the deleter exactly once.
fn refused(f: &Fields) -> DlpackError {
    let v = versioned(f);
    // SAFETY: `v` is a valid tensor whose ownership passes to the import.
    let err = unsafe { ImportedTensor::from_versioned(v.ptr()) }.unwrap_err();
    assert_eq!(v.calls(), 1, "versioned deleter calls after: {err}");
    if f.version.0 == 1 {
        let u = unversioned(f);
        // SAFETY: as above.
        let err_u = unsafe { ImportedTensor::from_unversioned(u.ptr()) }.unwrap_err();
        // Same variant (addresses differ between the two allocations).
        assert_eq!(
            std::mem::discriminant(&err_u),
            std::mem::discriminant(&err),
            "unversioned and versioned imports disagree: {err_u} / {err}"
        );
        assert_eq!(u.calls(), 1, "unversioned deleter calls after: {err_u}");
    }
    err
}

fn accepted(f: &Fields) -> (Foreign<DLManagedTensorVersioned>, ImportedTensor) {
    let v = versioned(f);
    // SAFETY: as above.
    let t = unsafe { ImportedTensor::from_versioned(v.ptr()) }.unwrap();
    assert_eq!(v.calls(), 0, "deleter ran while the import is alive");
    (v, t)
}

#[test]
fn valid_tensor_is_accepted_and_deleted_once_on_drop() {
    let (v, t) = accepted(&Fields::default());
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.strides(), &[3, 1]);
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(t.device(), Device::CPU);
    assert_eq!(t.version(), Some((1, 3)));
    assert!(t.is_c_contiguous());
    drop(t);
    assert_eq!(v.calls(), 1);
}

#[test]
fn major_version_2_is_refused_without_reading_other_fields() {
    // Fields a version-2 layout may have moved: garbage that would crash if read.
    let f = Fields {
        version: (2, 0),
        ndim: 5,
        shape: None,
        strides: None,
        device_type: 77,
        data: Some(std::ptr::dangling_mut()),
        ..Fields::default()
    };
    let e = refused(&f);
    assert_eq!(
        e,
        DlpackError::UnsupportedVersion {
            major: 2,
            minor: 0,
            supported_major: 1,
            supported_minor: 3
        }
    );
    assert!(e.to_string().contains("2.0"), "{e}");
    assert!(matches!(
        refused(&Fields {
            version: (0, 8),
            ..Fields::default()
        }),
        DlpackError::UnsupportedVersion { major: 0, .. }
    ));
}

#[test]
fn newer_minor_version_is_accepted() {
    let (_v, t) = accepted(&Fields {
        version: (1, 99),
        ..Fields::default()
    });
    assert_eq!(t.version(), Some((1, 99)));
}

#[test]
fn unknown_device_type_7_is_refused_by_code() {
    let e = refused(&Fields {
        device_type: 7,
        ..Fields::default()
    });
    assert_eq!(e, DlpackError::UnknownDeviceType { code: 7 });
    assert!(e.to_string().contains("device type 7"), "{e}");
}

#[test]
fn negative_device_id_is_refused() {
    let e = refused(&Fields {
        device_type: 2,
        device_id: -1,
        ..Fields::default()
    });
    assert_eq!(e, DlpackError::NegativeDeviceId { code: 2, id: -1 });
}

#[test]
fn every_supported_device_type_is_accepted() {
    for (code, kind) in [
        (1, DeviceType::Cpu),
        (2, DeviceType::Cuda),
        (3, DeviceType::CudaHost),
        (13, DeviceType::CudaManaged),
    ] {
        let (_v, t) = accepted(&Fields {
            device_type: code,
            device_id: 1,
            ..Fields::default()
        });
        assert_eq!(t.device(), Device { kind, id: 1 });
    }
}

#[test]
fn fp8_dtype_is_refused() {
    // kDLFloat8_e4m3 = 8, 8 bits.
    let e = refused(&Fields {
        code: 8,
        bits: 8,
        ..Fields::default()
    });
    assert_eq!(
        e,
        DlpackError::UnsupportedDType {
            code: 8,
            bits: 8,
            lanes: 1
        }
    );
    assert!(e.to_string().contains("code 8, bits 8"), "{e}");
    assert!(
        e.to_string().contains("float32"),
        "lists supported dtypes: {e}"
    );
}

#[test]
fn vector_lanes_4_are_refused() {
    let e = refused(&Fields {
        lanes: 4,
        ..Fields::default()
    });
    assert_eq!(
        e,
        DlpackError::VectorLanes {
            code: 2,
            bits: 32,
            lanes: 4
        }
    );
    assert!(e.to_string().contains("4 lanes"), "{e}");
}

#[test]
fn ndim_minus_1_and_33_are_refused() {
    for ndim in [-1, 33, i32::MIN] {
        let e = refused(&Fields {
            ndim,
            shape: Some(vec![1; 40]),
            strides: Some(vec![1; 40]),
            ..Fields::default()
        });
        assert_eq!(
            e,
            DlpackError::BadNdim {
                ndim: ndim.into(),
                max: 32
            }
        );
        assert!(e.to_string().contains(&format!("ndim {ndim}")), "{e}");
    }
}

#[test]
fn null_shape_is_refused() {
    let e = refused(&Fields {
        shape: None,
        ..Fields::default()
    });
    assert_eq!(e, DlpackError::NullShape { ndim: 2 });
}

#[test]
fn negative_shape_is_refused() {
    let e = refused(&Fields {
        shape: Some(vec![2, -3]),
        ..Fields::default()
    });
    assert_eq!(
        e,
        DlpackError::NegativeShape {
            dim: 1,
            extent: -3,
            shape: vec![2, -3]
        }
    );
}

#[test]
fn overflowing_shape_is_refused() {
    let e = refused(&Fields {
        shape: Some(vec![1 << 40, 1 << 40]),
        strides: Some(vec![1 << 40, 1]),
        ..Fields::default()
    });
    assert!(
        matches!(e, DlpackError::Core(CoreError::ShapeOverflow { .. })),
        "{e}"
    );
}

#[test]
fn negative_stride_is_refused() {
    let e = refused(&Fields {
        strides: Some(vec![-3, 1]),
        ..Fields::default()
    });
    assert!(
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::NegativeStride {
                dim: 0,
                stride: -3,
                ..
            }))
        ),
        "{e}"
    );
    assert!(e.to_string().contains("stride -3 in dimension 0"), "{e}");
}

#[test]
fn aliasing_strides_are_refused() {
    for strides in [vec![0, 1], vec![1, 1], vec![2, 1]] {
        let e = refused(&Fields {
            strides: Some(strides.clone()),
            ..Fields::default()
        });
        assert!(
            matches!(
                e,
                DlpackError::Core(CoreError::Layout(LayoutError::OverlappingStrides { .. }))
            ),
            "{strides:?}: {e}"
        );
    }
}

#[test]
fn misaligned_byte_offset_is_refused() {
    let e = refused(&Fields {
        byte_offset: 2,
        ..Fields::default()
    });
    assert!(
        matches!(
            e,
            DlpackError::Core(CoreError::Layout(LayoutError::Misaligned {
                byte_offset: 2,
                align: 4,
                dtype: DType::F32,
                ..
            }))
        ),
        "{e}"
    );
    // An aligned offset is fine and lands in data().
    let (_v, t) = accepted(&Fields {
        byte_offset: 8,
        ..Fields::default()
    });
    assert_eq!(t.byte_offset(), 8);
}

#[test]
fn null_data_is_refused_unless_empty() {
    let e = refused(&Fields {
        data: Some(std::ptr::null_mut()),
        ..Fields::default()
    });
    assert_eq!(
        e,
        DlpackError::Core(CoreError::Layout(LayoutError::NullData {
            shape: vec![2, 3]
        }))
    );
    let (_v, t) = accepted(&Fields {
        data: Some(std::ptr::null_mut()),
        shape: Some(vec![2, 0]),
        ..Fields::default()
    });
    assert!(t.is_empty());
    assert_eq!(t.nbytes(), 0);
    assert!(t.data().is_null());
}

#[test]
fn non_contiguous_strides_are_accepted_and_reported() {
    // Fortran order, and every other element of a row.
    for (shape, strides, span) in [
        (vec![2, 3], vec![1, 2], 6 * 4),
        (vec![2, 3], vec![6, 2], 11 * 4),
    ] {
        let (_v, t) = accepted(&Fields {
            shape: Some(shape.clone()),
            strides: Some(strides.clone()),
            ..Fields::default()
        });
        assert!(!t.is_c_contiguous(), "{strides:?}");
        assert_eq!(t.strides(), strides.as_slice());
        assert_eq!(t.nbytes(), 24);
        assert_eq!(t.span_bytes(), span);
    }
}

#[test]
fn null_strides_mean_c_contiguous() {
    let (_v, t) = accepted(&Fields {
        shape: Some(vec![4, 5, 6]),
        strides: None,
        ndim: 3,
        ..Fields::default()
    });
    assert_eq!(t.strides(), &[30, 6, 1]);
    assert!(t.is_c_contiguous());
}

#[test]
fn zero_d_tensor_accepts_null_or_valid_shape() {
    for (shape, strides) in [(None, None), (Some(vec![]), Some(vec![]))] {
        let (_v, t) = accepted(&Fields {
            ndim: 0,
            shape,
            strides,
            ..Fields::default()
        });
        assert_eq!(t.shape(), &[] as &[usize]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.nbytes(), 4);
    }
}

#[test]
fn flags_are_read() {
    let (_v, t) = accepted(&Fields {
        flags: 0b11,
        ..Fields::default()
    });
    assert!(t.read_only() && t.is_copied());
    let (_v, t) = accepted(&Fields::default());
    assert!(!t.read_only() && !t.is_copied());
}

#[test]
fn null_deleter_is_allowed() {
    let f = Fields {
        has_deleter: false,
        ..Fields::default()
    };
    let v = versioned(&f);
    // SAFETY: valid tensor, ownership passes.
    let t = unsafe { ImportedTensor::from_versioned(v.ptr()) }.unwrap();
    drop(t);
    assert_eq!(v.calls(), 0);
}

#[test]
fn unversioned_imports_carry_no_flags() {
    let u = unversioned(&Fields::default());
    // SAFETY: valid tensor, ownership passes.
    let t = unsafe { ImportedTensor::from_unversioned(u.ptr()) }.unwrap();
    assert!(!t.read_only() && !t.is_copied() && !t.is_versioned());
    assert_eq!(t.version(), None);
    drop(t);
    assert_eq!(u.calls(), 1);
}

#[test]
fn offsets_and_strides_past_user_space_are_refused() {
    let huge_offset = Fields {
        byte_offset: 1 << 63,
        ..Fields::default()
    };
    assert!(
        matches!(
            refused(&huge_offset),
            DlpackError::Core(CoreError::Layout(LayoutError::OutsideAddressSpace { .. }))
        ),
        "byte_offset 2**63"
    );
    // Inside user space but far past the producer's 256-byte buffer: host memory that is
    // not mapped (CPU), or that no process could map (a CUDA stride past 2**57).
    for (device_type, stride) in [(1, 1i64 << 40), (2, 1i64 << 58)] {
        let f = Fields {
            device_type,
            shape: Some(vec![2, 3]),
            strides: Some(vec![stride, 1]),
            ..Fields::default()
        };
        let e = refused(&f);
        assert!(
            matches!(
                e,
                DlpackError::Unmapped { .. }
                    | DlpackError::Core(CoreError::Layout(LayoutError::OutsideAddressSpace { .. }))
            ),
            "device {device_type} stride {stride}: {e}"
        );
    }
    // The same strides over memory the producer really has pass.
    let (_v, t) = accepted(&Fields {
        strides: Some(vec![4, 1]),
        ..Fields::default()
    });
    assert_eq!(t.strides(), &[4, 1]);
}
