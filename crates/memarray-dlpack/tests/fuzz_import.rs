//! DLPack import fuzzing: malformed `DLManagedTensor` and
//! `DLManagedTensorVersioned` values of every kind, generated with proptest.
//!
//! Every case is either refused with a typed error or imported with exactly the fields
//! it was given; in both cases the producer's deleter runs exactly once (on refusal at
//! once, on acceptance when the import drops). `MEMARRAY_FUZZ_CASES` sets the count
//! (100,000 by default; CI's valgrind run uses fewer).

mod common;

use std::ffi::c_void;

use common::{Fields, unversioned, versioned};
use memarray_dlpack::{DType, DeviceType, DlpackError, ImportedTensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn cases() -> u32 {
    std::env::var("MEMARRAY_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Extents and strides: mostly small, sometimes zero, huge or negative.
fn dim_value() -> impl Strategy<Value = i64> {
    prop_oneof![
        24 => 0i64..5,
        1 => Just(0i64),
        1 => prop_oneof![Just(i64::MAX), Just(i64::MAX / 2), Just(1i64 << 32), Just(1i64 << 62)],
        1 => prop_oneof![Just(-1i64), Just(i64::MIN), -100i64..0],
        1 => any::<i64>(),
    ]
}

/// Pointers: the producer's buffer (None), null, or a misaligned / odd address that is
/// never dereferenced (import does not read data).
fn data_ptr() -> impl Strategy<Value = Option<*mut c_void>> {
    prop_oneof![
        8 => Just(None),
        1 => Just(Some(std::ptr::null_mut())),
        1 => prop_oneof![Just(1usize), Just(0x1000), Just(usize::MAX - 7), Just(0x1003)]
            .prop_map(|a| Some(a as *mut c_void)),
    ]
}

fn fields() -> impl Strategy<Value = Fields> {
    let ndim = prop_oneof![
        8 => 0i32..6,
        1 => 30i32..35,
        1 => prop_oneof![Just(-1i32), Just(i32::MIN), Just(i32::MAX), Just(33i32), Just(1000i32)],
    ];
    let version = prop_oneof![
        6 => (Just(1u32), 0u32..5),
        1 => (Just(0u32), 0u32..10),
        1 => (2u32..4, 0u32..3),
        1 => (any::<u32>(), any::<u32>()),
    ];
    let valid: Vec<(u8, u8, u16)> = DType::ALL.iter().map(|d| d.dlpack()).collect();
    let dtype = prop_oneof![
        6 => proptest::sample::select(valid),
        2 => (0u8..6, prop_oneof![Just(1u8), Just(8), Just(16), Just(32), Just(64), Just(128)], Just(1u16)),
        1 => (any::<u8>(), any::<u8>(), any::<u16>()),
        1 => (0u8..6, Just(32u8), 0u16..5),
    ];
    let device = prop_oneof![
        6 => (prop_oneof![Just(1u32), Just(2), Just(3), Just(13)], 0i32..3),
        1 => (any::<u32>(), any::<i32>()),
        1 => (1u32..20, -3i32..0),
    ];
    let byte_offset = prop_oneof![
        6 => Just(0u64),
        2 => 0u64..64,
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 3), Just(1u64 << 63)],
    ];
    (
        version,
        any::<u64>(),
        device,
        dtype,
        ndim,
        (any::<bool>(), any::<bool>()),
        proptest::collection::vec(dim_value(), 32),
        proptest::collection::vec(dim_value(), 32),
        byte_offset,
        data_ptr(),
        prop_oneof![9 => Just(true), 1 => Just(false)],
    )
        .prop_map(
            |(
                version,
                flags,
                device,
                dtype,
                ndim,
                (null_shape, null_strides),
                sh,
                st,
                off,
                data,
                del,
            )| {
                // Pointer arrays hold `ndim` entries when 0 <= ndim <= 32 (the importer's
                // contract: DLPack gives no length to check against); past that, whatever.
                let n = usize::try_from(ndim).map_or(0, |n| n.min(32));
                Fields {
                    version,
                    flags,
                    device_type: device.0,
                    device_id: device.1,
                    code: dtype.0,
                    bits: dtype.1,
                    lanes: dtype.2,
                    ndim,
                    shape: (!null_shape || ndim == 0).then(|| sh[..n].to_vec()),
                    strides: (!null_strides).then(|| st[..n].to_vec()),
                    byte_offset: off,
                    data,
                    has_deleter: del,
                }
            },
        )
}

/// Checks an accepted import against the fields it was made from.
fn check_accepted(f: &Fields, t: &ImportedTensor, base: *mut c_void) {
    assert_eq!(
        t.dtype(),
        DType::from_dlpack(f.code, f.bits, f.lanes).unwrap()
    );
    assert_eq!(f.lanes, 1);
    assert!((0..=32).contains(&f.ndim));
    let shape = f.shape.as_deref().unwrap_or(&[]);
    let want: Vec<usize> = shape.iter().map(|&d| usize::try_from(d).unwrap()).collect();
    assert_eq!(t.shape(), want.as_slice());
    match &f.strides {
        Some(s) if f.ndim > 0 => assert_eq!(t.strides(), s.as_slice()),
        _ => assert_eq!(
            t.strides(),
            memarray_core::shape::c_strides(&want).as_slice()
        ),
    }
    // Strides of extent-0/1 dimensions never address memory and are ignored (as NumPy
    // does), and an empty tensor addresses nothing; every other stride is non-negative.
    assert!(
        t.is_empty()
            || t.shape()
                .iter()
                .zip(t.strides())
                .all(|(&d, &s)| d <= 1 || s >= 0),
        "negative strides are refused"
    );
    assert!(t.device().id >= 0);
    assert_eq!(
        t.device().kind,
        DeviceType::from_code(f.device_type).unwrap()
    );
    assert_eq!(t.byte_offset(), f.byte_offset);
    assert_eq!(
        t.data() as usize,
        (base as usize).wrapping_add(f.byte_offset as usize)
    );
    if !t.is_empty() {
        assert!(!base.is_null(), "null data with elements is refused");
        assert_eq!(
            t.data() as usize % t.dtype().align(),
            0,
            "misaligned data is refused"
        );
    }
    let nbytes = memarray_core::shape::checked_nbytes(t.shape(), t.dtype().size()).unwrap();
    assert_eq!(t.nbytes(), nbytes);
    assert!(t.span_bytes() >= t.nbytes() || t.is_empty());
    if f.version.0 == 1 && t.is_versioned() {
        assert_eq!(t.version(), Some(f.version));
        assert_eq!(t.read_only(), f.flags & 1 != 0);
    }
}

/// One case, versioned and (for major 1) unversioned: refused or accepted, deleter once.
fn one_case(f: &Fields, refused: &mut u64, accepted: &mut u64) {
    let expected_calls = usize::from(f.has_deleter);
    let v = versioned(f);
    let base = f.data.unwrap_or_else(|| v.buffer_ptr());
    // SAFETY: `v` is a tensor built to the importer's contract (pointer arrays of ndim
    // entries); ownership passes to the import.
    match unsafe { ImportedTensor::from_versioned(v.ptr()) } {
        Ok(t) => {
            assert_eq!(v.calls(), 0, "deleter ran while the import lives");
            check_accepted(f, &t, base);
            drop(t);
            *accepted += 1;
        }
        Err(e) => {
            check_refusal(f, &e);
            *refused += 1;
        }
    }
    assert_eq!(v.calls(), expected_calls, "versioned deleter calls: {f:?}");
    if f.version.0 != 1 {
        return;
    }
    let u = unversioned(f);
    let base = f.data.unwrap_or_else(|| u.buffer_ptr());
    // SAFETY: as above.
    match unsafe { ImportedTensor::from_unversioned(u.ptr()) } {
        Ok(t) => {
            assert_eq!(u.calls(), 0);
            check_accepted(f, &t, base);
            assert!(!t.read_only() && t.version().is_none());
        }
        Err(e) => check_refusal(f, &e),
    }
    assert_eq!(
        u.calls(),
        expected_calls,
        "unversioned deleter calls: {f:?}"
    );
}

/// A refusal is a typed error whose message names something, and fits the input.
fn check_refusal(f: &Fields, e: &DlpackError) {
    assert!(!e.to_string().is_empty());
    if let DlpackError::UnsupportedVersion { major, .. } = e {
        assert_eq!(*major, f.version.0);
        assert_ne!(f.version.0, 1);
    }
    if let DlpackError::BadNdim { ndim, .. } = e {
        assert!(!(0..=32).contains(ndim));
    }
}

#[test]
fn fuzz_import_refuses_or_imports_and_deletes_once() {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let counts = std::cell::Cell::new((0u64, 0u64));
    runner
        .run(&fields(), |f| {
            let (mut refused, mut accepted) = counts.get();
            one_case(&f, &mut refused, &mut accepted);
            counts.set((refused, accepted));
            Ok(())
        })
        .unwrap();
    let (refused, accepted) = counts.get();
    eprintln!(
        "fuzz: {} cases ({refused} refused, {accepted} imported); deleter ran once in each",
        refused + accepted
    );
    assert_eq!(u64::from(cases()), refused + accepted);
    assert!(
        refused > 0 && accepted > 0,
        "the generator must reach both outcomes"
    );
}
