//! Spilling on the GPU: workloads past a device budget keep every value,
//! exports and locks pin arrays, spilled arrays come back on every device path, the
//! out-of-memory path spills, 16 threads with spilling on, and spilling off changes
//! nothing. Spill settings are per process: the tests take one mutex.

use std::sync::{Arc, Mutex};

use memarray_core::resource::LimitingAdaptor;
use memarray_core::{DType, Location, MemoryResource};
use memarray_cuda::array::{Consumer, SharedArray};
use memarray_cuda::resource::{default_resource, set_default_resource};
use memarray_cuda::spill::{self, SpillSettings};
use memarray_cuda::{ArrayError, CudaError, RawArray};
use memarray_seed as seed;
use memarray_testing::gpu::gpu_or_skip;

static SERIAL: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;

/// A u32 array of `n` elements, element i = i * 7 + seed, on device 0.
fn array_on_device(n: usize, seed: u32) -> SharedArray {
    let bytes: Vec<u8> = (0..n as u32)
        .flat_map(|i| (i.wrapping_mul(7).wrapping_add(seed)).to_ne_bytes())
        .collect();
    let a = SharedArray::new(RawArray::from_bytes(DType::U32, &[n], &bytes, 0).unwrap());
    a.with(|r| r.move_memory(Location::Device(0), None, true, None))
        .unwrap();
    a
}

/// Element i after `passes` runs of the seed kernel (adds i each time).
fn expected(i: u32, seed: u32, passes: u32) -> u32 {
    i.wrapping_mul(7)
        .wrapping_add(seed)
        .wrapping_add(i.wrapping_mul(passes))
}

fn check(a: &SharedArray, seed: u32, passes: u32) {
    a.with(|r| {
        let mut out = vec![0u8; r.nbytes()];
        r.read_all(&mut out, None).unwrap();
        for (i, c) in out.chunks_exact(4).enumerate() {
            let v = u32::from_ne_bytes(c.try_into().unwrap());
            assert_eq!(v, expected(i as u32, seed, passes), "element {i}");
        }
    });
}

fn with_spill<R>(settings: SpillSettings, f: impl FnOnce() -> R) -> R {
    spill::enable(0, settings).unwrap();
    let r = f();
    spill::disable(0);
    r
}

#[test]
fn workloads_at_2x_and_4x_the_budget_keep_every_value() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if gpu_or_skip().is_none() {
        return;
    }
    let chunk = 4 * MIB;
    let budget = 16 * chunk;
    for factor in [2usize, 4] {
        with_spill(
            SpillSettings {
                device_budget: Some(budget as u64),
                ..Default::default()
            },
            || {
                let count = factor * budget / chunk;
                let arrays: Vec<SharedArray> = (0..count)
                    .map(|k| array_on_device(chunk / 4, k as u32))
                    .collect();
                let s = spill::statistics(0).unwrap();
                assert!(s.arrays.resident_bytes <= budget as u64, "{s:?}");
                for _pass in 0..3 {
                    for a in &arrays {
                        a.with(|r| seed::add_index_tuple_device(r, None, None))
                            .unwrap();
                        let s = spill::statistics(0).unwrap();
                        assert!(s.arrays.resident_bytes <= budget as u64, "{s:?}");
                    }
                }
                for (k, a) in arrays.iter().enumerate() {
                    assert_eq!(a.state().location(), Location::Device(0));
                    check(a, k as u32, 3);
                }
                let s = spill::statistics(0).unwrap();
                assert!(s.arrays.spilled_arrays >= (count - 16) as u64, "{s:?}");
                assert!(s.arrays.restored_arrays > 0, "{s:?}");
                assert_eq!(
                    s.arrays.current_spilled_bytes,
                    s.arrays.spilled_bytes - s.arrays.restored_bytes
                );
                drop(arrays);
                let s = spill::statistics(0).unwrap();
                assert_eq!(
                    (s.arrays.resident_bytes, s.arrays.current_spilled_bytes),
                    (0, 0)
                );
            },
        );
    }
}

#[test]
fn born_on_device_arrays_spill_to_pinned_copies_and_the_file_tier() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if gpu_or_skip().is_none() {
        return;
    }
    let dir = std::env::temp_dir();
    let chunk = 2 * MIB;
    with_spill(
        SpillSettings {
            device_budget: Some(4 * chunk as u64),
            host_budget: Some(2 * chunk as u64),
            file_dir: Some(dir),
        },
        || {
            let arrays: Vec<SharedArray> = (0..10u32)
                .map(|k| {
                    let a = SharedArray::new(
                        RawArray::full_on(
                            DType::U32,
                            &[chunk / 4],
                            Location::Device(0),
                            &k.to_ne_bytes(),
                            None,
                            None,
                        )
                        .unwrap(),
                    );
                    // Listed on its first access through the SharedArray.
                    a.with(|r| r.synchronize(None)).unwrap();
                    a
                })
                .collect();
            let s = spill::statistics(0).unwrap();
            assert!(s.arrays.spilled_arrays >= 6, "{s:?}");
            assert!(
                s.host_bytes > 0 && s.host_bytes <= 2 * chunk as u64,
                "{s:?}"
            );
            assert!(
                s.file_bytes > 0,
                "beyond the host budget copies go to the file: {s:?}"
            );
            for (k, a) in arrays.iter().enumerate() {
                a.with(|r| {
                    let mut out = vec![0u8; r.nbytes()];
                    r.read_all(&mut out, None).unwrap();
                    assert!(out.chunks_exact(4).all(|c| c == (k as u32).to_ne_bytes()));
                });
            }
        },
    );
}

#[test]
fn exports_and_locks_pin_and_device_paths_restore() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if gpu_or_skip().is_none() {
        return;
    }
    with_spill(
        SpillSettings {
            device_budget: Some(8 * MIB as u64),
            ..Default::default()
        },
        || {
            let pinned = array_on_device(MIB / 4, 1);
            let export = pinned
                .with(|r| r.export_buffer(None, false, Consumer::Host))
                .unwrap();
            let err = pinned.evict().unwrap_err();
            assert!(
                matches!(err, CudaError::Array(ArrayError::NotSpillable { .. })),
                "{err}"
            );
            // Others spill around it; its address never changes.
            let others: Vec<SharedArray> = (0..12).map(|k| array_on_device(MIB / 4, k)).collect();
            for a in &others {
                a.with(|r| seed::add_index_tuple_device(r, None, None))
                    .unwrap();
            }
            assert!(!pinned.state().is_spilled());
            assert_eq!(pinned.state().device_ptr(None).unwrap(), export.ptr as u64);
            drop(export);
            // Released: it spills on request, reads from the host copy, and comes back
            // on the next export.
            pinned.evict().unwrap();
            assert!(pinned.state().is_spilled());
            assert_eq!(pinned.state().location(), Location::Device(0));
            assert!(matches!(
                pinned.state().device_ptr(None),
                Err(CudaError::Array(ArrayError::Spilled))
            ));
            check(&pinned, 1, 0);
            let e = pinned
                .with(|r| r.export_buffer(None, false, Consumer::Host))
                .unwrap();
            assert_eq!(e.location, Location::Device(0));
            assert!(!pinned.state().is_spilled());
            drop(e);
            // IPC restores too.
            pinned.evict().unwrap();
            pinned.with(|r| r.ipc_handle(None)).unwrap();
            assert!(!pinned.state().is_spilled());
            // Another process may map it now: it stays resident for good.
            let err = pinned.evict().unwrap_err().to_string();
            assert!(err.contains("IPC"), "{err}");
            // A locked array does not spill; moving a spilled array to the host costs no copy.
            let locked = array_on_device(MIB / 4, 2);
            let token = locked.try_lock().unwrap();
            assert!(locked.evict().is_err());
            locked.unlock(token).unwrap();
            locked.evict().unwrap();
            locked
                .with(|r| r.move_memory(Location::Host, None, true, None))
                .unwrap();
            assert!(!locked.state().is_spilled());
            assert_eq!(locked.state().location(), Location::Host);
            check(&locked, 2, 0);
            // Each of the others still holds its values (kernel ran once).
            for (k, a) in others.iter().enumerate() {
                check(a, k as u32, 1);
            }
        },
    );
}

#[test]
fn the_out_of_memory_path_spills_and_spilling_off_fails_as_before() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(dev) = gpu_or_skip() else {
        return;
    };
    let before = default_resource(&dev).unwrap();
    let limit: Arc<dyn MemoryResource> =
        Arc::new(LimitingAdaptor::new(before.clone(), (24 * MIB) as u64));
    set_default_resource(&dev, limit).unwrap();
    let run = || -> Result<Vec<SharedArray>, CudaError> {
        let mut v = Vec::new();
        for k in 0..10u32 {
            let bytes = vec![k as u8; 4 * MIB];
            let a = SharedArray::new(RawArray::from_bytes(DType::U8, &[4 * MIB], &bytes, 0)?);
            a.with(|r| r.move_memory(Location::Device(0), None, true, None))?;
            v.push(a);
        }
        Ok(v)
    };
    // Off: the tenth 4 MiB array does not fit in 24 MiB.
    let off = run();
    assert!(matches!(&off, Err(e) if e.is_out_of_memory()), "{off:?}");
    drop(off);
    // On, without a budget: the out-of-memory path spills.
    let on = with_spill(SpillSettings::default(), run);
    set_default_resource(&dev, before).unwrap();
    let arrays = on.unwrap();
    for (k, a) in arrays.iter().enumerate() {
        a.with(|r| {
            let mut out = vec![0u8; r.nbytes()];
            r.read_all(&mut out, None).unwrap();
            assert!(out.iter().all(|&b| b == k as u8));
        });
    }
    let p = memarray_core::resource::pressure_statistics();
    assert!(p.spills > 0 && p.spilled_bytes > 0, "{p:?}");
}

#[test]
fn sixteen_threads_with_spilling_on() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if gpu_or_skip().is_none() {
        return;
    }
    with_spill(
        SpillSettings {
            device_budget: Some(16 * MIB as u64),
            ..Default::default()
        },
        || {
            let shared: Vec<SharedArray> = (0..8).map(|k| array_on_device(MIB / 4, k)).collect();
            let runs = Mutex::new(vec![0u32; shared.len()]);
            std::thread::scope(|s| {
                for t in 0..16u32 {
                    let (shared, runs) = (&shared, &runs);
                    s.spawn(move || {
                        let own: Vec<SharedArray> = (0..4)
                            .map(|k| array_on_device(MIB / 4, 100 + t * 4 + k))
                            .collect();
                        for round in 0..6u32 {
                            for (k, a) in own.iter().enumerate() {
                                a.with(|r| seed::add_index_tuple_device(r, None, None))
                                    .unwrap();
                                if round % 2 == 1 {
                                    let _ = a.evict();
                                }
                                let _ = k;
                            }
                            let j = ((t + round) as usize) % shared.len();
                            // Kernel and count under the array's mutex: no lost update.
                            shared[j].with(|r| {
                                seed::add_index_tuple_device(r, None, None).unwrap();
                                runs.lock().unwrap()[j] += 1;
                            });
                        }
                        for (k, a) in own.iter().enumerate() {
                            check(a, 100 + t * 4 + k as u32, 6);
                        }
                    });
                }
            });
            let runs = runs.into_inner().unwrap();
            for (k, a) in shared.iter().enumerate() {
                check(a, k as u32, runs[k]);
            }
            let s = spill::statistics(0).unwrap();
            assert!(
                s.arrays.spilled_arrays > 0 && s.arrays.restored_arrays > 0,
                "{s:?}"
            );
        },
    );
}

#[test]
fn the_budget_holds_after_every_array_was_evicted_and_prefetched_back() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if gpu_or_skip().is_none() {
        return;
    }
    let chunk = 2 * MIB;
    let budget = 8 * chunk;
    with_spill(
        SpillSettings {
            device_budget: Some(budget as u64),
            ..Default::default()
        },
        || {
            let arrays: Vec<SharedArray> = (0..32).map(|k| array_on_device(chunk / 4, k)).collect();
            for a in &arrays {
                let _ = a.evict();
            }
            let s = spill::statistics(0).unwrap();
            assert_eq!(s.arrays.resident_bytes, 0, "{s:?}");
            let stream =
                memarray_cuda::Stream::new(&memarray_cuda::Device::get(0).unwrap()).unwrap();
            for pass in 0..2 {
                for (i, a) in arrays.iter().enumerate() {
                    arrays[(i + 1) % arrays.len()]
                        .with(|r| r.prefetch(Some(stream.as_ref()), None))
                        .unwrap();
                    a.with(|r| seed::add_index_tuple_device(r, None, None))
                        .unwrap();
                    let s = spill::statistics(0).unwrap();
                    assert!(
                        s.arrays.resident_bytes <= budget as u64,
                        "pass {pass}, array {i}: {s:?}"
                    );
                }
            }
            for (k, a) in arrays.iter().enumerate() {
                check(a, k as u32, 2);
            }
        },
    );
}
