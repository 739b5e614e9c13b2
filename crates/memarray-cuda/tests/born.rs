//! Arrays born where they are used: `empty_on`, `zeros_on`, `full_on` on the
//! host (CPU) and on a device (GPU): device-born arrays have no host copy until their
//! first move to the host, and their fill happens on the device.

mod common;

use common::{bytes_of, val};
use memarray_core::{DType, Location, with_dtype};
use memarray_cuda::{CudaError, HostKind, RawArray, is_available};
use memarray_seed::AddIndex;
use memarray_testing::gpu::gpu_or_skip;

fn elements(a: &RawArray) -> Vec<u8> {
    let mut out = vec![0u8; a.nbytes()];
    a.read_all(&mut out, None).unwrap();
    out
}

fn value_bytes<T: AddIndex>(k: u64) -> Vec<u8> {
    bytes_of(&[val::<T>(k)]).to_vec()
}

#[test]
fn host_born_arrays_for_every_dtype() {
    for d in DType::ALL {
        let v = with_dtype!(d, T => value_bytes::<T>(5));
        for shape in [&[][..], &[0][..], &[3, 4][..], &[2, 3, 5][..]] {
            let z = RawArray::zeros_on(d, shape, Location::Host, None, None).unwrap();
            assert!(elements(&z).iter().all(|&b| b == 0), "{d} {shape:?}");
            let f = RawArray::full_on(d, shape, Location::Host, &v, None, None).unwrap();
            assert!(
                elements(&f).chunks(d.size()).all(|c| c == v),
                "{d} {shape:?}"
            );
            let e = RawArray::empty_on(d, shape, Location::Host, Some(HostKind::Pageable), None)
                .unwrap();
            assert_eq!((e.location(), e.has_host_copy()), (Location::Host, true));
        }
    }
}

#[test]
fn full_with_a_wrong_sized_value_is_refused() {
    assert!(RawArray::full_on(DType::F64, &[2], Location::Host, &[0u8; 4], None, None).is_err());
}

#[test]
fn device_born_without_cuda_is_unavailable() {
    if is_available() {
        return;
    }
    let e = RawArray::zeros_on(DType::F32, &[4], Location::Device(0), None, None).unwrap_err();
    assert!(matches!(e, CudaError::Unavailable { .. }), "{e}");
}

#[test]
fn gpu_device_born_arrays_fill_on_the_device_and_get_a_host_copy_on_first_move() {
    if gpu_or_skip().is_none() {
        return;
    }
    let dev = Location::Device(0);
    for d in DType::ALL {
        let v = with_dtype!(d, T => value_bytes::<T>(3));
        for shape in [&[][..], &[0][..], &[1000][..], &[7, 1, 333][..]] {
            let z = RawArray::zeros_on(d, shape, dev, None, None).unwrap();
            assert_eq!((z.location(), z.has_host_copy()), (dev, false));
            assert!(elements(&z).iter().all(|&b| b == 0), "{d} {shape:?}");
            let mut f = RawArray::full_on(d, shape, dev, &v, None, None).unwrap();
            assert!(
                elements(&f).chunks(d.size()).all(|c| c == v),
                "{d} {shape:?}"
            );
            f.move_memory(Location::Host, None, true, None).unwrap();
            assert!(f.has_host_copy());
            assert!(f.host_bytes(None).unwrap().chunks(d.size()).all(|c| c == v));
            let mut e = RawArray::empty_on(d, shape, dev, None, None).unwrap();
            if !shape.contains(&0) {
                let idx = vec![0u64; shape.len()];
                e.write_element(&idx, &v, None).unwrap();
                let mut out = vec![0u8; d.size()];
                e.read_element(&idx, &mut out, None).unwrap();
                assert_eq!(out, v);
            }
        }
    }
}

#[test]
fn gpu_device_born_array_of_64_mib_full_is_exact() {
    if gpu_or_skip().is_none() {
        return;
    }
    let v = 1.25f64.to_ne_bytes();
    let a = RawArray::full_on(
        DType::F64,
        &[(64 << 20) / 8 + 3],
        Location::Device(0),
        &v,
        None,
        None,
    )
    .unwrap();
    let out = elements(&a);
    assert!(out.chunks(8).all(|c| c == v));
}
