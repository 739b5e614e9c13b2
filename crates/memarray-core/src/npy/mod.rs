//! The NumPy `.npy` format (versions 1.0, 2.0 and 3.0): header parsing and writing.
//!
//! A file is the magic `\x93NUMPY`, a version, a header length, a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with spaces to a
//! multiple of 64 bytes and ended by a newline, then the raw data. Headers are read as
//! `np.load` reads them: what NumPy refuses is refused, and of what it loads, every file
//! of a dtype memarray holds is read, in either byte order and either memory order
//! ([`NpyHeader::to_c_native`] turns big-endian or Fortran-order data into the native,
//! C-order bytes an array holds).

mod literal;

use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::shape;
use literal::Lit;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// A parsed `.npy` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: Vec<usize>,
    /// Byte offset of the data in the file.
    pub data_offset: usize,
    /// Bytes of data the header describes.
    pub nbytes: usize,
    /// The data is in Fortran (column-major) order: extents of 1 aside, more than one
    /// extent exceeds 1 (otherwise the two orders are the same bytes and this is false).
    pub fortran_order: bool,
    /// The data is big-endian (multi-byte elements; complex numbers by part).
    pub byte_swapped: bool,
}

impl NpyHeader {
    /// Whether the file's data must be reordered or byte-swapped ([`Self::to_c_native`])
    /// before an array can hold it.
    pub fn needs_conversion(&self) -> bool {
        self.fortran_order || self.byte_swapped
    }

    /// Writes the file's data `src` into `dst` in C order and native byte order. Both are
    /// [`NpyHeader::nbytes`] long.
    ///
    /// # Panics
    /// When either slice is not `nbytes` long.
    pub fn to_c_native(&self, src: &[u8], dst: &mut [u8]) {
        assert!(src.len() == self.nbytes && dst.len() == self.nbytes);
        let size = self.dtype.size();
        if self.fortran_order {
            fortran_to_c(src, dst, &self.shape, size);
        } else {
            dst.copy_from_slice(src);
        }
        if self.byte_swapped {
            // Complex numbers swap each part.
            let complex = matches!(self.dtype, DType::Complex64 | DType::Complex128);
            let unit = if complex { size / 2 } else { size };
            if unit > 1 {
                for e in dst.chunks_exact_mut(unit) {
                    e.reverse();
                }
            }
        }
    }
}

/// Copies the column-major `src` of `shape` into the row-major `dst`, element by element.
fn fortran_to_c(src: &[u8], dst: &mut [u8], shape: &[usize], size: usize) {
    let n = shape.len();
    // Column-major strides, in elements.
    let mut fstride = vec![1usize; n];
    for k in 1..n {
        fstride[k] = fstride[k - 1] * shape[k - 1];
    }
    let mut idx = vec![0usize; n];
    let mut from = 0usize; // the current C index's column-major offset, in elements
    for out in dst.chunks_exact_mut(size) {
        out.copy_from_slice(&src[from * size..(from + 1) * size]);
        // Next C index: the last axis fastest.
        for k in (0..n).rev() {
            idx[k] += 1;
            from += fstride[k];
            if idx[k] < shape[k] {
                break;
            }
            from -= fstride[k] * shape[k];
            idx[k] = 0;
        }
    }
}

fn bad(reason: impl Into<String>) -> CoreError {
    CoreError::BadNpy {
        path: "the header".into(),
        reason: reason.into(),
    }
}

/// NumPy's limit on header text (`np.load`'s `max_header_size` default).
pub const MAX_HEADER_TEXT: usize = 10_000;

/// Parses the header at the start of `bytes` (at least the first 12 bytes and the whole
/// header; the data need not follow), as `numpy.lib.format` reads it: versions 1.0, 2.0
/// and 3.0; the dict evaluated as a Python literal (the last of duplicate keys wins);
/// exactly the keys `descr`, `fortran_order` and `shape`; a tuple of ints for the shape
/// and a bool for the order. Headers NumPy refuses are refused; of those it accepts,
/// memarray refuses what it cannot hold (Fortran order, big-endian or non-numeric dtypes,
/// bfloat16's `V2`), saying so.
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a .npy file (no \\x93NUMPY magic)"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start): (usize, usize) = match (major, minor) {
        (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        (2 | 3, 0) if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        (2 | 3, 0) => return Err(bad("truncated .npy header")),
        _ => {
            return Err(bad(format!(
                "unsupported .npy version {major}.{minor} (NumPy reads 1.0, 2.0 and 3.0)"
            )));
        }
    };
    let end = start
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(format!("truncated .npy header ({len} bytes announced)")))?;
    let raw = &bytes[start..end];
    // Versions 1 and 2 are latin-1 (every byte a character), 3 is UTF-8.
    let text: String = if major == 3 {
        std::str::from_utf8(raw)
            .map_err(|_| bad("the version 3.0 header is not UTF-8"))?
            .to_string()
    } else {
        raw.iter().map(|&b| b as char).collect()
    };
    let chars = text.chars().count();
    if chars > MAX_HEADER_TEXT {
        return Err(bad(format!(
            "header text of {chars} characters is longer than NumPy loads ({MAX_HEADER_TEXT})"
        )));
    }
    let dict = literal::parse(&text, false)
        .or_else(|e| {
            if major <= 2 {
                literal::parse(&text, true)
            } else {
                Err(e)
            }
        })
        .map_err(|e| bad(format!("cannot parse header {text:?}: {e}")))?;
    let mut keys = dict
        .str_keys()
        .ok_or_else(|| bad(format!("header is not a dict of string keys: {text:?}")))?;
    keys.sort_unstable();
    if keys != ["descr", "fortran_order", "shape"] {
        return Err(bad(format!(
            "header does not contain exactly the keys 'descr', 'fortran_order', 'shape': \
             {keys:?}"
        )));
    }
    let shape_lit = dict.get("shape");
    let shape: Vec<i128> = match shape_lit {
        Some(Lit::Tuple(items)) => items
            .iter()
            .map(|x| match x {
                // NumPy's header check lets bools through (they are ints), but making
                // the array refuses them: refused here at once.
                Lit::Int(n) => Some(*n),
                _ => None,
            })
            .collect::<Option<_>>(),
        _ => None,
    }
    .ok_or_else(|| bad(format!("shape is not a tuple of ints: {shape_lit:?}")))?;
    let fortran = match dict.get("fortran_order") {
        Some(Lit::Bool(f)) => *f,
        other => return Err(bad(format!("fortran_order is not a bool: {other:?}"))),
    };
    // A subarray descr `('<f4', ())` with no extents is its base dtype; with extents
    // (`('<f4', (2,))`) `np.load` of a file refuses it (it reads the elements of the base
    // dtype, counts them as subarrays and finds a size mismatch), so memarray does too.
    let descr = match dict.get("descr") {
        Some(Lit::Str(s)) => s.as_str(),
        Some(Lit::Tuple(t)) if t.len() == 2 && matches!(&t[0], Lit::Str(_)) => {
            let Lit::Str(s) = &t[0] else { unreachable!() };
            if t[1] != Lit::Tuple(Vec::new()) {
                return Err(bad(format!(
                    "descr {t:?} is a subarray dtype, which np.load cannot read from a file"
                )));
            }
            s.as_str()
        }
        other => {
            return Err(bad(format!(
                "descr {other:?} is not a dtype memarray holds (structured and object \
                 dtypes are not)"
            )));
        }
    };
    let (dtype, byte_swapped) = descr_dtype(descr)?;
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .ok()
                .filter(|&d| d <= isize::MAX as usize)
        })
        .collect::<Option<_>>()
        .ok_or_else(|| bad(format!("shape {shape:?} has an extent outside 0..2**63")))?;
    let nbytes = shape::validate(&shape, dtype.size())?;
    // Fortran order is C order where at most one extent exceeds 1 (NumPy writes 1-d
    // arrays either way).
    let fortran_order =
        fortran && !shape.contains(&0) && shape.iter().filter(|&&d| d > 1).count() > 1;
    Ok(NpyHeader {
        dtype,
        shape,
        data_offset: end,
        nbytes,
        fortran_order,
        byte_swapped: byte_swapped && dtype.size() > 1,
    })
}

/// NumPy's names of the dtypes memarray holds (`np.dtype(name)`; no byte-order prefix).
const NAMES: &[(&str, DType)] = &[
    ("bool", DType::Bool),
    ("bool_", DType::Bool),
    ("byte", DType::I8),
    ("int8", DType::I8),
    ("short", DType::I16),
    ("int16", DType::I16),
    ("intc", DType::I32),
    ("int32", DType::I32),
    ("int", DType::I64),
    ("int_", DType::I64),
    ("intp", DType::I64),
    ("long", DType::I64),
    ("longlong", DType::I64),
    ("int64", DType::I64),
    ("ubyte", DType::U8),
    ("uint8", DType::U8),
    ("ushort", DType::U16),
    ("uint16", DType::U16),
    ("uintc", DType::U32),
    ("uint32", DType::U32),
    ("uint", DType::U64),
    ("uintp", DType::U64),
    ("ulong", DType::U64),
    ("ulonglong", DType::U64),
    ("uint64", DType::U64),
    ("half", DType::F16),
    ("float16", DType::F16),
    ("single", DType::F32),
    ("float32", DType::F32),
    ("double", DType::F64),
    ("float", DType::F64),
    ("float64", DType::F64),
    ("csingle", DType::Complex64),
    ("complex64", DType::Complex64),
    ("cdouble", DType::Complex128),
    ("complex", DType::Complex128),
    ("complex128", DType::Complex128),
];

/// NumPy's one-character type codes of the dtypes memarray holds (64-bit Linux: `l`, `q`,
/// `n` and `p` are int64).
const CODES: &[(u8, DType)] = &[
    (b'?', DType::Bool),
    (b'b', DType::I8),
    (b'B', DType::U8),
    (b'h', DType::I16),
    (b'H', DType::U16),
    (b'i', DType::I32),
    (b'I', DType::U32),
    (b'l', DType::I64),
    (b'L', DType::U64),
    (b'q', DType::I64),
    (b'Q', DType::U64),
    (b'n', DType::I64),
    (b'N', DType::U64),
    (b'p', DType::I64),
    (b'P', DType::U64),
    (b'e', DType::F16),
    (b'f', DType::F32),
    (b'd', DType::F64),
    (b'F', DType::Complex64),
    (b'D', DType::Complex128),
];

/// The size after a kind character, read as NumPy reads it (C's `strtol` over the rest:
/// leading whitespace, an optional `+`, decimal digits, nothing after).
fn kind_size(rest: &str) -> Option<usize> {
    let t = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// The dtype of a `descr` string as `np.dtype(descr)` reads it, for the dtypes memarray
/// holds: a name (`'float32'`, `'double'`), a type code (`'d'`, `'<q'`) or a kind and size
/// (`'<f4'`, `'|b1'`, `'i 8'`), with an optional byte-order prefix on codes and kinds;
/// whether the data is big-endian. bfloat16 is refused: its typestr `'<V2'` is NumPy's raw
/// void, not bfloat16.
fn descr_dtype(descr: &str) -> Result<(DType, bool)> {
    let refuse = |why: &str| {
        bad(format!(
            "dtype {descr:?} is not one memarray holds ({why}; it holds {} in .npy)",
            DType::ALL
                .iter()
                .filter(|d| **d != DType::BF16)
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    if let Some((_, d)) = NAMES.iter().find(|(n, _)| *n == descr) {
        return Ok((*d, false));
    }
    let (order, body) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'=' | b'|') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let big = order == b'>';
    if let [c] = body.as_bytes()
        && let Some((_, d)) = CODES.iter().find(|(k, _)| k == c)
    {
        return Ok((*d, big));
    }
    let mut chars = body.chars();
    let kind = chars.next().ok_or_else(|| refuse("empty"))?;
    let size = kind_size(chars.as_str()).ok_or_else(|| refuse("unknown or unsupported type"))?;
    let d = match (kind, size) {
        ('b', 1) => DType::Bool,
        ('i', 1) => DType::I8,
        ('i', 2) => DType::I16,
        ('i', 4) => DType::I32,
        ('i', 8) => DType::I64,
        ('u', 1) => DType::U8,
        ('u', 2) => DType::U16,
        ('u', 4) => DType::U32,
        ('u', 8) => DType::U64,
        ('f', 2) => DType::F16,
        ('f', 4) => DType::F32,
        ('f', 8) => DType::F64,
        ('c', 8) => DType::Complex64,
        ('c', 16) => DType::Complex128,
        ('V', 2) => return Err(refuse("bfloat16 has no .npy dtype; V2 is raw bytes")),
        _ => return Err(refuse("unknown or unsupported type")),
    };
    Ok((d, big))
}

/// The header for `dtype` and `shape` (version 1.0, or 2.0 when it needs more than 64 KiB),
/// padded so the data starts at a multiple of 64 bytes.
pub fn write_header(dtype: DType, shape: &[usize]) -> Result<Vec<u8>> {
    if dtype == DType::BF16 {
        return Err(CoreError::UnsupportedDType {
            what: "bfloat16 in .npy (NumPy has no standard bfloat16 dtype)".into(),
        });
    }
    shape::validate(shape, dtype.size())?;
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {dims}, }}",
        dtype.typestr()
    );
    let v1 = dict.len() + 1 + 10 <= u16::MAX as usize;
    let prefix = if v1 { 10 } else { 12 };
    let total = (prefix + dict.len() + 1).next_multiple_of(64);
    let hlen = total - prefix;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    if v1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(hlen as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(hlen as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype_and_some_shapes() {
        for d in DType::ALL.into_iter().filter(|d| *d != DType::BF16) {
            for shape in [vec![], vec![0], vec![7], vec![2, 3, 4]] {
                let h = write_header(d, &shape).unwrap();
                assert_eq!(h.len() % 64, 0);
                let p = parse_header(&h).unwrap();
                assert_eq!(
                    (p.dtype, p.shape.clone(), p.data_offset),
                    (d, shape.clone(), h.len())
                );
            }
        }
    }

    #[test]
    fn numpy_written_headers_parse() {
        // np.save of np.zeros((3, 4), '<f4') and of a 0-d int64, byte for byte.
        let mut h =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
                .to_vec();
        h.resize(127, b' ');
        h.push(b'\n');
        let p = parse_header(&h).unwrap();
        assert_eq!(
            (p.dtype, p.shape, p.data_offset, p.nbytes),
            (DType::F32, vec![3, 4], 128, 48)
        );
        let mut h =
            b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (), }"
                .to_vec();
        h.resize(127, b' ');
        h.push(b'\n');
        assert_eq!(parse_header(&h).unwrap().shape, Vec::<usize>::new());
    }

    /// A header `good` with its dict text replaced by what `edit` makes of it (the same
    /// length keeps the header's announced size true).
    fn edited(good: &[u8]) -> impl Fn(&dyn Fn(&str) -> String) -> Vec<u8> + '_ {
        move |edit| {
            let text = std::str::from_utf8(&good[10..]).unwrap();
            let mut v = good[..10].to_vec();
            v.extend_from_slice(edit(text).as_bytes());
            v
        }
    }

    #[test]
    fn bad_headers_are_errors() {
        let good = write_header(DType::F64, &[2, 2]).unwrap();
        let with = edited(&good);
        assert!(parse_header(b"PK\x03\x04").is_err());
        assert!(parse_header(&good[..20]).is_err(), "truncated");
        assert!(parse_header(&with(&|t| t.replace("<f8", "<f2x"))).is_err());
        assert!(parse_header(&with(&|t| t.replace("(2, 2)", "(2, -2)"))).is_err());
        assert!(parse_header(&with(&|t| t.replace("(2, 2)", "(9223372036854775807, 4)"))).is_err());
        let mut v = good.clone();
        v[6] = 9;
        assert!(parse_header(&v).is_err(), "version 9");
        assert!(write_header(DType::BF16, &[1]).is_err());
    }

    #[test]
    fn fortran_order_and_big_endian_data_convert_to_c_native() {
        let good = write_header(DType::I16, &[2, 3]).unwrap();
        let with = edited(&good);
        let h = parse_header(&with(&|t| {
            t.replace("False", "True ").replace("<i2", ">i2")
        }))
        .unwrap();
        assert!(h.fortran_order && h.byte_swapped && h.needs_conversion());
        // np.array([[0, 1, 2], [3, 4, 5]], '>i2', order='F') as its file holds it.
        let col_major: Vec<u8> = [0i16, 3, 1, 4, 2, 5]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let mut out = vec![0u8; 12];
        h.to_c_native(&col_major, &mut out);
        let got: Vec<i16> = out
            .chunks(2)
            .map(|c| i16::from_ne_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 1, 2, 3, 4, 5]);
        // Three dimensions.
        let h3 = NpyHeader {
            dtype: DType::U8,
            shape: vec![2, 3, 4],
            data_offset: 0,
            nbytes: 24,
            fortran_order: true,
            byte_swapped: false,
        };
        let src: Vec<u8> = (0..24).collect();
        let mut dst = vec![0u8; 24];
        h3.to_c_native(&src, &mut dst);
        for (c, v) in dst.iter().enumerate() {
            let (i, j, k) = (c / 12, c / 4 % 3, c % 4);
            assert_eq!(*v as usize, i + 2 * j + 6 * k);
        }
        // One extent above 1: the same bytes in either order.
        let h1 = parse_header(&with(&|t| {
            t.replace("False", "True ").replace("(2, 3)", "(1, 3)")
        }))
        .unwrap();
        assert!(!h1.fortran_order);
    }

    #[test]
    fn descriptors_numpy_reads() {
        for (descr, want, swapped) in [
            ("<q", DType::I64, false),
            ("<l", DType::I64, false),
            ("d", DType::F64, false),
            ("double", DType::F64, false),
            ("<e", DType::F16, false),
            ("?", DType::Bool, false),
            ("<f", DType::F32, false),
            ("<B", DType::U8, false),
            ("i 8", DType::I64, false),
            ("f04", DType::F32, false),
            (">D", DType::Complex128, true),
            ("|b1", DType::Bool, false),
            (">u1", DType::U8, true),
        ] {
            assert_eq!(descr_dtype(descr).unwrap(), (want, swapped), "{descr}");
        }
        for refused in [
            "<float32", ">int", "float32 ", " <f4", "i16", "B1", "<<f4", "f4.0", "V2", "g",
        ] {
            assert!(descr_dtype(refused).is_err(), "{refused}");
        }
    }
}
