//! Device queries, binding and peer access (GPU; skipped visibly without one).

use std::sync::Arc;

use memarray_cuda::{CudaError, Device, device_count, is_available};
use memarray_testing::gpu::{gpu_or_skip, gpus_or_skip};

#[test]
fn gpu_device_info() {
    let Some(dev) = gpu_or_skip() else { return };
    assert!(is_available());
    let n = device_count().unwrap();
    assert!(n >= 1);
    assert_eq!(dev.id(), 0);
    assert!(!dev.name().is_empty());
    assert!(
        dev.compute_capability() >= (7, 5),
        "{:?}",
        dev.compute_capability()
    );
    assert!(dev.multiprocessor_count() > 0);
    let info = dev.memory_info().unwrap();
    assert!(info.free <= info.total && info.total > 0, "{info:?}");
    println!("{dev:?}: {info:?}");
}

#[test]
fn gpu_devices_are_cached_and_ordinals_checked() {
    let Some(dev) = gpu_or_skip() else { return };
    assert!(Arc::ptr_eq(&dev, &Device::get(0).unwrap()));
    let n = device_count().unwrap();
    let e = Device::get(n).unwrap_err();
    assert_eq!(e, CudaError::NoSuchDevice { id: n, count: n });
    assert!(e.to_string().contains("CUDA_VISIBLE_DEVICES"));
}

#[test]
fn gpu_bind_from_other_threads() {
    let Some(dev) = gpu_or_skip() else { return };
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let d = dev.clone();
            std::thread::spawn(move || {
                {
                    let _outer = d.bind().unwrap();
                    let _inner = d.bind().unwrap();
                    d.memory_info().unwrap();
                    d.synchronize().unwrap();
                }
                // memarray leaves no context behind on the thread.
                assert!(memarray_cuda::device::current_context_is_null().unwrap());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn gpu_peer_access_is_idempotent() {
    let Some(dev) = gpu_or_skip() else { return };
    assert!(dev.can_access_peer(&dev).unwrap());
    dev.enable_peer_access(&dev).unwrap();
    let Some(devs) = gpus_or_skip(2) else { return };
    let (a, b) = (&devs[0], &devs[1]);
    if a.can_access_peer(b).unwrap() {
        a.enable_peer_access(b).unwrap();
        a.enable_peer_access(b).unwrap();
    } else {
        memarray_testing::gpu::report_skip("devices 0 and 1 cannot access each other");
    }
}
