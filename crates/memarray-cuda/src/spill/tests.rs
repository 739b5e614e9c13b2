//! Spilling's unit tests and its bookkeeping cost (`cost`, ignored: run by hand).

mod basics {
    use super::super::*;

    #[test]
    fn byte_counts_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes(" 4 gib "), Ok(4 << 30));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        for bad in ["", "GiB", "-1", "4 parsecs", "1e400", "nan", ".", "1.2.3"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn byte_counts_are_exact_below_two_to_the_64() {
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_bytes("16777215.99999999906867742538TiB").ok(), None);
        for over in [
            "18446744073709551616",
            "17179869184GiB",
            "16777216TiB",
            "99999999999999999999999999999999999",
        ] {
            let e = parse_bytes(over).unwrap_err();
            assert!(e.contains("2**64"), "{over}: {e}");
        }
        // Fractions of a byte are not byte counts; fractions of a unit that make whole
        // bytes are.
        assert!(parse_bytes("0.5").unwrap_err().contains("whole"));
        assert!(parse_bytes("1.0000000001KiB").is_err());
        assert_eq!(parse_bytes("0.5KiB"), Ok(512));
        assert_eq!(parse_bytes(".5KiB"), Ok(512));
        assert_eq!(parse_bytes("2."), Ok(2));
    }
}

/// A device's spilling without a driver: `id` in the shared map, with `budget`.
fn fake_device(id: u32, budget: Option<u64>) -> std::sync::Arc<super::DeviceSpill> {
    use super::*;
    let state = Arc::new(DeviceSpill {
        device: id,
        epoch: NEXT_EPOCH.fetch_add(1, Ordering::Relaxed),
        registry: SpillRegistry::new(budget),
        settings: SpillSettings {
            device_budget: budget,
            ..SpillSettings::default()
        },
        arrays: Mutex::new(HashMap::new()),
        stream: OnceLock::new(),
        host: Arc::new(StatisticsAdaptor::new(Arc::new(HostResource))),
        pageable: Arc::new(StatisticsAdaptor::new(Arc::new(HostResource))),
        file: Mutex::new(None),
        resident_now: AtomicI64::new(0),
    });
    let _ = ENV.set(Ok(()));
    DEVICES
        .write()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(id, state.clone());
    GENERATION.fetch_add(1, Ordering::AcqRel);
    ACTIVE.store(true, Ordering::Release);
    state
}

mod batches {
    use super::super::batch::PENDING;
    use super::super::*;
    use super::fake_device;
    use memarray_core::spill::SpillOutcome;

    struct Dummy;
    impl SpillTarget for Dummy {
        fn try_spill(&self, _: &DeviceSpill) -> SpillOutcome {
            SpillOutcome::Busy
        }
    }

    fn pending() -> usize {
        PENDING.with(|p| p.borrow().events.len())
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn arrays_made_and_dropped_never_reach_the_registry_or_the_count() {
        // Device 11: this test's own (tests run on threads of one process).
        let d = fake_device(11, None);
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        flush();
        for id in 0..1000u64 {
            let mut note = SpillNote::default();
            after_access(id, &mut note, (Some(11), Some(11)), MIB, false, || {
                Arc::downgrade(&target)
            });
            assert_eq!(note.registered, Some(11));
            forget(id, &mut note);
            // The drop took its listing back: the batch does not grow.
            assert_eq!(pending(), 0, "array {id}");
        }
        assert_eq!(Arc::weak_count(&target), 0, "every weak handle was dropped");
        flush();
        assert_eq!(d.registry.statistics().resident_bytes, 0);
        assert_eq!(d.resident_bytes(), 0);
    }

    #[test]
    fn survivors_are_listed_and_counted_when_the_batch_applies() {
        let d = fake_device(12, None);
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        flush();
        let mut notes: Vec<SpillNote> = (0..3).map(|_| SpillNote::default()).collect();
        for (id, note) in notes.iter_mut().enumerate() {
            after_access(id as u64, note, (Some(12), Some(12)), MIB, false, || {
                Arc::downgrade(&target)
            });
        }
        // Without a budget the count waits in this thread's batch ...
        assert_eq!(d.resident_bytes(), 0);
        assert_eq!(pending(), 3);
        flush();
        // ... and arrives with the listing.
        assert_eq!(d.resident_bytes(), 3 * MIB as u64);
        assert_eq!(d.registry.statistics().resident_bytes, 3 * MIB as u64);
        // Dropped in the order made (not the reverse): each one's Forgot is news.
        for (id, note) in notes.iter_mut().enumerate() {
            forget(id as u64, note);
        }
        flush();
        assert_eq!(d.resident_bytes(), 0);
        assert_eq!(d.registry.statistics().resident_bytes, 0);
    }

    #[test]
    fn arrays_listed_before_a_disable_are_listed_again_after_an_enable() {
        let first = fake_device(15, Some(u64::MAX));
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        flush();
        let mut note = SpillNote::default();
        let place = (Some(15), Some(15));
        after_access(1, &mut note, place, MIB, false, || Arc::downgrade(&target));
        flush();
        assert_eq!(first.registry.statistics().resident_bytes, MIB as u64);
        // Spilling off on the device, then on again: a registry that never saw the array.
        DEVICES.write().unwrap().as_mut().unwrap().remove(&15);
        GENERATION.fetch_add(1, Ordering::AcqRel);
        let second = fake_device(15, Some(u64::MAX));
        // A plain use lists it in the new registry and counts it once.
        after_access(1, &mut note, place, MIB, false, || Arc::downgrade(&target));
        flush();
        assert_eq!(second.registry.statistics().resident_bytes, MIB as u64);
        assert_eq!(second.resident_bytes(), MIB as u64);
        // Dropped: out of the new registry and count, nothing taken from the old one's.
        forget(1, &mut note);
        flush();
        assert_eq!(second.registry.statistics().resident_bytes, 0);
        assert_eq!(second.resident_bytes(), 0);
        assert_eq!(
            first.resident_bytes(),
            MIB as u64,
            "the old state is left alone"
        );
    }

    #[test]
    fn an_array_moved_to_another_device_within_a_batch_is_listed_there() {
        let (from, to) = (fake_device(16, None), fake_device(17, None));
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        let used_on = |id: u64, note: &mut SpillNote, device: u32| {
            after_access(id, note, (Some(device), Some(device)), MIB, false, || {
                Arc::downgrade(&target)
            });
        };
        flush();
        let (mut moved, mut other) = (SpillNote::default(), SpillNote::default());
        used_on(1, &mut moved, 16);
        // Another array's listing comes between: the move's Forgot is not the last event.
        used_on(2, &mut other, 16);
        used_on(1, &mut moved, 17);
        assert_eq!(moved.registered, Some(17));
        flush();
        assert_eq!(to.registry.statistics().resident_bytes, MIB as u64);
        assert_eq!(to.resident_bytes(), MIB as u64);
        assert_eq!(
            from.registry.statistics().resident_bytes,
            MIB as u64,
            "array 2"
        );
        assert_eq!(from.resident_bytes(), MIB as u64);
        // Moved back, away and back again within one batch: listed on 16, gone from 17.
        for (id, device) in [(1, 16), (2, 16), (1, 17), (2, 16), (1, 16)] {
            let note = if id == 1 { &mut moved } else { &mut other };
            used_on(id, note, device);
        }
        flush();
        assert_eq!(to.registry.statistics().resident_bytes, 0);
        assert_eq!(from.registry.statistics().resident_bytes, 2 * MIB as u64);
        for (id, note) in [(1, &mut moved), (2, &mut other)] {
            forget(id, note);
        }
        flush();
        assert_eq!(from.registry.statistics().resident_bytes, 0);
        assert_eq!(from.resident_bytes() + to.resident_bytes(), 0);
    }

    #[test]
    fn with_a_budget_the_count_is_kept_at_once() {
        let d = fake_device(13, Some(u64::MAX));
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        flush();
        let mut note = SpillNote::default();
        after_access(1, &mut note, (Some(13), Some(13)), MIB, false, || {
            Arc::downgrade(&target)
        });
        assert_eq!(
            d.resident_bytes(),
            MIB as u64,
            "counted before any batch applies"
        );
        forget(1, &mut note);
        assert_eq!(d.resident_bytes(), 0);
        // A count taken away by another thread first never reads below zero.
        d.resident_now.fetch_sub(5, Ordering::Relaxed);
        assert_eq!(d.resident_bytes(), 0);
    }

    /// Counts the spills asked of it (and spills nothing).
    struct Asked(std::sync::atomic::AtomicUsize);
    impl SpillTarget for Asked {
        fn try_spill(&self, _: &DeviceSpill) -> SpillOutcome {
            self.0.fetch_add(1, Ordering::Relaxed);
            SpillOutcome::Busy
        }
    }

    #[test]
    fn an_array_first_listed_in_a_capture_spills_nothing_to_keep_the_budget() {
        let d = fake_device(14, Some(MIB as u64));
        let asked = Arc::new(Asked(std::sync::atomic::AtomicUsize::new(0)));
        let target: Arc<dyn SpillTarget> = asked.clone();
        flush();
        let mut notes: Vec<SpillNote> = (0..3).map(|_| SpillNote::default()).collect();
        let mut list = |id: usize, captured: bool| {
            after_access(
                id as u64,
                &mut notes[id],
                (Some(14), Some(14)),
                MIB,
                captured,
                || Arc::downgrade(&target),
            );
        };
        list(0, false); // the budget, full
        list(1, true); // past it, in a capture: nothing is asked to spill
        assert_eq!(asked.0.load(Ordering::Relaxed), 0);
        assert_eq!(d.resident_bytes(), 2 * MIB as u64, "counted all the same");
        list(2, false); // past it outside a capture: the others are asked
        assert!(asked.0.load(Ordering::Relaxed) > 0);
        for (id, note) in notes.iter_mut().enumerate() {
            forget(id as u64, note);
        }
    }
}

mod cost {
    use super::super::*;
    use memarray_core::spill::SpillOutcome;

    struct Dummy;
    impl SpillTarget for [u8; 256] {
        fn try_spill(&self, _: &DeviceSpill) -> SpillOutcome {
            SpillOutcome::Busy
        }
    }
    impl SpillTarget for Dummy {
        fn try_spill(&self, _: &DeviceSpill) -> SpillOutcome {
            SpillOutcome::Busy
        }
    }

    /// The bookkeeping alone, on the CPU: `cargo test --release -p memarray-cuda
    /// spill::cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn bookkeeping_cost() {
        super::fake_device(7, None);
        let target: Arc<dyn SpillTarget> = Arc::new(Dummy);
        let n = 1_000_000u64;
        let t = std::time::Instant::now();
        for id in 0..n {
            let mut note = SpillNote::default();
            after_access(id, &mut note, (Some(7), Some(7)), 1 << 20, false, || {
                Arc::downgrade(&target)
            });
            forget(id, &mut note);
        }
        println!(
            "list + forget: {:.1} ns",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        // As the real cell: a target of its own per array, gone before its batch applies.
        let t = std::time::Instant::now();
        for id in 0..n {
            let own: Arc<dyn SpillTarget> = Arc::new([0u8; 256]);
            let mut note = SpillNote::default();
            after_access(id, &mut note, (Some(7), Some(7)), 1 << 20, false, || {
                Arc::downgrade(&own)
            });
            forget(id, &mut note);
            drop(own);
        }
        println!(
            "list + forget, a target each: {:.1} ns",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        let mut note = SpillNote::default();
        after_access(n, &mut note, (Some(7), Some(7)), 1 << 20, false, || {
            Arc::downgrade(&target)
        });
        let t = std::time::Instant::now();
        for _ in 0..n {
            after_access(n, &mut note, (Some(7), Some(7)), 1 << 20, false, || {
                Arc::downgrade(&target)
            });
        }
        println!("touch: {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
        let mut notes: Vec<SpillNote> = (0..64).map(|_| SpillNote::default()).collect();
        for (k, note) in notes.iter_mut().enumerate() {
            after_access(
                n + 1 + k as u64,
                note,
                (Some(7), Some(7)),
                1 << 20,
                false,
                || Arc::downgrade(&target),
            );
        }
        let t = std::time::Instant::now();
        for i in 0..n {
            let k = (i % 64) as usize;
            after_access(
                n + 1 + k as u64,
                &mut notes[k],
                (Some(7), Some(7)),
                1 << 20,
                false,
                || Arc::downgrade(&target),
            );
        }
        println!(
            "touch, 64 arrays in turn: {:.1} ns",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(device_spill(7));
        }
        println!("lookup: {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    }
}
