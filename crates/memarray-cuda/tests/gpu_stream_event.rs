//! Streams and events: ordering across streams without host blocking, queries, timing.

use std::sync::Arc;

use memarray_core::{DType, HostBuffer};
use memarray_cuda::copy;
use memarray_cuda::{DeviceBuffer, DeviceResource, Event, PinnedResource, Stream, StreamRef};
use memarray_seed as seed;
use memarray_testing::gpu::gpu_or_skip;

#[test]
fn gpu_record_on_a_wait_on_b_orders_the_work() {
    let Some(dev) = gpu_or_skip() else { return };
    let (a, b) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let res = Arc::new(DeviceResource::new(&dev));
    let n = 64 << 20;
    let pinned = Arc::new(PinnedResource::new(&dev));
    let mut src = HostBuffer::zeroed_in(n, pinned.clone()).unwrap();
    for (i, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 7 % 251) as u8;
    }
    let buf1 = DeviceBuffer::zeroed(&dev, n, res.clone(), a.as_ref()).unwrap();
    let buf2 = DeviceBuffer::zeroed(&dev, n, res, b.as_ref()).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();

    // On A: upload, then a kernel over it, then record. On B: wait, copy, download.
    let _ = copy::copy_htod(&buf1, 0, src.as_slice(), a.as_ref()).unwrap();
    let ev = Event::new(&dev).unwrap();
    seed::add_index_tuple(DType::U8, &buf1, &[n], a.as_ref())
        .unwrap()
        .record(&ev)
        .unwrap();
    b.wait(&ev).unwrap();
    let _ = copy::copy_dtod(&buf2, 0, &buf1, 0, n, b.as_ref()).unwrap();
    let mut out = vec![0u8; n];
    copy::copy_dtoh(&mut out, &buf2, 0, b.as_ref()).unwrap();
    for (i, (&got, &s)) in out.iter().zip(src.as_slice()).enumerate() {
        assert_eq!(got, s.wrapping_add(i as u8), "byte {i}");
    }
    assert!(ev.is_complete().unwrap());
}

#[test]
fn gpu_event_queries_and_timing() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let fresh = Event::new(&dev).unwrap();
    assert!(
        fresh.is_complete().unwrap(),
        "a never-recorded event is complete"
    );
    fresh.synchronize().unwrap();
    let (start, end) = (Event::timed(&dev).unwrap(), Event::timed(&dev).unwrap());
    assert!(start.is_timed() && !fresh.is_timed());
    let n = 256 << 20;
    let buf =
        DeviceBuffer::zeroed(&dev, n, Arc::new(DeviceResource::new(&dev)), s.as_ref()).unwrap();
    start.record(s.as_ref()).unwrap();
    for _ in 0..8 {
        let _ = seed::add_index_tuple(DType::U8, &buf, &[n], s.as_ref()).unwrap();
    }
    end.record(s.as_ref()).unwrap();
    end.synchronize().unwrap();
    assert!(end.is_complete().unwrap());
    let ms = end.elapsed_ms(&start).unwrap();
    assert!(ms > 0.0, "{ms} ms");
    // An event without timing cannot be timed: an error, not a panic.
    fresh.record(s.as_ref()).unwrap();
    assert!(fresh.elapsed_ms(&start).is_err());
}

#[test]
fn gpu_default_streams_and_enqueued_helpers() {
    let Some(dev) = gpu_or_skip() else { return };
    let res = Arc::new(DeviceResource::new(&dev));
    for s in [StreamRef::legacy(), StreamRef::per_thread()] {
        let buf = DeviceBuffer::zeroed(&dev, 4096, res.clone(), s).unwrap();
        let ev = copy::copy_htod(&buf, 0, &[9u8; 4096], s)
            .unwrap()
            .into_event()
            .unwrap();
        s.wait(&ev).unwrap();
        s.synchronize(&dev).unwrap();
        let mut out = [0u8; 4096];
        copy::copy_dtoh(&mut out, &buf, 0, s).unwrap();
        assert!(out.iter().all(|&x| x == 9));
    }
}
