//! `.npy` files in and out of arrays (issue 7): [`RawArray::load_npy`] and
//! [`RawArray::save_npy`]. Loading opens the file as a [`FileResource`], maps the data
//! region and copies it straight to where the array is born (a device-born array gets no
//! host buffer); saving writes the current data, read back from the device when it is
//! there.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use memarray_core::npy::{parse_header, write_header};
use memarray_core::{CoreError, FileResource, Location, LockToken};

/// The largest header read: version 2/3 headers may be longer than version 1's 64 KiB,
/// but no writer makes them so.
const HEADER_MAX: u64 = 1 << 20;

use super::host_kind::HostKind;
use super::raw::RawArray;
use crate::error::Result;

fn io(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn named(path: &Path, e: CoreError) -> CoreError {
    match e {
        CoreError::BadNpy { reason, .. } => CoreError::BadNpy {
            path: path.display().to_string(),
            reason,
        },
        other => other,
    }
}

impl RawArray {
    /// Reads the `.npy` file at `path` into a new array at `location` (its host kind
    /// [`HostKind::auto`] unless given). Errors: `Io` (missing or unreadable file),
    /// `BadNpy` (bad header, unsupported dtype or order, less data than the header says).
    pub fn load_npy(
        path: impl AsRef<Path>,
        location: Location,
        host_kind: Option<HostKind>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let file = FileResource::open_read_only(path)?;
        let file_len = file.file_len()?;
        // The header is at most a few KiB (64 KiB for version 1); read what the file has.
        let head = file_len.min(HEADER_MAX) as usize;
        let h = file
            .read_region(0, head, parse_header)?
            .map_err(|e| named(path, e))?;
        let available = file_len.saturating_sub(h.data_offset as u64);
        if (h.nbytes as u64) > available {
            return Err(CoreError::BadNpy {
                path: path.display().to_string(),
                reason: format!(
                    "the header describes {} bytes of data but the file holds {available}",
                    h.nbytes
                ),
            }
            .into());
        }
        let mut a = RawArray::empty_on(h.dtype, &h.shape, location, host_kind, None)?;
        // The data is copied straight from the file's pages to where the array lives.
        file.read_region(h.data_offset as u64, h.nbytes, |data| -> Result<()> {
            match location {
                Location::Host => a.host_bytes_mut(None)?.copy_from_slice(data),
                Location::Device(_) => a.dev.write_bytes(0, data)?,
            }
            Ok(())
        })??;
        Ok(a)
    }

    /// Writes the current data to `path` as a `.npy` file (version 1.0, C order), readable
    /// by `numpy.load`. bfloat16 has no NumPy dtype and is refused.
    pub fn save_npy(&self, path: impl AsRef<Path>, token: Option<LockToken>) -> Result<()> {
        let path = path.as_ref();
        self.check(token)?;
        let header = write_header(self.dtype, &self.shape)?;
        let mut f = std::io::BufWriter::new(File::create(path).map_err(|e| io(path, e))?);
        f.write_all(&header).map_err(|e| io(path, e))?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                f.write_all(self.host_buf()?.as_slice())
                    .map_err(|e| io(path, e))?;
            }
            Location::Device(_) => {
                // In 64 MiB pieces: bounded host memory for any size.
                const PIECE: usize = 64 << 20;
                let mut piece = vec![0u8; PIECE.min(self.nbytes)];
                let mut off = 0;
                while off < self.nbytes {
                    let n = PIECE.min(self.nbytes - off);
                    self.dev.read_bytes(off, &mut piece[..n])?;
                    f.write_all(&piece[..n]).map_err(|e| io(path, e))?;
                    off += n;
                }
            }
        }
        f.flush().map_err(|e| io(path, e))?;
        Ok(())
    }
}
