//! [`NcclError`]: what the collectives refuse, apart from the rest of the CUDA layer's
//! errors: it exists only with the `nccl` feature.

use memarray_core::CoreError;
use thiserror::Error;

use crate::error::CudaError;

/// Errors of `memarray_cuda::nccl`. CUDA-layer errors (a device, a stream, an operand on
/// the wrong device) arrive as [`NcclError::Cuda`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NcclError {
    /// NCCL cannot be loaded: no libnccl on this machine or at the path given.
    #[error(
        "NCCL is unavailable: {reason}. Install it (pip install nvidia-nccl-cu13, or the \
         libnccl2 package) or point MEMARRAY_NCCL_LIBRARY at libnccl.so.2"
    )]
    Unavailable {
        /// What was tried and why it failed.
        reason: String,
    },
    /// An NCCL call failed, or a collective was given operands it cannot take.
    #[error("NCCL {call}: {reason}")]
    Call {
        /// The NCCL entry point or memarray operation, e.g. `"ncclAllReduce"`.
        call: &'static str,
        /// The NCCL error and its last-error text, or what is wrong with the operands.
        reason: String,
    },
    /// The communicator was aborted ([`super::Comm::abort`]): nothing more runs on it, and
    /// what it was receiving when aborted did not arrive.
    #[error("NCCL {call}: the communicator was aborted; make a new one (every rank) to go on")]
    Aborted {
        /// The operation refused, e.g. `"ncclSend"`.
        call: &'static str,
    },
    /// An error of the CUDA layer (devices, streams, operands, memory).
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

impl From<CoreError> for NcclError {
    fn from(e: CoreError) -> Self {
        NcclError::Cuda(e.into())
    }
}

/// Result alias for the collectives.
pub type Result<T, E = NcclError> = std::result::Result<T, E>;

impl NcclError {
    /// What kind of failure this is: the CUDA layer's kind, else a failed call (a missing
    /// NCCL library included: it is no CUDA driver problem).
    pub fn kind(&self) -> memarray_core::ErrorKind {
        match self {
            NcclError::Cuda(c) => c.kind(),
            _ => memarray_core::ErrorKind::Failed,
        }
    }
}
