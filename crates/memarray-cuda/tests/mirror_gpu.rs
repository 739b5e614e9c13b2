//! GPU tests of the MemArray mirror: the seed's flow for every dtype and ndim 1..=4,
//! moves and their ordering across streams, device-resident element access, host kinds,
//! peer moves, clones, indexers and locks on device paths. Each test skips visibly
//! without a GPU (and fails instead under `MEMARRAY_REQUIRE_GPU=1`).

mod common;

use std::sync::Arc;

use common::{index_of, random_bytes, val};
use memarray_core::{CoreError, DType, Location, LockToken, with_dtype};
use memarray_cuda::array::Consumer;
use memarray_cuda::{
    ArrayError, CudaError, Device, HostKind, MemArray, Stream, StreamRef, device_of_pointer,
};
use memarray_seed::{self as seed, AddIndex};
use memarray_testing::gpu::{gpu_or_skip, gpus_or_skip};

const DEV0: Location = Location::Device(0);

fn locked(held: LockToken, requested: Option<LockToken>) -> CudaError {
    CudaError::Core(CoreError::Locked {
        held: held.id(),
        requested: requested.map(LockToken::id),
    })
}

/// The seed's C++ test: write 2 everywhere, run add_index_tuple on the device, read
/// elements from the device without moving, then move home and compare everything.
fn seed_flow<T: AddIndex, const N: usize>(shape: [usize; N]) {
    let mut a = MemArray::<T, N>::new(shape).unwrap();
    let n = a.size();
    let two = val::<T>(2);
    for linear in 0..n {
        a.set(index_of(shape, linear), two).unwrap();
    }
    seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap();
    assert_eq!(a.location(), DEV0);
    let expect = |linear| {
        let idx = index_of(shape, linear);
        (idx, two.add_u64(idx.iter().sum::<usize>() as u64))
    };
    // Element reads come from the device (at most 64 per shape: each is a small copy).
    for linear in (0..n).step_by((n as usize / 64).max(1)) {
        let (idx, want) = expect(linear);
        assert_eq!(
            a.get(idx).unwrap(),
            want,
            "{} {shape:?} at {idx:?}",
            T::DTYPE
        );
    }
    assert_eq!(a.location(), DEV0, "get reads in place, it does not move");
    let not_on_host = CudaError::Array(ArrayError::NotOnHost { location: DEV0 });
    assert_eq!(a.as_slice().unwrap_err(), not_on_host);
    a.move_memory(Location::Host, None, true, None).unwrap();
    let host = a.as_slice().unwrap();
    for linear in 0..n {
        let (idx, want) = expect(linear);
        assert_eq!(
            host[linear as usize],
            want,
            "{} {shape:?} at {idx:?}",
            T::DTYPE
        );
    }
}

fn seed_flow_ndim_1_to_4<T: AddIndex>() {
    seed_flow::<T, 1>([7]);
    seed_flow::<T, 1>([1000]);
    seed_flow::<T, 2>([3, 5]);
    seed_flow::<T, 2>([37, 129]);
    seed_flow::<T, 3>([2, 3, 4]);
    seed_flow::<T, 4>([2, 3, 2, 3]);
    seed_flow::<T, 4>([3, 1, 17, 9]);
}

#[test]
fn gpu_seed_flow_every_dtype_and_ndim_1_to_4() {
    let Some(_dev) = gpu_or_skip() else { return };
    for dtype in DType::ALL {
        with_dtype!(dtype, T => seed_flow_ndim_1_to_4::<T>());
    }
}

#[test]
fn gpu_move_round_trips_random_data() {
    let Some(_dev) = gpu_or_skip() else { return };
    for (k, n) in [0usize, 1, 4 << 10, (1 << 20) + 3].into_iter().enumerate() {
        for kind in [HostKind::Pageable, HostKind::Pinned] {
            for sync in [true, false] {
                let what = format!("n={n} {kind:?} sync={sync}");
                let mut data = random_bytes(n, k as u64 + 1);
                let mut a = MemArray::<u8, 1>::with_options([n], 0, kind).unwrap();
                a.as_raw_mut().write_all(&data, None).unwrap();
                a.move_memory(DEV0, None, sync, None).unwrap();
                assert_eq!(a.location(), DEV0, "{what}");
                if n > 0 {
                    // Change the device copy, so the way home must carry it.
                    let v = data[n / 2].wrapping_add(1);
                    a.set([n / 2], v).unwrap();
                    data[n / 2] = v;
                }
                a.move_memory(Location::Host, None, sync, None).unwrap();
                assert_eq!(a.location(), Location::Host, "{what}");
                assert!(a.as_slice().unwrap() == &data[..], "{what}");
            }
        }
    }
}

/// `sync=false` only decides when the call returns: a host read right after an
/// asynchronous download waits for it (64 MiB of pinned memory take milliseconds to
/// arrive, so a read that did not wait would see the old zeros).
#[test]
fn gpu_host_access_after_an_async_download_is_never_torn() {
    let Some(_dev) = gpu_or_skip() else { return };
    let n = 16 << 20;
    let want = |i: usize| i as u32;
    for reader in 0..3 {
        let mut a = MemArray::<u32, 1>::with_options([n], 0, HostKind::Pinned).unwrap();
        a.move_memory(DEV0, None, false, None).unwrap();
        seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap();
        a.move_memory(Location::Host, None, false, None).unwrap();
        match reader {
            0 => {
                let host = a.as_slice().unwrap();
                let bad = (0..n).find(|&i| host[i] != want(i));
                assert_eq!(bad, None, "as_slice saw a torn copy");
            }
            1 => assert_eq!(a.get([n - 1]).unwrap(), want(n - 1)),
            _ => {
                let mut out = vec![0u8; n * 4];
                a.as_raw().read_all(&mut out, None).unwrap();
                let last = u32::from_ne_bytes(out[out.len() - 4..].try_into().unwrap());
                assert_eq!(last, want(n - 1), "read_all saw a torn copy");
            }
        }
    }
}

#[test]
fn gpu_moving_to_where_the_data_is_returns_at_once() {
    let Some(_dev) = gpu_or_skip() else { return };
    let mut a = MemArray::<i32, 1>::from_slice([4], &[1, 2, 3, 4]).unwrap();
    a.move_memory(DEV0, None, true, None).unwrap();
    let dev_ptr = a.indexer(None).unwrap().data;
    a.set([0], 100).unwrap();
    // Already on the device: no upload of the (now stale) host copy.
    a.move_memory(DEV0, None, true, None).unwrap();
    a.move_memory(DEV0, None, false, None).unwrap();
    assert_eq!(a.indexer(None).unwrap().data, dev_ptr);
    assert_eq!(a.get([0]).unwrap(), 100);
    a.move_memory(Location::Host, None, true, None).unwrap();
    a.set([1], 200).unwrap();
    // Already on the host: no download of the (now stale) device copy.
    a.move_memory(Location::Host, None, false, None).unwrap();
    assert_eq!(a.as_slice().unwrap(), &[100, 200, 3, 4]);
    // The device buffer is allocated once and reused.
    a.move_memory(DEV0, None, true, None).unwrap();
    assert_eq!(a.indexer(None).unwrap().data, dev_ptr);
    assert_eq!(a.get([1]).unwrap(), 200);
}

/// Stream A moves to the device and runs kernels; stream B moves back with no host
/// synchronisation in between. B must wait for A on the device.
#[test]
fn gpu_stream_b_waits_for_stream_a_without_a_host_sync() {
    let Some(dev) = gpu_or_skip() else { return };
    let (sa, sb) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let n = 16 << 20;
    let mut a = MemArray::<u32, 1>::with_options([n], 0, HostKind::Pinned).unwrap();
    a.move_memory(DEV0, Some(sa.as_ref()), false, None).unwrap();
    for _ in 0..8 {
        seed::add_index_tuple_device(a.as_raw_mut(), Some(sa.as_ref()), None).unwrap();
    }
    a.move_memory(Location::Host, Some(sb.as_ref()), false, None)
        .unwrap();
    assert_eq!(a.as_raw().pending_stream().unwrap(), Some(sb.as_ref()));
    let host = a.as_slice().unwrap();
    let bad = (0..n).find(|&i| host[i] != (8 * i) as u32);
    assert_eq!(
        bad, None,
        "stream B copied before stream A's kernels finished"
    );
}

/// Two arrays on two streams, interleaved, one of them changing streams at each step.
#[test]
fn gpu_two_arrays_on_two_streams() {
    let Some(dev) = gpu_or_skip() else { return };
    let (sa, sb) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let (ra, rb) = (Some(sa.as_ref()), Some(sb.as_ref()));
    let n = 4 << 20;
    let mut x = MemArray::<u32, 1>::with_options([n], 0, HostKind::Pinned).unwrap();
    let mut y = MemArray::<u32, 1>::new([n]).unwrap();
    x.move_memory(DEV0, ra, false, None).unwrap();
    y.move_memory(DEV0, rb, false, None).unwrap();
    seed::add_index_tuple_device(x.as_raw_mut(), rb, None).unwrap();
    seed::add_index_tuple_device(y.as_raw_mut(), rb, None).unwrap();
    seed::add_index_tuple_device(x.as_raw_mut(), ra, None).unwrap();
    seed::add_index_tuple_device(y.as_raw_mut(), ra, None).unwrap();
    seed::add_index_tuple_device(y.as_raw_mut(), rb, None).unwrap();
    x.move_memory(Location::Host, rb, false, None).unwrap();
    y.move_memory(Location::Host, ra, false, None).unwrap();
    let (hx, hy) = (x.as_slice().unwrap(), y.as_slice().unwrap());
    assert_eq!((0..n).find(|&i| hx[i] != (2 * i) as u32), None, "x");
    assert_eq!((0..n).find(|&i| hy[i] != (3 * i) as u32), None, "y");
}

#[test]
fn gpu_element_set_and_get_on_device_resident_data() {
    let Some(_dev) = gpu_or_skip() else { return };
    let mut a = MemArray::<f64, 2>::new([3, 4]).unwrap();
    a.move_memory(DEV0, None, false, None).unwrap();
    for linear in 0..12 {
        a.set(index_of([3, 4], linear), linear as f64 * 1.5)
            .unwrap();
    }
    for linear in 0..12 {
        assert_eq!(
            a.get(index_of([3, 4], linear)).unwrap(),
            linear as f64 * 1.5
        );
    }
    for bad in [[3, 0], [0, 4]] {
        let want = CudaError::Core(CoreError::OutOfBounds {
            index: bad.map(|i| i as u64).to_vec(),
            shape: vec![3, 4],
        });
        assert_eq!(a.get(bad).unwrap_err(), want);
        assert_eq!(a.set(bad, 0.0).unwrap_err(), want);
    }
    assert_eq!(a.location(), DEV0);
    a.move_memory(Location::Host, None, true, None).unwrap();
    let want: Vec<f64> = (0..12).map(|i| i as f64 * 1.5).collect();
    assert_eq!(a.as_slice().unwrap(), &want[..]);
}

#[test]
fn gpu_pinned_and_managed_host_kinds_round_trip() {
    let Some(_dev) = gpu_or_skip() else { return };
    let pattern = |i: usize, j: usize| (i * 7 + j * 3) as i16;
    for kind in [HostKind::Pinned, HostKind::Managed] {
        let mut a = MemArray::<i16, 2>::with_options([300, 301], 0, kind).unwrap();
        assert_eq!(a.as_raw().host_kind(), kind);
        a.view_mut()
            .unwrap()
            .indexed_iter_mut()
            .for_each(|((i, j), v)| *v = pattern(i, j));
        a.move_memory(DEV0, None, false, None).unwrap();
        seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap();
        a.move_memory(Location::Host, None, false, None).unwrap();
        let clone = a.try_clone().unwrap();
        assert_eq!(clone.as_raw().host_kind(), kind);
        for (m, what) in [(&a, "array"), (&clone, "clone")] {
            let v = m.view().unwrap();
            let bad = v
                .indexed_iter()
                .find(|&((i, j), &x)| x != pattern(i, j).wrapping_add((i + j) as i16));
            assert_eq!(bad, None, "{kind:?} {what}");
        }
    }
}

#[test]
fn gpu_peer_moves_between_two_devices() {
    let Some(devs) = gpus_or_skip(2) else { return };
    let n = 8 << 20;
    // Default streams: kernels on device 0, then a peer move with no host sync.
    let mut a = MemArray::<u32, 1>::new([n]).unwrap();
    a.move_memory(DEV0, None, false, None).unwrap();
    for _ in 0..4 {
        seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap();
    }
    a.move_memory(Location::Device(1), None, false, None)
        .unwrap();
    assert_eq!((a.location(), a.device_id()), (Location::Device(1), 1));
    let addr = a.indexer(None).unwrap().data as u64;
    assert_eq!(device_of_pointer(addr).unwrap().id(), 1);
    assert_eq!(a.get([n - 1]).unwrap(), 4 * (n as u32 - 1));
    seed::add_index_tuple_device(a.as_raw_mut(), None, None).unwrap();
    a.move_memory(Location::Host, None, false, None).unwrap();
    let host = a.as_slice().unwrap();
    assert_eq!((0..n).find(|&i| host[i] != (5 * i) as u32), None);
    peer_moves_with_owned_streams(&devs, n);
}

/// Regression: an owned stream of device 0 must not become the default for
/// work on device 1 (kernels and event records on another device's stream fail).
fn peer_moves_with_owned_streams(devs: &[Arc<Device>], n: usize) {
    let s0 = Stream::new(&devs[0]).unwrap();
    let s1 = Stream::new(&devs[1]).unwrap();
    let mut b = MemArray::<u32, 1>::with_options([n], 0, HostKind::Pinned).unwrap();
    b.move_memory(DEV0, Some(s0.as_ref()), false, None).unwrap();
    seed::add_index_tuple_device(b.as_raw_mut(), Some(s0.as_ref()), None).unwrap();
    b.move_memory(Location::Device(1), None, false, None)
        .unwrap();
    seed::add_index_tuple_device(b.as_raw_mut(), None, None).unwrap();
    seed::add_index_tuple_device(b.as_raw_mut(), Some(s1.as_ref()), None).unwrap();
    b.move_memory(DEV0, Some(s0.as_ref()), false, None).unwrap();
    seed::add_index_tuple_device(b.as_raw_mut(), None, None).unwrap();
    assert_eq!(b.location(), DEV0);
    b.move_memory(Location::Host, None, false, None).unwrap();
    let host = b.as_slice().unwrap();
    assert_eq!((0..n).find(|&i| host[i] != (4 * i) as u32), None);
}

#[test]
fn gpu_try_clone_of_device_data_is_deep() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let mut a = MemArray::<i64, 2>::new([64, 65]).unwrap();
    a.move_memory(DEV0, Some(s.as_ref()), false, None).unwrap();
    // Pending work on an owned stream: the clone must include its result.
    seed::add_index_tuple_device(a.as_raw_mut(), Some(s.as_ref()), None).unwrap();
    let mut b = a.try_clone().unwrap();
    assert_eq!(b.location(), DEV0);
    assert!(!b.is_locked());
    let (pa, pb) = (a.indexer(None).unwrap().data, b.indexer(None).unwrap().data);
    assert_ne!(pa, pb);
    assert_eq!(b.get([63, 64]).unwrap(), 127);
    b.set([63, 64], -1).unwrap();
    a.set([0, 0], -2).unwrap();
    assert_eq!(a.get([63, 64]).unwrap(), 127);
    assert_eq!(b.get([0, 0]).unwrap(), 0);
    seed::add_index_tuple_device(b.as_raw_mut(), None, None).unwrap();
    a.move_memory(Location::Host, None, true, None).unwrap();
    b.move_memory(Location::Host, None, true, None).unwrap();
    assert_eq!(a.get([1, 2]).unwrap(), 3);
    assert_eq!(b.get([1, 2]).unwrap(), 6);
    assert_eq!(b.get([63, 64]).unwrap(), 126);
}

#[test]
fn gpu_indexer_of_device_data_has_the_device_pointer() {
    let Some(dev) = gpu_or_skip() else { return };
    let mut a = MemArray::<f32, 3>::new([2, 3, 4]).unwrap();
    let host_ptr = a.host_ptr(None).unwrap();
    a.move_memory(DEV0, None, true, None).unwrap();
    let ix = a.indexer(None).unwrap();
    assert_eq!(ix.shape, [2, 3, 4]);
    assert_ne!(ix.data.cast::<f32>(), host_ptr);
    assert_eq!(ix.data as u64, a.as_raw().device_ptr(None).unwrap());
    assert_eq!(device_of_pointer(ix.data as u64).unwrap().id(), dev.id());
    assert!(matches!(
        a.host_ptr(None),
        Err(CudaError::Array(ArrayError::NotOnHost { .. }))
    ));
    a.move_memory(Location::Host, None, true, None).unwrap();
    assert_eq!(a.indexer(None).unwrap().data.cast::<f32>(), host_ptr);
}

#[test]
fn gpu_lock_checks_on_device_paths() {
    let Some(_dev) = gpu_or_skip() else { return };
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let mut a = MemArray::<f32, 2>::from_slice([4, 4], &data).unwrap();
    a.move_memory(DEV0, None, false, None).unwrap();
    let other = MemArray::<u8, 1>::new([1]).unwrap();
    let t = a.try_lock().unwrap();
    let foreign = other.try_lock().unwrap();
    for tok in [None, Some(foreign)] {
        let want = locked(t, tok);
        assert_eq!(a.get_with([1, 1], tok).unwrap_err(), want);
        assert_eq!(a.set_with([1, 1], 9.0, tok).unwrap_err(), want);
        assert_eq!(a.indexer(tok).unwrap_err(), want);
        for target in [Location::Host, DEV0] {
            assert_eq!(a.move_memory(target, None, true, tok), Err(want.clone()));
        }
        let raw = a.as_raw_mut();
        assert_eq!(
            seed::add_index_tuple_device(raw, None, tok),
            Err(want.clone())
        );
        assert_eq!(seed::add_index_tuple_host(raw, tok), Err(want.clone()));
        assert_eq!(raw.read_all(&mut [0u8; 64], tok), Err(want.clone()));
        assert_eq!(raw.write_all(&[0u8; 64], tok), Err(want.clone()));
        assert_eq!(raw.synchronize(tok), Err(want.clone()));
        assert_eq!(raw.device_ptr(tok), Err(want.clone()));
        let s = Consumer::Stream(StreamRef::legacy());
        assert_eq!(raw.export_buffer(tok, false, s).unwrap_err(), want);
    }
    assert_eq!(a.location(), DEV0, "refused operations change nothing");
    for linear in 0..16 {
        let idx = index_of([4, 4], linear);
        assert_eq!(a.get_with(idx, Some(t)).unwrap(), linear as f32);
    }
    seed::add_index_tuple_device(a.as_raw_mut(), None, Some(t)).unwrap();
    a.set_with([0, 0], -1.0, Some(t)).unwrap();
    a.move_memory(Location::Host, None, true, Some(t)).unwrap();
    a.unlock(t).unwrap();
    other.unlock(foreign).unwrap();
    assert_eq!(a.get([0, 0]).unwrap(), -1.0);
    assert_eq!(a.get([3, 3]).unwrap(), 15.0 + 6.0);
}

/// Host-side whole-array operations on device-resident data.
#[test]
fn gpu_write_all_and_host_add_index_on_device_data() {
    let Some(_dev) = gpu_or_skip() else { return };
    let mut a = MemArray::<u16, 1>::from_slice([5], &[1, 2, 3, 4, 5]).unwrap();
    a.move_memory(DEV0, None, true, None).unwrap();
    let mut out = [0u8; 10];
    a.as_raw().read_all(&mut out, None).unwrap();
    assert_eq!(out, [1, 0, 2, 0, 3, 0, 4, 0, 5, 0]);
    // add_index_tuple_host moves home first.
    seed::add_index_tuple_host(&mut a, None).unwrap();
    assert_eq!(a.location(), Location::Host);
    assert_eq!(a.as_slice().unwrap(), &[1, 3, 5, 7, 9]);
    // write_all on device data writes the device copy in place (it stays current there).
    a.move_memory(DEV0, None, true, None).unwrap();
    a.as_raw_mut().write_all(&[9u8; 10], None).unwrap();
    assert_eq!(a.location(), DEV0);
    assert_eq!(a.get([4]).unwrap(), 0x0909);
    a.move_memory(Location::Host, None, true, None).unwrap();
    assert_eq!(a.as_slice().unwrap(), &[0x0909; 5]);
}

/// The one import of a foreign device tensor. A C-contiguous tensor over
/// another array's device memory is shared; a strided view of it is gathered into a new
/// C-contiguous device array; a claim past the end of the allocation is refused before
/// any copy reads it; copies forbidden refuse the view.
#[test]
fn foreign_device_tensors_share_gather_or_refuse() {
    use memarray_core::foreign::{ForeignTensor, Place};
    use memarray_cuda::array::{CopyPolicy, RawArray};
    let Some(_dev) = gpu_or_skip() else { return };
    let values: Vec<u8> = (0..24).map(|i| i as u8 * 3).collect();
    let mut src = RawArray::zeros(DType::U8, &[4, 6], 0).unwrap();
    src.host_bytes_mut(None).unwrap().copy_from_slice(&values);
    src.move_memory(DEV0, None, false, None).unwrap();
    let buf = src.device_buffer(None).unwrap();
    let addr = buf.device_ptr();
    let tensor = |shape: Vec<usize>, strides: Vec<i64>| {
        // SAFETY: `buf` (the owner) holds 24 bytes at `addr` on device 0; the layouts that
        // reach past them are refused by the import's driver check before any read.
        unsafe {
            ForeignTensor::new(
                Place::Device(0),
                addr,
                0,
                DType::U8,
                shape,
                strides,
                false,
                Box::new(buf.clone()),
            )
        }
        .unwrap()
    };
    let shared = RawArray::import(tensor(vec![4, 6], vec![6, 1]), CopyPolicy::Never, None).unwrap();
    assert_eq!(shared.device_ptr(None).unwrap(), addr, "shared, not copied");
    // Every other column, transposed: 3 x 4, gathered on the device.
    let mut view =
        RawArray::import(tensor(vec![3, 4], vec![2, 6]), CopyPolicy::IfNeeded, None).unwrap();
    assert_eq!(view.location(), DEV0);
    assert_ne!(view.device_ptr(None).unwrap(), addr);
    view.move_memory(Location::Host, None, false, None).unwrap();
    let mut want = Vec::new();
    for i in 0..3 {
        for j in 0..4 {
            want.push(values[j * 6 + i * 2]);
        }
    }
    assert_eq!(view.host_bytes(None).unwrap(), &want[..]);
    let e = RawArray::import(tensor(vec![3, 4], vec![2, 6]), CopyPolicy::Never, None).unwrap_err();
    assert!(
        matches!(e, CudaError::Array(ArrayError::NotShareable { .. })),
        "{e}"
    );
    // 25 bytes claimed over a 24-byte array: the pool may round the allocation up, so
    // claim far past it.
    let e =
        RawArray::import(tensor(vec![1 << 30], vec![1]), CopyPolicy::IfNeeded, None).unwrap_err();
    assert!(
        matches!(e, CudaError::Array(ArrayError::ForeignMemory { .. })),
        "{e}"
    );
}
