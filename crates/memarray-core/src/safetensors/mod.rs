//! The safetensors format (the format models ship in): header reading and writing.
//!
//! A file is `N` (a little-endian `u64`), `N` bytes of a JSON object, then the data: the
//! object maps each tensor's name to `{"dtype": "F32", "shape": [2, 3], "data_offsets":
//! [begin, end]}` (offsets into the data, which follows the header), and the optional key
//! `"__metadata__"` to an object of strings. Headers are read as safetensors' own reader
//! reads them, and more strictly where it would let a file mislead: the header at most
//! [`MAX_HEADER`] bytes and inside the file, UTF-8, one JSON object whose keys are given
//! once; each tensor's dtype one safetensors defines, its shape non-negative, its bytes
//! `end - begin` exactly its elements times its dtype's size; the tensors in offset order
//! tile the data from 0 with no gap and no overlap, and the data ends where the file
//! does. A file breaking any of these is [`CoreError::BadSafetensors`] naming the rule,
//! before any data is read.

mod json;

use crate::dtype::DType;
use crate::error::{CoreError, Result};
use json::Value;

/// The largest header read (safetensors' own limit).
pub const MAX_HEADER: u64 = 100_000_000;

/// The header's reserved key for the file's metadata.
const METADATA: &str = "__metadata__";

/// Each dtype safetensors defines: its name, its bits per element, and the dtype memarray
/// holds it as (None where memarray holds no such dtype: it is refused by name on load).
const DTYPES: [(&str, u64, Option<DType>); 20] = [
    ("BOOL", 8, Some(DType::Bool)),
    ("U8", 8, Some(DType::U8)),
    ("I8", 8, Some(DType::I8)),
    ("U16", 16, Some(DType::U16)),
    ("I16", 16, Some(DType::I16)),
    ("F16", 16, Some(DType::F16)),
    ("BF16", 16, Some(DType::BF16)),
    ("U32", 32, Some(DType::U32)),
    ("I32", 32, Some(DType::I32)),
    ("F32", 32, Some(DType::F32)),
    ("C64", 64, Some(DType::Complex64)),
    ("U64", 64, Some(DType::U64)),
    ("I64", 64, Some(DType::I64)),
    ("F64", 64, Some(DType::F64)),
    ("F8_E4M3", 8, None),
    ("F8_E5M2", 8, None),
    ("F8_E8M0", 8, None),
    ("F6_E2M3", 6, None),
    ("F6_E3M2", 6, None),
    ("F4", 4, None),
];

/// The safetensors name of `dtype`; None for complex128, which safetensors does not define.
pub fn dtype_name(dtype: DType) -> Option<&'static str> {
    DTYPES
        .iter()
        .find(|(_, _, d)| *d == Some(dtype))
        .map(|(n, _, _)| *n)
}

/// One tensor of a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its dtype as the file names it ("F32").
    pub dtype_name: String,
    /// Its dtype in memarray; None for one memarray does not hold (float8, float6,
    /// float4).
    pub dtype: Option<DType>,
    /// Extents.
    pub shape: Vec<usize>,
    /// Its data: bytes `[begin, end)` after the header.
    pub begin: u64,
    /// See `begin`.
    pub end: u64,
}

impl Tensor {
    /// Its bytes.
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }
}

/// A parsed header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The tensors, in data order.
    pub tensors: Vec<Tensor>,
    /// `__metadata__`, in file order.
    pub metadata: Vec<(String, String)>,
    /// Where the data starts in the file: `8 + N`.
    pub data_offset: u64,
}

fn bad(reason: impl Into<String>) -> CoreError {
    CoreError::BadSafetensors {
        // A loader names its file in place of this.
        path: "the header".into(),
        reason: reason.into(),
    }
}

/// The header's length `N` from the file's first 8 bytes, checked against the limit and
/// the file's length.
///
/// # Errors
/// [`CoreError::BadSafetensors`] for a file shorter than 8 bytes, a header past
/// [`MAX_HEADER`] or past the end of the file.
pub fn header_len(first: &[u8], file_len: u64) -> Result<u64> {
    let Some(n) = first.get(..8) else {
        return Err(bad(format!(
            "the file holds {file_len} bytes: fewer than the 8 of the header's length"
        )));
    };
    let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
    if n > MAX_HEADER {
        return Err(bad(format!(
            "the header's length {n} is past the limit of {MAX_HEADER} bytes"
        )));
    }
    if n.saturating_add(8) > file_len {
        return Err(bad(format!(
            "the header's length {n} runs past the end of the file ({file_len} bytes)"
        )));
    }
    Ok(n)
}

/// Reads the header `text` (the `N` bytes after the length) of a file of `file_len` bytes.
///
/// # Errors
/// [`CoreError::BadSafetensors`] naming what breaks the format (see the module's docs).
pub fn parse_header(text: &[u8], file_len: u64) -> Result<Header> {
    let data_offset = 8 + text.len() as u64;
    let text =
        std::str::from_utf8(text).map_err(|e| bad(format!("the header is not UTF-8: {e}")))?;
    if !text.starts_with('{') {
        return Err(bad("the header does not start with '{'"));
    }
    let Value::Object(entries) = json::parse(text).map_err(bad)? else {
        return Err(bad("the header is not a JSON object"));
    };
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = Vec::new();
    for (name, v) in entries {
        if name == METADATA {
            metadata = parse_metadata(v)?;
        } else {
            tensors.push(parse_tensor(name, v)?);
        }
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = 0u64;
    for t in &tensors {
        if t.begin != at {
            let what = if t.begin < at {
                "overlaps the tensor before it"
            } else {
                "leaves a gap before it"
            };
            return Err(bad(format!(
                "tensor {:?} at data bytes [{}, {}) {what} (the data so far ends at {at})",
                t.name, t.begin, t.end
            )));
        }
        at = t.end;
    }
    let held = file_len - data_offset;
    if at != held {
        return Err(bad(format!(
            "the tensors describe {at} bytes of data but the file holds {held} after the header"
        )));
    }
    Ok(Header {
        tensors,
        metadata,
        data_offset,
    })
}

fn parse_metadata(v: Value) -> Result<Vec<(String, String)>> {
    let Value::Object(pairs) = v else {
        return Err(bad(format!(
            "{METADATA} is {}, not an object of strings",
            v.kind()
        )));
    };
    pairs
        .into_iter()
        .map(|(k, v)| match v {
            Value::Str(s) => Ok((k, s)),
            other => Err(bad(format!(
                "{METADATA}[{k:?}] is {}, not a string",
                other.kind()
            ))),
        })
        .collect()
}

fn parse_tensor(name: String, v: Value) -> Result<Tensor> {
    let Value::Object(fields) = v else {
        return Err(bad(format!(
            "tensor {name:?} is {}, not an object",
            v.kind()
        )));
    };
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| bad(format!("tensor {name:?} has no {key:?}")))
    };
    if let Some((k, _)) = fields
        .iter()
        .find(|(k, _)| !matches!(k.as_str(), "dtype" | "shape" | "data_offsets"))
    {
        return Err(bad(format!("tensor {name:?} has an unknown field {k:?}")));
    }
    let Value::Str(dtype_name) = field("dtype")? else {
        return Err(bad(format!("tensor {name:?}: its dtype is not a string")));
    };
    let Some(&(_, bits, dtype)) = DTYPES.iter().find(|(n, _, _)| n == dtype_name) else {
        return Err(bad(format!(
            "tensor {name:?}: unknown dtype {dtype_name:?} (safetensors defines {})",
            DTYPES.map(|d| d.0).join(", ")
        )));
    };
    let ints = |key: &str| -> Result<Vec<u64>> {
        let Value::Array(items) = field(key)? else {
            return Err(bad(format!("tensor {name:?}: {key} is not an array")));
        };
        items
            .iter()
            .map(|x| match x {
                Value::Int(n) => u64::try_from(*n).map_err(|_| {
                    bad(format!(
                        "tensor {name:?}: {key} holds {n}, not a size (0 to 2^64 - 1)"
                    ))
                }),
                other => Err(bad(format!(
                    "tensor {name:?}: {key} holds {}, not an integer",
                    other.kind()
                ))),
            })
            .collect()
    };
    let shape = ints("shape")?;
    let offsets = ints("data_offsets")?;
    let [begin, end] = offsets[..] else {
        return Err(bad(format!(
            "tensor {name:?}: data_offsets is not [begin, end]"
        )));
    };
    if end < begin {
        return Err(bad(format!(
            "tensor {name:?}: data_offsets [{begin}, {end}] ends before it begins"
        )));
    }
    let shape: Vec<usize> = shape
        .iter()
        .map(|&n| usize::try_from(n))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            bad(format!(
                "tensor {name:?}: an extent past this machine's sizes"
            ))
        })?;
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64))
        .and_then(|n| n.checked_mul(bits))
        .ok_or_else(|| bad(format!("tensor {name:?}: shape {shape:?} overflows")))?;
    if elements % 8 != 0 {
        return Err(bad(format!(
            "tensor {name:?}: {elements} bits is not whole bytes"
        )));
    }
    if end - begin != elements / 8 {
        return Err(bad(format!(
            "tensor {name:?}: shape {shape:?} of {dtype_name} is {} bytes but data_offsets \
             [{begin}, {end}] hold {}",
            elements / 8,
            end - begin
        )));
    }
    if shape.len() > crate::MAX_NDIM {
        return Err(bad(format!(
            "tensor {name:?}: {} dimensions (memarray holds at most {})",
            shape.len(),
            crate::MAX_NDIM
        )));
    }
    Ok(Tensor {
        name,
        dtype_name: dtype_name.clone(),
        dtype,
        shape,
        begin,
        end,
    })
}

/// One tensor to write: its name, dtype and shape (its bytes follow in the order given
/// to [`write_header`]).
#[derive(Clone, Debug)]
pub struct Entry<'a> {
    /// Its name (not `__metadata__`, each once).
    pub name: &'a str,
    /// Its dtype (not complex128, which safetensors does not define).
    pub dtype: DType,
    /// Extents.
    pub shape: &'a [usize],
}

/// The order a writer lays tensors out in, as safetensors' own does: larger elements first
/// (each tensor's data then starts aligned to its element), then by name. Returns indices
/// into `entries`.
pub fn write_order(entries: &[Entry<'_>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&entries[a], &entries[b]);
        y.dtype
            .size()
            .cmp(&x.dtype.size())
            .then_with(|| x.name.cmp(y.name))
    });
    order
}

/// The file's first bytes for `entries`, laid out in that order (see [`write_order`]): the
/// length, then the JSON header padded with spaces to a multiple of 8 bytes.
///
/// # Errors
/// [`CoreError::BadSafetensors`] for a name given twice or reserved, a dtype safetensors
/// does not define (complex128), a size that overflows.
pub fn write_header(entries: &[Entry<'_>], metadata: &[(String, String)]) -> Result<Vec<u8>> {
    let mut text = String::from("{");
    if !metadata.is_empty() {
        text += &json::string(METADATA);
        text += ":{";
        let pairs: Vec<String> = metadata
            .iter()
            .map(|(k, v)| format!("{}:{}", json::string(k), json::string(v)))
            .collect();
        text += &pairs.join(",");
        text += "}";
    }
    let mut at = 0u64;
    for (i, e) in entries.iter().enumerate() {
        if e.name == METADATA {
            return Err(bad(format!(
                "{METADATA} is reserved for the file's metadata"
            )));
        }
        if entries[..i].iter().any(|o| o.name == e.name) {
            return Err(bad(format!("the name {:?} is given twice", e.name)));
        }
        let dtype = dtype_name(e.dtype).ok_or_else(|| {
            bad(format!(
                "tensor {:?}: safetensors defines no {} dtype",
                e.name,
                e.dtype.name()
            ))
        })?;
        let nbytes = crate::shape::checked_len(e.shape)?
            .checked_mul(e.dtype.size() as u64)
            .ok_or_else(|| bad(format!("tensor {:?}: its size overflows", e.name)))?;
        let end = at + nbytes;
        if text.len() > 1 {
            text.push(',');
        }
        let shape: Vec<String> = e.shape.iter().map(usize::to_string).collect();
        text += &format!(
            "{}:{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{at},{end}]}}",
            json::string(e.name),
            shape.join(",")
        );
        at = end;
    }
    text.push('}');
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests;
