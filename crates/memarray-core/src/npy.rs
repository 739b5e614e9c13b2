//! The NumPy `.npy` format (versions 1.0, 2.0 and 3.0): header parsing and writing.
//!
//! A file is the magic `\x93NUMPY`, a version, a header length, a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with spaces to a
//! multiple of 64 bytes and ended by a newline, then the raw data. Only what memarray can
//! hold is accepted: little-endian (or byte-order-free) dtypes of [`DType`], C order.

use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::npy_literal::{self, Lit};
use crate::shape;

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
    let dict = npy_literal::parse(&text, false)
        .or_else(|e| {
            if major <= 2 {
                npy_literal::parse(&text, true)
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
    let dtype = match dict.get("descr") {
        Some(Lit::Str(s)) => descr_dtype(s)?,
        other => {
            return Err(bad(format!(
                "descr {other:?} is not a dtype memarray holds (structured and object \
                 dtypes are not)"
            )));
        }
    };
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
    if fortran && !shape.contains(&0) && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(bad(
            "Fortran-order .npy files are not supported; save np.ascontiguousarray(x)",
        ));
    }
    Ok(NpyHeader {
        dtype,
        shape,
        data_offset: end,
        nbytes,
    })
}

/// The dtype of a `descr` string: a NumPy typestr (`'<f4'`, `'|u1'`, `'=i8'`, `'f8'`) or
/// name (`'float32'`) of a dtype memarray holds, little-endian or byte-order free.
/// bfloat16 is refused: its typestr `'<V2'` is NumPy's raw void, not bfloat16.
fn descr_dtype(descr: &str) -> Result<DType> {
    let refuse = |why: &str| {
        bad(format!(
            "dtype {descr:?} is not one memarray holds ({why}; little-endian numeric \
             dtypes: {})",
            DType::supported_names()
        ))
    };
    if let Ok(d) = DType::from_name(descr) {
        return if d == DType::BF16 {
            Err(refuse("bfloat16 has no .npy dtype"))
        } else {
            Ok(d)
        };
    }
    let (order, body) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'=' | b'|') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let d = DType::ALL
        .into_iter()
        .filter(|d| *d != DType::BF16)
        .find(|d| &d.typestr()[1..] == body)
        .ok_or_else(|| refuse("unknown or unsupported type"))?;
    if order == b'>' && d.size() > 1 {
        return Err(refuse("big-endian"));
    }
    Ok(d)
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

    #[test]
    fn bad_headers_are_errors() {
        let good = write_header(DType::F64, &[2, 2]).unwrap();
        let text = std::str::from_utf8(&good[10..]).unwrap().to_string();
        let with = |s: &str| {
            let mut v = good[..10].to_vec();
            v.extend_from_slice(s.as_bytes());
            v
        };
        assert!(parse_header(b"PK\x03\x04").is_err());
        assert!(parse_header(&good[..20]).is_err(), "truncated");
        assert!(
            parse_header(&with(&text.replace("<f8", ">f8"))).is_err(),
            "big-endian"
        );
        assert!(parse_header(&with(&text.replace("<f8", "<f2x"))).is_err());
        assert!(
            parse_header(&with(&text.replace("False", "True"))).is_err(),
            "Fortran"
        );
        assert!(parse_header(&with(&text.replace("(2, 2)", "(2, -2)"))).is_err());
        assert!(parse_header(&with(&text.replace("(2, 2)", "(9223372036854775807, 4)"))).is_err());
        let mut v = good.clone();
        v[6] = 9;
        assert!(parse_header(&v).is_err(), "version 9");
        assert!(write_header(DType::BF16, &[1]).is_err());
    }
}
