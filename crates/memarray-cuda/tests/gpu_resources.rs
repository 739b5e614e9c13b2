//! The core conformance suite against every CUDA resource, and device buffers from each.

use std::sync::Arc;

use memarray_core::{HostBuffer, HostResource, MemoryKind, MemoryResource};
use memarray_cuda::copy;
use memarray_cuda::resource::default_resource;
use memarray_cuda::{
    AsyncPoolResource, CudaError, DEVICE_ALIGN, DeviceBuffer, DeviceResource, ManagedResource,
    PinnedFlags, PinnedResource, Stream,
};
use memarray_testing::conformance;
use memarray_testing::gpu::gpu_or_skip;

fn resources(dev: &Arc<memarray_cuda::Device>) -> Vec<Arc<dyn MemoryResource>> {
    vec![
        Arc::new(DeviceResource::new(dev)),
        Arc::new(AsyncPoolResource::new(dev).unwrap()),
        Arc::new(PinnedResource::new(dev)),
        Arc::new(PinnedResource::with_flags(
            dev,
            PinnedFlags {
                portable: true,
                mapped: true,
                write_combined: true,
            },
        )),
        Arc::new(ManagedResource::new(dev)),
    ]
}

#[test]
fn gpu_every_resource_conforms() {
    let Some(dev) = gpu_or_skip() else { return };
    for r in resources(&dev) {
        // Every part: alignment, sizes, 16 threads, accounting, out-of-memory.
        conformance::check_all(r.clone());
        println!("{} conforms", r.name());
    }
}

#[test]
fn gpu_kinds_and_accessibility() {
    let Some(dev) = gpu_or_skip() else { return };
    let kinds: Vec<_> = resources(&dev).iter().map(|r| r.kind()).collect();
    use MemoryKind::*;
    assert_eq!(kinds, [Device, Device, Pinned, Pinned, Managed]);
    let loc = dev.location();
    for r in resources(&dev) {
        assert!(r.is_accessible_from(loc), "{}", r.name());
    }
    assert!(!DeviceResource::new(&dev).is_accessible_from(memarray_core::Location::Host));
    assert!(PinnedResource::new(&dev).is_accessible_from(memarray_core::Location::Host));
    let info = DeviceResource::new(&dev).memory_info().unwrap();
    assert!(info.free <= info.total);
    assert_eq!(
        AsyncPoolResource::new(&dev).unwrap().release_threshold(),
        u64::MAX
    );
    let r = AsyncPoolResource::with_release_threshold(&dev, 1 << 30).unwrap();
    assert_eq!(r.release_threshold(), 1 << 30);
    // Restore the process-wide default pool setting for the other tests.
    AsyncPoolResource::new(&dev).unwrap();
}

#[test]
fn gpu_device_buffers_from_every_resource_are_zeroed_and_aligned() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    for r in resources(&dev) {
        for len in [0usize, 1, 1000, 1 << 20] {
            let b = DeviceBuffer::zeroed(&dev, len, r.clone(), s.as_ref()).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.device_ptr() % DEVICE_ALIGN as u64, 0);
            assert_eq!(b.kind(), r.kind());
            let mut out = vec![0xFFu8; len];
            copy::copy_dtoh(&mut out, &b, 0, s.as_ref()).unwrap();
            assert!(out.iter().all(|&x| x == 0), "{} len {len}", r.name());
        }
        // Zero-byte buffers still get unique addresses.
        let a = DeviceBuffer::zeroed(&dev, 0, r.clone(), s.as_ref()).unwrap();
        let b = DeviceBuffer::zeroed(&dev, 0, r.clone(), s.as_ref()).unwrap();
        assert_ne!(a.device_ptr(), b.device_ptr(), "{}", r.name());
    }
}

#[test]
fn gpu_host_memory_cannot_back_a_device_buffer() {
    let Some(dev) = gpu_or_skip() else { return };
    let e = DeviceBuffer::zeroed(
        &dev,
        64,
        Arc::new(HostResource),
        memarray_cuda::StreamRef::legacy(),
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::Inaccessible { .. }), "{e:?}");
    assert!(e.to_string().contains("cuda:0"), "{e}");
}

#[test]
fn gpu_out_of_memory_is_an_out_of_memory_error_naming_bytes_and_device() {
    let Some(dev) = gpu_or_skip() else { return };
    let total = dev.memory_info().unwrap().total as usize;
    let huge = total * 4;
    for r in [
        Arc::new(DeviceResource::new(&dev)) as Arc<dyn MemoryResource>,
        Arc::new(AsyncPoolResource::new(&dev).unwrap()),
    ] {
        // (Managed memory may oversubscribe the device, so it is not asked here.)
        let e = DeviceBuffer::zeroed(&dev, huge, r.clone(), memarray_cuda::StreamRef::legacy())
            .unwrap_err();
        let CudaError::Core(memarray_core::CoreError::OutOfMemory { bytes, reason, .. }) = &e
        else {
            panic!("{}: expected a core OutOfMemory error, got {e:?}", r.name());
        };
        assert_eq!(*bytes, huge);
        assert!(reason.contains("cuda:0"), "{}: {reason}", r.name());
    }
}

#[test]
fn gpu_pinned_host_buffers_round_trip() {
    let Some(dev) = gpu_or_skip() else { return };
    let pinned: Arc<dyn MemoryResource> = Arc::new(PinnedResource::new(&dev));
    let src = HostBuffer::from_bytes(&[5u8; 10_000], pinned.clone()).unwrap();
    let mut dst = HostBuffer::zeroed_in(10_000, pinned).unwrap();
    let s = Stream::new(&dev).unwrap();
    let d =
        DeviceBuffer::zeroed(&dev, 10_000, default_resource(&dev).unwrap(), s.as_ref()).unwrap();
    let _ = copy::copy_htod(&d, 0, src.as_slice(), s.as_ref()).unwrap();
    copy::copy_dtoh(dst.as_mut_slice(), &d, 0, s.as_ref()).unwrap();
    assert_eq!(src.as_slice(), dst.as_slice());
}

#[test]
fn gpu_default_resource_is_cached_per_device() {
    let Some(dev) = gpu_or_skip() else { return };
    let a = default_resource(&dev).unwrap();
    let b = default_resource(&dev).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    if std::env::var("MEMARRAY_MEMORY_RESOURCE").is_err() {
        assert_eq!(a.name(), "pool(cuda:0 device)");
    }
}

#[test]
fn gpu_foreign_device_memory_is_wrapped_and_released_with_its_owner() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let owned =
        DeviceBuffer::zeroed(&dev, 1000, Arc::new(DeviceResource::new(&dev)), s.as_ref()).unwrap();
    let addr = owned.device_ptr();
    let _ = copy::copy_htod(&owned, 0, &[3u8; 1000], s.as_ref()).unwrap();
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct Owner(
        #[allow(dead_code)] DeviceBuffer,
        Arc<std::sync::atomic::AtomicBool>,
    );
    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let owner = Box::new(Owner(owned, dropped.clone()));
    // SAFETY: `owner` keeps the allocation alive; the htod above is on the same stream.
    let wrapped =
        unsafe { DeviceBuffer::from_foreign(&dev, addr + 10, 990, owner, s.as_ref()) }.unwrap();
    assert_eq!(wrapped.device_ptr(), addr + 10);
    assert_eq!(wrapped.kind(), MemoryKind::Device);
    let mut out = vec![0u8; 990];
    copy::copy_dtoh(&mut out, &wrapped, 0, s.as_ref()).unwrap();
    assert!(out.iter().all(|&x| x == 3));
    // A copy through the wrapper's resource is a fresh device allocation.
    let copy = DeviceBuffer::zeroed(&dev, 990, wrapped.resource().clone(), s.as_ref()).unwrap();
    let _ = copy::copy_dtod(&copy, 0, &wrapped, 0, 990, s.as_ref()).unwrap();
    s.synchronize().unwrap();
    drop(wrapped);
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the owner was released"
    );
    copy::copy_dtoh(&mut out, &copy, 0, s.as_ref()).unwrap();
    assert!(out.iter().all(|&x| x == 3));
}

#[test]
fn gpu_device_of_pointer() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = memarray_cuda::StreamRef::legacy();
    for r in [
        Arc::new(DeviceResource::new(&dev)) as Arc<dyn MemoryResource>,
        Arc::new(ManagedResource::new(&dev)),
    ] {
        let b = DeviceBuffer::zeroed(&dev, 64, r, s).unwrap();
        let d = memarray_cuda::device_of_pointer(b.device_ptr() + 5).unwrap();
        assert!(Arc::ptr_eq(&d, &dev));
    }
    // Pageable host memory: an error, or a device where the driver manages it (HMM).
    let on_stack = 0u64;
    let _ = memarray_cuda::device_of_pointer(&on_stack as *const u64 as u64);
}
