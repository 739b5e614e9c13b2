//! The NumPy `.npy` format (versions 1.0, 2.0 and 3.0): header parsing and writing.
//!
//! A file is the magic `\x93NUMPY`, a version, a header length, a Python dict literal
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with spaces to a
//! multiple of 64 bytes and ended by a newline, then the raw data. Only what memarray can
//! hold is accepted: little-endian (or byte-order-free) dtypes of [`DType`], C order.

use crate::dtype::DType;
use crate::error::{CoreError, Result};
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

/// Parses the header at the start of `bytes` (at least the first 12 bytes and the whole
/// header; the data need not follow).
pub fn parse_header(bytes: &[u8]) -> Result<NpyHeader> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("not a .npy file (no \\x93NUMPY magic)"));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(bad(format!("unsupported .npy version {major}.{minor}"))),
    };
    let end = start
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad(format!("truncated .npy header ({len} bytes announced)")))?;
    let text =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| bad("the .npy header is not text"))?;
    let descr = field(text, "descr").ok_or_else(|| bad(format!("no 'descr' in {text:?}")))?;
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let dtype = DType::ALL
        .into_iter()
        .find(|d| {
            let t = d.typestr();
            t == descr || (descr.starts_with('=') && t[1..] == descr[1..])
        })
        .ok_or_else(|| {
            bad(format!(
                "dtype {descr:?} is not one memarray holds (little-endian numeric dtypes: {})",
                DType::supported_names()
            ))
        })?;
    let fortran = field(text, "fortran_order").map(str::trim);
    match fortran {
        Some("False") => {}
        Some("True") => {
            return Err(bad(
                "Fortran-order .npy files are not supported; save np.ascontiguousarray(x)",
            ));
        }
        _ => return Err(bad(format!("no valid 'fortran_order' in {text:?}"))),
    }
    let shape_text = field(text, "shape").ok_or_else(|| bad(format!("no 'shape' in {text:?}")))?;
    let inner = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| bad(format!("bad shape {shape_text:?}")))?;
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad(format!("bad shape {shape_text:?}")))?;
    let nbytes = shape::validate(&shape, dtype.size())?;
    Ok(NpyHeader {
        dtype,
        shape,
        data_offset: end,
        nbytes,
    })
}

/// The value text of `'key': value` in a header dict (up to the next top-level comma).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let quoted = [format!("'{key}'"), format!("\"{key}\"")];
    let at = quoted
        .iter()
        .find_map(|k| text.find(k.as_str()).map(|i| i + k.len()))?;
    let rest = text[at..].trim_start().strip_prefix(':')?;
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
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
