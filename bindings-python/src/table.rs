//! `_PackTable`: where each array of a pack sits (dtype, shape, byte offset), parsed once.
//!
//! `_pack` and `_share` return one, `_check_table` checks one against its pack (or makes
//! one from a list), `_unpack` reads it with no parsing. It pickles as one bytes object
//! (`_pack_table` rebuilds it, checking every byte): a table of 1,000 entries as a list of
//! tuples cost about 0.25 ms to pickle and load and another 0.26 ms to check, each time a
//! Bundle or a transport's metadata crossed a process.

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyIterator, PyList, PyString, PyTuple};

use memarray_core::{DType, MAX_NDIM};
use memarray_cuda::array::Packed;

/// A pack's table: each array's dtype, shape and byte offset in the pack. A sequence of
/// `(dtype name, [dims], offset)` tuples to Python; equal to a list of the same tuples.
#[pyclass(frozen, module = "memarray._memarray", name = "_PackTable")]
pub struct PackTable {
    pub(crate) entries: Vec<Packed>,
}

/// The first byte of a pickled table: its format.
const FORMAT: u8 = 1;

#[pymethods]
impl PackTable {
    fn __len__(&self) -> usize {
        self.entries.len()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, i: isize) -> PyResult<Bound<'py, PyTuple>> {
        let n = self.entries.len() as isize;
        let at = if i < 0 { i + n } else { i };
        if !(0..n).contains(&at) {
            return Err(PyIndexError::new_err(format!(
                "pack table index {i} out of range for {n} entries"
            )));
        }
        entry_tuple(py, &self.entries[at as usize], &mut Names::default())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.to_list(py)?.try_iter()
    }

    /// Equal to another table with the same entries, or to a list of the same tuples.
    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        if let Ok(t) = other.cast::<PackTable>() {
            return Ok(t.get().entries == self.entries);
        }
        self.to_list(py)?.eq(other)
    }

    fn __repr__(&self) -> String {
        format!(
            "memarray._memarray._PackTable({} entries)",
            self.entries.len()
        )
    }

    /// The table as bytes (its pickled form), which `_pack_table` reads back.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.encode())
    }

    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let rebuild = py.import("memarray._memarray")?.getattr("_pack_table")?;
        Ok((rebuild, (self.to_bytes(py),)))
    }
}

impl PackTable {
    pub(crate) fn new(entries: Vec<Packed>) -> Self {
        Self { entries }
    }

    /// The entries as a list of `(dtype name, [dims], offset)` tuples.
    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut names = Names::default();
        let items = self
            .entries
            .iter()
            .map(|e| entry_tuple(py, e, &mut names))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The pickled form: [`FORMAT`]; the dtype names used (a count byte, then each as a
    /// length byte and its UTF-8); the entry count (u64); each entry as its dtype's index
    /// in the names (u8), its ndim (u8), its dims and its offset (u64 each). Little-endian.
    fn encode(&self) -> Vec<u8> {
        let mut names: Vec<DType> = Vec::new();
        for e in &self.entries {
            if !names.contains(&e.dtype) {
                names.push(e.dtype);
            }
        }
        let dims: usize = self.entries.iter().map(|e| e.shape.len()).sum();
        let mut out =
            Vec::with_capacity(2 + names.len() * 12 + 8 + self.entries.len() * 10 + dims * 8);
        out.push(FORMAT);
        out.push(names.len() as u8); // at most DType::ALL.len() names
        for d in &names {
            out.push(d.name().len() as u8);
            out.extend_from_slice(d.name().as_bytes());
        }
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            let index = names.iter().position(|d| *d == e.dtype).unwrap_or(0);
            out.push(index as u8);
            out.push(e.shape.len() as u8); // at most MAX_NDIM
            for &d in &e.shape {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&(e.offset as u64).to_le_bytes());
        }
        out
    }

    /// The table [`encode`](Self::encode) wrote, every byte checked: None for anything
    /// else (a wrong format byte, an unknown dtype name or index, an ndim past
    /// [`MAX_NDIM`], a value past usize, bytes missing or left over).
    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if r.u8()? != FORMAT {
            return None;
        }
        let names = (0..r.u8()?)
            .map(|_| {
                let len = usize::from(r.u8()?);
                let name = std::str::from_utf8(r.take(len)?).ok()?;
                DType::from_name(name).ok()
            })
            .collect::<Option<Vec<DType>>>()?;
        let count = usize::try_from(r.u64()?).ok()?;
        // Each entry takes 10 bytes or more: no capacity past what the bytes can hold.
        let mut entries = Vec::with_capacity(count.min(r.0.len() / 10));
        for _ in 0..count {
            let dtype = *names.get(usize::from(r.u8()?))?;
            let ndim = usize::from(r.u8()?);
            if ndim > MAX_NDIM {
                return None;
            }
            let shape = (0..ndim)
                .map(|_| usize::try_from(r.u64()?).ok())
                .collect::<Option<Vec<usize>>>()?;
            let offset = usize::try_from(r.u64()?).ok()?;
            entries.push(Packed {
                dtype,
                shape,
                offset,
            });
        }
        r.0.is_empty().then_some(Self { entries })
    }

    /// Checks every entry's bytes lie inside a `pack_len`-byte pack; a ValueError naming
    /// the first that does not.
    fn check_bounds(&self, pack_len: usize) -> PyResult<()> {
        for (i, e) in self.entries.iter().enumerate() {
            let dims = e.shape.iter().map(|&d| d as u128);
            check_entry(i, e.dtype, dims, e.offset as u128, pack_len)?;
        }
        Ok(())
    }
}

/// Bytes read front to back; None once too few are left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Each dtype's name as one Python string, however many entries name it.
#[derive(Default)]
struct Names<'py>(Vec<(DType, Bound<'py, PyAny>)>);

impl<'py> Names<'py> {
    fn of(&mut self, py: Python<'py>, dtype: DType) -> Bound<'py, PyAny> {
        if let Some((_, s)) = self.0.iter().find(|(d, _)| *d == dtype) {
            return s.clone();
        }
        let s = PyString::new(py, dtype.name()).into_any();
        self.0.push((dtype, s.clone()));
        s
    }
}

fn entry_tuple<'py>(
    py: Python<'py>,
    e: &Packed,
    names: &mut Names<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            names.of(py, e.dtype),
            PyList::new(py, &e.shape)?.into_any(),
            e.offset.into_pyobject(py)?.into_any(),
        ],
    )
}

/// Checks entry `i` (`dims` of `dtype` at byte `at`) lies inside a `pack_len`-byte pack.
fn check_entry(
    i: usize,
    dtype: DType,
    dims: impl IntoIterator<Item = u128>,
    at: u128,
    pack_len: usize,
) -> PyResult<()> {
    // A dimension past usize is past any pack, even beside a zero.
    let nbytes = dims.into_iter().try_fold(dtype.size() as u128, |n, d| {
        (d <= usize::MAX as u128).then_some(())?;
        n.checked_mul(d)
    });
    if nbytes
        .and_then(|n| n.checked_add(at))
        .is_none_or(|end| end > pack_len as u128)
    {
        return Err(PyValueError::new_err(format!(
            "Bundle entry {i} ({at} + {} bytes) lies outside its {pack_len}-byte pack",
            nbytes.map_or_else(|| "too many".to_string(), |n| n.to_string())
        )));
    }
    Ok(())
}

/// A pickled `_PackTable` (its `__reduce__`), every byte checked: ValueError for bytes it
/// did not write.
#[pyfunction]
pub fn _pack_table(data: &[u8]) -> PyResult<PackTable> {
    PackTable::decode(data).ok_or_else(|| {
        PyValueError::new_err(format!(
            "these {} bytes are not a pickled pack table (format {FORMAT})",
            data.len()
        ))
    })
}

/// A Bundle's table from a pickle (`entries`: a `_PackTable`, or a list of `(dtype,
/// shape, offset)`), checked against its `pack_len`-byte pack before anything is made from
/// it, in one pass: each dtype one of memarray's names, each shape at most `MAX_NDIM`
/// non-negative ints, each offset a non-negative int, each entry's bytes inside the pack.
/// Returns the table as a `_PackTable`; a ValueError naming the entry otherwise.
#[pyfunction]
pub fn _check_table<'py>(
    py: Python<'py>,
    pack_len: usize,
    entries: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PackTable>> {
    if let Ok(t) = entries.cast::<PackTable>() {
        t.get().check_bounds(pack_len)?;
        return Ok(t.clone());
    }
    if !(entries.is_instance_of::<PyList>() || entries.is_instance_of::<PyTuple>()) {
        return Err(PyValueError::new_err(format!(
            "a Bundle's table must be a list, not {}",
            entries.get_type().name()?
        )));
    }
    Bound::new(py, PackTable::new(parse_list(py, entries, Some(pack_len))?))
}

/// A table given as a list of `(dtype, shape, offset)`: each dtype one of memarray's
/// names, each shape at most `MAX_NDIM` non-negative ints, each offset a non-negative int,
/// and with `pack_len` each entry's bytes inside the pack (without, `unpack` checks them);
/// a ValueError naming the entry otherwise.
fn parse_list<'py>(
    py: Python<'py>,
    entries: &Bound<'py, PyAny>,
    pack_len: Option<usize>,
) -> PyResult<Vec<Packed>> {
    // A Python int that is not a bool, as a u128 (None: negative, too large, not an int).
    let natural = |v: &Bound<'py, PyAny>| -> Option<u128> {
        (v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>())
            .then(|| v.extract::<u128>().ok())
            .flatten()
    };
    let mut out = Vec::new();
    for (i, entry) in entries.try_iter()?.enumerate() {
        let entry = entry?;
        let not_three =
            || PyValueError::new_err(format!("Bundle entry {i} is not (dtype, shape, offset)"));
        let items: Vec<Bound<'py, PyAny>> = entry
            .try_iter()
            .and_then(|it| it.collect::<PyResult<_>>())
            .map_err(|_| not_three())?;
        let [dtype, shape, offset] =
            <[Bound<'py, PyAny>; 3]>::try_from(items).map_err(|_| not_three())?;
        let shape: Vec<Bound<'py, PyAny>> = shape
            .try_iter()
            .and_then(|it| it.collect::<PyResult<_>>())
            .map_err(|_| not_three())?;
        let dt = dtype
            .cast::<PyString>()
            .ok()
            .and_then(|s| s.to_str().ok())
            .and_then(|name| DType::from_name(name).ok());
        let Some(dt) = dt else {
            return Err(PyValueError::new_err(format!(
                "Bundle entry {i}: {} is not a memarray dtype",
                dtype.repr()?
            )));
        };
        let dims: Option<Vec<u128>> = shape.iter().map(natural).collect();
        let at = natural(&offset);
        let (Some(dims), Some(at)) = (dims.filter(|d| d.len() <= MAX_NDIM), at) else {
            return Err(PyValueError::new_err(format!(
                "Bundle entry {i}: shape {} and offset {} must be at most {MAX_NDIM} \
                 non-negative ints and a non-negative int",
                PyList::new(py, &shape)?.repr()?,
                offset.repr()?,
            )));
        };
        match pack_len {
            Some(len) => check_entry(i, dt, dims.iter().copied(), at, len)?,
            None if dims.iter().chain([&at]).any(|&v| v > usize::MAX as u128) => {
                return Err(PyValueError::new_err(format!(
                    "Bundle entry {i}: a dimension or offset past any pack"
                )));
            }
            None => {}
        }
        // Checked above: every value fits a usize.
        out.push(Packed {
            dtype: dt,
            shape: dims.iter().map(|&d| d as usize).collect(),
            offset: at as usize,
        });
    }
    Ok(out)
}

/// `entries` for `_unpack`: a `_PackTable`'s own entries (borrowed), else a list read as
/// `_check_table` reads one (`unpack` checks the bounds against its pack).
pub(crate) fn packed_entries<'a>(
    py: Python<'_>,
    entries: &'a Bound<'_, PyAny>,
) -> PyResult<std::borrow::Cow<'a, [Packed]>> {
    if let Ok(t) = entries.cast::<PackTable>() {
        return Ok(std::borrow::Cow::Borrowed(&t.get().entries));
    }
    Ok(std::borrow::Cow::Owned(parse_list(py, entries, None)?))
}
