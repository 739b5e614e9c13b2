//! Calls on several MemArrays at once (a pack, a batch move, a collective): each array's
//! state locked once, in one order every such call shares.

use memarray_cuda::RawArray;

use crate::array::PyMemArray;

/// The states of several arrays, each locked once, in id order (`SharedArray::spill_id`,
/// the order of every call that locks several): two calls locking overlapping sets cannot
/// deadlock. Take it with the GIL released.
pub(crate) struct Locked<'a> {
    keys: Vec<u64>,
    guards: Vec<memarray_cuda::array::StateGuard<'a>>,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(arrays: &[&'a PyMemArray]) -> Self {
        Self::taking(arrays, true).expect("a lock waited for is always taken")
    }

    /// As [`Locked::new`] without waiting: None when another thread is in a call on one
    /// of them (then take it with the GIL released).
    pub(crate) fn try_new(arrays: &[&'a PyMemArray]) -> Option<Self> {
        Self::taking(arrays, false)
    }

    fn taking(arrays: &[&'a PyMemArray], wait: bool) -> Option<Self> {
        let mut sorted: Vec<&'a PyMemArray> = arrays.to_vec();
        sorted.sort_by_key(|a| key(a));
        sorted.dedup_by_key(|a| key(a));
        let guards = sorted
            .iter()
            .map(|a| {
                if wait {
                    Some(a.shared.state())
                } else {
                    a.shared.try_state()
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            keys: sorted.iter().map(|a| key(a)).collect(),
            guards,
        })
    }

    /// Each distinct array's state, in id order.
    pub(crate) fn all_mut(&mut self) -> Vec<&mut RawArray> {
        self.guards.iter_mut().map(|g| &mut **g).collect()
    }

    /// The state of `a` (one of the arrays locked).
    pub(crate) fn get(&self, a: &PyMemArray) -> Option<&RawArray> {
        let i = self.keys.binary_search(&key(a)).ok()?;
        Some(&*self.guards[i])
    }

    /// The states of two distinct arrays locked here.
    pub(crate) fn pair_mut(
        &mut self,
        a: &PyMemArray,
        b: &PyMemArray,
    ) -> Option<(&mut RawArray, &mut RawArray)> {
        let i = self.keys.binary_search(&key(a)).ok()?;
        let j = self.keys.binary_search(&key(b)).ok()?;
        let (lo, hi) = (i.min(j), i.max(j));
        if lo == hi {
            return None;
        }
        let (left, right) = self.guards.split_at_mut(hi);
        let (x, y) = (&mut *left[lo], &mut *right[0]);
        Some(if i < j { (x, y) } else { (y, x) })
    }
}

fn key(a: &PyMemArray) -> u64 {
    a.shared.spill_id()
}
