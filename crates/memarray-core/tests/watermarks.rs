//! Soft watermarks (their own process: the ledger and the watermarks are process-wide;
//! each test its own device): a notice once per rise past the watermark, re-armed by a
//! fall below it, delivered off the allocating thread (a slow callback holds no
//! allocation up, a failing one is counted and the next notice still comes, a callback
//! may allocate through memarray), and none once removed.

mod common;

use common::{Slots, alloc, free};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memarray_core::Location;
use memarray_core::Source;
use memarray_core::resource::watermark::{WatermarkCallback, set_watermark, watermarks};

/// A callback that sends each notice to the returned receiver.
fn notices() -> (WatermarkCallback, Receiver<(Location, u64, u64)>) {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let cb: WatermarkCallback = Arc::new(move |place, held, level| {
        tx.lock().unwrap().send((place, held, level)).ok();
        Ok(())
    });
    (cb, rx)
}

fn row(place: Location) -> memarray_core::resource::watermark::WatermarkStatistics {
    watermarks().into_iter().find(|r| r.place == place).unwrap()
}

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(150);

#[test]
fn a_notice_once_per_rise_rearmed_by_a_fall() {
    let dev = Slots::on(Some(50));
    let place = Location::Device(50);
    let (cb, rx) = notices();
    set_watermark(place, Some((1000, cb))).unwrap();
    let a = alloc(&dev, Source::MEMARRAY, 600).unwrap();
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "below the watermark: no notice"
    );
    let torch = Source::register("lib_t").unwrap();
    let b = alloc(&dev, torch, 600).unwrap(); // every library's bytes count
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), (place, 1200, 1000));
    let c = alloc(&dev, torch, 100).unwrap();
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "still above: no second notice"
    );
    free(&dev, torch, b, 600);
    free(&dev, torch, c, 100); // 600 held: below, re-armed
    let d = alloc(&dev, torch, 500).unwrap();
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), (place, 1100, 1000));
    assert_eq!(row(place).crossings, 2);
    // Removed: no more notices.
    set_watermark(place, None).unwrap();
    free(&dev, torch, d, 500);
    let e = alloc(&dev, torch, 2000).unwrap();
    assert!(rx.recv_timeout(QUIET).is_err());
    assert!(watermarks().iter().all(|r| r.place != place));
    free(&dev, torch, e, 2000);
    free(&dev, Source::MEMARRAY, a, 600);
}

#[test]
fn a_slow_or_failing_callback_holds_no_allocation_up() {
    let dev = Slots::on(Some(51));
    let place = Location::Device(51);
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let cb: WatermarkCallback = Arc::new(move |_, _, _| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(400));
        match n {
            0 => Err("the first one fails".into()),
            1 => panic!("the second one panics"),
            _ => Ok(()),
        }
    });
    set_watermark(place, Some((100, cb))).unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        held.push(alloc(&dev, Source::MEMARRAY, 200).unwrap()); // crosses
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        free(&dev, Source::MEMARRAY, held.pop().unwrap(), 200); // re-arms
    }
    let deadline = Instant::now() + WAIT;
    while calls.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500)); // the third finishes
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let r = row(place);
    assert_eq!((r.crossings, r.failures), (3, 2), "{r:?}");
    set_watermark(place, None).unwrap();
}

#[test]
fn a_callback_may_allocate_and_free_through_memarray() {
    let dev = Arc::new(Slots::on(Some(52)));
    let place = Location::Device(52);
    let inner = dev.clone();
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let cb: WatermarkCallback = Arc::new(move |_, held, _| {
        // Crossing again from inside the callback queues nothing (not re-armed).
        let p = alloc(&inner, Source::MEMARRAY, 4096).map_err(|e| e.to_string())?;
        free(&inner, Source::MEMARRAY, p, 4096);
        tx.lock().unwrap().send(held).ok();
        Ok(())
    });
    set_watermark(place, Some((1, cb))).unwrap();
    let p = alloc(&dev, Source::MEMARRAY, 8).unwrap();
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), 8);
    free(&dev, Source::MEMARRAY, p, 8);
    set_watermark(place, None).unwrap();
    assert!(
        set_watermark(Location::Device(64), None).is_err(),
        "past the ledger's devices"
    );
}
