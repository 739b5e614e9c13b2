//! safetensors files in and out of arrays: [`RawArray::load_safetensors`] and
//! [`SafetensorsWriter`] ([`RawArray::save_safetensors`] over it). Loading checks the
//! whole header first ([`memarray_core::safetensors`]: a hostile file is refused before any
//! data is read), then reads each tensor as `.npy` data is read: positional reads straight
//! into the array's host buffer, or, for device-born arrays, into the staging pipeline's
//! pinned slots in one pipeline for all the tensors. No mapping is read, so a file
//! truncated meanwhile is an error, never SIGBUS. Saving lays tensors out as safetensors'
//! own writer does and writes each array's current data (read back from the device where
//! it is there).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memarray_core::safetensors::{
    Entry, Header, header_len, parse_header, write_header, write_order,
};
use memarray_core::{CoreError, DType, FileMode, FileResource, Location, open_regular};

use super::device_side::DeviceSide;
use super::host_kind::HostKind;
use super::npy::{io, read_parallel};
use super::raw::RawArray;
use crate::error::Result;

/// `e` naming `path` where it is a format error.
fn named(path: &Path, e: CoreError) -> CoreError {
    match e {
        CoreError::BadSafetensors { reason, .. } => CoreError::BadSafetensors {
            path: path.display().to_string(),
            reason,
        },
        other => other,
    }
}

/// Reads and checks the header of the safetensors file open as `file`.
fn read_header(path: &Path, file: &FileResource) -> Result<Header> {
    let file_len = file.file_len()?;
    let mut first = vec![0u8; file_len.min(8) as usize];
    file.read_into(0, &mut first)?;
    let n = header_len(&first, file_len).map_err(|e| named(path, e))?;
    let mut text = vec![0u8; n as usize];
    file.read_into(8, &mut text)?;
    Ok(parse_header(&text, file_len).map_err(|e| named(path, e))?)
}

/// Fills `buf` with the bytes `[off, off + buf.len())` of the file parts `(file offset,
/// bytes)` laid end to end, each piece read by `read(file offset, into)`.
fn read_laid(
    parts: &[(u64, usize)],
    off: usize,
    buf: &mut [u8],
    read: &dyn Fn(u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    crate::copy::each_laid(parts, off, buf.len(), |at, into, n| {
        read(at, &mut buf[into..into + n])
    })
}

/// What [`RawArray::load_safetensors`] read: each tensor's name and array in data order,
/// and the file's metadata.
pub type Loaded = (Vec<(String, RawArray)>, Vec<(String, String)>);

impl RawArray {
    /// The header of the safetensors file at `path`, checked whole (see
    /// [`memarray_core::safetensors`]): its tensors in data order and its metadata.
    pub fn safetensors_header(path: impl AsRef<Path>) -> Result<Header> {
        let path = path.as_ref();
        read_header(path, &FileResource::open_read_only(path)?)
    }

    /// Reads the tensors of the safetensors file at `path` (all of them, or those named,
    /// in data order) into new arrays at `location` (host kind [`HostKind::auto`] unless
    /// given), adding the data bytes read so far to `done`. Returns them with their names,
    /// and the file's metadata.
    ///
    /// Errors: `Io` (missing or unreadable file), `BadSafetensors` (a header that breaks
    /// the format, a name the file does not have, a tensor of a dtype memarray does not
    /// hold: float8, float6, float4), nothing read after a refusal.
    pub fn load_safetensors(
        path: impl AsRef<Path>,
        location: Location,
        host_kind: Option<HostKind>,
        names: Option<&[&str]>,
        done: &AtomicU64,
    ) -> Result<Loaded> {
        let path = path.as_ref();
        let file = FileResource::open_read_only(path)?;
        let header = read_header(path, &file)?;
        let refuse = |reason: String| CoreError::BadSafetensors {
            path: path.display().to_string(),
            reason,
        };
        if let Some(names) = names {
            let missing: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| !header.tensors.iter().any(|t| t.name == *n))
                .collect();
            if !missing.is_empty() {
                let shown: Vec<String> = missing.iter().take(5).map(|n| format!("{n:?}")).collect();
                return Err(refuse(format!(
                    "no tensor named {}{} (the file holds {} tensors)",
                    shown.join(", "),
                    if missing.len() > 5 { ", ..." } else { "" },
                    header.tensors.len()
                ))
                .into());
            }
        }
        let chosen: Vec<_> = header
            .tensors
            .iter()
            .filter(|t| names.is_none_or(|n| n.contains(&t.name.as_str())))
            .collect();
        // Every dtype checked before any data is read.
        let dtypes: Vec<DType> = chosen
            .iter()
            .map(|t| {
                t.dtype.ok_or_else(|| {
                    refuse(format!(
                        "tensor {:?} is {}: memarray holds no such dtype (name the others with \
                         names=)",
                        t.name, t.dtype_name
                    ))
                })
            })
            .collect::<std::result::Result<_, _>>()?;
        let mut out = Vec::with_capacity(chosen.len());
        // (file offset, bytes) of each tensor with data, in `out`'s order.
        let mut parts = Vec::with_capacity(chosen.len());
        for (t, dtype) in chosen.into_iter().zip(dtypes) {
            let mut a = RawArray::empty_on(dtype, &t.shape, location, host_kind, None)?;
            let start = header.data_offset + t.begin;
            let nbytes = t.nbytes() as usize;
            if nbytes > 0 && location == Location::Host {
                read_parallel(&file, start, a.host_bytes_mut(None)?, done)?;
            }
            parts.push((start, nbytes));
            out.push((t.name.clone(), a));
        }
        if location != Location::Host {
            // On a device, one staged upload for every tensor: the pinned slots fill and
            // drain once for the file, not once per tensor.
            let fill = |off: usize, buf: &mut [u8]| -> Result<()> {
                read_laid(&parts, off, buf, &|at, into| Ok(file.read_into(at, into)?))?;
                done.fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            };
            let mut sides: Vec<_> = out
                .iter_mut()
                .zip(&parts)
                .filter(|(_, p)| p.1 > 0)
                .map(|((_, a), p)| (&mut a.dev, p.1))
                .collect();
            DeviceSide::write_many_with(&mut sides, &fill)?;
        }
        Ok((out, header.metadata))
    }

    /// Writes `arrays` (name, array) to `path` as a safetensors file that safetensors'
    /// own loaders read, with `metadata` as its `__metadata__`, adding the data bytes
    /// written to `done`. complex128 (which safetensors does not define) and a name given
    /// twice are refused before the file is created.
    pub fn save_safetensors(
        path: impl AsRef<Path>,
        arrays: &[(&str, &RawArray)],
        metadata: &[(String, String)],
        done: &AtomicU64,
    ) -> Result<()> {
        for (_, a) in arrays {
            a.check(None)?;
        }
        let entries: Vec<Entry<'_>> = arrays
            .iter()
            .map(|(name, a)| Entry {
                name,
                dtype: a.dtype,
                shape: &a.shape,
            })
            .collect();
        let mut w = SafetensorsWriter::create(path, &entries, metadata)?;
        for &i in &w.order().to_vec() {
            w.write(arrays[i].1, done)?;
        }
        w.finish()
    }
}

/// A safetensors file being written: the header is written at creation, then each array's
/// data in [`SafetensorsWriter::order`] (a front end that holds its arrays one at a time
/// hands them over in turn).
pub struct SafetensorsWriter {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    /// Indices into the entries given, in data order.
    order: Vec<usize>,
    /// (dtype, shape) of each entry, to check each array handed over against.
    expected: Vec<(DType, Vec<usize>)>,
    next: usize,
}

impl SafetensorsWriter {
    /// Creates (or truncates) `path` and writes the header for `entries`.
    pub fn create(
        path: impl AsRef<Path>,
        entries: &[Entry<'_>],
        metadata: &[(String, String)],
    ) -> Result<Self> {
        let path = path.as_ref();
        let order = write_order(entries);
        let laid: Vec<Entry<'_>> = order.iter().map(|&i| entries[i].clone()).collect();
        // Refused before the file is touched.
        let header = write_header(&laid, metadata).map_err(|e| named(path, e))?;
        let mut file = std::io::BufWriter::new(open_regular(path, FileMode::Truncate)?);
        file.write_all(&header).map_err(|e| io(path, e))?;
        Ok(SafetensorsWriter {
            file,
            path: path.to_path_buf(),
            order,
            expected: entries
                .iter()
                .map(|e| (e.dtype, e.shape.to_vec()))
                .collect(),
            next: 0,
        })
    }

    /// The entries' indices in the order their data is written.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Writes the data of the next entry in [`Self::order`]: `a` must have that entry's
    /// dtype and shape.
    pub fn write(&mut self, a: &RawArray, done: &AtomicU64) -> Result<()> {
        let Some(&i) = self.order.get(self.next) else {
            return Err(CoreError::BadSafetensors {
                path: self.path.display().to_string(),
                reason: "more arrays than the header names".into(),
            }
            .into());
        };
        let (dtype, shape) = &self.expected[i];
        if a.dtype != *dtype || a.shape != *shape {
            return Err(CoreError::BadSafetensors {
                path: self.path.display().to_string(),
                reason: format!(
                    "an array changed since the header was written: {} {:?}, not {} {:?}",
                    a.dtype.name(),
                    a.shape,
                    dtype.name(),
                    shape
                ),
            }
            .into());
        }
        a.write_data(&mut self.file, &self.path, done)?;
        self.next += 1;
        Ok(())
    }

    /// Flushes the file once every array was written.
    pub fn finish(mut self) -> Result<()> {
        if self.next != self.order.len() {
            return Err(CoreError::BadSafetensors {
                path: self.path.display().to_string(),
                reason: format!("{} of {} arrays written", self.next, self.order.len()),
            }
            .into());
        }
        self.file.flush().map_err(|e| io(&self.path, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_laid_end_to_end_read_back_from_their_file_offsets() {
        // A "file" whose byte k is k % 251; parts out of file order, one empty, with gaps.
        let file: Vec<u8> = (0..4096u32).map(|k| (k % 251) as u8).collect();
        let parts = [
            (100u64, 7usize),
            (3000, 0),
            (10, 64),
            (2000, 1000),
            (4000, 96),
        ];
        let want: Vec<u8> = parts
            .iter()
            .flat_map(|&(f, n)| file[f as usize..f as usize + n].to_vec())
            .collect();
        let read = |at: u64, into: &mut [u8]| -> Result<()> {
            into.copy_from_slice(&file[at as usize..at as usize + into.len()]);
            Ok(())
        };
        for chunk in [1, 5, 7, 63, 64, 100, 999, want.len()] {
            let mut got = vec![0u8; want.len()];
            for (k, piece) in got.chunks_mut(chunk).enumerate() {
                read_laid(&parts, k * chunk, piece, &read).unwrap();
            }
            assert_eq!(got, want, "chunks of {chunk}");
        }
    }
}
