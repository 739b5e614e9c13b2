//! [`FileResource`]: regions of a file as host-accessible memory (umem's `umemFile`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use memmap2::{MmapMut, MmapOptions};

use super::{Location, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Granularity of file regions: mappings start at page-aligned offsets.
const PAGE: usize = 4096;

/// A file used as a storage device: each allocation is a page-aligned region of the file,
/// memory-mapped read-write (so the host reads and writes it like RAM, and the operating
/// system pages it to and from the file). Freed regions are reused by later allocations;
/// the file grows as needed and is never shrunk while the resource lives.
///
/// Alignments up to the page size (4096) are served. Copies in and out are ordinary host
/// copies ([`crate::HostBuffer`] over a file region reads like any host buffer), and the
/// CUDA layer copies to and from it like pageable memory.
///
/// ```
/// use memarray_core::{FileResource, MemoryKind, MemoryResource};
///
/// let path = std::env::temp_dir().join(format!("memarray-file-doc-{}", std::process::id()));
/// let file = FileResource::create(&path)?;
/// let p = file.allocate_zeroed(10_000, 64, None)?;
/// // SAFETY: p is a live, host-accessible allocation of 10,000 bytes.
/// unsafe { p.as_ptr().add(9_999).write(42) };
/// assert_eq!(file.kind(), MemoryKind::File);
/// assert!(file.file_len()? >= 10_000);
/// // SAFETY: p came from this resource with these arguments and is freed once.
/// unsafe { file.deallocate(p, 10_000, 64, None) };
/// # drop(file);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct FileResource {
    path: PathBuf,
    name: String,
    /// The open file; positional reads and `set_len` need no lock of ours.
    file: File,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// End of the regions handed out so far (page-aligned).
    end: u64,
    /// Freed regions, `(offset, len)`, reused first-fit.
    free: Vec<(u64, u64)>,
    /// Live mappings by address: the mapping and its region.
    live: HashMap<usize, (MmapMut, u64, u64)>,
}

/// How a file is opened by [`open_regular`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileMode {
    /// Read only, under a shared lock.
    Read,
    /// Read-write, created if missing, under an exclusive lock; the contents are kept.
    Write,
    /// As `Write`, then truncated to 0 bytes once the lock is held.
    Truncate,
}

/// Opens `path` as a regular file under an advisory lock (`flock`): shared for
/// [`FileMode::Read`], exclusive otherwise; the lock lasts as long as the `File`.
///
/// This is how memarray keeps its own mappings safe: a [`FileResource`] holds
/// its file's exclusive lock while it lives, so another `FileResource`, `.npy` save or
/// load in any memarray process is refused with [`CoreError::FileInUse`] instead of
/// truncating pages that are mapped (which would make the next access die with SIGBUS).
/// The file is opened non-blocking, so a FIFO or device never blocks the caller; anything
/// but a regular file is refused with [`CoreError::Io`]. Truncation happens only after the
/// lock is taken.
pub fn open_regular(path: &Path, mode: FileMode) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    o.read(true).custom_flags(libc::O_NONBLOCK);
    if mode != FileMode::Read {
        o.write(true).create(true);
    }
    let file = o.open(path).map_err(|e| io_err(path, e))?;
    let meta = file.metadata().map_err(|e| io_err(path, e))?;
    if !meta.is_file() {
        return Err(CoreError::Io {
            path: path.display().to_string(),
            reason: "not a regular file (FIFOs, sockets and devices are refused)".into(),
            errno: None,
        });
    }
    let locked = match mode {
        FileMode::Read => file.try_lock_shared(),
        FileMode::Write | FileMode::Truncate => file.try_lock(),
    };
    match locked {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(CoreError::FileInUse {
                path: path.display().to_string(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_err(path, e)),
    }
    if mode == FileMode::Truncate {
        file.set_len(0).map_err(|e| io_err(path, e))?;
    }
    Ok(file)
}

impl FileResource {
    /// Creates (or truncates) the file at `path` and uses it as storage. A file that
    /// another live `FileResource` (of this or any process) uses is refused with
    /// [`CoreError::FileInUse`], never truncated under its mappings.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = open_regular(path, FileMode::Truncate)?;
        Ok(Self::with_file(path, file, 0))
    }

    /// Opens an existing file read-write and appends new regions after its current end,
    /// leaving its contents untouched. [`CoreError::FileInUse`] as for
    /// [`create`](Self::create).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(io_err(
                path,
                std::io::Error::from(std::io::ErrorKind::NotFound),
            ));
        }
        let file = open_regular(path, FileMode::Write)?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        Ok(Self::with_file(
            path,
            file,
            len.next_multiple_of(PAGE as u64),
        ))
    }

    /// Opens an existing file read-only (under a shared lock): it serves
    /// [`read_into`](Self::read_into); allocations fail (the file cannot grow).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = open_regular(path, FileMode::Read)?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        Ok(Self::with_file(
            path,
            file,
            len.next_multiple_of(PAGE as u64),
        ))
    }

    /// Reads `dst.len()` bytes of the file from `offset` into `dst` with positional reads
    /// (`pread`), never through a mapping: a file shrunk meanwhile (by anyone, memarray's
    /// lock is advisory) gives [`CoreError::Io`], not SIGBUS. Past the end of
    /// the file is [`CoreError::CopyOutOfRange`]. Safe to call from several threads.
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let file_len = self.file_len()?;
        let end = offset
            .checked_add(dst.len() as u64)
            .filter(|&e| e <= file_len);
        if end.is_none() {
            return Err(CoreError::CopyOutOfRange {
                offset: usize::try_from(offset).unwrap_or(usize::MAX),
                len: dst.len(),
                capacity: usize::try_from(file_len).unwrap_or(usize::MAX),
            });
        }
        self.file.read_exact_at(dst, offset).map_err(|e| {
            let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!(
                    "the file ended before {} bytes at offset {offset} were read: it shrank \
                     while being read",
                    dst.len()
                )
            } else {
                e.to_string()
            };
            CoreError::Io {
                path: self.path.display().to_string(),
                reason,
                errno: e.raw_os_error(),
            }
        })
    }

    fn with_file(path: &Path, file: File, end: u64) -> Self {
        Self {
            name: format!("file {}", path.display()),
            path: path.to_path_buf(),
            file,
            state: Mutex::new(State {
                end,
                free: Vec::new(),
                live: HashMap::new(),
            }),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's current length in bytes.
    pub fn file_len(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| io_err(&self.path, e))
    }

    /// Writes every live region's dirty pages back to the file.
    pub fn flush(&self) -> Result<()> {
        let st = self.lock();
        for (m, _, _) in st.live.values() {
            m.flush().map_err(|e| io_err(&self.path, e))?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Maps a region of at least `bytes` (0 allowed); returns the address and whether
    /// the region is fresh (so already zero).
    fn map(&self, bytes: usize, align: usize) -> Result<(NonNull<u8>, bool)> {
        if !align.is_power_of_two() || align > PAGE {
            return Err(CoreError::BadAlignment { align, max: PAGE });
        }
        let oom = |reason: String| CoreError::OutOfMemory {
            bytes,
            resource: self.name.clone(),
            reason,
        };
        let len = (bytes.max(1) as u64)
            .checked_next_multiple_of(PAGE as u64)
            .filter(|&l| l <= i64::MAX as u64 && usize::try_from(l).is_ok())
            .ok_or_else(|| oom("the size does not fit a file offset".into()))?;
        let mut st = self.lock();
        let (offset, fresh) = match st.free.iter().position(|&(_, l)| l >= len) {
            Some(i) => {
                let (off, l) = st.free.swap_remove(i);
                if l > len {
                    st.free.push((off + len, l - len));
                }
                (off, false)
            }
            None => {
                let off = st.end;
                let end = off
                    .checked_add(len)
                    .ok_or_else(|| oom("the file would pass 2^64 bytes".into()))?;
                // Growing the file is a sparse extension: no bytes are written.
                self.file
                    .set_len(end.max(self.file.metadata().map(|m| m.len()).unwrap_or(0)))
                    .map_err(|e| oom(format!("cannot grow {}: {e}", self.path.display())))?;
                st.end = end;
                (off, true)
            }
        };
        // SAFETY: the region [offset, offset + len) belongs to this resource alone (handed
        // out once, from `end` or the free list); the file is not truncated while mapped:
        // this resource holds the file's exclusive lock (`open_regular`), so no other
        // memarray resource or `.npy` save truncates it. Code that ignores the advisory
        // lock (another program truncating the file) is outside this contract.
        let map = unsafe {
            MmapOptions::new()
                .offset(offset)
                .len(len as usize)
                .map_mut(&self.file)
        };
        let mut map = match map {
            Ok(m) => m,
            Err(e) => {
                st.free.push((offset, len));
                return Err(oom(format!("mmap of {len} bytes failed: {e}")));
            }
        };
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| oom("mmap returned null".into()))?;
        st.live.insert(ptr.as_ptr() as usize, (map, offset, len));
        Ok((ptr, fresh))
    }
}

fn io_err(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::io(path, &e)
}

impl MemoryResource for FileResource {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        _stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.map(bytes, align).map(|(p, _)| p)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        _stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let (p, fresh) = self.map(bytes, align)?;
        if !fresh {
            // SAFETY: p maps at least `bytes` writable bytes, owned by the caller now.
            unsafe { p.as_ptr().write_bytes(0, bytes) };
        }
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        _bytes: usize,
        _align: usize,
        _stream: Option<RawStream>,
    ) {
        let mut st = self.lock();
        if let Some((map, offset, len)) = st.live.remove(&(ptr.as_ptr() as usize)) {
            drop(map);
            st.free.push((offset, len));
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::File
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Host
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("memarray-{tag}-{}", std::process::id()))
    }

    #[test]
    fn read_into_reads_any_offset_and_refuses_past_the_end() {
        let path = tmp("region");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = FileResource::open_read_only(&path).unwrap();
        for (off, len) in [
            (0u64, 10_000usize),
            (4095, 7),
            (4096, 100),
            (9_999, 1),
            (123, 0),
        ] {
            let mut got = vec![0u8; len];
            f.read_into(off, &mut got).unwrap();
            assert_eq!(got, &data[off as usize..off as usize + len], "{off} {len}");
        }
        assert!(f.read_into(9_999, &mut [0; 2]).is_err());
        assert!(f.read_into(u64::MAX, &mut [0; 2]).is_err());
        assert!(
            f.allocate(10, 8, None).is_err(),
            "a read-only file cannot grow"
        );
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn a_file_in_use_is_never_truncated() {
        let path = tmp("inuse");
        let first = FileResource::create(&path).unwrap();
        let p = first.allocate_zeroed(1 << 20, 64, None).unwrap();
        // SAFETY: p is a live 1 MiB allocation of `first`.
        unsafe { p.as_ptr().add(100).write(7) };
        for again in [
            FileResource::create(&path).map(|_| ()),
            FileResource::open(&path).map(|_| ()),
            FileResource::open_read_only(&path).map(|_| ()),
        ] {
            assert!(
                matches!(again, Err(CoreError::FileInUse { .. })),
                "{again:?}"
            );
        }
        assert!(first.file_len().unwrap() >= 1 << 20, "not truncated");
        // SAFETY: the mapping is still live: the refused calls touched nothing.
        assert_eq!(unsafe { p.as_ptr().add(100).read() }, 7);
        // SAFETY: p came from `first` with these arguments.
        unsafe { first.deallocate(p, 1 << 20, 64, None) };
        drop(first);
        assert!(
            FileResource::create(&path).is_ok(),
            "free again once dropped"
        );
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn a_file_shrunk_while_read_is_an_error_not_a_fault() {
        let path = tmp("shrink");
        std::fs::write(&path, vec![1u8; 1 << 16]).unwrap();
        let f = FileResource::open_read_only(&path).unwrap();
        // Another writer (not memarray: the lock is advisory) truncates the file.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let mut dst = vec![0u8; 1 << 16];
        assert!(f.read_into(0, &mut dst).is_err());
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn fifos_are_refused_without_blocking() {
        let path = tmp("fifo");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for mode in [FileMode::Read, FileMode::Write, FileMode::Truncate] {
            let e = open_regular(&path, mode).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        std::fs::remove_file(&path).ok();
    }
}
