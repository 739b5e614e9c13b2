//! [`SharedArray`]: a [`RawArray`] shared between threads, every method on `&self`.
//!
//! The array's state sits behind a mutex of its own, so calls from any number of threads
//! are serialised: none can tear data or observe a half-done move. The lock slot (the
//! seed's `_lock_id`) sits outside that mutex, so taking or releasing a token never waits
//! for a long copy, and a [`LockGuard`] can release it from any thread, at any time.
//!
//! Callers that hold another lock of their own (Python's GIL) must not block on the
//! mutex while holding it: use [`SharedArray::try_state`] first and block on
//! [`SharedArray::state`] only with that lock released.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use memarray_core::spill::SpillOutcome;
use memarray_core::{Location, Lock, LockGuard, LockToken};

use super::device_side::CaptureUse;
use super::raw::RawArray;
use crate::error::{ArrayError, CudaError, Result};
use crate::event::Enqueued;
use crate::graph::{GraphMember, HeldMember};
use crate::spill::{self, DeviceSpill, SpillTarget};
use crate::stream::StreamRef;

/// A [`RawArray`] that threads share through `&self` (wrap it in an [`Arc`]).
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::DType;
/// use memarray_cuda::array::{RawArray, SharedArray};
///
/// let a = Arc::new(SharedArray::new(RawArray::zeros(DType::U32, &[4], 0)?));
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             // Serialised read-modify-write of element 0 under the array's mutex.
///             a.with(|raw| -> memarray_cuda::Result<()> {
///                 let mut v = [0u8; 4];
///                 raw.read_element(&[0], &mut v, None)?;
///                 let n = u32::from_ne_bytes(v) + 1;
///                 raw.write_element(&[0], &n.to_ne_bytes(), None)
///             })
///         });
///     }
/// });
/// let mut v = [0u8; 4];
/// a.with(|raw| raw.read_element(&[0], &mut v, None))?;
/// assert_eq!(u32::from_ne_bytes(v), 4);
///
/// // An outside observer's lock: other callers are refused until the guard drops.
/// let guard = a.lock_guard()?;
/// assert!(a.with(|raw| raw.check(None)).is_err());
/// drop(guard);
/// assert!(!a.is_locked());
/// # Ok::<(), memarray_cuda::CudaError>(())
/// ```
#[derive(Debug)]
pub struct SharedArray {
    lock: Arc<Lock>,
    cell: Arc<Cell>,
}

/// The array's state and its id in the spill registries ([`crate::spill`], which hold a
/// weak reference to reach it from another thread).
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) id: u64,
    state: Mutex<RawArray>,
    /// How many graphs hold the array ([`GraphMember`]): the spiller leaves it be.
    pub(super) graphs: AtomicUsize,
}

impl Cell {
    /// The state if no call is in progress on it, without the spill bookkeeping of a
    /// [`StateGuard`] (the spiller's own access).
    fn try_raw(&self) -> Option<MutexGuard<'_, RawArray>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl SpillTarget for Cell {
    fn try_spill(&self, to: &DeviceSpill) -> SpillOutcome {
        if self.graphs.load(Ordering::Relaxed) > 0 {
            return SpillOutcome::Busy; // a graph's launches expect it on the device
        }
        let Some(mut raw) = self.try_raw() else {
            return SpillOutcome::Busy;
        };
        if raw.spill_refusal().is_some() {
            return SpillOutcome::Busy;
        }
        match to
            .stream()
            .and_then(|s| raw.spill_to_host(s, &|n| to.host_for(n)))
        {
            Ok(bytes) => {
                let device = raw.device_id();
                spill::left_device(&mut raw.spill_note, device, bytes);
                SpillOutcome::Spilled { bytes }
            }
            // The array keeps its device copy (nothing was freed): try another.
            Err(_) => SpillOutcome::Busy,
        }
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        let raw = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        spill::forget(self.id, &mut raw.spill_note);
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A [`SharedArray`]'s state, held: derefs to the [`RawArray`]. Dropping it tells the
/// spill registry what the call changed (the array became resident, was used, left the
/// device); with spilling off that is one atomic load.
#[derive(Debug)]
pub struct StateGuard<'a> {
    cell: &'a Arc<Cell>,
    raw: MutexGuard<'a, RawArray>,
}

impl Deref for StateGuard<'_> {
    type Target = RawArray;
    fn deref(&self) -> &RawArray {
        &self.raw
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut RawArray {
        &mut self.raw
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let raw = &mut *self.raw;
        let (place, nbytes) = (raw.spill_place(), raw.nbytes());
        let cell = self.cell;
        // Used in a capture memarray began: the array joins its graph (after the spill
        // registry hears of the call, which spills nothing for a call captured).
        let news = raw.dev.take_capture_news();
        // The weak handle costs one count, no strong clone.
        spill::after_access(
            cell.id,
            &mut raw.spill_note,
            place,
            nbytes,
            news.is_some(),
            || Arc::<Cell>::downgrade(cell),
        );
        if let Some(used) = news {
            join_graph(cell, used);
        }
    }
}

impl Cell {
    /// The state of the array in `cell`, waiting for any other call on it.
    pub(super) fn guard(cell: &Arc<Cell>) -> StateGuard<'_> {
        StateGuard {
            cell,
            raw: cell.state.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }
}

impl SharedArray {
    /// Shares `raw`. Its lock slot stays with this handle for good (a swap exchanges
    /// contents, never locks).
    pub fn new(raw: RawArray) -> Self {
        let shared = Self {
            lock: raw.lock_slot(),
            cell: Arc::new(Cell {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                state: Mutex::new(raw),
                graphs: AtomicUsize::new(0),
            }),
        };
        // Listed at once if resident on a device that spills.
        drop(shared.state());
        shared
    }

    /// The array back, out of the spill registries (a spilled array stays spilled: a
    /// `&mut` operation that needs the device data restores it).
    pub fn into_inner(self) -> RawArray {
        let mut g = self
            .cell
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        spill::forget(self.cell.id, &mut g.spill_note);
        std::mem::replace(&mut *g, RawArray::placeholder())
    }

    /// This array's id (unique in the process): its key in the spill registries, and the
    /// order in which every call that locks several arrays (a launch, a graph's launch, a
    /// swap) locks them.
    pub fn spill_id(&self) -> u64 {
        self.cell.id
    }

    /// Spills the array now, on request ([`crate::spill`]): its data moves to its host
    /// copy and its device buffer is freed; it comes back on its next device use. Fails
    /// with [`ArrayError::NotSpillable`] when it cannot go (not on a device, locked,
    /// exported, work still queued on it) or spilling is off on its device. A spilled
    /// array is left as it is.
    pub fn evict(&self) -> Result<()> {
        let mut raw = self.state();
        if raw.is_spilled() {
            return Ok(());
        }
        // Asked first: it lasts as long as the graph (work still queued passes).
        if self.cell.graphs.load(Ordering::Relaxed) > 0 {
            return Err(ArrayError::NotSpillable {
                reason: "a CUDA graph uses it (drop the graph first)",
            }
            .into());
        }
        if let Some(reason) = raw.spill_refusal() {
            return Err(ArrayError::NotSpillable { reason }.into());
        }
        let Location::Device(device) = raw.location() else {
            return Err(ArrayError::NotSpillable {
                reason: "its data is not on a device",
            }
            .into());
        };
        let Some(d) = spill::device_spill(device) else {
            return Err(ArrayError::NotSpillable {
                reason: "spilling is off on its device (memarray_cuda::spill::enable)",
            }
            .into());
        };
        let start = std::time::Instant::now();
        let bytes = raw.spill_to_host(d.stream()?, &|n| d.host_for(n))?;
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        d.note_spilled(self.cell.id, bytes, ns);
        spill::left_device(&mut raw.spill_note, device, bytes);
        raw.spill_note.registered = Some(device);
        Ok(())
    }

    /// The array's state, waiting for any other thread's call to finish.
    ///
    /// A panic in another thread while it held the state does not poison it for good:
    /// every `RawArray` method leaves the array consistent at each point it can fail.
    pub fn state(&self) -> StateGuard<'_> {
        Cell::guard(&self.cell)
    }

    /// The array's state if no other thread is in a call on it, else `None`.
    pub fn try_state(&self) -> Option<StateGuard<'_>> {
        Some(StateGuard {
            cell: &self.cell,
            raw: self.cell.try_raw()?,
        })
    }

    /// Runs `f` on the array, serialised with every other call on it.
    pub fn with<R>(&self, f: impl FnOnce(&mut RawArray) -> R) -> R {
        f(&mut self.state())
    }

    /// Takes the lock with a fresh token, without waiting for calls in progress; fails
    /// with `Locked { held, requested }` while another token holds it.
    pub fn try_lock(&self) -> Result<LockToken> {
        Ok(self.lock.try_lock()?)
    }

    /// Takes the lock and returns a guard that releases it when dropped.
    pub fn lock_guard(&self) -> Result<LockGuard> {
        Ok(self.lock.try_guard()?)
    }

    /// Releases the lock held by `token` (from any thread, without waiting).
    pub fn unlock(&self, token: LockToken) -> Result<()> {
        Ok(self.lock.unlock(token)?)
    }

    /// Id of the token holding the lock, if any.
    pub fn lock_holder(&self) -> Option<u64> {
        self.lock.holder()
    }

    /// Whether the array is locked.
    pub fn is_locked(&self) -> bool {
        self.lock.is_locked()
    }

    /// Swaps contents with `other` (see [`RawArray::swap`]); both must be unlocked.
    /// Both mutexes are taken in id order ([`Self::spill_id`], as launches and graphs
    /// take theirs), so two threads swapping the same pair in opposite directions cannot
    /// deadlock. Swapping an array with itself is a no-op.
    pub fn swap(&self, other: &SharedArray) -> Result<()> {
        if std::ptr::eq(self, other) {
            return self.with(|raw| raw.check(None));
        }
        let (first, second) = if self.cell.id < other.cell.id {
            (self, other)
        } else {
            (other, self)
        };
        let mut a = first.state();
        let mut b = second.state();
        a.swap(&mut b)
    }

    /// A deep copy, unlocked (see [`RawArray::try_clone`]).
    pub fn try_clone(&self, token: Option<LockToken>) -> Result<SharedArray> {
        Ok(SharedArray::new(self.with(|raw| raw.try_clone(token))?))
    }
}

impl From<RawArray> for SharedArray {
    fn from(raw: RawArray) -> Self {
        Self::new(raw)
    }
}

// Arrays in graphs: an array used in a capture memarray began joins the capture as a
// [`GraphMember`] (when the call that used it drops its state guard), and the graph holds
// it for its life. Each launch locks it, brings its data to the device where the capture
// used it, orders the launch after its pending work and makes the launch that work, as a
// kernel launch would.

/// An array a graph holds: its cell (kept alive by the graph) and how the capture used it.
#[derive(Debug)]
struct InGraph {
    cell: Arc<Cell>,
    used: CaptureUse,
}

/// Makes the array in `cell` a member of the capture it was `used` in (if memarray began
/// that capture; else nothing is kept).
fn join_graph(cell: &Arc<Cell>, used: CaptureUse) {
    let id = used.id;
    cell.graphs.fetch_add(1, Ordering::Relaxed);
    let member = Arc::new(InGraph {
        cell: cell.clone(),
        used,
    });
    crate::graph::join_capture(id, member);
}

impl Drop for InGraph {
    fn drop(&mut self) {
        self.cell.graphs.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An [`InGraph`] held for one launch: the array's state, locked.
struct Held<'a> {
    state: StateGuard<'a>,
    write: bool,
}

impl GraphMember for InGraph {
    fn key(&self) -> u64 {
        self.cell.id
    }

    fn hold(&self, stream: StreamRef) -> Result<Box<dyn HeldMember + '_>> {
        let mut state = Cell::guard(&self.cell);
        let CaptureUse {
            device,
            addr: captured,
            write,
            ..
        } = self.used;
        let moved = |now| CudaError::GraphArrayMoved {
            device,
            captured,
            now,
        };
        // Where the device data is now, before anything moves: a graph never brings an
        // array back into other memory than the capture's (the spiller leaves members be,
        // so only the caller's own move or swap takes one away).
        let now = state.dev.device_addr().unwrap_or(0);
        if now != captured {
            return Err(moved(now));
        }
        // A newer host copy goes up, into the same buffer.
        let buffer = state.kernel_operand(device, stream, None)?;
        if buffer.device_ptr() != captured {
            return Err(moved(buffer.device_ptr()));
        }
        Ok(Box::new(Held { state, write }))
    }
}

impl HeldMember for Held<'_> {
    fn launched(&mut self, launch: &Enqueued) -> Result<()> {
        let op = Enqueued::new(launch.stream(), launch.device().clone());
        if self.write {
            self.state.wrote(op)
        } else {
            self.state.was_read(launch)
        }
    }
}
