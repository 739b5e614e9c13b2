//! Round-trip copies at many sizes and unaligned offsets, bounds errors, peer copies.

mod common;

use std::sync::Arc;

use common::random_bytes;
use memarray_core::{CoreError, HostBuffer, MemoryResource};
use memarray_cuda::copy;
use memarray_cuda::{
    AsyncPoolResource, CudaError, DeviceBuffer, DeviceResource, ManagedResource, PinnedResource,
    Stream, StreamRef,
};
use memarray_testing::gpu::{gpu_or_skip, gpus_or_skip};

const SIZES: [usize; 7] = [0, 1, 7, 256, 4099, 1 << 20, (1 << 20) + 5];
const OFFSETS: [usize; 3] = [0, 3, 17];

#[test]
fn gpu_htod_dtod_dtoh_round_trip() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let resources: [Arc<dyn MemoryResource>; 3] = [
        Arc::new(DeviceResource::new(&dev)),
        Arc::new(AsyncPoolResource::new(&dev).unwrap()),
        Arc::new(ManagedResource::new(&dev)),
    ];
    for r in &resources {
        for (k, &n) in SIZES.iter().enumerate() {
            for &o1 in &OFFSETS {
                let o2 = (o1 * 5 + 1) % 23;
                let data = random_bytes(n, (k * 31 + o1) as u64 + 1);
                let a = DeviceBuffer::zeroed(&dev, n + o1, r.clone(), s.as_ref()).unwrap();
                let b = DeviceBuffer::zeroed(&dev, n + o2 + 9, r.clone(), s.as_ref()).unwrap();
                let _ = copy::copy_htod(&a, o1, &data, s.as_ref()).unwrap();
                let _ = copy::copy_dtod(&b, o2, &a, o1, n, s.as_ref()).unwrap();
                let mut out = vec![0u8; n + o2 + 9];
                copy::copy_dtoh(&mut out, &b, 0, s.as_ref()).unwrap();
                assert!(out[..o2].iter().all(|&x| x == 0), "{} n={n}", r.name());
                assert_eq!(
                    &out[o2..o2 + n],
                    &data[..],
                    "{} n={n} o1={o1} o2={o2}",
                    r.name()
                );
                assert!(out[o2 + n..].iter().all(|&x| x == 0));
                // memset a middle range back to zero.
                if n > 2 {
                    let _ = copy::memset_zero(&b, o2 + 1, n - 2, s.as_ref()).unwrap();
                    let mut mid = vec![1u8; n - 2];
                    copy::copy_dtoh(&mut mid, &b, o2 + 1, s.as_ref()).unwrap();
                    assert!(mid.iter().all(|&x| x == 0));
                }
            }
        }
    }
}

#[test]
fn gpu_raw_copies_from_and_to_pinned_memory() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let pinned: Arc<dyn MemoryResource> = Arc::new(PinnedResource::new(&dev));
    let n = (8 << 20) + 3;
    let src = HostBuffer::from_bytes(&random_bytes(n, 99), pinned.clone()).unwrap();
    let dst = HostBuffer::zeroed_in(n, pinned).unwrap();
    let d = DeviceBuffer::zeroed(&dev, n, Arc::new(DeviceResource::new(&dev)), s.as_ref()).unwrap();
    // SAFETY: both host buffers live and are untouched until the event below completes.
    let ev = unsafe {
        let _ = copy::copy_htod_raw(&d, 0, src.as_ptr(), n, s.as_ref()).unwrap();
        copy::copy_dtoh_raw(dst.as_mut_ptr(), &d, 0, n, s.as_ref()).unwrap()
    }
    .into_event()
    .unwrap();
    ev.synchronize().unwrap();
    assert_eq!(src.as_slice(), dst.as_slice());
}

#[test]
fn gpu_out_of_range_copies_are_refused() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = StreamRef::legacy();
    let r = Arc::new(DeviceResource::new(&dev));
    let a = DeviceBuffer::zeroed(&dev, 100, r.clone(), s).unwrap();
    let b = DeviceBuffer::zeroed(&dev, 50, r, s).unwrap();
    let oob = |e: CudaError| matches!(e, CudaError::Core(CoreError::CopyOutOfRange { .. }));
    assert!(oob(copy::copy_htod(&a, 1, &[0u8; 100], s).unwrap_err()));
    assert!(oob(
        copy::copy_htod(&a, usize::MAX, &[0u8; 2], s).unwrap_err()
    ));
    assert!(oob(copy::copy_dtoh(&mut [0u8; 60], &b, 0, s).unwrap_err()));
    assert!(oob(copy::copy_dtod(&b, 0, &a, 0, 51, s).unwrap_err()));
    assert!(oob(copy::copy_dtod(&a, 0, &b, 49, 2, s).unwrap_err()));
    assert!(oob(copy::memset_zero(&b, 50, 1, s).unwrap_err()));
    let e = copy::copy_htod(&b, 40, &[0u8; 20], s).unwrap_err();
    assert_eq!(
        e.to_string(),
        "copy of 20 bytes at offset 40 overruns a buffer of 50 bytes"
    );
    // Edges are fine, including empty ranges at the end.
    let _ = copy::copy_htod(&b, 50, &[], s).unwrap();
    let _ = copy::copy_dtod(&a, 50, &b, 0, 50, s).unwrap();
}

#[test]
fn gpu_peer_copies_between_devices() {
    let Some(devs) = gpus_or_skip(2) else { return };
    let (d0, d1) = (&devs[0], &devs[1]);
    let n = (4 << 20) + 11;
    let data = random_bytes(n, 7);
    let s0 = Stream::new(d0).unwrap();
    let s1 = Stream::new(d1).unwrap();
    let a = DeviceBuffer::zeroed(d0, n, Arc::new(DeviceResource::new(d0)), s0.as_ref()).unwrap();
    let b =
        DeviceBuffer::zeroed(d1, n + 5, Arc::new(DeviceResource::new(d1)), s1.as_ref()).unwrap();
    let ev = copy::copy_htod(&a, 0, &data, s0.as_ref())
        .unwrap()
        .into_event()
        .unwrap();
    s1.wait(&ev).unwrap();
    for enable in [false, true] {
        if enable && d1.can_access_peer(d0).unwrap() {
            d1.enable_peer_access(d0).unwrap();
        }
        let _ = copy::copy_peer(&b, 5, &a, 0, n, s1.as_ref()).unwrap();
        let mut out = vec![0u8; n];
        copy::copy_dtoh(&mut out, &b, 5, s1.as_ref()).unwrap();
        assert_eq!(out, data, "peer access enabled: {enable}");
    }
    let e = copy::copy_dtod(&b, 0, &a, 0, 1, s1.as_ref()).unwrap_err();
    assert!(
        matches!(
            e,
            CudaError::WrongDevice {
                expected: 1,
                got: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("copy_peer"));
}
