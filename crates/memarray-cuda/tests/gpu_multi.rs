//! One array across devices (scatter / gather) and IPC handles with events. Runs on one
//! GPU with the parts on device 0; the 2-GPU cases skip on one GPU (fail under
//! MEMARRAY_REQUIRE_PEER=1).

mod common;

use common::i32s;
use memarray_core::{DType, Location};
use memarray_cuda::{RawArray, Stream};
use memarray_seed as seed;
use memarray_testing::gpu::{gpu_or_skip, gpus_or_skip};

fn ramp(rows: usize, cols: usize) -> RawArray {
    let bytes: Vec<u8> = (0..(rows * cols) as i32)
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    RawArray::from_bytes(DType::I32, &[rows, cols], &bytes, 0).unwrap()
}

/// Scatters a host and a device array over `devices`, runs the kernel on each part, and
/// checks the gathered result element by element.
fn scatter_kernel_gather(devices: &[u32]) {
    let (rows, cols) = (1001, 37);
    for on_device in [false, true] {
        let mut a = ramp(rows, cols);
        if on_device {
            a.move_memory(Location::Device(0), None, false, None)
                .unwrap();
        }
        let mut parts = a.scatter(devices, None).unwrap();
        let sizes: Vec<usize> = parts.iter().map(|p| p.shape()[0]).collect();
        assert_eq!(sizes.iter().sum::<usize>(), rows);
        for (p, &d) in parts.iter_mut().zip(devices) {
            assert_eq!(p.location(), Location::Device(d));
            seed::add_index_tuple_device(p, None, None).unwrap();
        }
        let refs: Vec<&RawArray> = parts.iter().collect();
        for to in [Location::Host, Location::Device(devices[devices.len() - 1])] {
            let g = RawArray::gather(&refs, to).unwrap();
            assert_eq!(g.location(), to);
            assert_eq!(g.shape(), &[rows, cols]);
            let got = i32s(&g);
            let mut start = 0;
            for &n in &sizes {
                for i in 0..n {
                    for j in 0..cols {
                        let global = ((start + i) * cols + j) as i32;
                        assert_eq!(
                            got[(start + i) * cols + j],
                            global + (i + j) as i32,
                            "row {} col {j} (part rows {sizes:?}, from device {on_device}, to {to})",
                            start + i
                        );
                    }
                }
                start += n;
            }
        }
        // The source is untouched and still usable.
        assert_eq!(i32s(&a), (0..(rows * cols) as i32).collect::<Vec<_>>());
    }
}

#[test]
fn gpu_scatter_gather_on_one_device() {
    if gpu_or_skip().is_none() {
        return;
    }
    scatter_kernel_gather(&[0, 0, 0]);
}

#[test]
fn gpu_scatter_gather_across_two_devices() {
    if gpus_or_skip(2).is_none() {
        return;
    }
    scatter_kernel_gather(&[0, 1]);
    scatter_kernel_gather(&[1, 0, 1]);
}

#[test]
fn gpu_scatter_orders_after_pending_work_on_another_stream() {
    let Some(dev) = gpu_or_skip() else { return };
    let s = Stream::new(&dev).unwrap();
    let mut a =
        RawArray::zeros_on(DType::I32, &[4096, 64], Location::Device(0), None, None).unwrap();
    // The kernel is pending on `s` when scatter copies on the legacy stream.
    for _ in 0..5 {
        seed::add_index_tuple_device(&mut a, Some(s.as_ref()), None).unwrap();
    }
    let parts = a.scatter(&[0, 0], None).unwrap();
    let refs: Vec<&RawArray> = parts.iter().collect();
    let got = i32s(&RawArray::gather(&refs, Location::Host).unwrap());
    for (k, v) in got.iter().enumerate() {
        let (i, j) = (k / 64, k % 64);
        assert_eq!(*v, 5 * (i + j) as i32, "element {k}");
    }
}

#[test]
fn gpu_array_ipc_handles_carry_an_event_and_are_reused() {
    if gpu_or_skip().is_none() {
        return;
    }
    let mut a = ramp(64, 64);
    a.move_memory(Location::Device(0), None, false, None)
        .unwrap();
    let h1 = a.ipc_handle(None).unwrap();
    let h2 = a.ipc_handle(None).unwrap();
    assert!(
        h1.event.is_some(),
        "an array's handle orders the importer with an event"
    );
    assert_eq!(
        h1, h2,
        "the allocation's handle and the event are made once"
    );
    assert_eq!(h1.nbytes, 64 * 64 * 4);
    // The buffer-level handle has no event (the caller finished its writes).
    let b = a.device_buffer(None).unwrap();
    assert!(b.ipc_handle().unwrap().event.is_none());
    // This process cannot open its own handle.
    assert!(RawArray::from_ipc_handle(&h1, DType::I32, &[64, 64]).is_err());
}

/// Packs arrays of several dtypes and sizes (one empty, one written by a kernel just
/// before) into one allocation, moves the pack to `to`, unpacks it there, and checks every
/// array byte for byte; the unpacked arrays outlive the pack and stay independent.
fn pack_move_unpack(to: u32) {
    let mut parts: Vec<RawArray> = Vec::new();
    for (i, n) in [1usize, 7, 0, 1000, 64].into_iter().enumerate() {
        let mut a = ramp(n, 3);
        a.move_memory(Location::Device(0), None, false, None)
            .unwrap();
        if i == 3 {
            // Pending work the pack must wait for.
            seed::add_index_tuple_device(&mut a, None, None).unwrap();
        }
        parts.push(a);
    }
    let bytes: Vec<u8> = (0..=255u8).cycle().take(4099).collect();
    let mut odd = RawArray::from_bytes(DType::U8, &[4099], &bytes, 0).unwrap();
    odd.move_memory(Location::Device(0), None, false, None)
        .unwrap();
    parts.push(odd);
    let expected: Vec<Vec<u8>> = parts
        .iter()
        .map(|p| {
            let mut b = vec![0u8; p.nbytes()];
            p.read_all(&mut b, None).unwrap();
            b
        })
        .collect();
    let refs: Vec<&RawArray> = parts.iter().collect();
    let (mut pack, entries) = RawArray::pack(&refs, Location::Device(0)).unwrap();
    assert!(!pack.has_pending_work());
    assert_eq!(entries.len(), parts.len());
    for (e, p) in entries.iter().zip(&parts) {
        assert_eq!((e.dtype, e.shape.as_slice()), (p.dtype(), p.shape()));
        assert_eq!(e.offset % memarray_cuda::array::PACK_ALIGN, 0);
    }
    drop(parts); // the pack holds copies
    pack.move_memory(Location::Device(to), None, false, None)
        .unwrap();
    let mut out = pack.unpack(&entries, None).unwrap();
    drop(pack);
    for (i, (a, want)) in out.iter().zip(&expected).enumerate() {
        assert_eq!(a.location(), Location::Device(to), "array {i}");
        let mut got = vec![0u8; a.nbytes()];
        a.read_all(&mut got, None).unwrap();
        assert_eq!(&got, want, "array {i}");
    }
    // Slices are separate arrays: a kernel on one leaves its neighbours alone.
    seed::add_index_tuple_device(&mut out[1], None, None).unwrap();
    let mut got = vec![0u8; out[0].nbytes()];
    out[0].read_all(&mut got, None).unwrap();
    assert_eq!(got, expected[0]);
    // A range outside the pack is refused.
    let (pack, _) = RawArray::pack(&[&out[0]], Location::Device(to)).unwrap();
    let too_far = memarray_cuda::array::Packed {
        dtype: DType::I32,
        shape: vec![1000],
        offset: 0,
    };
    assert!(pack.unpack(&[too_far], None).is_err());
    // Parts on another device than the pack's are refused by name.
    let e = RawArray::pack(&[&out[0]], Location::Device(to + 1)).unwrap_err();
    assert!(e.to_string().contains("part 0"), "{e}");
}

#[test]
fn gpu_pack_and_unpack_on_one_device() {
    if gpu_or_skip().is_none() {
        return;
    }
    pack_move_unpack(0);
}

/// More small parts than one kernel launch takes, of odd lengths, one part larger than
/// the kernel's limit (the driver copies it), and unaligned sources (slices at odd
/// offsets): every byte lands, and the copies went the way `copy::many` says.
#[test]
fn gpu_pack_takes_many_odd_parts_through_the_kernel_and_large_ones_through_the_driver() {
    let Some(dev) = gpu_or_skip() else { return };
    use memarray_cuda::copy::{KERNEL_MAX, TABLE_MAX, copies_made, tuning};
    let limit = tuning(&dev).unwrap().kernel_max;
    let n = TABLE_MAX + 76;
    let mut parts: Vec<RawArray> = Vec::new();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for i in 0..n {
        let len = 1 + (i * 37) % 300;
        let bytes: Vec<u8> = (0..len).map(|k| (i * 7 + k) as u8).collect();
        let mut a = RawArray::from_bytes(DType::U8, &[len], &bytes, 0).unwrap();
        a.move_memory(Location::Device(0), None, false, None)
            .unwrap();
        parts.push(a);
        expected.push(bytes);
    }
    let big: Vec<u8> = (0..limit.unwrap_or(KERNEL_MAX) + 4096)
        .map(|k| (k % 251) as u8)
        .collect();
    let mut a = RawArray::from_bytes(DType::U8, &[big.len()], &big, 0).unwrap();
    a.move_memory(Location::Device(0), None, false, None)
        .unwrap();
    parts.push(a);
    expected.push(big);
    let (kernel0, driver0) = copies_made();
    let refs: Vec<&RawArray> = parts.iter().collect();
    let (pack, entries) = RawArray::pack(&refs, Location::Device(0)).unwrap();
    let (kernel1, driver1) = copies_made();
    if limit.is_some_and(|l| l >= 300) {
        // Parts that continue each other on both sides are merged first: at most n copies.
        let (k, d) = (kernel1 - kernel0, driver1 - driver0);
        assert!(
            k <= n as u64 && k >= n as u64 / 2,
            "small parts by the kernel: {k}"
        );
        assert_eq!(d, 1, "the large part by the driver");
    } else {
        assert_eq!(kernel1, kernel0, "no kernel copies without the kernel");
    }
    let out = pack.unpack(&entries, None).unwrap();
    for (i, (a, want)) in out.iter().zip(&expected).enumerate() {
        let mut got = vec![0u8; a.nbytes()];
        a.read_all(&mut got, None).unwrap();
        assert_eq!(&got, want, "part {i}");
    }
    // Unaligned sources: 1-byte views at odd offsets of the pack, packed again.
    let odd: Vec<memarray_cuda::array::Packed> = (0..40)
        .map(|k| memarray_cuda::array::Packed {
            dtype: DType::U8,
            shape: vec![17 + k],
            offset: entries[k].offset + 3,
        })
        .collect();
    let views = pack.unpack(&odd, None).unwrap();
    let refs: Vec<&RawArray> = views.iter().collect();
    let (again, entries2) = RawArray::pack(&refs, Location::Device(0)).unwrap();
    let back = again.unpack(&entries2, None).unwrap();
    let mut host = vec![0u8; pack.nbytes()];
    pack.read_all(&mut host, None).unwrap();
    for (k, a) in back.iter().enumerate() {
        let mut got = vec![0u8; a.nbytes()];
        a.read_all(&mut got, None).unwrap();
        // The view starts 3 bytes into part k and may run into the padding after it.
        let at = entries[k].offset + 3;
        assert_eq!(got, host[at..at + 17 + k], "view {k}");
    }
}

#[test]
fn gpu_pack_and_unpack_across_two_devices() {
    if gpus_or_skip(2).is_none() {
        return;
    }
    pack_move_unpack(1);
}

/// The small-copy engine measures its kernel limit once per device: both ways over every
/// trial size, a limit up to which the kernel never lost, cached.
#[test]
fn gpu_the_copy_engine_measures_its_limit_once_per_device() {
    let Some(dev) = gpu_or_skip() else { return };
    use memarray_cuda::copy::{LimitSource, tuning};
    let t = tuning(&dev).unwrap();
    eprintln!("copy engine on cuda:0: {t:?}");
    if std::env::var_os("MEMARRAY_COPY_KERNEL").is_some_and(|v| v == "0") {
        assert_eq!((t.kernel_max, t.source), (None, LimitSource::NoKernel));
        return;
    }
    assert_eq!(t.source, LimitSource::Measured);
    let sizes: Vec<usize> = t.trial.iter().map(|r| r.0).collect();
    assert_eq!(sizes, (12..=18).map(|p| 1usize << p).collect::<Vec<_>>());
    assert!(
        t.trial
            .iter()
            .all(|r| r.1 > 0.0 && r.2 > 0.0 && r.1.is_finite())
    );
    for &(size, kernel_us, driver_us) in &t.trial {
        if t.kernel_max.is_some_and(|l| size <= l) {
            assert!(
                kernel_us <= driver_us,
                "{size}: the kernel lost below the limit"
            );
        }
    }
    if let Some(l) = t.kernel_max {
        let next = t.trial.iter().find(|r| r.0 > l);
        assert!(
            next.is_none_or(|r| r.1 > r.2),
            "the limit stops where the kernel lost"
        );
    }
    assert_eq!(tuning(&dev).unwrap(), t, "measured once, then cached");
}

/// A producer's device memory wrapped zero-copy (as a DLPack import is), on `device`.
fn imported(device: u32, values: &[i32]) -> RawArray {
    let dev = memarray_cuda::Device::get(device).unwrap();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let owned = memarray_cuda::DeviceBuffer::zeroed(
        &dev,
        bytes.len(),
        std::sync::Arc::new(memarray_cuda::DeviceResource::new(&dev)),
        memarray_cuda::StreamRef::legacy(),
    )
    .unwrap();
    memarray_cuda::copy::copy_htod(&owned, 0, &bytes, memarray_cuda::StreamRef::legacy())
        .unwrap()
        .into_event()
        .unwrap()
        .synchronize()
        .unwrap();
    let addr = owned.device_ptr();
    // SAFETY: `owned` (the owner) holds these bytes, uploaded and waited for.
    unsafe {
        RawArray::from_device_memory(
            &dev,
            DType::I32,
            &[values.len()],
            addr,
            bytes.len(),
            Box::new(owned),
            true,
            None,
        )
    }
    .unwrap()
}

/// The name of the resource an array's device memory came from.
fn resource_of(a: &RawArray) -> String {
    a.device_buffer(None).unwrap().resource().name().to_string()
}

/// A copy of memarray's or a producer's memory, on its device or another, comes from the
/// target device's default pool (a producer's own wrapper would serve it from a plain
/// cuMemAlloc, freed by a synchronising cuMemFree) and holds the data; the source stays.
#[test]
fn gpu_copies_of_a_producers_memory_come_from_the_default_pool() {
    let Some(devs) = gpus_or_skip(1) else {
        return;
    };
    let targets: Vec<u32> = (0..devs.len().min(2) as u32).collect();
    let values: Vec<i32> = (0..4099).map(|v| v * 7 - 3).collect();
    let pool = |d: u32| {
        memarray_cuda::resource::default_resource(&memarray_cuda::Device::get(d).unwrap())
            .unwrap()
            .name()
            .to_string()
    };
    let theirs = imported(0, &values);
    assert!(
        !resource_of(&theirs).starts_with("pool"),
        "{}",
        resource_of(&theirs)
    );
    let clone = theirs.try_clone(None).unwrap();
    assert_eq!(resource_of(&clone), pool(0));
    assert_eq!(i32s(&clone), values);
    let mut ours = ramp(1, 4099);
    ours.move_memory(Location::Device(0), None, true, None)
        .unwrap();
    for &to in &targets {
        for source in [&theirs, &ours] {
            let out = source.copied_to(Location::Device(to), None, None).unwrap();
            assert_eq!(out.location(), Location::Device(to));
            assert_eq!(resource_of(&out), pool(to));
            assert_eq!(i32s(&out), i32s(source));
            assert_eq!(source.location(), Location::Device(0));
        }
    }
}

/// `copied_to` another device orders its one peer copy after the source's pending work
/// on another stream, without the host waiting for it first.
#[test]
fn gpu_a_copy_to_another_device_follows_the_sources_pending_work() {
    let Some(_devs) = gpus_or_skip(2) else {
        return;
    };
    let mut a = ramp(64, 1024);
    let s = Stream::new(&memarray_cuda::Device::get(0).unwrap()).unwrap();
    for _ in 0..3 {
        seed::add_index_tuple_device(&mut a, Some(s.as_ref()), None).unwrap();
    }
    let out = a.copied_to(Location::Device(1), None, None).unwrap();
    assert_eq!(i32s(&out), i32s(&a));
    let want: Vec<i32> = (0..64 * 1024)
        .map(|i| i + 3 * ((i / 1024) + (i % 1024)))
        .collect();
    assert_eq!(i32s(&out), want);
}

/// Views of one device pack, in reverse order, pack again with no copy: the shared pack is
/// a span of the first pack's memory (its address), its entries give back every part
/// byte for byte, and arrays that are not views of one allocation are not shared.
#[test]
fn gpu_views_of_one_pack_share_it_without_a_copy() {
    if gpu_or_skip().is_none() {
        return;
    }
    let mut parts: Vec<RawArray> = Vec::new();
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for i in 0..100usize {
        let bytes: Vec<u8> = (0..4096).map(|k| (i * 13 + k) as u8).collect();
        let mut a = RawArray::from_bytes(DType::U8, &[4096], &bytes, 0).unwrap();
        a.move_memory(Location::Device(0), None, false, None)
            .unwrap();
        parts.push(a);
        expected.push(bytes);
    }
    let refs: Vec<&RawArray> = parts.iter().collect();
    assert!(
        RawArray::share(&refs, Location::Device(0))
            .unwrap()
            .is_none(),
        "separate arrays are not views of one allocation"
    );
    let (pack, entries) = RawArray::pack(&refs, Location::Device(0)).unwrap();
    let views = pack.unpack(&entries, None).unwrap();
    let rev: Vec<&RawArray> = views.iter().rev().collect();
    let (shared, e2) = RawArray::share(&rev, Location::Device(0))
        .unwrap()
        .expect("views of one pack share it");
    assert_eq!(shared.nbytes(), pack.nbytes());
    assert_eq!(
        pack.device_ptr(None).unwrap(),
        shared.device_ptr(None).unwrap(),
        "the same memory, not a copy"
    );
    let back = shared.unpack(&e2, None).unwrap();
    for (k, a) in back.iter().enumerate() {
        let mut got = vec![0u8; a.nbytes()];
        a.read_all(&mut got, None).unwrap();
        assert_eq!(got, expected[99 - k], "view {k}");
    }
}
