//! CPU tests of the MemArray mirror's host side: construction for every dtype and ndim,
//! element access with bounds and lock checks, clone/swap/move, ndarray views, the
//! indexer, the host `add_index_tuple` against a reference, and what happens without a
//! GPU. The property tests are in `mirror_host_props.rs`.

mod common;

use common::{bytes_of, index_of, random_bytes, val};
use memarray_core::{CoreError, DType, Location, LockToken, MAX_NDIM, shape, with_dtype};
use memarray_cuda::{CudaError, HostKind, MemArray, RawArray, is_available};
use memarray_seed::{self as seed, AddIndex};
use memarray_testing::gpu::report_skip;
use ndarray::{Array2, Array3, s};

fn locked(held: LockToken, requested: Option<LockToken>) -> CudaError {
    CudaError::Core(CoreError::Locked {
        held: held.id(),
        requested: requested.map(LockToken::id),
    })
}

/// Shapes of ndim `N` including empty ones.
fn shapes_of<const N: usize>() -> Vec<[usize; N]> {
    let full: [usize; N] = std::array::from_fn(|d| [3, 2, 4, 2][d]);
    let mut out = vec![full];
    for d in 0..N {
        let mut e = full;
        e[d] = 0;
        out.push(e);
    }
    out
}

fn check_zeros<T: AddIndex, const N: usize>(shape: [usize; N])
where
    [usize; N]: ndarray::IntoDimension<Dim = ndarray::Dim<[usize; N]>>,
    ndarray::Dim<[usize; N]>: ndarray::Dimension,
{
    let a = MemArray::<T, N>::new(shape).unwrap();
    let n = shape.iter().product::<usize>();
    assert_eq!(a.shape(), shape);
    assert_eq!(a.ndim(), N);
    assert_eq!(a.size(), n as u64);
    assert_eq!(a.nbytes(), n * std::mem::size_of::<T>());
    assert_eq!(a.dtype(), T::DTYPE);
    assert_eq!(a.location(), Location::Host);
    assert_eq!(a.device_id(), 0);
    assert_eq!((a.lock_holder(), a.is_locked()), (None, false));
    assert_eq!(a.as_raw().host_kind(), HostKind::Pageable);
    assert_eq!(a.as_raw().is_empty(), n == 0);
    assert!(a.as_slice().unwrap().iter().all(|&x| x == T::default()));
    assert_eq!(a.view().unwrap().shape(), &shape[..]);
    for linear in 0..n as u64 {
        assert_eq!(a.get(index_of(shape, linear)).unwrap(), T::default());
    }
}

fn zeros_every_ndim<T: AddIndex>() {
    check_zeros::<T, 0>([]);
    shapes_of::<1>().into_iter().for_each(check_zeros::<T, 1>);
    shapes_of::<2>().into_iter().for_each(check_zeros::<T, 2>);
    shapes_of::<3>().into_iter().for_each(check_zeros::<T, 3>);
    shapes_of::<4>().into_iter().for_each(check_zeros::<T, 4>);
}

#[test]
fn new_is_zero_filled_for_every_dtype_and_ndim_0_to_4() {
    for dtype in DType::ALL {
        with_dtype!(dtype, T => zeros_every_ndim::<T>());
        for shape in [&[][..], &[4], &[2, 0], &[2, 3, 1, 2], &[1, 2, 1, 2, 1, 2]] {
            let r = RawArray::zeros(dtype, shape, 0).unwrap();
            let n = shape.iter().product::<usize>();
            assert_eq!(
                (r.dtype(), r.shape(), r.ndim()),
                (dtype, shape, shape.len())
            );
            assert_eq!((r.len(), r.nbytes()), (n as u64, n * dtype.size()));
            let mut out = vec![1u8; r.nbytes()];
            r.read_all(&mut out, None).unwrap();
            assert!(out.iter().all(|&b| b == 0), "{dtype} {shape:?}");
        }
    }
}

#[test]
fn with_options_keeps_device_id_and_host_kind() {
    let a = MemArray::<f32, 2>::with_options([2, 2], 3, HostKind::Pageable).unwrap();
    assert_eq!((a.device_id(), a.location()), (3, Location::Host));
    assert_eq!(a.as_raw().host_kind(), HostKind::Pageable);
}

#[test]
fn from_slice_copies_and_refuses_a_length_mismatch() {
    let data: Vec<i16> = (0..6).collect();
    let a = MemArray::<i16, 2>::from_slice([2, 3], &data).unwrap();
    assert_eq!(a.as_slice().unwrap(), &data[..]);
    assert_eq!(a.get([1, 0]).unwrap(), 3);
    for bad in [&data[..5], &[0i16; 7][..], &[][..]] {
        let e = MemArray::<i16, 2>::from_slice([2, 3], bad).unwrap_err();
        assert_eq!(
            e,
            CudaError::Core(CoreError::CopyOutOfRange {
                offset: 0,
                len: bad.len() * 2,
                capacity: 12
            })
        );
    }
    let z = MemArray::<u8, 0>::from_slice([], &[9]).unwrap();
    assert_eq!(z.get([]).unwrap(), 9);
    assert!(
        MemArray::<u8, 2>::from_slice([0, 4], &[])
            .unwrap()
            .as_raw()
            .is_empty()
    );
}

#[test]
fn from_ndarray_any_layout() {
    let base = Array2::from_shape_fn((2, 3), |(i, j)| (10 * i + j) as f64);
    let a = MemArray::from_ndarray(&base).unwrap();
    assert_eq!(a.view().unwrap(), base.view());
    // A transposed view is not C-contiguous: the copy follows its logical order.
    let t = base.t();
    assert!(!t.is_standard_layout());
    let at = MemArray::from_ndarray(&t).unwrap();
    assert_eq!(at.shape(), [3, 2]);
    for (i, j) in [(0, 0), (2, 1), (1, 0)] {
        assert_eq!(at.get([i, j]).unwrap(), base[[j, i]]);
    }
    assert_eq!(at.view().unwrap(), t);
    // A strided slice of a 3-d array.
    let cube = Array3::from_shape_fn((3, 4, 5), |(i, j, k)| (i * 100 + j * 10 + k) as u32);
    let sl = cube.slice(s![.., 1..;2, ..;-2]);
    let asl = MemArray::from_ndarray(&sl).unwrap();
    assert_eq!(asl.shape(), [3, 2, 3]);
    assert_eq!(asl.view().unwrap(), sl);
}

#[test]
fn get_set_check_bounds_and_leave_the_array_unchanged() {
    let mut a = MemArray::<u16, 2>::new([2, 3]).unwrap();
    a.set([1, 2], 7).unwrap();
    for bad in [[2, 0], [0, 3], [usize::MAX, 0]] {
        let want = CudaError::Core(CoreError::OutOfBounds {
            index: bad.iter().map(|&i| i as u64).collect(),
            shape: vec![2, 3],
        });
        assert_eq!(a.get(bad).unwrap_err(), want);
        assert_eq!(a.set(bad, 1).unwrap_err(), want);
        assert!(
            a.get(bad)
                .unwrap_err()
                .to_string()
                .contains("out of bounds")
        );
    }
    assert_eq!(a.as_slice().unwrap(), &[0, 0, 0, 0, 0, 7]);
    // An empty array has no valid index.
    let e = MemArray::<u8, 1>::new([0]).unwrap();
    assert!(matches!(
        e.get([0]),
        Err(CudaError::Core(CoreError::OutOfBounds { .. }))
    ));
    // Raw access: wrong index length and wrong element size.
    let raw = a.as_raw_mut();
    let mut out = [0u8; 2];
    let wrong_len = CudaError::Core(CoreError::WrongNdim {
        expected: 2,
        got: 1,
    });
    assert_eq!(
        raw.read_element(&[0], &mut out, None),
        Err(wrong_len.clone())
    );
    assert_eq!(raw.write_element(&[1], &[1, 1], None), Err(wrong_len));
    let three = raw.read_element(&[0, 0, 0], &mut out, None).unwrap_err();
    assert!(matches!(
        three,
        CudaError::Core(CoreError::WrongNdim { got: 3, .. })
    ));
    assert!(matches!(
        raw.write_element(&[0, 0], &[1, 1, 1, 1], None),
        Err(CudaError::Core(CoreError::CopyOutOfRange { .. }))
    ));
    raw.read_element(&[1, 2], &mut out, None).unwrap();
    assert_eq!(u16::from_ne_bytes(out), 7);
    assert_eq!(a.as_slice().unwrap(), &[0, 0, 0, 0, 0, 7]);
}

#[test]
fn lock_refuses_every_access_without_the_holders_token() {
    let mut a = MemArray::<i32, 2>::from_slice([2, 2], &[1, 2, 3, 4]).unwrap();
    let other = MemArray::<i32, 1>::new([1]).unwrap();
    let t = a.try_lock().unwrap();
    let foreign = other.try_lock().unwrap();
    assert_ne!(t.id(), foreign.id());
    assert_eq!((a.lock_holder(), a.is_locked()), (Some(t.id()), true));
    match a.try_lock().unwrap_err() {
        CudaError::Core(CoreError::Locked {
            held,
            requested: Some(r),
        }) => assert!(held == t.id() && r != t.id(), "names both ids"),
        other => panic!("expected Locked naming both ids, got {other:?}"),
    }
    for tok in [None, Some(foreign)] {
        let want = locked(t, tok);
        let msg = want.to_string();
        assert!(msg.contains(&t.id().to_string()), "{msg}");
        if let Some(f) = tok {
            assert!(msg.contains(&f.id().to_string()), "{msg}");
        }
        assert_eq!(a.get_with([0, 0], tok).unwrap_err(), want);
        assert_eq!(a.set_with([0, 0], 9, tok).unwrap_err(), want);
        assert_eq!(
            a.move_memory(Location::Host, None, true, tok),
            Err(want.clone())
        );
        let to_dev = a.move_memory(Location::Device(0), None, false, tok);
        assert_eq!(to_dev, Err(want.clone()), "the lock is checked before CUDA");
        assert_eq!(seed::add_index_tuple_host(&mut a, tok), Err(want.clone()));
        assert_eq!(a.indexer(tok).unwrap_err(), want);
        assert_eq!(a.host_ptr(tok).unwrap_err(), want);
        let raw = a.as_raw_mut();
        assert_eq!(raw.read_all(&mut [0u8; 16], tok), Err(want.clone()));
        assert_eq!(raw.write_all(&[0u8; 16], tok), Err(want.clone()));
        assert_eq!(raw.host_bytes(tok).unwrap_err(), want);
        assert_eq!(raw.synchronize(tok), Err(want.clone()));
        assert_eq!(
            seed::add_index_tuple_device(raw, None, tok),
            Err(want.clone())
        );
        let export = raw.export_buffer(tok, false, memarray_cuda::array::Consumer::Host);
        assert_eq!(export.unwrap_err(), want);
        assert_eq!(a.unlock(foreign).unwrap_err(), locked(t, Some(foreign)));
    }
    // The views take no token: they are refused to everyone while locked.
    assert_eq!(a.view().unwrap_err(), locked(t, None));
    assert_eq!(a.view_mut().unwrap_err(), locked(t, None));
    assert_eq!(a.as_slice().unwrap_err(), locked(t, None));
    assert_eq!(a.get([1, 1]).unwrap_err(), locked(t, None));
    // Nothing changed, the lock is still held, and the holder gets through.
    assert_eq!(a.lock_holder(), Some(t.id()));
    assert_eq!(a.location(), Location::Host);
    for (k, idx) in [[0, 0], [0, 1], [1, 0], [1, 1]].into_iter().enumerate() {
        assert_eq!(a.get_with(idx, Some(t)).unwrap(), k as i32 + 1);
    }
    a.set_with([0, 0], 10, Some(t)).unwrap();
    a.move_memory(Location::Host, None, true, Some(t)).unwrap();
    seed::add_index_tuple_host(&mut a, Some(t)).unwrap();
    assert_eq!(a.indexer(Some(t)).unwrap().shape, [2, 2]);
    a.unlock(t).unwrap();
    assert_eq!(a.as_slice().unwrap(), &[10, 3, 4, 6]);
    assert_eq!(
        a.unlock(t).unwrap_err(),
        CudaError::Core(CoreError::NotLocked { requested: t.id() })
    );
    // Tokens are never reused.
    let t2 = a.try_lock().unwrap();
    assert!(t2.id() != t.id() && t2.id() != foreign.id());
    assert_eq!(
        a.get_with([0, 0], Some(t)).unwrap_err(),
        locked(t2, Some(t))
    );
    a.unlock(t2).unwrap();
    other.unlock(foreign).unwrap();
}

#[test]
#[should_panic(expected = "MemArray::lock on a locked array")]
fn lock_panics_when_already_locked() {
    let a = MemArray::<u8, 1>::new([1]).unwrap();
    let _t = a.lock();
    let _ = a.lock();
}

#[test]
fn clone_is_deep_and_unlocked() {
    let mut a = MemArray::<f32, 2>::from_slice([2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let mut b = a.clone();
    assert_eq!(b.as_slice().unwrap(), a.as_slice().unwrap());
    assert_ne!(b.host_ptr(None).unwrap(), a.host_ptr(None).unwrap());
    b.set([0, 0], -1.0).unwrap();
    a.set([1, 1], -4.0).unwrap();
    assert_eq!(a.as_slice().unwrap(), &[1.0, 2.0, 3.0, -4.0]);
    assert_eq!(b.as_slice().unwrap(), &[-1.0, 2.0, 3.0, 4.0]);
    let t = a.try_lock().unwrap();
    assert_eq!(a.try_clone().unwrap_err(), locked(t, None));
    let c = a.try_clone_with(Some(t)).unwrap();
    assert!(!c.is_locked());
    assert_eq!(c.as_slice().unwrap(), &[1.0, 2.0, 3.0, -4.0]);
    a.unlock(t).unwrap();
}

#[test]
fn swap_exchanges_contents_and_is_refused_while_locked() {
    let mut a = MemArray::<u8, 2>::from_slice([2, 3], &[1, 2, 3, 4, 5, 6]).unwrap();
    let mut b = MemArray::<u8, 2>::from_slice([1, 2], &[8, 9]).unwrap();
    a.swap(&mut b).unwrap();
    assert_eq!((a.shape(), a.as_slice().unwrap()), ([1, 2], &[8, 9][..]));
    assert_eq!(
        (b.shape(), b.as_slice().unwrap()),
        ([2, 3], &[1, 2, 3, 4, 5, 6][..])
    );
    let t = a.try_lock().unwrap();
    assert_eq!(a.swap(&mut b).unwrap_err(), locked(t, None));
    assert_eq!(b.swap(&mut a).unwrap_err(), locked(t, None));
    assert_eq!(a.get_with([0, 1], Some(t)).unwrap(), 9);
    assert_eq!(b.as_slice().unwrap(), &[1, 2, 3, 4, 5, 6]);
    a.unlock(t).unwrap();
    // Raw arrays swap dtype and ndim too; each lock stays with its array.
    let mut r = RawArray::from_bytes(DType::I64, &[2], bytes_of(&[5i64, 6]), 0).unwrap();
    let mut q = RawArray::zeros(DType::F16, &[1, 1, 1], 0).unwrap();
    r.swap(&mut q).unwrap();
    assert_eq!((r.dtype(), r.shape()), (DType::F16, &[1, 1, 1][..]));
    assert_eq!(
        (q.dtype(), q.shape(), q.nbytes()),
        (DType::I64, &[2][..], 16)
    );
    let tq = q.try_lock().unwrap();
    assert_eq!(r.swap(&mut q).unwrap_err(), locked(tq, None));
    assert_eq!(q.lock_holder(), Some(tq.id()));
    assert_eq!(r.lock_holder(), None);
}

#[test]
fn rust_moves_keep_the_data() {
    let a = MemArray::<i64, 1>::from_slice([3], &[4, 5, 6]).unwrap();
    let p = a.host_ptr(None).unwrap();
    let boxed = Box::new(a);
    let v = vec![*boxed];
    let moved = std::thread::spawn(move || {
        let a = v.into_iter().next().unwrap();
        assert_eq!(a.get([2]).unwrap(), 6);
        a
    })
    .join()
    .unwrap();
    assert_eq!(
        moved.host_ptr(None).unwrap(),
        p,
        "moving never copies the data"
    );
    assert_eq!(moved.as_slice().unwrap(), &[4, 5, 6]);
    let raw = moved.into_raw();
    let back = MemArray::<i64, 1>::try_from_raw(raw).unwrap();
    assert_eq!(back.get([0]).unwrap(), 4);
    let wrong = MemArray::<i32, 1>::try_from_raw(back.into_raw()).unwrap_err();
    assert!(matches!(
        wrong,
        CudaError::Core(CoreError::DTypeMismatch { .. })
    ));
    let r = RawArray::zeros(DType::I64, &[2, 2], 0).unwrap();
    let e = MemArray::<i64, 1>::try_from_raw(r).unwrap_err();
    assert_eq!(
        e,
        CudaError::Core(CoreError::WrongNdim {
            expected: 1,
            got: 2
        })
    );
}

#[test]
fn views_show_and_change_the_host_copy() {
    let mut a = MemArray::<u32, 3>::new([2, 3, 4]).unwrap();
    for linear in 0..24u64 {
        a.set(index_of([2, 3, 4], linear), linear as u32 * 3)
            .unwrap();
    }
    let reference = Array3::from_shape_fn((2, 3, 4), |(i, j, k)| ((i * 12 + j * 4 + k) * 3) as u32);
    assert_eq!(a.view().unwrap(), reference);
    {
        let mut v = a.view_mut().unwrap();
        v[[1, 2, 3]] = 1000;
        v.slice_mut(s![0, .., 0]).fill(7);
    }
    assert_eq!(a.get([1, 2, 3]).unwrap(), 1000);
    assert_eq!(a.get([0, 2, 0]).unwrap(), 7);
    assert_eq!(a.get([0, 2, 1]).unwrap(), 27);
    let z = MemArray::<f64, 0>::from_slice([], &[2.5]).unwrap();
    assert_eq!(z.view().unwrap().into_scalar(), &2.5);
}

fn check_indexer<const N: usize>(shape: [usize; N]) {
    let mut a = MemArray::<u64, N>::new(shape).unwrap();
    let n = a.size();
    for linear in 0..n {
        a.set(index_of(shape, linear), linear * 11).unwrap();
    }
    let ix = a.indexer(None).unwrap();
    assert_eq!(ix.data.cast::<u64>(), a.host_ptr(None).unwrap());
    assert_eq!(ix.shape, shape.map(|d| d as u64));
    assert_eq!(ix.len(), n);
    for linear in 0..n {
        let idx = index_of(shape, linear);
        let idx64 = idx.map(|i| i as u64);
        let off = ix.offset(idx64);
        assert_eq!(off, shape::offset_of(&shape, &idx64).unwrap());
        assert_eq!((off, ix.unravel(off)), (linear, idx64));
        // SAFETY: off < n elements of the live host copy, which nothing writes meanwhile.
        let v = unsafe { ix.data.cast::<u64>().add(off as usize).read() };
        assert_eq!(v, a.get(idx).unwrap());
    }
}

#[test]
fn indexer_offsets_match_shape_offset_of() {
    check_indexer::<0>([]);
    check_indexer::<1>([5]);
    check_indexer::<2>([3, 4]);
    check_indexer::<3>([2, 3, 4]);
    check_indexer::<4>([2, 1, 3, 2]);
    check_indexer::<2>([3, 0]);
}

/// add_index_tuple_host against `initial + sum(unravel(linear))` via `Element::add_u64`.
fn check_add_index<T: AddIndex>(shape: &[usize]) {
    let n = shape::checked_len(shape).unwrap();
    let initial: Vec<T> = (0..n).map(|i| val::<T>(i % 5)).collect();
    let mut r = RawArray::from_bytes(T::DTYPE, shape, bytes_of(&initial), 0).unwrap();
    seed::add_index_tuple_host(&mut r, None).unwrap();
    let mut got = vec![T::default(); n as usize];
    // SAFETY: got's bytes are plain data of T, written in full by read_all.
    let out = unsafe { std::slice::from_raw_parts_mut(got.as_mut_ptr().cast::<u8>(), r.nbytes()) };
    r.read_all(out, None).unwrap();
    for linear in 0..n {
        let sum: u64 = shape::unravel(shape, linear).unwrap().iter().sum();
        let want = initial[linear as usize].add_u64(sum);
        assert_eq!(
            got[linear as usize],
            want,
            "{} {shape:?} at {linear}",
            T::DTYPE
        );
    }
}

#[test]
fn add_index_tuple_host_matches_the_reference_for_every_dtype() {
    let shapes: [&[usize]; 9] = [
        &[],
        &[7],
        &[3, 5],
        &[2, 3, 4],
        &[2, 3, 2, 3],
        &[2, 1, 3, 1, 2, 2],
        &[0],
        &[3, 0, 2],
        &[300],
    ];
    for dtype in DType::ALL {
        for shape in shapes {
            with_dtype!(dtype, T => check_add_index::<T>(shape));
        }
    }
    // The typed API forwards to the same code.
    let mut a = MemArray::<i8, 2>::new([2, 200]).unwrap();
    seed::add_index_tuple_host(&mut a, None).unwrap();
    assert_eq!(a.get([1, 199]).unwrap(), 200u64 as i8);
}

#[test]
fn moving_to_a_device_without_cuda_is_unavailable_and_changes_nothing() {
    if is_available() {
        report_skip("a CUDA device is present; the no-CUDA mirror path is not exercised");
        return;
    }
    let mut a = MemArray::<f64, 1>::from_slice([3], &[1.0, 2.0, 3.0]).unwrap();
    for target in [Location::Device(0), Location::Device(5)] {
        for sync in [true, false] {
            let e = a.move_memory(target, None, sync, None).unwrap_err();
            assert!(matches!(e, CudaError::Unavailable { .. }), "{e:?}");
            assert!(e.to_string().contains("CUDA is unavailable"), "{e}");
            assert_eq!(a.location(), Location::Host);
            assert_eq!(a.device_id(), 0);
        }
    }
    let e = seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap_err();
    assert!(matches!(e, CudaError::Unavailable { .. }), "{e:?}");
    assert_eq!(a.as_slice().unwrap(), &[1.0, 2.0, 3.0]);
    a.move_memory(Location::Host, None, true, None).unwrap();
    a.set([0], 9.0).unwrap();
    assert_eq!(a.get([0]).unwrap(), 9.0);
    for kind in [HostKind::Pinned, HostKind::Managed] {
        let e = MemArray::<u8, 1>::with_options([4], 0, kind).unwrap_err();
        assert!(
            matches!(e, CudaError::Unavailable { .. }),
            "{kind:?}: {e:?}"
        );
    }
}

#[test]
fn raw_arrays_hold_32_dims_and_refuse_33() {
    let mut shape = [1usize; MAX_NDIM];
    shape[0] = 2;
    shape[31] = 3;
    let mut r = RawArray::zeros(DType::F32, &shape, 0).unwrap();
    assert_eq!((r.ndim(), r.len()), (32, 6));
    let mut idx = [0u64; 32];
    idx[0] = 1;
    idx[31] = 2;
    r.write_element(&idx, &7.5f32.to_ne_bytes(), None).unwrap();
    let mut out = [0u8; 4];
    r.read_element(&idx, &mut out, None).unwrap();
    assert_eq!(f32::from_ne_bytes(out), 7.5);
    seed::add_index_tuple_host(&mut r, None).unwrap();
    r.read_element(&idx, &mut out, None).unwrap();
    assert_eq!(f32::from_ne_bytes(out), 10.5);
    let too_many = [1usize; MAX_NDIM + 1];
    let want = CudaError::Core(CoreError::TooManyDims { ndim: 33, max: 32 });
    assert_eq!(RawArray::zeros(DType::F32, &too_many, 0).unwrap_err(), want);
    assert_eq!(
        RawArray::from_bytes(DType::U8, &too_many, &[0], 0).unwrap_err(),
        want
    );
    let overflow = RawArray::zeros(DType::F64, &[1 << 62, 4], 0).unwrap_err();
    assert!(matches!(
        overflow,
        CudaError::Core(CoreError::ShapeOverflow { .. })
    ));
}

#[test]
fn write_all_and_read_all_refuse_wrong_lengths_and_change_nothing() {
    let data = random_bytes(24, 3);
    let mut r = RawArray::from_bytes(DType::U16, &[3, 4], &data, 0).unwrap();
    for len in [0, 23, 25, 48] {
        let want = CudaError::Core(CoreError::CopyOutOfRange {
            offset: 0,
            len,
            capacity: 24,
        });
        assert_eq!(r.write_all(&vec![0xAB; len], None), Err(want.clone()));
        let mut out = vec![0xCD; len];
        assert_eq!(r.read_all(&mut out, None), Err(want));
        assert!(
            out.iter().all(|&b| b == 0xCD),
            "a failed read writes nothing"
        );
    }
    assert_eq!(r.host_bytes(None).unwrap(), &data[..]);
    let fresh = random_bytes(24, 4);
    r.write_all(&fresh, None).unwrap();
    let mut out = vec![0; 24];
    r.read_all(&mut out, None).unwrap();
    assert_eq!(out, fresh);
}

#[test]
fn foreign_bool_bytes_read_as_valid_bools() {
    let mut raw = RawArray::zeros(DType::Bool, &[3], 0).unwrap();
    // A producer (a uint8 view, say) may store any byte; element writes take bytes as is.
    raw.write_element(&[1], &[2], None).unwrap();
    raw.write_element(&[2], &[255], None).unwrap();
    let a = MemArray::<bool, 1>::try_from_raw(raw).unwrap();
    assert_eq!(a.as_slice().unwrap(), &[false, true, true]);
    assert!(a.get([2]).unwrap());
    assert_eq!(a.as_raw().host_bytes(None).unwrap(), &[0, 1, 1]);
}

/// Byte ranges read and written wherever the data lives: the range is checked, a locked
/// array refuses, and on a device (when there is one) a write lands where it was aimed.
#[test]
fn ranges_are_read_and_written_in_place_and_checked() {
    let bytes: Vec<u8> = (0..64u8).collect();
    let mut a = RawArray::from_bytes(DType::U8, &[64], &bytes, 0).unwrap();
    let mut out = [0u8; 8];
    a.read_range(10, &mut out, None).unwrap();
    assert_eq!(out, [10, 11, 12, 13, 14, 15, 16, 17]);
    a.write_range(60, &[1, 2, 3, 4], None).unwrap();
    assert_eq!(&a.host_bytes(None).unwrap()[58..], &[58, 59, 1, 2, 3, 4]);
    assert!(a.read_range(60, &mut out, None).is_err(), "past the end");
    assert!(
        a.write_range(usize::MAX, &[1], None).is_err(),
        "overflowing offset"
    );
    let t = a.try_lock().unwrap();
    assert!(a.read_range(0, &mut out, None).is_err(), "locked");
    a.read_range(0, &mut out, Some(t)).unwrap();
    a.unlock(t).unwrap();
    if memarray_cuda::is_available() {
        a.move_memory(Location::Device(0), None, true, None)
            .unwrap();
        a.write_range(0, &[9; 4], None).unwrap();
        a.read_range(0, &mut out, None).unwrap();
        assert_eq!(out, [9, 9, 9, 9, 4, 5, 6, 7]);
    }
}
