//! The tracking adaptor's tests: live allocations, the timeline, the clocks, traces.

use super::*;
use std::time::Instant;

use crate::HostResource;

#[test]
fn live_allocations_timeline_and_backtraces() {
    let t = TrackingAdaptor::new(Arc::new(HostResource), Source::register("numba").unwrap())
        .with_backtraces(true);
    t.lock().spacing = 0; // a point per event
    let a = t.allocate(100, 8, None).unwrap();
    let b = super::super::with_source(Source::register("torch").unwrap(), || {
        t.allocate_zeroed(300, 64, None).unwrap()
    });
    let live = t.live();
    assert_eq!(live.iter().map(|a| a.size).collect::<Vec<_>>(), [100, 300]);
    assert_eq!(
        live.iter().map(|a| a.source).collect::<Vec<_>>(),
        [
            Source::register("numba").unwrap(),
            Source::register("torch").unwrap()
        ]
    );
    assert!(live.iter().all(|a| a.device.is_none() && a.stack.is_none()));
    // A captured backtrace has frames; their names need symbols (stripped binaries
    // print `<unknown>`), so only the frames are checked.
    let bt = live[0].backtrace.as_deref().unwrap();
    assert!(bt.lines().count() > 3, "{bt}");
    assert!(live[1].backtrace.is_some());
    // SAFETY: a and b came from `t` with these arguments and are freed once.
    unsafe {
        t.deallocate(a, 100, 8, None);
        t.deallocate(b, 300, 64, None);
    }
    assert!(t.live().is_empty());
    let per =
        |s: Source| -> Vec<usize> { t.timeline().iter().map(|(_, b)| b[s.index()]).collect() };
    assert_eq!(per(Source::register("numba").unwrap()), [100, 100, 0, 0]);
    assert_eq!(per(Source::register("torch").unwrap()), [0, 300, 300, 0]);
    let times: Vec<u64> = t.timeline().iter().map(|&(t, _)| t).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn events_within_a_span_update_one_point_with_the_latest_bytes() {
    let t = TrackingAdaptor::new(Arc::new(HostResource), Source::MEMARRAY);
    assert!(t.lock().spacing >= 1, "a calibrated span");
    t.lock().spacing = u64::MAX; // every event inside one span
    for _ in 0..1000 {
        let p = t.allocate(8, 8, None).unwrap();
        // SAFETY: p came from `t` with these arguments and is freed once.
        unsafe { t.deallocate(p, 8, 8, None) };
    }
    let p = t.allocate(100, 8, None).unwrap();
    let m = Source::MEMARRAY.index();
    assert_eq!(
        t.timeline().iter().map(|(_, b)| b[m]).collect::<Vec<_>>(),
        [100]
    );
    t.lock().spacing = 0; // the next event starts a point of its own
    // SAFETY: as above.
    unsafe { t.deallocate(p, 100, 8, None) };
    assert_eq!(
        t.timeline().iter().map(|(_, b)| b[m]).collect::<Vec<_>>(),
        [100, 0]
    );
}

#[test]
fn times_are_coarse_by_default_precise_with_stacks_and_ordered_either_way() {
    // Each allocation's time lies between the real instants read around it, so the
    // gaps are bounded by real time, however slowly the threads are scheduled (valgrind
    // runs one at a time).
    let gap = |t: &TrackingAdaptor, wait: std::time::Duration| {
        let before_a = Instant::now();
        let a = t.allocate(8, 8, None).unwrap();
        let after_a = Instant::now();
        while after_a.elapsed() < wait {
            std::hint::spin_loop();
        }
        let before_b = Instant::now();
        let b = t.allocate(8, 8, None).unwrap();
        let c = t.allocate(8, 8, None).unwrap();
        let after_c = Instant::now();
        let live = t.live();
        let order: Vec<usize> = live.iter().map(|x| x.address).collect();
        assert_eq!(
            order,
            [a, b, c].map(|p| p.as_ptr() as usize),
            "oldest first"
        );
        for p in [a, b, c] {
            // SAFETY: p came from `t` with these arguments and is freed once.
            unsafe { t.deallocate(p, 8, 8, None) };
        }
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap();
        (
            live[1].time_ns - live[0].time_ns,
            live[2].time_ns - live[1].time_ns,
            ns(before_b - after_a)..=ns(after_c - before_a),
            ns(after_c - before_b),
        )
    };
    // The coarse clock's resolution is at most 10 ms (a jiffy).
    let tick = 10_000_000;
    let coarse = TrackingAdaptor::new(Arc::new(HostResource), Source::MEMARRAY);
    assert!(!coarse.clock.precise);
    let (waited, at_once, real, real_once) = gap(&coarse, std::time::Duration::from_millis(30));
    assert!(
        waited + tick >= *real.start() && waited <= real.end() + tick,
        "{waited} ns against {real:?} of real time"
    );
    assert!(at_once <= real_once + tick, "{at_once} against {real_once}");
    let precise = TrackingAdaptor::new(Arc::new(HostResource), Source::MEMARRAY).with_stacks(true);
    assert!(precise.clock.precise);
    let (waited, _, real, _) = gap(&precise, std::time::Duration::from_micros(200));
    // Calibrated against real time: within a quarter of the real span and 100 us.
    assert!(
        waited * 4 + 400_000 >= real.start() * 3 && waited * 4 <= real.end() * 5 + 400_000,
        "{waited} ns against {real:?} of real time"
    );
    assert_eq!(precise.lock().spacing, precise.clock.ticks_per_span());
}

#[test]
fn the_timeline_stays_bounded() {
    let t = TrackingAdaptor::new(Arc::new(HostResource), Source::MEMARRAY);
    t.lock().spacing = 0; // a point per event until the first thinning
    for _ in 0..(TIMELINE_POINTS / 2 + 10) {
        let p = t.allocate(8, 8, None).unwrap();
        // SAFETY: p came from `t` with these arguments and is freed once.
        unsafe { t.deallocate(p, 8, 8, None) };
    }
    let n = t.timeline().len();
    assert!(n <= TIMELINE_POINTS && n > TIMELINE_POINTS / 4, "{n}");
    assert_eq!(
        t.timeline().last().map(|(_, b)| b.iter().sum()),
        Some(0usize)
    );
}

#[test]
fn with_stacks_a_bounded_trace_keeps_allocations_and_frees() {
    let off = TrackingAdaptor::new(Arc::new(crate::HostResource), Source::MEMARRAY);
    let p = off.allocate(64, 64, None).unwrap();
    // SAFETY: p came from `off` with these arguments and is freed once.
    unsafe { off.deallocate(p, 64, 64, None) };
    assert!(off.trace().is_empty(), "no trace with stacks off");

    let t = TrackingAdaptor::new(Arc::new(crate::HostResource), Source::MEMARRAY).with_stacks(true);
    let a = t.allocate(100, 64, None).unwrap();
    let b = t.allocate(200, 64, None).unwrap();
    // SAFETY: a came from `t` with these arguments and is freed once.
    unsafe { t.deallocate(a, 100, 64, None) };
    let trace = t.trace();
    let kinds: Vec<(bool, usize)> = trace.iter().map(|e| (e.free, e.size)).collect();
    assert_eq!(kinds, [(false, 100), (false, 200), (true, 100)]);
    assert_eq!(trace[2].address, a.as_ptr() as usize);
    assert!(trace.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    for _ in 0..TRACE_EVENTS {
        let p = t.allocate(8, 8, None).unwrap();
        // SAFETY: as above.
        unsafe { t.deallocate(p, 8, 8, None) };
    }
    assert_eq!(t.trace().len(), TRACE_EVENTS, "bounded");
    // SAFETY: as above.
    unsafe { t.deallocate(b, 200, 64, None) };
}

thread_local! {
    /// The stack this thread's allocations report (the test's stack provider).
    static SITE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn with_stacks_live_bytes_per_stack_follow_allocations_and_frees() {
    fn site() -> Option<String> {
        SITE.with(|s| s.borrow().clone())
    }
    assert!(
        set_stack_provider(site),
        "no other test installs a provider"
    );
    let at = |s: &str| SITE.with(|c| *c.borrow_mut() = Some(s.to_string()));
    let t = TrackingAdaptor::new(Arc::new(crate::HostResource), Source::MEMARRAY).with_stacks(true);
    at("a.py:1");
    let a1 = t.allocate(100, 64, None).unwrap();
    let a2 = t.allocate(50, 64, None).unwrap();
    let torch = Source::register("torch").unwrap();
    at("b.py:2");
    let b = super::super::with_source(torch, || t.allocate(30, 64, None)).unwrap();
    let mut sites = t.live_by_stack();
    sites.sort_by(|x, y| x.1.cmp(&y.1));
    assert_eq!(
        sites,
        [
            (Source::MEMARRAY, "a.py:1".to_string(), 150),
            (torch, "b.py:2".to_string(), 30)
        ]
    );
    let (bytes, count) = t.live_bytes();
    assert_eq!(count, 3);
    assert!(bytes.contains(&(Source::MEMARRAY, 150)) && bytes.contains(&(torch, 30)));
    // SAFETY: each pointer came from `t` with these arguments and is freed once.
    unsafe { t.deallocate(a1, 100, 64, None) };
    assert_eq!(t.live_by_stack().iter().map(|x| x.2).sum::<usize>(), 80);
    // SAFETY: as above.
    unsafe {
        t.deallocate(a2, 50, 64, None);
        t.deallocate(b, 30, 64, None);
    }
    assert!(
        t.live_by_stack().is_empty(),
        "a stack with nothing live is forgotten"
    );
    assert_eq!(t.live_bytes().1, 0);
    SITE.with(|c| *c.borrow_mut() = None);
}
