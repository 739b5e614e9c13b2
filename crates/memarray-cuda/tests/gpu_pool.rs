//! The caching pool on the device: the conformance suite over device, pinned and
//! managed upstreams (and a statistics adaptor over the pool), and the cross-stream reuse
//! rule: a block freed on a busy stream is not handed to another stream until that
//! stream's work has completed, while the same stream reuses it at once.

use std::sync::Arc;

use memarray_core::{MemoryResource, RawStream, StatisticsAdaptor};
use memarray_cuda::copy;
use memarray_cuda::resource::CachingPool;
use memarray_cuda::{DeviceBuffer, DeviceResource, ManagedResource, PinnedResource, Stream};
use memarray_testing::conformance;
use memarray_testing::gpu::{ForeignStream, gpu_or_skip};

#[test]
fn gpu_pool_over_every_upstream_conforms() {
    let Some(dev) = gpu_or_skip() else { return };
    let upstreams: Vec<Arc<dyn MemoryResource>> = vec![
        Arc::new(DeviceResource::new(&dev)),
        Arc::new(PinnedResource::new(&dev)),
        Arc::new(ManagedResource::new(&dev)),
    ];
    for up in upstreams {
        for threshold in [usize::MAX, 0] {
            let pool: Arc<dyn MemoryResource> =
                Arc::new(CachingPool::new(up.clone(), &dev, threshold));
            conformance::check_all(pool.clone());
            conformance::check_all(Arc::new(StatisticsAdaptor::new(pool.clone())));
            println!("{} (threshold {threshold}) conforms", pool.name());
        }
    }
}

fn raw(s: &Stream) -> RawStream {
    // SAFETY: s is a live stream of the pool's device for the whole test.
    unsafe { RawStream::from_raw(s.raw()) }
}

#[test]
fn gpu_pool_reuses_across_streams_only_after_the_work_completed() {
    let Some(dev) = gpu_or_skip() else { return };
    let upstream: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
    let pool = Arc::new(CachingPool::new(upstream.clone(), &dev, usize::MAX));
    let (a, b) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    for bytes in [64 << 10, 3 << 20] {
        let p = pool.allocate(bytes, 256, Some(raw(&a))).unwrap();
        // Keep stream a busy for many milliseconds: 1 GiB memsets, queued.
        let big = DeviceBuffer::zeroed(&dev, 1 << 30, upstream.clone(), a.as_ref()).unwrap();
        for _ in 0..40 {
            let _ = copy::memset_zero(&big, 0, 1 << 30, a.as_ref()).unwrap();
        }
        // SAFETY: p came from the pool with these arguments; its last use is on a.
        unsafe { pool.deallocate(p, bytes, 256, Some(raw(&a))) };
        let on_b = pool.allocate(bytes, 256, Some(raw(&b))).unwrap();
        assert_ne!(
            on_b, p,
            "{bytes} B: reused on b while a's work was still queued"
        );
        let on_a = pool.allocate(bytes, 256, Some(raw(&a))).unwrap();
        assert_eq!(on_a, p, "{bytes} B: the same stream reuses at once");
        // SAFETY: as above, each freed once on the stream of its last use.
        unsafe {
            pool.deallocate(on_a, bytes, 256, Some(raw(&a)));
            pool.deallocate(on_b, bytes, 256, Some(raw(&b)));
        }
        a.synchronize().unwrap();
        drop(big);
        // a is idle now: b may take a's block (b's own cached block comes first).
        let first = pool.allocate(bytes, 256, Some(raw(&b))).unwrap();
        let second = pool.allocate(bytes, 256, Some(raw(&b))).unwrap();
        assert!(
            first == on_b && second == p,
            "{bytes} B: idle stream's block not reused"
        );
        // SAFETY: as above.
        unsafe {
            pool.deallocate(first, bytes, 256, Some(raw(&b)));
            pool.deallocate(second, bytes, 256, Some(raw(&b)));
        }
    }
    b.synchronize().unwrap();
    assert!(pool.trim() > 0);
    assert_eq!(pool.statistics().upstream_bytes, 0);
}

#[test]
fn gpu_pool_zeroes_device_memory_and_device_buffers_use_it() {
    let Some(dev) = gpu_or_skip() else { return };
    let pool: Arc<dyn MemoryResource> = Arc::new(CachingPool::new(
        Arc::new(DeviceResource::new(&dev)),
        &dev,
        usize::MAX,
    ));
    let s = Stream::new(&dev).unwrap();
    for round in 0..3 {
        let buf = DeviceBuffer::zeroed(&dev, 5 << 20, pool.clone(), s.as_ref()).unwrap();
        let mut host = vec![1u8; 5 << 20];
        copy::copy_dtoh(&mut host, &buf, 0, s.as_ref()).unwrap();
        assert!(host.iter().all(|&x| x == 0), "round {round}: not zeroed");
        // Dirty it so the next round's reuse must zero again.
        let ones = vec![0xFFu8; 5 << 20];
        let _ = copy::copy_htod(&buf, 0, &ones, s.as_ref()).unwrap();
    }
}

/// An export's consumer stream is recorded when the export is released: the freed block
/// is not handed to another stream while the consumer's queued work may still use it.
#[test]
fn gpu_pool_waits_for_an_export_consumer_before_reuse() {
    use memarray_core::{DType, Location};
    use memarray_cuda::StreamRef;
    use memarray_cuda::array::{Consumer, RawArray};

    let Some(dev) = gpu_or_skip() else { return };
    let upstream: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
    let pool = Arc::new(CachingPool::new(upstream.clone(), &dev, usize::MAX));
    let mut a = RawArray::zeros(DType::U8, &[1 << 20], 0).unwrap();
    a.set_device_resource(Some(pool.clone())).unwrap();
    a.move_memory(Location::Device(0), None, true, None)
        .unwrap();
    let consumer = Stream::new(&dev).unwrap();
    let export = a
        .export_buffer(None, false, Consumer::Stream(consumer.as_ref()))
        .unwrap();
    let addr = export.ptr as usize;
    // The consumer queues long work, then releases the export; the array goes too.
    let big = DeviceBuffer::zeroed(&dev, 1 << 30, upstream, consumer.as_ref()).unwrap();
    for _ in 0..40 {
        let _ = copy::memset_zero(&big, 0, 1 << 30, consumer.as_ref()).unwrap();
    }
    drop(export);
    drop(a);
    let other = Stream::new(&dev).unwrap();
    let p = pool.allocate(1 << 20, 256, Some(raw(&other))).unwrap();
    assert_ne!(
        p.as_ptr() as usize,
        addr,
        "reused under the consumer's queued work"
    );
    consumer.synchronize().unwrap();
    StreamRef::legacy().synchronize(&dev).unwrap();
    let q = pool.allocate(1 << 20, 256, Some(raw(&other))).unwrap();
    assert_eq!(
        q.as_ptr() as usize,
        addr,
        "reused once the consumer's work is done"
    );
    // SAFETY: both came from the pool with these arguments and are freed once.
    unsafe {
        pool.deallocate(p, 1 << 20, 256, Some(raw(&other)));
        pool.deallocate(q, 1 << 20, 256, Some(raw(&other)));
    }
    other.synchronize().unwrap();
    drop(big);
}

#[test]
fn gpu_pool_never_names_a_stream_again_after_its_call() {
    // cuda.core, torch and CuPy destroy streams while blocks freed on them sit in the
    // cache: reuse on other streams and trimming must not touch the dead stream (it used
    // to record an event there: a segfault in the driver).
    let Some(dev) = gpu_or_skip() else { return };
    let upstream: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
    let pool = CachingPool::new(upstream, &dev, usize::MAX);
    let sizes = [4 << 10, 1 << 20, 5 << 20];
    // A foreign stream (memarray's own are recycled, never destroyed).
    let gone = ForeignStream::new(&dev).unwrap();
    // SAFETY: live until dropped below, after its last call.
    let gone_raw = unsafe { RawStream::from_raw(gone.raw()) };
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&n| pool.allocate(n, 256, Some(gone_raw)).unwrap())
        .collect();
    for (&p, &n) in blocks.iter().zip(&sizes) {
        // SAFETY: p came from the pool with these arguments and is freed once, on `gone`.
        unsafe { pool.deallocate(p, n, 256, Some(gone_raw)) };
    }
    dev.synchronize().unwrap();
    drop(gone); // destroyed: its handle may name anything now
    let other = Stream::new(&dev).unwrap();
    for (&p, &n) in blocks.iter().zip(&sizes) {
        let q = pool.allocate(n, 256, Some(raw(&other))).unwrap();
        assert_eq!(q, p, "{n} B: the dead stream's finished block is reused");
        // SAFETY: as above, on `other`.
        unsafe { pool.deallocate(q, n, 256, Some(raw(&other))) };
    }
    drop(other);
    // Trimming blocks last freed on a destroyed stream: ordered by their events.
    assert!(pool.trim() > 0);
    assert_eq!(pool.statistics().upstream_bytes, 0);
    dev.synchronize().unwrap();
}

#[test]
fn gpu_pool_frees_on_memarrays_own_streams_record_no_event_and_still_order_reuse() {
    // memarray's streams outlive every call: a free there records nothing (the bare
    // pool's cost); a reuse on another stream records an event on the freeing stream then,
    // and trimming orders the give-back the same way.
    let Some(dev) = gpu_or_skip() else { return };
    let upstream: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
    let pool = Arc::new(CachingPool::new(upstream.clone(), &dev, usize::MAX));
    let (a, b) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let bytes = 1 << 20;
    // Cheap, like a free on the legacy stream: compare the best of 7 runs of each (an
    // event recorded per free would cost several times more; sub-millisecond medians were
    // too noisy on some hosts).
    let cost = |s: RawStream| {
        let mut t: Vec<f64> = (0..7)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..20000 {
                    let p = pool.allocate(bytes, 256, Some(s)).unwrap();
                    // SAFETY: freed once, on the stream it was allocated on.
                    unsafe { pool.deallocate(p, bytes, 256, Some(s)) };
                }
                start.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[0]
    };
    let legacy = cost(RawStream::LEGACY);
    let own = cost(raw(&a));
    assert!(
        own < legacy * 2.0,
        "a free on memarray's stream costs {own:.4} s per 20000 against {legacy:.4} s on legacy"
    );
    // Ordering still holds (as gpu_pool_reuses_across_streams_only_after_the_work_completed).
    let p = pool.allocate(bytes, 256, Some(raw(&a))).unwrap();
    let big = DeviceBuffer::zeroed(&dev, 1 << 30, upstream.clone(), a.as_ref()).unwrap();
    for _ in 0..40 {
        let _ = copy::memset_zero(&big, 0, 1 << 30, a.as_ref()).unwrap();
    }
    // SAFETY: freed once, on a, its last use.
    unsafe { pool.deallocate(p, bytes, 256, Some(raw(&a))) };
    let q = pool.allocate(bytes, 256, Some(raw(&b))).unwrap();
    assert_ne!(q, p, "reused on b while a's work was still queued");
    // SAFETY: as above, on b.
    unsafe { pool.deallocate(q, bytes, 256, Some(raw(&b))) };
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    drop(big);
    assert!(pool.trim() > 0);
    assert_eq!(pool.statistics().upstream_bytes, 0);
}

#[test]
fn gpu_a_block_freed_under_a_capture_waits_for_its_graph_to_go() {
    use memarray_cuda::graph::CaptureMode;
    let Some(dev) = gpu_or_skip() else { return };
    let upstream: Arc<dyn MemoryResource> = Arc::new(DeviceResource::new(&dev));
    let pool = Arc::new(CachingPool::new(upstream, &dev, usize::MAX));
    let s = Stream::new(&dev).unwrap();
    for bytes in [4 << 10, 3 << 20] {
        let p = pool.allocate(bytes, 256, Some(raw(&s))).unwrap();
        let capture = s
            .as_ref()
            .begin_capture(&dev, CaptureMode::ThreadLocal)
            .unwrap();
        // SAFETY: p came from the pool with these arguments; the graph may use it.
        unsafe { pool.deallocate(p, bytes, 256, Some(raw(&s))) };
        let graph = capture.end().unwrap();
        let exec = graph.instantiate().unwrap();
        drop(graph);
        // Held for the executable: not handed out again, on this stream or any.
        let q = pool.allocate(bytes, 256, Some(raw(&s))).unwrap();
        assert_ne!(q, p, "{bytes} B: reused while its graph can still run");
        exec.launch(s.as_ref()).unwrap().synchronize().unwrap();
        drop(exec);
        // The graph gone (its release comes on a driver thread), the block comes back.
        let mut back = false;
        for _ in 0..200 {
            let r = pool.allocate(bytes, 256, None).unwrap();
            back = r == p;
            // SAFETY: r came from the pool with these arguments, unused.
            unsafe { pool.deallocate(r, bytes, 256, None) };
            if back {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            back,
            "{bytes} B: the block never came back after its graph was gone"
        );
        // SAFETY: q came from the pool with these arguments.
        unsafe { pool.deallocate(q, bytes, 256, Some(raw(&s))) };
    }
}
