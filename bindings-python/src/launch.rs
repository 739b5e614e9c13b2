//! `memarray.cuda.Module`, `Function`, `In` and `Out`: users' kernels on
//! MemArrays, ordered by memarray. A thin layer over `memarray_cuda::launch`: arguments
//! are parsed here (MemArrays, `In(a)` / `Out(a)`, NumPy scalars, bytes) and
//! `launch_shared` (with the GIL released) locks each distinct array once and launches.

use crate::fork::Detach;
use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use memarray_cuda::launch::{Function, LaunchConfig, Module, SharedArg, launch_shared};

use crate::array::PyMemArray;
use crate::convert;
use crate::device::device_of;
use crate::errors::IntoPyResult;
use crate::stream::parse_move_stream;

/// A loaded kernel module (PTX, cubin or fatbin) of one device.
///
/// `Module(image, device_id=0)` loads bytes or a str of PTX; `Module.from_source(source,
/// name="kernel.cu", options=None, device_id=0)` compiles CUDA C++ with NVRTC (kernels
/// declared `extern "C"`; CudaUnavailableError without NVRTC, ValueError with NVRTC's log
/// on a compile error).
#[pyclass(name = "Module", module = "memarray.cuda", frozen)]
pub struct PyModule_ {
    inner: Arc<Module>,
}

#[pymethods]
impl PyModule_ {
    #[new]
    #[pyo3(signature = (image, device_id=None))]
    fn new(
        py: Python<'_>,
        image: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let bytes: Vec<u8> = if image.is_instance_of::<pyo3::types::PyString>() {
            crate::convert::text(image, "image")?.into_bytes()
        } else if let Ok(b) = image.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            return Err(PyTypeError::new_err(format!(
                "Module takes PTX text (str or bytes), a cubin or a fatbin (bytes), got {}",
                crate::errors::type_name(image)
            )));
        };
        let device = device_of(device_id)?;
        let inner = py.detach_section(|| Module::load(&device, &bytes)).py()?;
        Ok(Self { inner })
    }

    /// Compiles CUDA C++ `source` with NVRTC for the device's architecture and loads it.
    #[staticmethod]
    #[pyo3(signature = (source, name=None, options=None, device_id=None))]
    fn from_source(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        name: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyAny>>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        use crate::convert::text;
        let source = text(source, "source")?;
        let name = match name {
            Some(n) => text(n, "name")?,
            None => "kernel.cu".to_owned(),
        };
        let options: Vec<String> = match options.filter(|o| !o.is_none()) {
            None => Vec::new(),
            Some(o) if o.is_instance_of::<pyo3::types::PyString>() => {
                return Err(pyo3::exceptions::PyTypeError::new_err(
                    "options must be a list of str (e.g. [\"-I<dir>\"]), not one str",
                ));
            }
            Some(o) => o
                .try_iter()
                .map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "options must be a list of str, not {}",
                        crate::errors::type_name(o)
                    ))
                })?
                .enumerate()
                .map(|(i, x)| text(&x?, &format!("options[{i}]")))
                .collect::<PyResult<_>>()?,
        };
        let (source, name) = (source.as_str(), name.as_str());
        let device = device_of(device_id)?;
        let opts: Vec<&str> = options.iter().map(String::as_str).collect();
        let inner = py
            .detach_section(|| Module::from_cuda_source(&device, source, name, &opts))
            .py()?;
        Ok(Self { inner })
    }

    /// The device the module is loaded on.
    #[getter]
    fn device_id(&self) -> u32 {
        self.inner.device().id()
    }

    /// The kernel `name` (its `extern "C"` name); ValueError naming it when absent.
    fn function(&self, name: &str) -> PyResult<PyFunction> {
        Ok(PyFunction {
            inner: self.inner.function(name).py()?,
        })
    }

    fn __repr__(&self) -> String {
        format!("Module(device_id={})", self.inner.device().id())
    }
}

/// A kernel of a Module.
///
/// `f.launch(*args, grid=None, block=None, shared_bytes=0, stream=None)`: each MemArray
/// argument is passed as its Indexer (`memarray/indexer.cuh`); a bare MemArray or `Out(a)`
/// is written by the kernel, `In(a)` only read. Scalars are NumPy scalars
/// (`numpy.float32(2.0)`) or bytes; Python ints and floats are refused (their C type is
/// ambiguous). Arrays move to the kernel's device, the stream waits on their pending work
/// and their events record the launch: no manual synchronisation is needed.
#[pyclass(name = "Function", module = "memarray.cuda", frozen)]
pub struct PyFunction {
    inner: Function,
}

/// `In(a)`: an array the kernel only reads.
#[pyclass(name = "In", module = "memarray.cuda", frozen)]
pub struct PyIn {
    #[pyo3(get)]
    array: Py<PyMemArray>,
}

#[pymethods]
impl PyIn {
    #[new]
    fn new(array: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            array: PyMemArray::arg(array, "In")?.clone().unbind(),
        })
    }
}

/// `Out(a)`: an array the kernel writes (the same as passing `a` bare).
#[pyclass(name = "Out", module = "memarray.cuda", frozen)]
pub struct PyOut {
    #[pyo3(get)]
    array: Py<PyMemArray>,
}

#[pymethods]
impl PyOut {
    #[new]
    fn new(array: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self {
            array: PyMemArray::arg(array, "Out")?.clone().unbind(),
        })
    }
}

/// A grid or block: an int or a tuple of 1 to 3 ints, each at least 1.
fn dims(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<[u32; 3]> {
    let mut out = [1u32; 3];
    if let Ok(t) = obj.cast::<PyTuple>() {
        if t.is_empty() || t.len() > 3 {
            return Err(PyValueError::new_err(format!(
                "{name} takes 1 to 3 dimensions, got {}",
                t.len()
            )));
        }
        for (i, d) in t.iter().enumerate() {
            out[i] = convert::int(&d, name)?;
        }
    } else {
        out[0] = convert::int(obj, name)?;
    }
    if out.contains(&0) {
        return Err(PyValueError::new_err(format!(
            "{name} {out:?} must be at least 1 in every dimension"
        )));
    }
    Ok(out)
}

/// A scalar argument's bytes: a NumPy scalar or bytes.
fn value_bytes(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let np = obj.py().import("numpy")?;
    if obj.is_instance(&np.getattr("generic")?)? {
        return Ok(obj
            .call_method0("tobytes")?
            .cast::<PyBytes>()?
            .as_bytes()
            .to_vec());
    }
    Err(PyTypeError::new_err(format!(
        "kernel argument {i}: expected a MemArray, In(a), Out(a), a NumPy scalar \
         (numpy.float32(2.0)) or bytes, got {} (Python ints and floats have no C type: \
         wrap them in the NumPy type the kernel takes)",
        crate::errors::type_name(obj)
    )))
}

#[pymethods]
impl PyFunction {
    /// The kernel's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The sizes in bytes of its parameters, in order.
    #[getter]
    fn param_sizes(&self) -> Vec<usize> {
        self.inner.param_sizes().to_vec()
    }

    /// `(grid, block)` for one thread per element of `n`: every element gets a thread, for
    /// kernels written as `if (i < n) ...`. The default of `launch`.
    fn config_for(&self, n: u64) -> ((u32, u32, u32), (u32, u32, u32)) {
        dims_of(self.inner.config_for(n))
    }

    /// `(grid, block)` for a grid-stride kernel (`for (i = ...; i < n; i += gridDim.x *
    /// blockDim.x)`): the grid capped at the blocks the device holds at once. A
    /// one-thread-per-element kernel launched this way skips the elements past the grid.
    fn config_grid_stride(&self, n: u64) -> ((u32, u32, u32), (u32, u32, u32)) {
        dims_of(self.inner.config_grid_stride(n))
    }

    /// Launches the kernel (see the class docs). Without `grid` and `block`: one thread
    /// per element of the largest array argument (`config_for`); a grid-stride kernel may
    /// pass `config_grid_stride(n)`'s grid and block instead.
    #[pyo3(signature = (*args, grid=None, block=None, shared_bytes=0, stream=None))]
    fn launch(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        grid: Option<&Bound<'_, PyAny>>,
        block: Option<&Bound<'_, PyAny>>,
        shared_bytes: u32,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = parse_move_stream(stream)?;
        let mut arrays: Vec<(Bound<'_, PyMemArray>, bool)> = Vec::new();
        let mut values: Vec<Option<Vec<u8>>> = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            let (array, write) = if let Ok(x) = a.cast::<PyMemArray>() {
                (x.clone(), true)
            } else if let Ok(x) = a.cast::<PyIn>() {
                (x.get().array.bind(py).clone(), false)
            } else if let Ok(x) = a.cast::<PyOut>() {
                (x.get().array.bind(py).clone(), true)
            } else {
                values.push(Some(value_bytes(&a, i)?));
                continue;
            };
            arrays.push((array, write));
            values.push(None);
        }
        let cfg = match (grid, block) {
            (Some(g), Some(b)) => LaunchConfig {
                grid: dims(g, "grid")?,
                block: dims(b, "block")?,
                shared_bytes,
            },
            (None, None) => {
                // Sized by the largest array (its length read now: a concurrent swap only
                // changes how many threads loop over it).
                let n = arrays
                    .iter()
                    .map(|(a, _)| a.get().peek(py, |raw| raw.len()))
                    .max()
                    .ok_or_else(|| {
                        PyValueError::new_err(
                            "no array argument to size the grid by: give grid= and block=",
                        )
                    })?;
                LaunchConfig {
                    shared_bytes,
                    ..self.inner.config_for(n)
                }
            }
            _ => {
                return Err(PyValueError::new_err(
                    "give both grid and block, or neither (one thread per element)",
                ));
            }
        };
        let mut next_array = arrays.iter();
        let list: Vec<SharedArg<'_>> = values
            .into_iter()
            .map(|v| match v {
                Some(bytes) => SharedArg::Value(bytes),
                None => {
                    let (a, write) = next_array.next().expect("one array per None");
                    SharedArg::Array {
                        array: &a.get().shared,
                        write: *write,
                        token: None,
                    }
                }
            })
            .collect();
        let f = &self.inner;
        py.detach_section(|| launch_shared(f, cfg, stream, &list))
            .py()
    }

    fn __repr__(&self) -> String {
        format!(
            "Function({:?}, param_sizes={:?})",
            self.inner.name(),
            self.inner.param_sizes()
        )
    }
}

/// A launch configuration's grid and block as Python tuples.
fn dims_of(c: LaunchConfig) -> ((u32, u32, u32), (u32, u32, u32)) {
    (
        (c.grid[0], c.grid[1], c.grid[2]),
        (c.block[0], c.block[1], c.block[2]),
    )
}

pub fn register(cuda: &Bound<'_, pyo3::types::PyModule>) -> PyResult<()> {
    cuda.add_class::<PyModule_>()?;
    cuda.add_class::<PyFunction>()?;
    cuda.add_class::<PyIn>()?;
    cuda.add_class::<PyOut>()?;
    Ok(())
}
