//! The fallible ways to name a [`DType`]: by DLPack triple and by name. Apart from
//! `dtype` so that the error type, which names dtypes in its messages, and the dtypes,
//! whose lookups fail with it, do not import each other.

use crate::dtype::DType;
use crate::error::CoreError;

impl DType {
    /// The dtype for a DLPack `(code, bits, lanes)` triple.
    ///
    /// Returns [`CoreError::UnsupportedDType`] for vector lanes, sub-byte types, fp8 and
    /// anything else memarray does not store.
    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<DType, CoreError> {
        let found = if lanes != 1 {
            None
        } else {
            DType::ALL
                .into_iter()
                .find(|d| d.dlpack() == (code, bits, 1))
        };
        found.ok_or_else(|| CoreError::UnsupportedDType {
            what: format!("DLPack dtype (code {code}, bits {bits}, lanes {lanes})"),
        })
    }

    /// The dtype with this [`name`](DType::name).
    pub fn from_name(name: &str) -> Result<DType, CoreError> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| CoreError::UnsupportedDType {
                what: format!("dtype {name:?}"),
            })
    }
}
