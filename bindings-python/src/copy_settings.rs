//! The copy wing's settings as `memarray.cuda` shows and sets them: the staged pipeline's
//! threads and slots (`staging_config`, `set_staging_config`), the pinned pool's fallbacks
//! (`pinned_fallbacks`) and the small-copy engine's kernel limit (`copy_engine`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert;
use crate::device::device_of;
use crate::errors::IntoPyResult;
use crate::fork::Detach;

/// The staged-copy settings for pageable host memory, per direction (`"to_device"`,
/// `"to_host"`): `threads` (host threads per copy), `fill_threads` (host threads of a
/// file load's copy: reads through the kernel, so more), `chunk_bytes` (pinned slot size),
/// `direct_below` (smaller copies go straight to the driver), `lane_min` (fewest bytes
/// a thread is given: short copies use fewer threads) and `short_below` (smaller copies
/// take the short path: threads only copy host memory, one thread issues the DMA).
#[pyfunction]
pub(crate) fn staging_config(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for (name, dir) in DIRECTIONS {
        let c = memarray_cuda::copy::staging_config(dir).py()?;
        let d = PyDict::new(py);
        d.set_item("threads", c.threads)?;
        d.set_item("fill_threads", c.fill_threads)?;
        d.set_item("chunk_bytes", c.chunk_bytes)?;
        d.set_item("direct_below", c.direct_below)?;
        d.set_item("lane_min", c.lane_min)?;
        d.set_item("short_below", c.short_below)?;
        out.set_item(name, d)?;
    }
    Ok(out)
}

/// How often host buffers that were to be pinned (staging slots, `move_many`'s packing
/// buffer, automatic host copies, spill copies) came from pageable memory because pinning
/// failed (the system's limit or `MEMARRAY_PINNED_LIMIT`'s): `{"count": ..., "bytes": ...}`
/// since the process started. Needs no device.
#[pyfunction]
pub(crate) fn pinned_fallbacks(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let f = memarray_cuda::resource::pinned_fallbacks();
    let d = PyDict::new(py);
    d.set_item("count", f.count)?;
    d.set_item("bytes", f.bytes)?;
    Ok(d)
}

/// `device_id`'s (default 0) engine for many small copies on the device (packing many
/// arrays into one allocation): `{"kernel_max": bytes or None, "source":
/// "measured" | "env" | "default" | "no kernel", "trial": [(bytes, kernel_us, driver_us),
/// ...]}`. The limit is measured on first use per device (a few milliseconds) unless
/// `MEMARRAY_COPY_KERNEL_MAX` or `MEMARRAY_COPY_KERNEL=0` decide it.
#[pyfunction]
#[pyo3(signature = (device_id=None))]
pub(crate) fn copy_engine<'py>(
    py: Python<'py>,
    device_id: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    use memarray_cuda::copy::{LimitSource, tuning};
    let d = device_of(device_id)?;
    let t = py.detach_section(|| tuning(&d)).py()?;
    let out = PyDict::new(py);
    out.set_item("kernel_max", t.kernel_max)?;
    out.set_item(
        "source",
        match t.source {
            LimitSource::Measured => "measured",
            LimitSource::Env => "env",
            LimitSource::Default => "default",
            LimitSource::NoKernel => "no kernel",
        },
    )?;
    out.set_item("trial", t.trial)?;
    Ok(out)
}

const DIRECTIONS: [(&str, memarray_cuda::copy::Direction); 2] = [
    ("to_device", memarray_cuda::copy::Direction::ToDevice),
    ("to_host", memarray_cuda::copy::Direction::ToHost),
];

/// Changes the staged-copy settings of `direction` ("to_device", "to_host" or "both", the
/// default);
/// those not given stay. Out-of-range values raise ValueError and change nothing.
#[pyfunction]
#[pyo3(signature = (direction=None, threads=None, chunk_bytes=None, direct_below=None, lane_min=None, short_below=None, fill_threads=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn set_staging_config(
    direction: Option<&Bound<'_, PyAny>>,
    threads: Option<&Bound<'_, PyAny>>,
    chunk_bytes: Option<&Bound<'_, PyAny>>,
    direct_below: Option<&Bound<'_, PyAny>>,
    lane_min: Option<&Bound<'_, PyAny>>,
    short_below: Option<&Bound<'_, PyAny>>,
    fill_threads: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    use memarray_cuda::copy::{
        Direction, StagingConfig, set_staging_config as set_config, staging_config as config,
    };
    let direction = match direction.filter(|d| !d.is_none()) {
        Some(d) => convert::text(d, "direction")?,
        None => "both".into(),
    };
    let threads: Option<usize> = convert::opt_int(threads, "threads")?;
    let fill_threads: Option<usize> = convert::opt_int(fill_threads, "fill_threads")?;
    let chunk_bytes: Option<usize> = convert::opt_int(chunk_bytes, "chunk_bytes")?;
    let direct_below: Option<usize> = convert::opt_int(direct_below, "direct_below")?;
    let lane_min: Option<usize> = convert::opt_int(lane_min, "lane_min")?;
    let short_below: Option<usize> = convert::opt_int(short_below, "short_below")?;
    let dirs: &[Direction] = match direction.as_str() {
        "to_device" => &[Direction::ToDevice],
        "to_host" => &[Direction::ToHost],
        "both" => &[Direction::ToDevice, Direction::ToHost],
        other => {
            return Err(PyValueError::new_err(format!(
                "direction must be 'to_device', 'to_host' or 'both', not {other:?}"
            )));
        }
    };
    // Check every direction's new settings before changing any.
    let mut new = Vec::new();
    for &d in dirs {
        let c = config(d).unwrap_or(StagingConfig::default_for(d));
        new.push((
            d,
            StagingConfig {
                threads: threads.unwrap_or(c.threads),
                fill_threads: fill_threads.unwrap_or(c.fill_threads),
                chunk_bytes: chunk_bytes.unwrap_or(c.chunk_bytes),
                direct_below: direct_below.unwrap_or(c.direct_below),
                lane_min: lane_min.unwrap_or(c.lane_min),
                short_below: short_below.unwrap_or(c.short_below),
            },
        ));
    }
    for &(d, c) in &new {
        // Refuses out-of-range values; the first direction is only set if valid, and
        // both share the same checks, so a refusal changes nothing.
        set_config(d, c).py()?;
    }
    Ok(())
}
