//! Property tests of the MemArray mirror's host side: element writes and reads at random
//! indices of random shapes and dtypes against a byte model, typed set/get round trips,
//! and random lock/unlock/access sequences against a model of the lock.

mod common;

use common::bytes_of;
use memarray_core::{CoreError, DType, Location, LockToken, shape};
use memarray_cuda::{CudaError, MemArray, RawArray};
use proptest::prelude::*;

fn locked(held: LockToken, requested: Option<LockToken>) -> CudaError {
    CudaError::Core(CoreError::Locked {
        held: held.id(),
        requested: requested.map(LockToken::id),
    })
}

/// One random element write: a (possibly out-of-range or wrong-length) index and a seed.
fn index_for(shape: &[usize]) -> impl Strategy<Value = (Vec<u64>, u64)> + use<> {
    let coords: Vec<_> = shape.iter().map(|&d| 0..=d as u64).collect();
    (coords, any::<u64>(), prop::bool::weighted(0.05)).prop_map(|(mut idx, seed, extra)| {
        if extra {
            idx.push(0);
        }
        (idx, seed)
    })
}

/// Element writes: an index (one coordinate per dimension, or one too many) and a seed.
type Writes = Vec<(Vec<u64>, u64)>;

fn shape_and_writes() -> impl Strategy<Value = (usize, Vec<usize>, Writes)> {
    (0..DType::ALL.len(), prop::collection::vec(0usize..6, 0..=5)).prop_flat_map(|(d, shape)| {
        let writes = prop::collection::vec(index_for(&shape), 1..24);
        (Just(d), Just(shape), writes)
    })
}

proptest! {
    /// Element writes at random indices of random shapes and dtypes behave like a byte
    /// model: in-range writes land at `offset_of`, everything else is refused with the
    /// core error and changes nothing.
    #[test]
    fn random_shapes_set_get_round_trip((d, shape, writes) in shape_and_writes()) {
        let dtype = DType::ALL[d];
        let size = dtype.size();
        let mut r = RawArray::zeros(dtype, &shape, 0).unwrap();
        let mut model = vec![0u8; r.nbytes()];
        for (idx, seed) in writes {
            let mut value = seed.to_le_bytes().repeat(2)[..size].to_vec();
            if dtype == DType::Bool {
                value[0] &= 1;
            }
            let res = r.write_element(&idx, &value, None);
            match shape::offset_of(&shape, &idx) {
                Ok(off) => {
                    prop_assert!(res.is_ok(), "{:?}", res);
                    let at = off as usize * size;
                    model[at..at + size].copy_from_slice(&value);
                    let mut out = vec![0u8; size];
                    r.read_element(&idx, &mut out, None).unwrap();
                    prop_assert_eq!(out, value);
                }
                Err(e) => {
                    prop_assert_eq!(res, Err(CudaError::Core(e.clone())));
                    let mut out = vec![0u8; size];
                    let read = r.read_element(&idx, &mut out, None);
                    prop_assert_eq!(read, Err(CudaError::Core(e)));
                }
            }
        }
        let mut all = vec![0u8; r.nbytes()];
        r.read_all(&mut all, None).unwrap();
        prop_assert_eq!(all, model);
    }

    /// Typed get/set round trips on random 3-d shapes.
    #[test]
    fn typed_set_get_round_trip(
        shape in [0usize..6, 0usize..6, 0usize..6],
        idx in [0usize..7, 0usize..7, 0usize..7],
        v in any::<i64>(),
    ) {
        let mut a = MemArray::<i64, 3>::new(shape).unwrap();
        let in_range = idx.iter().zip(&shape).all(|(i, d)| i < d);
        prop_assert_eq!(a.set(idx, v).is_ok(), in_range);
        match a.get(idx) {
            Ok(got) => prop_assert!(in_range && got == v),
            Err(e) => {
                let oob = matches!(e, CudaError::Core(CoreError::OutOfBounds { .. }));
                prop_assert!(!in_range && oob, "{:?}", e);
            }
        }
        let nonzero = a.as_slice().unwrap().iter().filter(|&&x| x != 0).count();
        prop_assert_eq!(nonzero, usize::from(in_range && v != 0));
    }

    /// Random sequences of lock, unlock and accesses with the holder's token, an old
    /// token, a foreign token or none behave like `Option<holder>`; refused accesses name
    /// both ids and change nothing.
    #[test]
    fn lock_invariant_matches_a_model(ops in prop::collection::vec(op(), 1..48)) {
        let mut a = MemArray::<i32, 2>::new([3, 4]).unwrap();
        let other = MemArray::<i32, 1>::new([1]).unwrap();
        let foreign = other.try_lock().unwrap();
        let mut holder: Option<LockToken> = None;
        let mut issued: Vec<LockToken> = Vec::new();
        let mut model = [0i32; 12];
        for op in ops {
            let tok = |t: Tok| t.resolve(&issued, foreign);
            let h = holder;
            let allowed = |t: Option<LockToken>| h.is_none() || h == t;
            let refusal = |t: Option<LockToken>| h.map(|h| locked(h, t));
            match op {
                Op::Lock => match a.try_lock() {
                    Ok(t) => {
                        prop_assert!(holder.is_none());
                        prop_assert!(issued.iter().all(|o| o.id() != t.id()));
                        holder = Some(t);
                        issued.push(t);
                    }
                    // A refused attempt names the holder and its own, never-used id.
                    Err(e) => match e {
                        CudaError::Core(CoreError::Locked { held, requested: Some(r) }) => {
                            prop_assert_eq!(Some(held), h.map(|h| h.id()));
                            prop_assert!(issued.iter().all(|o| o.id() != r));
                        }
                        other => prop_assert!(false, "expected Locked, got {other:?}"),
                    },
                },
                Op::Unlock(t) => {
                    let Some(t) = tok(t) else { continue };
                    let r = a.unlock(t);
                    if holder == Some(t) {
                        prop_assert!(r.is_ok());
                        holder = None;
                    } else if holder.is_none() {
                        let want = CoreError::NotLocked { requested: t.id() };
                        prop_assert_eq!(r, Err(CudaError::Core(want)));
                    } else {
                        prop_assert_eq!(r.err(), refusal(Some(t)));
                    }
                }
                Op::Get(t, i) => {
                    let t = tok(t);
                    match a.get_with([i / 4, i % 4], t) {
                        Ok(v) => prop_assert!(allowed(t) && v == model[i]),
                        Err(e) => prop_assert_eq!(Some(e), refusal(t)),
                    }
                }
                Op::Set(t, i, v) => {
                    let t = tok(t);
                    match a.set_with([i / 4, i % 4], v, t) {
                        Ok(()) => { prop_assert!(allowed(t)); model[i] = v; }
                        Err(e) => prop_assert_eq!(Some(e), refusal(t)),
                    }
                }
                Op::Move(t) => {
                    let t = tok(t);
                    match a.move_memory(Location::Host, None, true, t) {
                        Ok(()) => prop_assert!(allowed(t)),
                        Err(e) => prop_assert_eq!(Some(e), refusal(t)),
                    }
                }
                Op::View => match a.view() {
                    Ok(v) => {
                        prop_assert!(holder.is_none());
                        prop_assert_eq!(v.as_slice().unwrap(), &model[..]);
                    }
                    Err(e) => prop_assert_eq!(Some(e), refusal(None)),
                },
            }
            prop_assert_eq!(a.lock_holder(), holder.map(LockToken::id));
            prop_assert_eq!(a.location(), Location::Host);
            let mut bytes = [0u8; 48];
            a.as_raw().read_all(&mut bytes, holder).unwrap();
            prop_assert_eq!(&bytes[..], bytes_of(&model));
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Tok {
    None,
    Latest,
    Old(usize),
    Foreign,
}

impl Tok {
    fn resolve(self, issued: &[LockToken], foreign: LockToken) -> Option<LockToken> {
        match self {
            Tok::None => None,
            Tok::Latest => issued.last().copied(),
            Tok::Old(i) => (!issued.is_empty()).then(|| issued[i % issued.len()]),
            Tok::Foreign => Some(foreign),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Lock,
    Unlock(Tok),
    Get(Tok, usize),
    Set(Tok, usize, i32),
    Move(Tok),
    View,
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        Just(Tok::None),
        Just(Tok::Latest),
        (0usize..8).prop_map(Tok::Old),
        Just(Tok::Foreign),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Lock),
        2 => tok().prop_map(Op::Unlock),
        3 => (tok(), 0usize..12).prop_map(|(t, i)| Op::Get(t, i)),
        3 => (tok(), 0usize..12, any::<i32>()).prop_map(|(t, i, v)| Op::Set(t, i, v)),
        1 => tok().prop_map(Op::Move),
        1 => Just(Op::View),
    ]
}
