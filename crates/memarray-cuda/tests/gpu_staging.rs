//! The staged pageable pipeline and batched moves: every size, offset and setting gives
//! back the bytes it was given; concurrent staged copies from many threads stay correct.

mod common;

use common::random_bytes;
use memarray_core::{DType, Location};
use memarray_cuda::array::Fill;
use memarray_cuda::copy::{self, Direction, StagingConfig};
use memarray_cuda::{DeviceBuffer, HostKind, RawArray, Stream, resource};
use memarray_seed as seed;
use memarray_testing::gpu::gpu_or_skip;

/// Sizes around the direct threshold, the minimum chunk and the plans' edges.
const SIZES: [usize; 9] = [
    0,
    1,
    (256 << 10) - 1,
    256 << 10,
    (256 << 10) + 1,
    (1 << 20) + 3,
    (4 << 20) + 4097,
    (16 << 20) + 5,
    (67 << 20) + 11,
];

/// Settings are process-wide: every test holds this (move_many and the mirror read the
/// thresholds that other tests change).
static SETTINGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn gpu_staged_round_trip_every_size_offset_and_setting() {
    let Some(dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let dirs = [Direction::ToDevice, Direction::ToHost];
    let before = dirs.map(|d| copy::staging_config(d).unwrap());
    let s = Stream::new(&dev).unwrap();
    let pool = resource::default_resource(&dev).unwrap();
    for cfg in [
        None,
        Some(StagingConfig {
            threads: 1,
            ..before[0]
        }),
        Some(StagingConfig {
            threads: 3,
            fill_threads: 3,
            chunk_bytes: copy::MIN_CHUNK,
            direct_below: 0,
            lane_min: 0,
            short_below: 0,
        }),
        // The short path: every size below 64 MiB, on one lane and on three.
        Some(StagingConfig {
            threads: 1,
            direct_below: 0,
            short_below: copy::MAX_SHORT,
            ..before[0]
        }),
        Some(StagingConfig {
            threads: 3,
            fill_threads: 3,
            chunk_bytes: copy::MIN_CHUNK,
            direct_below: 0,
            lane_min: 0,
            short_below: copy::MAX_SHORT,
        }),
    ] {
        for (d, b) in dirs.iter().zip(before) {
            copy::set_staging_config(*d, cfg.unwrap_or(b)).unwrap();
        }
        for (k, &n) in SIZES.iter().enumerate() {
            for off in [0usize, 3] {
                // Unaligned host ranges: a slice starting `off` bytes into a vector.
                let data = random_bytes(n + off, k as u64 * 7 + off as u64 + 1);
                let d = DeviceBuffer::zeroed(&dev, n + 64, pool.clone(), s.as_ref()).unwrap();
                let up = copy::staged_to_device(&d, 32, &data[off..], s.as_ref()).unwrap();
                drop(up);
                let mut back = vec![0u8; n + off];
                copy::staged_to_host(&mut back[off..], &d, 32, s.as_ref()).unwrap();
                assert!(back[off..] == data[off..], "{cfg:?} n={n} off={off}");
                assert!(
                    back[..off].iter().all(|&b| b == 0),
                    "wrote before the range"
                );
                // The bytes around the range on the device are untouched.
                let mut edges = vec![1u8; 32];
                copy::staged_to_host(&mut edges, &d, 0, s.as_ref()).unwrap();
                assert!(edges.iter().all(|&b| b == 0));
            }
        }
    }
    for (d, b) in dirs.iter().zip(before) {
        copy::set_staging_config(*d, b).unwrap();
    }
}

#[test]
fn gpu_staged_copies_out_of_range_are_refused() {
    let Some(dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let s = Stream::new(&dev).unwrap();
    let pool = resource::default_resource(&dev).unwrap();
    let d = DeviceBuffer::zeroed(&dev, 1 << 20, pool, s.as_ref()).unwrap();
    let big = vec![0u8; (1 << 20) + 1];
    assert!(copy::staged_to_device(&d, 0, &big, s.as_ref()).is_err());
    let mut out = vec![0u8; 1 << 20];
    assert!(copy::staged_to_host(&mut out, &d, 1, s.as_ref()).is_err());
}

#[test]
fn gpu_staged_fill_errors_and_panics_end_the_copy_on_both_paths() {
    let Some(dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let before = copy::staging_config(Direction::ToDevice).unwrap();
    let s = Stream::new(&dev).unwrap();
    let pool = resource::default_resource(&dev).unwrap();
    let n = 6 << 20;
    let d = DeviceBuffer::zeroed(&dev, n, pool, s.as_ref()).unwrap();
    for short_below in [0, copy::MAX_SHORT] {
        copy::set_staging_config(
            Direction::ToDevice,
            StagingConfig {
                threads: 4,
                direct_below: 0,
                lane_min: 0,
                short_below,
                ..before
            },
        )
        .unwrap();
        let fails = |off: usize, buf: &mut [u8]| {
            if off >= n / 2 {
                return Err(memarray_cuda::CudaError::InvalidArgument {
                    what: "test fill",
                    detail: format!("refused at {off}"),
                });
            }
            buf.fill(1);
            Ok(())
        };
        let e = copy::staged_to_device_with(&d, 0, n, &fails, s.as_ref()).unwrap_err();
        assert!(e.to_string().contains("refused at"), "{e}");
        let panics = |off: usize, buf: &mut [u8]| {
            assert!(off < n / 2, "fill panics");
            buf.fill(2);
            Ok(())
        };
        let e = copy::staged_to_device_with(&d, 0, n, &panics, s.as_ref()).unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        // The pipeline still works afterwards, with every byte in place.
        let fill = |off: usize, buf: &mut [u8]| {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = ((off + i) % 253) as u8;
            }
            Ok(())
        };
        drop(copy::staged_to_device_with(&d, 0, n, &fill, s.as_ref()).unwrap());
        let mut back = vec![0u8; n];
        copy::staged_to_host(&mut back, &d, 0, s.as_ref()).unwrap();
        assert!(back.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
    }
    copy::set_staging_config(Direction::ToDevice, before).unwrap();
}

#[test]
fn gpu_staged_copies_from_many_threads_stay_correct() {
    let Some(dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let dev = dev.clone();
            scope.spawn(move || {
                let s = Stream::new(&dev).unwrap();
                let pool = resource::default_resource(&dev).unwrap();
                for i in 0..6u64 {
                    let n = (3 << 20) + (t * 4099 + i) as usize;
                    let data = random_bytes(n, t * 100 + i + 1);
                    let d = DeviceBuffer::zeroed(&dev, n, pool.clone(), s.as_ref()).unwrap();
                    drop(copy::staged_to_device(&d, 0, &data, s.as_ref()).unwrap());
                    let mut back = vec![0u8; n];
                    copy::staged_to_host(&mut back, &d, 0, s.as_ref()).unwrap();
                    assert!(back == data, "thread {t} copy {i}");
                }
            });
        }
    });
}

#[test]
fn gpu_mirror_moves_of_pageable_arrays_are_staged_and_exact() {
    let Some(_dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    for n in [(1usize << 20) + 3, (40 << 20) + 1] {
        let data = random_bytes(n, n as u64);
        let mut a = RawArray::zeros_in(DType::U8, &[n], 0, HostKind::Pageable).unwrap();
        a.write_all(&data, None).unwrap();
        a.move_memory(Location::Device(0), None, false, None)
            .unwrap();
        // Overwrite on the device (a staged write_all), then read back.
        let flipped: Vec<u8> = data.iter().map(|b| !b).collect();
        a.write_all(&flipped, None).unwrap();
        assert_eq!(a.location(), Location::Device(0));
        let mut out = vec![0u8; n];
        a.read_all(&mut out, None).unwrap();
        assert!(out == flipped);
        a.move_memory(Location::Host, None, true, None).unwrap();
        assert!(a.host_bytes(None).unwrap() == &flipped[..]);
    }
}

#[test]
fn gpu_move_many_moves_every_array_both_ways() {
    let Some(_dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let kinds = [HostKind::Pageable, HostKind::Pinned];
    let mut arrays: Vec<RawArray> = (0..300usize)
        .map(|i| {
            let n = [0, 1, 4096, 4099, 65536][i % 5] + i;
            let mut a = RawArray::zeros_in(DType::U8, &[n], 0, kinds[i % 2]).unwrap();
            a.write_all(&random_bytes(n, i as u64 + 1), None).unwrap();
            a
        })
        .collect();
    // One already on the device, one big one (the per-array path).
    arrays[7]
        .move_memory(Location::Device(0), None, true, None)
        .unwrap();
    let mut big = RawArray::zeros_in(DType::U8, &[(9 << 20) + 1], 0, HostKind::Pageable).unwrap();
    big.write_all(&random_bytes((9 << 20) + 1, 99), None)
        .unwrap();
    arrays.push(big);
    let expect: Vec<Vec<u8>> = arrays
        .iter()
        .map(|a| {
            let mut v = vec![0u8; a.nbytes()];
            a.read_all(&mut v, None).unwrap();
            v
        })
        .collect();
    let mut refs: Vec<&mut RawArray> = arrays.iter_mut().collect();
    RawArray::move_many(&mut refs, Location::Device(0), None).unwrap();
    for (a, e) in arrays.iter().zip(&expect) {
        assert_eq!(a.location(), Location::Device(0));
        let mut v = vec![0u8; a.nbytes()];
        a.read_all(&mut v, None).unwrap();
        assert!(&v == e);
    }
    // Change each on the device, then bring all back in one call.
    for a in arrays.iter_mut() {
        let flipped: Vec<u8> = {
            let mut v = vec![0u8; a.nbytes()];
            a.read_all(&mut v, None).unwrap();
            v.iter().map(|b| b.wrapping_add(1)).collect()
        };
        a.write_all(&flipped, None).unwrap();
    }
    let mut refs: Vec<&mut RawArray> = arrays.iter_mut().collect();
    RawArray::move_many(&mut refs, Location::Host, None).unwrap();
    for (a, e) in arrays.iter().zip(&expect) {
        assert_eq!(a.location(), Location::Host);
        let want: Vec<u8> = e.iter().map(|b| b.wrapping_add(1)).collect();
        assert!(a.host_bytes(None).unwrap() == &want[..]);
    }
}

#[test]
fn gpu_move_many_with_a_locked_array_moves_nothing() {
    let Some(_dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let mut a = RawArray::zeros(DType::F32, &[16], 0).unwrap();
    let mut b = RawArray::zeros(DType::F32, &[16], 0).unwrap();
    let t = b.try_lock().unwrap();
    let mut refs = vec![&mut a, &mut b];
    assert!(RawArray::move_many(&mut refs, Location::Device(0), None).is_err());
    assert_eq!(a.location(), Location::Host);
    b.unlock(t).unwrap();
}

#[test]
fn gpu_move_many_packs_new_arrays_into_one_block_that_outlives_any_of_them() {
    let Some(_dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let sizes: Vec<usize> = (0..200).map(|i| 4000 + 37 * i).collect();
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| random_bytes(n, 1000 + i as u64))
        .collect();
    let mut arrays: Vec<RawArray> = data
        .iter()
        .map(|d| {
            let mut a = RawArray::zeros_in(DType::U8, &[d.len()], 0, HostKind::Pageable).unwrap();
            a.write_all(d, None).unwrap();
            a
        })
        .collect();
    let mut refs: Vec<&mut RawArray> = arrays.iter_mut().collect();
    RawArray::move_many(&mut refs, Location::Device(0), None).unwrap();
    // One block laid out as the staging buffer: consecutive, 256-byte aligned slices.
    let ptrs: Vec<u64> = arrays.iter().map(|a| a.device_ptr(None).unwrap()).collect();
    for i in 1..ptrs.len() {
        assert_eq!(
            ptrs[i] - ptrs[i - 1],
            sizes[i - 1].next_multiple_of(256) as u64,
            "slice {i}"
        );
    }
    // A kernel on one slice leaves its neighbours alone.
    seed::add_index_tuple_device(&mut arrays[5], None, None).unwrap();
    let want5: Vec<u8> = data[5]
        .iter()
        .enumerate()
        .map(|(k, &b)| b.wrapping_add(k as u8))
        .collect();
    for (i, w) in [(4, &data[4]), (5, &want5), (6, &data[6])] {
        let mut v = vec![0u8; sizes[i]];
        arrays[i].read_all(&mut v, None).unwrap();
        assert!(&v == w, "array {i}");
    }
    // Dropping most arrays keeps the block alive for the rest; new allocations do not
    // reuse its memory while they live.
    let clone = arrays[7].try_clone(None).unwrap();
    assert_ne!(clone.device_ptr(None).unwrap(), ptrs[7]);
    let kept: Vec<(usize, RawArray)> = arrays
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 3 == 1)
        .collect();
    let fresh: Vec<RawArray> = (0..50)
        .map(|_| {
            RawArray::full_on(DType::U8, &[8192], Location::Device(0), &[0xAB], None, None).unwrap()
        })
        .collect();
    for (i, mut a) in kept {
        let want = if i == 5 { &want5 } else { &data[i] };
        let mut v = vec![0u8; sizes[i]];
        a.read_all(&mut v, None).unwrap();
        assert!(&v == want, "array {i} after the others dropped");
        a.move_memory(Location::Host, None, true, None).unwrap();
        assert!(
            a.host_bytes(None).unwrap() == &want[..],
            "array {i} back on the host"
        );
    }
    let mut v = vec![0u8; sizes[7]];
    clone.read_all(&mut v, None).unwrap();
    assert!(v == data[7]);
    drop(fresh);
}

#[test]
fn gpu_small_pageable_uploads_may_reuse_their_source_at_once() {
    // Below `direct_below` the driver copies pageable memory without a wait for the DMA
    // (it has staged the bytes when the call returns): the caller's buffer is clobbered
    // at once, and every later reader (the legacy stream, another stream, the host) sees
    // the uploaded bytes.
    let Some(dev) = gpu_or_skip() else { return };
    let _g = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
    let below = copy::staging_config(Direction::ToDevice)
        .unwrap()
        .direct_below;
    let other = Stream::new(&dev).unwrap();
    for (k, n) in [1usize, 7, 4096, below.saturating_sub(1).max(1)]
        .into_iter()
        .enumerate()
    {
        for round in 0..40u64 {
            let mut src = random_bytes(n, round * 7 + k as u64 + 1);
            let want = src.clone();
            // Default (legacy stream, lazy ordering) and an owned stream (recorded event).
            let stream = (round % 2 == 1).then(|| other.as_ref());
            let mut a = RawArray::born_with(
                DType::U8,
                &[n],
                Location::Device(0),
                Fill::Unset,
                None,
                None,
                stream,
            )
            .unwrap();
            a.write_all(&src, None).unwrap();
            src.fill(0xA5);
            drop(src);
            if stream.is_none() {
                // Lazy work on the legacy stream: pending, yet a drop need not wait (no
                // host copy to free; the device buffer is freed on that stream).
                assert!(a.has_pending_work() && !a.drop_may_wait(), "n={n}");
            }
            let mut out = vec![0u8; n];
            if round % 4 < 2 {
                a.read_all(&mut out, None).unwrap();
            } else {
                // Read on a stream the upload did not run on.
                let s = Stream::new(&dev).unwrap();
                a.move_memory(Location::Host, Some(s.as_ref()), true, None)
                    .unwrap();
                out.copy_from_slice(a.host_bytes(None).unwrap());
            }
            assert!(out == want, "n={n} round={round}");
        }
    }
    // With a host copy the drop waits for the lazy upload before freeing it: callers
    // holding a lock (Python's GIL) are told so.
    let mut a = RawArray::zeros_in(DType::U8, &[4096], 0, HostKind::Pageable).unwrap();
    a.move_memory(Location::Device(0), None, true, None)
        .unwrap();
    a.write_all(&[7u8; 4096], None).unwrap();
    assert!(a.has_host_copy() && a.has_pending_work() && a.drop_may_wait());
    let mut out = vec![0u8; 4096];
    a.read_all(&mut out, None).unwrap();
    assert!(out.iter().all(|&b| b == 7));
}
