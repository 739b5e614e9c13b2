/* memarray's C ABI. Generated from crates/memarray-c/src by cbindgen: do not edit.
 * Every call returns a memarray_status; memarray_last_error() says why one failed.
 * Ownership, threads and the status model: docs/c-cpp-guide.md. */

#ifndef MEMARRAY_H
#define MEMARRAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "dlpack/dlpack.h"

// The most dimensions an array has (memarray-core's `MAX_NDIM`).
#define MEMARRAY_MAX_NDIM 32

// Where an array's data goes: the host, or a CUDA device by its ordinal.
#define MEMARRAY_HOST -1

// What a call did. Every error comes with a message from `memarray_last_error`.
typedef enum {
  // The call succeeded.
  MEMARRAY_STATUS_OK = 0,
  // A null pointer, a size or count that does not fit, an unknown code, a bad shape,
  // an argument list that does not match a kernel, a malformed DLPack tensor.
  MEMARRAY_STATUS_INVALID_ARGUMENT = 1,
  // A dtype that does not match, or one memarray does not support.
  MEMARRAY_STATUS_WRONG_DTYPE = 2,
  // The array is locked by another token (or the token given does not hold it).
  MEMARRAY_STATUS_LOCKED = 3,
  // The data is not where the call needs it (a host pointer of device data).
  MEMARRAY_STATUS_WRONG_LOCATION = 4,
  // An allocation failed or a resource's limit was reached.
  MEMARRAY_STATUS_OUT_OF_MEMORY = 5,
  // No CUDA driver or device, or a missing library (NVRTC).
  MEMARRAY_STATUS_CUDA_UNAVAILABLE = 6,
  // The CUDA driver refused a call (its error is in the message).
  MEMARRAY_STATUS_CUDA = 7,
  // Anything else that failed (I/O, a file resource).
  MEMARRAY_STATUS_FAILED = 8,
  // A bug in memarray (a panic, caught at the boundary).
  MEMARRAY_STATUS_INTERNAL = 9,
} memarray_status;

// Element types (the `dtype` arguments; NumPy's names in the comments).
typedef enum {
  // bool
  MEMARRAY_DTYPE_BOOL = 0,
  // int8
  MEMARRAY_DTYPE_I8 = 1,
  // int16
  MEMARRAY_DTYPE_I16 = 2,
  // int32
  MEMARRAY_DTYPE_I32 = 3,
  // int64
  MEMARRAY_DTYPE_I64 = 4,
  // uint8
  MEMARRAY_DTYPE_U8 = 5,
  // uint16
  MEMARRAY_DTYPE_U16 = 6,
  // uint32
  MEMARRAY_DTYPE_U32 = 7,
  // uint64
  MEMARRAY_DTYPE_U64 = 8,
  // float16
  MEMARRAY_DTYPE_F16 = 9,
  // bfloat16
  MEMARRAY_DTYPE_BF16 = 10,
  // float32
  MEMARRAY_DTYPE_F32 = 11,
  // float64
  MEMARRAY_DTYPE_F64 = 12,
  // complex64
  MEMARRAY_DTYPE_C64 = 13,
  // complex128
  MEMARRAY_DTYPE_C128 = 14,
} memarray_dtype;

// The kind of host memory an array's host copy uses (the `host_kind` arguments).
typedef enum {
  // Pinned from 1 MiB up when a CUDA device is present, pageable otherwise.
  MEMARRAY_HOST_KIND_AUTO = 0,
  // Ordinary pageable memory.
  MEMARRAY_HOST_KIND_PAGEABLE = 1,
  // Page-locked memory (full-speed asynchronous copies).
  MEMARRAY_HOST_KIND_PINNED = 2,
  // CUDA managed memory.
  MEMARRAY_HOST_KIND_MANAGED = 3,
} memarray_host_kind;

// What a kernel argument is (`memarray_kernel_arg::kind`).
typedef enum {
  // An array the kernel only reads, passed as its indexer.
  MEMARRAY_ARG_KIND_READ = 0,
  // An array the kernel writes, passed as its indexer.
  MEMARRAY_ARG_KIND_WRITE = 1,
  // `size` bytes at `value`, passed by value.
  MEMARRAY_ARG_KIND_VALUE = 2,
} memarray_arg_kind;

// An open device access (opaque): from `memarray_access_begin` to
// `memarray_access_end`.
typedef struct memarray_access memarray_access;

// An N-d array (opaque). Made by `memarray_array_zeros`, `memarray_array_from_data` or
// `memarray_array_from_dlpack`; released by `memarray_array_free`.
typedef struct memarray_array memarray_array;

// A capture in progress on one stream (opaque): end it with `memarray_capture_end`, or
// abandon it with `memarray_capture_free`.
typedef struct memarray_capture memarray_capture;

// A kernel of a module (opaque); keeps its module loaded.
typedef struct memarray_function memarray_function;

// An instantiated graph (opaque), launchable any number of times.
typedef struct memarray_graph memarray_graph;

// A loaded module of one device (opaque).
typedef struct memarray_module memarray_module;

// A memory resource (opaque), reference-counted: adaptors and arrays keep what they use.
typedef struct memarray_resource memarray_resource;

// A CUDA stream (opaque), of one device.
typedef struct memarray_stream memarray_stream;

// A data pointer and a C-order shape: what a kernel receives (`memarray::Indexer<N>` in
// `memarray/indexer.cuh` holds `data` and the first N extents).
typedef struct {
  // The first element (host or device memory, as the call that filled it says).
  void *data;
  // The number of dimensions.
  uint64_t ndim;
  // The extents; entries past `ndim` are 0.
  uint64_t shape[MEMARRAY_MAX_NDIM];
} memarray_indexer;

// What an array is, read in one call.
typedef struct {
  // A `memarray_dtype` value.
  int32_t dtype;
  // Bytes per element.
  uint64_t itemsize;
  // The number of dimensions.
  uint64_t ndim;
  // The extents; entries past `ndim` are 0.
  uint64_t shape[MEMARRAY_MAX_NDIM];
  // Elements.
  uint64_t size;
  // Bytes.
  uint64_t nbytes;
  // Where the current data is: `MEMARRAY_HOST` or a device ordinal.
  int32_t location;
  // The device the array moves to by default.
  int32_t device;
  // A `memarray_host_kind` value (never `Auto`).
  int32_t host_kind;
  // The id of the token holding the array's lock, 0 when unlocked.
  uint64_t lock_holder;
  // Whether the array is spilled to the host under a device budget.
  bool spilled;
} memarray_array_info;

// A launch's grid and block (x, y, z) and dynamic shared memory per block.
typedef struct {
  // Blocks in each dimension (each at least 1).
  uint32_t grid[3];
  // Threads per block in each dimension (each at least 1).
  uint32_t block[3];
  // Bytes of dynamic shared memory per block.
  uint32_t shared_bytes;
} memarray_launch_config;

// One kernel argument: an array (`kind` READ or WRITE, `array`, `token` when the caller
// holds its lock, else 0) or a value (`kind` VALUE, `value`, `size`).
typedef struct {
  // A `memarray_arg_kind` value.
  int32_t kind;
  // The array (READ / WRITE).
  const memarray_array *array;
  // The array's lock token, or 0.
  uint64_t token;
  // The value's bytes (VALUE).
  const void *value;
  // The value's size in bytes (VALUE).
  size_t size;
} memarray_kernel_arg;

// What a statistics resource has counted.
typedef struct {
  // Bytes allocated and not yet freed.
  uint64_t current_bytes;
  // The most `current_bytes` has been.
  uint64_t peak_bytes;
  // Allocations not yet freed.
  uint64_t current_count;
  // The most `current_count` has been.
  uint64_t peak_count;
  // Bytes ever allocated.
  uint64_t total_bytes;
  // Allocations ever made.
  uint64_t total_count;
} memarray_statistics;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library's version as `major * 10000 + minor * 100 + patch`.
uint32_t memarray_version(void);

// The number of CUDA devices (0 without a driver: not an error).
int32_t memarray_device_count(void);

// Opens device access to `a` for work the caller enqueues on `stream` (NULL: the
// legacy default stream) on `device`: the data moves there (restored if spilled),
// `stream` waits on the array's pending work, and `*out`'s indexer holds the device
// address. The array stays locked until `memarray_access_end`: by a new lock when
// `token` is 0 (it fails with `MEMARRAY_STATUS_LOCKED` if someone else holds one), or
// by the caller's lock `token`. `write`: whether the work writes the array (else it only
// reads it). Free nothing the access uses before ending it; the array handle itself may
// be freed (the access keeps the array).
//
// # Safety
// Handles are live; `out` is writable.
memarray_status memarray_access_begin(const memarray_array *a,
                                      int32_t device,
                                      const memarray_stream *stream,
                                      bool write,
                                      uint64_t token,
                                      memarray_access **out);

// The open access's indexer (`data` a device address).
//
// # Safety
// `acc` is a live access; `out` is writable.
memarray_status memarray_access_indexer(const memarray_access *acc, memarray_indexer *out);

// Ends an access, after the caller has enqueued its work on the access's stream: that
// work becomes the array's pending work (a write, or a read that later writes wait
// for), and the lock begin took is released. The access is freed whatever the status
// (NULL: `MEMARRAY_STATUS_INVALID_ARGUMENT`).
//
// # Safety
// `acc` is NULL or a live access, not used afterwards.
memarray_status memarray_access_end(memarray_access *acc);

// Makes a zero-filled array of `dtype` and shape `shape[0..ndim)` whose data lives at
// `location` (`MEMARRAY_HOST`, or a device ordinal: born there, the memset ordered on
// `stream`, not waited for). `host_kind` picks the host copy's memory; `resource`
// (nullable) serves the data at `location` and the array's later device buffers;
// `stream` (nullable: the legacy default stream). On success `*out` is a new array:
// release it with `memarray_array_free`.
//
// # Safety
// `shape` holds `ndim` values; handles are live; `out` is writable.
memarray_status memarray_array_zeros(int32_t dtype,
                                     size_t ndim,
                                     const uint64_t *shape,
                                     int32_t location,
                                     int32_t host_kind,
                                     const memarray_resource *resource,
                                     const memarray_stream *stream,
                                     memarray_array **out);

// Makes a host array of `dtype` and shape `shape[0..ndim)` holding a copy of `data`
// (C order; `nbytes` must be exactly the array's size). On success `*out` is a new
// array: release it with `memarray_array_free`.
//
// # Safety
// `shape` holds `ndim` values; `data` holds `nbytes` readable bytes; `out` is writable.
memarray_status memarray_array_from_data(int32_t dtype,
                                         size_t ndim,
                                         const uint64_t *shape,
                                         const void *data,
                                         size_t nbytes,
                                         memarray_array **out);

// Releases an array handle (NULL: nothing). The data is freed once nothing else uses it
// (an open access, a DLPack export, a pending device operation).
//
// # Safety
// `a` is NULL or a live handle, not used afterwards.
void memarray_array_free(memarray_array *a);

// Fills `*out` with the array's dtype, shape, size, location, host kind and lock holder.
//
// # Safety
// `a` is a live handle; `out` is writable.
memarray_status memarray_array_get_info(const memarray_array *a, memarray_array_info *out);

// Moves the array's data to `location` (`MEMARRAY_HOST` or a device ordinal) on
// `stream` (nullable: the array's last stream, else the legacy default stream). With
// `sync` the call returns once the copy is done; without, later operations on the array
// are ordered after it. `token`: the lock's token when the array is locked, else 0.
//
// # Safety
// Handles are live.
memarray_status memarray_array_move(const memarray_array *a,
                                    int32_t location,
                                    const memarray_stream *stream,
                                    bool sync,
                                    uint64_t token);

// Waits until the array's pending device work is done.
//
// # Safety
// `a` is a live handle.
memarray_status memarray_array_synchronize(const memarray_array *a, uint64_t token);

// Locks the array: until `memarray_array_unlock`, every call on it that does not
// present `*token` fails with `MEMARRAY_STATUS_LOCKED`. Fails with that status when
// the array is already locked.
//
// # Safety
// `a` is a live handle; `token` is writable.
memarray_status memarray_array_lock(const memarray_array *a, uint64_t *token);

// Releases the lock `token` holds.
//
// # Safety
// `a` is a live handle.
memarray_status memarray_array_unlock(const memarray_array *a, uint64_t token);

// The host data as an indexer (`data` is a host pointer), after the array's pending
// work. Fails with `MEMARRAY_STATUS_WRONG_LOCATION` unless the data is on the host.
// The pointer stays valid while the data stays on the host: lock the array to be sure
// no other thread moves it.
//
// # Safety
// `a` is a live handle; `out` is writable.
memarray_status memarray_array_host_indexer(const memarray_array *a,
                                            uint64_t token,
                                            memarray_indexer *out);

// Copies the whole array, wherever its data lives, into `dst` (`nbytes` must be the
// array's size exactly), after its pending work.
//
// # Safety
// `a` is a live handle; `dst` holds `nbytes` writable bytes.
memarray_status memarray_array_read(const memarray_array *a,
                                    void *dst,
                                    size_t nbytes,
                                    uint64_t token);

// Overwrites the whole array, where its data lives, with `src` (C order; `nbytes` must
// be the array's size exactly). Returns once `src` has been read.
//
// # Safety
// `a` is a live handle; `src` holds `nbytes` readable bytes.
memarray_status memarray_array_write(const memarray_array *a,
                                     const void *src,
                                     size_t nbytes,
                                     uint64_t token);

// Exports `a` zero-copy where its data is, as a DLPack 1.x versioned managed tensor.
// `consumer`: the stream the consumer will use (it waits on the array's pending work),
// or NULL to have the host wait before the call returns. On success `*out` is the
// caller's: end it with its `deleter` (or hand it to a consumer that will, such as a
// `"dltensor_versioned"` PyCapsule). The memory stays alive until then, whatever happens
// to the array.
//
// # Safety
// Handles are live; `out` is writable.
memarray_status memarray_array_to_dlpack(const memarray_array *a,
                                         const memarray_stream *consumer,
                                         uint64_t token,
                                         struct DLManagedTensorVersioned **out);

// Imports a DLPack 1.x versioned managed tensor, which becomes memarray's whatever the
// status (its deleter runs when the array is done with it, or before an error returns).
// C-contiguous writable tensors are shared zero-copy (host, pinned, managed or CUDA
// memory); read-only and strided ones (any non-negative, non-overlapping strides) are
// copied into a C-contiguous array where the data is: the rules of Python's
// `memarray.from_dlpack`, through the same import. `producer`: the stream the
// producer's work on a CUDA tensor is queued on (NULL: the legacy default stream);
// later work on the array waits for it. On success `*out` is a new array: release it
// with `memarray_array_free`.
//
// # Safety
// `t` is NULL or a valid `DLManagedTensorVersioned` the caller gives up; `producer` is
// NULL or live; `out` is writable.
memarray_status memarray_array_from_dlpack(struct DLManagedTensorVersioned *t,
                                           const memarray_stream *producer,
                                           memarray_array **out);

// This thread's last error message: the message of the last call on this thread that
// failed, or "" after one that succeeded. Never NULL; valid until the next call on this
// thread.
const char *memarray_last_error(void);

// Begins capturing `stream` (one of memarray's or a wrapped one, not a default stream)
// in `mode`: 0 global, 1 thread-local, 2 relaxed (CUDA's capture modes). memarray's
// kernels and device copies enqueued on it are recorded, not run; work a graph cannot
// replay (a pageable or staged host copy, a host wait) fails with
// `MEMARRAY_STATUS_FAILED` and leaves the capture valid. On success `*out` is the
// capture.
//
// # Safety
// `stream` is a live handle, used by the capture until it ends; `out` is writable.
memarray_status memarray_capture_begin(const memarray_stream *stream,
                                       int32_t mode,
                                       memarray_capture **out);

// Ends `capture` (consumed, also on failure) and instantiates its graph: on success
// `*out` is the graph; release it with `memarray_graph_free`. A capture invalidated by
// work illegal under it fails here (`MEMARRAY_STATUS_CUDA`); the stream works again
// either way.
//
// # Safety
// `capture` is a live handle, not used afterwards; `out` is writable.
memarray_status memarray_capture_end(memarray_capture *capture, memarray_graph **out);

// Abandons a capture (NULL: nothing): it ends and what it recorded is thrown away.
//
// # Safety
// `capture` is NULL or a live handle, not used afterwards.
void memarray_capture_free(memarray_capture *capture);

// Launches `graph` on `stream` (of the graph's device), after the work queued there and
// the pending work of the arrays the capture used; returns at once. The graph holds those
// arrays until `memarray_graph_free` (freeing an array's handle earlier is safe), and the
// launch becomes their pending work (a host read waits for it). An array that moved to
// other device memory since the capture (a swap) fails the launch, nothing launched.
//
// # Safety
// `graph` and `stream` are live handles.
memarray_status memarray_graph_launch(const memarray_graph *graph, const memarray_stream *stream);

// Uploads `graph` to its device on `stream` ahead of its first launch.
//
// # Safety
// `graph` and `stream` are live handles.
memarray_status memarray_graph_upload(const memarray_graph *graph, const memarray_stream *stream);

// The number of nodes (kernels, copies, memsets, waits) the capture recorded; 0 for
// NULL.
//
// # Safety
// `graph` is NULL or a live handle.
size_t memarray_graph_node_count(const memarray_graph *graph);

// Releases a graph (NULL: nothing); launches already queued still run.
//
// # Safety
// `graph` is NULL or a live handle, not used afterwards.
void memarray_graph_free(memarray_graph *graph);

// Loads `image` (`size` bytes: PTX text, a cubin or a fatbin) on `device`. On success
// `*out` is a new module: release it with `memarray_module_free`.
//
// # Safety
// `image` holds `size` readable bytes; `out` is writable.
memarray_status memarray_module_load(int32_t device,
                                     const void *image,
                                     size_t size,
                                     memarray_module **out);

// Compiles CUDA C++ `source` (named `name` in messages) with NVRTC for `device` and
// loads it; `options` holds `noptions` NVRTC options (`-I<dir>` for
// `memarray/indexer.cuh`). Kernels are declared `extern "C"`. Without NVRTC:
// `MEMARRAY_STATUS_CUDA_UNAVAILABLE`; a compile error: `MEMARRAY_STATUS_INVALID_ARGUMENT`
// with NVRTC's log.
//
// # Safety
// Strings are NUL-terminated; `options` holds `noptions` of them; `out` is writable.
memarray_status memarray_module_from_source(int32_t device,
                                            const char *source,
                                            const char *name,
                                            const char *const *options,
                                            size_t noptions,
                                            memarray_module **out);

// Releases a module handle (NULL: nothing); functions taken from it keep it loaded.
//
// # Safety
// `m` is NULL or a live handle, not used afterwards.
void memarray_module_free(memarray_module *m);

// The kernel `name` (its `extern "C"` name) of module `m`. On success `*out` is a new
// function: release it with `memarray_function_free`.
//
// # Safety
// `m` is live; `name` is NUL-terminated; `out` is writable.
memarray_status memarray_module_function(const memarray_module *m,
                                         const char *name,
                                         memarray_function **out);

// Releases a function handle (NULL: nothing).
//
// # Safety
// `f` is NULL or a live handle, not used afterwards.
void memarray_function_free(memarray_function *f);

// The number of the kernel's parameters (into `*count`) and, when `sizes` is not NULL,
// their sizes in bytes (the first `capacity` of them).
//
// # Safety
// `f` is live; `count` is writable; `sizes` is NULL or holds `capacity` writable values.
memarray_status memarray_function_params(const memarray_function *f,
                                         size_t *count,
                                         size_t *sizes,
                                         size_t capacity);

// One thread per element of `n`, in blocks of the size that maximises occupancy: every
// element gets a thread (kernels written as `if (i < n) ...`).
//
// # Safety
// `f` is live; `out` is writable.
memarray_status memarray_function_config_for(const memarray_function *f,
                                             uint64_t n,
                                             memarray_launch_config *out);

// A grid-stride configuration for `n` elements: the grid capped at the blocks the device
// holds at once. Only for kernels that loop (`i += gridDim.x * blockDim.x`): a
// one-thread-per-element kernel launched this way skips the elements past the grid.
//
// # Safety
// `f` is live; `out` is writable.
memarray_status memarray_function_config_grid_stride(const memarray_function *f,
                                                     uint64_t n,
                                                     memarray_launch_config *out);

// Launches `f` with `*config` on `stream` (NULL: the legacy default stream) with
// `args[0..nargs)`. Each array argument moves to the kernel's device, the stream waits
// on its pending work, and after the launch its event records it (a write for WRITE, a
// read for READ): no manual synchronisation is needed. The arguments must match the
// kernel's parameters in number and size (an array is an indexer: 8 + 8 * ndim bytes);
// nothing moves when they do not. One array may appear in several arguments.
//
// # Safety
// Handles are live; `config` is readable; `args` holds `nargs` readable arguments whose
// values hold `size` readable bytes.
memarray_status memarray_launch(const memarray_function *f,
                                const memarray_launch_config *config,
                                const memarray_stream *stream,
                                const memarray_kernel_arg *args,
                                size_t nargs);

// Ordinary host memory (no driver needed). `*out`: release with
// `memarray_resource_free`.
//
// # Safety
// `out` is writable.
memarray_status memarray_resource_host(memarray_resource **out);

// Device memory of `device` (`cuMemAlloc` / `cuMemFree` each time).
//
// # Safety
// `out` is writable.
memarray_status memarray_resource_device(int32_t device, memarray_resource **out);

// Page-locked host memory, usable by `device`'s copies at full speed.
//
// # Safety
// `out` is writable.
memarray_status memarray_resource_pinned(int32_t device, memarray_resource **out);

// A caching pool over `upstream`: freed blocks are kept for reuse, and cached bytes
// beyond `release_threshold` go back upstream after each free. `device`: the device
// whose streams use the blocks (ordering reuse after their work), or `MEMARRAY_HOST`
// for a pool of host memory.
//
// # Safety
// `upstream` is live; `out` is writable.
memarray_status memarray_resource_pool(const memarray_resource *upstream,
                                       int32_t device,
                                       uint64_t release_threshold,
                                       memarray_resource **out);

// `upstream` with at most `limit` bytes outstanding: allocations past it fail with
// `MEMARRAY_STATUS_OUT_OF_MEMORY`.
//
// # Safety
// `upstream` is live; `out` is writable.
memarray_status memarray_resource_limiting(const memarray_resource *upstream,
                                           uint64_t limit,
                                           memarray_resource **out);

// `upstream`, counting what goes through it (read with
// `memarray_resource_get_statistics`).
//
// # Safety
// `upstream` is live; `out` is writable.
memarray_status memarray_resource_statistics(const memarray_resource *upstream,
                                             memarray_resource **out);

// The counters of a resource made by `memarray_resource_statistics`
// (`MEMARRAY_STATUS_INVALID_ARGUMENT` for any other).
//
// # Safety
// `r` is live; `out` is writable.
memarray_status memarray_resource_get_statistics(const memarray_resource *r,
                                                 memarray_statistics *out);

// Makes `r` the resource new device buffers on `device` come from (arrays already made
// keep theirs). `r` must serve memory the device can use.
//
// # Safety
// `r` is live.
memarray_status memarray_set_default_resource(int32_t device, const memarray_resource *r);

// `device`'s current default resource (a new handle to it).
//
// # Safety
// `out` is writable.
memarray_status memarray_default_resource(int32_t device, memarray_resource **out);

// Releases a resource handle (NULL: nothing); arrays and adaptors made from it keep it.
//
// # Safety
// `r` is NULL or a live handle, not used afterwards.
void memarray_resource_free(memarray_resource *r);

// Makes a non-blocking stream on `device`. On success `*out` is a new stream: release
// it with `memarray_stream_free`.
//
// # Safety
// `out` is writable.
memarray_status memarray_stream_create(int32_t device, memarray_stream **out);

// Wraps the caller's live `CUstream` (or `cudaStream_t`) `handle` of `device`, so
// memarray calls can order work on it; the caller keeps it alive while the wrapper is
// used. `handle` NULL is the legacy default stream. Release with
// `memarray_stream_free` (which does not destroy the caller's stream).
//
// # Safety
// `handle` is NULL or a live stream of `device`'s primary context; `out` is writable.
memarray_status memarray_stream_wrap(int32_t device, void *handle, memarray_stream **out);

// Releases a stream handle (NULL: nothing). memarray's own streams are recycled once
// their work is done; a wrapped stream is left to its owner.
//
// # Safety
// `s` is NULL or a live handle, not used afterwards.
void memarray_stream_free(memarray_stream *s);

// The stream's `CUstream` (usable as a `cudaStream_t`, e.g. in `<<<grid, block, 0,
// stream>>>`), or NULL for a NULL handle.
//
// # Safety
// `s` is NULL or a live handle.
void *memarray_stream_handle(const memarray_stream *s);

// Waits until the stream's work is done.
//
// # Safety
// `s` is a live handle.
memarray_status memarray_stream_synchronize(const memarray_stream *s);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* MEMARRAY_H */
