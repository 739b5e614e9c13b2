/* The C ABI's host paths, and its refusals of bad input (run by tests/native.rs, under
 * valgrind in CI). Exits non-zero on the first failed check. Without a GPU, device calls
 * must fail with MEMARRAY_STATUS_CUDA_UNAVAILABLE; with one, they must work. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define _DEFAULT_SOURCE         /* MAP_ANONYMOUS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memarray.h"

static int checks = 0;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        ++checks;                                                                    \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, \
                    __LINE__, #cond, memarray_last_error());                         \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)
#define OK(call) CHECK((call) == MEMARRAY_STATUS_OK)
/* The call fails with `status` and a message containing `text`. */
#define FAILS(call, status, text)                                \
    do {                                                         \
        CHECK((call) == (status));                               \
        CHECK(strstr(memarray_last_error(), (text)) != NULL);    \
    } while (0)

static void arrays_round_trip(void) {
    uint64_t shape[2] = {3, 4};
    float data[12], back[12];
    for (int i = 0; i < 12; ++i) data[i] = (float)i * 0.5f;
    memarray_array* a = NULL;
    OK(memarray_array_from_data(MEMARRAY_DTYPE_F32, 2, shape, data, sizeof data, &a));
    CHECK(strcmp(memarray_last_error(), "") == 0);
    memarray_array_info info;
    OK(memarray_array_get_info(a, &info));
    CHECK(info.dtype == MEMARRAY_DTYPE_F32 && info.itemsize == 4 && info.ndim == 2);
    CHECK(info.shape[0] == 3 && info.shape[1] == 4 && info.shape[2] == 0);
    CHECK(info.size == 12 && info.nbytes == 48 && info.location == MEMARRAY_HOST);
    CHECK(info.lock_holder == 0 && !info.spilled);
    OK(memarray_array_read(a, back, sizeof back, 0));
    CHECK(memcmp(data, back, sizeof data) == 0);

    /* The host indexer points at the data, C order. */
    memarray_indexer ix;
    OK(memarray_array_host_indexer(a, 0, &ix));
    CHECK(ix.ndim == 2 && ix.shape[0] == 3 && ix.shape[1] == 4);
    ((float*)ix.data)[1 * 4 + 2] = 42.0f;
    OK(memarray_array_read(a, back, sizeof back, 0));
    CHECK(back[6] == 42.0f);

    /* Writes replace the whole array; wrong sizes change nothing. */
    for (int i = 0; i < 12; ++i) data[i] = -(float)i;
    OK(memarray_array_write(a, data, sizeof data, 0));
    FAILS(memarray_array_write(a, data, 47, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "47");
    FAILS(memarray_array_read(a, back, 4, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "");
    OK(memarray_array_read(a, back, sizeof back, 0));
    CHECK(memcmp(data, back, sizeof data) == 0);

    /* Locks: other callers are refused until the holder unlocks. */
    uint64_t token = 0;
    OK(memarray_array_lock(a, &token));
    CHECK(token != 0);
    OK(memarray_array_get_info(a, &info));
    CHECK(info.lock_holder == token);
    FAILS(memarray_array_write(a, data, sizeof data, 0), MEMARRAY_STATUS_LOCKED, "lock");
    FAILS(memarray_array_host_indexer(a, 0, &ix), MEMARRAY_STATUS_LOCKED, "lock");
    FAILS(memarray_array_lock(a, &token), MEMARRAY_STATUS_LOCKED, "lock");
    FAILS(memarray_array_unlock(a, token + 1000), MEMARRAY_STATUS_LOCKED, "");
    OK(memarray_array_write(a, data, sizeof data, token));
    OK(memarray_array_host_indexer(a, token, &ix));
    OK(memarray_array_unlock(a, token));
    FAILS(memarray_array_unlock(a, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "token 0");
    memarray_array_free(a);

    /* Zeros on the host, every dtype; 0-d and empty shapes. */
    for (int d = MEMARRAY_DTYPE_BOOL; d <= MEMARRAY_DTYPE_C128; ++d) {
        uint64_t s[3] = {2, 0, 5};
        OK(memarray_array_zeros(d, 3, s, MEMARRAY_HOST, MEMARRAY_HOST_KIND_PAGEABLE, NULL, NULL, &a));
        OK(memarray_array_get_info(a, &info));
        CHECK(info.dtype == d && info.size == 0 && info.nbytes == 0);
        memarray_array_free(a);
    }
    int64_t scalar = -1;
    OK(memarray_array_zeros(MEMARRAY_DTYPE_I64, 0, NULL, MEMARRAY_HOST, MEMARRAY_HOST_KIND_AUTO, NULL, NULL, &a));
    OK(memarray_array_read(a, &scalar, 8, 0));
    CHECK(scalar == 0);
    memarray_array_free(a);
}

static void bad_input_is_refused(void) {
    uint64_t shape[1] = {4};
    int32_t v[4] = {1, 2, 3, 4};
    memarray_array* a = NULL;
    FAILS(memarray_array_zeros(99, 1, shape, MEMARRAY_HOST, 0, NULL, NULL, &a), MEMARRAY_STATUS_WRONG_DTYPE, "dtype 99");
    FAILS(memarray_array_zeros(-1, 1, shape, MEMARRAY_HOST, 0, NULL, NULL, &a), MEMARRAY_STATUS_WRONG_DTYPE, "dtype -1");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 1, shape, MEMARRAY_HOST, 7, NULL, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "host_kind 7");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 1, NULL, MEMARRAY_HOST, 0, NULL, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "shape is NULL");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 33, shape, MEMARRAY_HOST, 0, NULL, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "ndim 33");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 1, shape, -5, 0, NULL, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "location -5");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 1, shape, MEMARRAY_HOST, 0, NULL, NULL, NULL),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "out is NULL");
    uint64_t huge[2] = {UINT64_MAX / 2, 4};
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_I32, 2, huge, MEMARRAY_HOST, 0, NULL, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "");
    FAILS(memarray_array_from_data(MEMARRAY_DTYPE_I32, 1, shape, v, 15, &a), MEMARRAY_STATUS_INVALID_ARGUMENT, "");
    FAILS(memarray_array_from_data(MEMARRAY_DTYPE_I32, 1, shape, NULL, 16, &a), MEMARRAY_STATUS_INVALID_ARGUMENT,
          "data is NULL");
    CHECK(a == NULL); /* never written on failure */

    FAILS(memarray_array_get_info(NULL, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "array is NULL");
    FAILS(memarray_array_move(NULL, MEMARRAY_HOST, NULL, true, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "array is NULL");
    FAILS(memarray_array_lock(NULL, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "NULL");
    FAILS(memarray_array_read(NULL, v, 16, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "NULL");
    FAILS(memarray_access_begin(NULL, 0, NULL, true, 0, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "NULL");
    FAILS(memarray_access_end(NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "access is NULL");
    FAILS(memarray_launch(NULL, NULL, NULL, NULL, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "function is NULL");
    FAILS(memarray_array_from_dlpack(NULL, NULL, &a), MEMARRAY_STATUS_INVALID_ARGUMENT, "tensor is NULL");
    FAILS(memarray_resource_limiting(NULL, 10, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "NULL");
    memarray_array_free(NULL);
    memarray_stream_free(NULL);
    memarray_resource_free(NULL);
    memarray_module_free(NULL);
    memarray_function_free(NULL);

    OK(memarray_array_from_data(MEMARRAY_DTYPE_I32, 1, shape, v, sizeof v, &a));
    memarray_indexer ix;
    FAILS(memarray_array_host_indexer(a, 0, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "out is NULL");
    FAILS(memarray_array_read(a, NULL, 16, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "dst is NULL");
    FAILS(memarray_array_move(a, -7, NULL, true, 0), MEMARRAY_STATUS_INVALID_ARGUMENT, "location -7");
    OK(memarray_array_host_indexer(a, 0, &ix));
    memarray_array_free(a);
}

static int deleted = 0;
static void count_delete(struct DLManagedTensorVersioned* self) {
    ++deleted;
    free(self->dl_tensor.shape);
    free(self->dl_tensor.data);
    free(self);
}

/* A 2 x 3 int32 host tensor over the values 0..5, with strides (s0, s1) in elements;
   shape and strides share one allocation (count_delete frees it through shape). */
static struct DLManagedTensorVersioned* strided_tensor(int64_t s0, int64_t s1) {
    struct DLManagedTensorVersioned* f = calloc(1, sizeof *f);
    f->version.major = 1;
    f->deleter = count_delete;
    int32_t* d = calloc(6, sizeof(int32_t));
    for (int i = 0; i < 6; ++i) d[i] = i;
    f->dl_tensor.data = d;
    f->dl_tensor.device.device_type = kDLCPU;
    f->dl_tensor.ndim = 2;
    f->dl_tensor.shape = malloc(4 * sizeof(int64_t));
    f->dl_tensor.shape[0] = 2;
    f->dl_tensor.shape[1] = 3;
    f->dl_tensor.strides = f->dl_tensor.shape + 2;
    f->dl_tensor.strides[0] = s0;
    f->dl_tensor.strides[1] = s1;
    f->dl_tensor.dtype.code = kDLInt;
    f->dl_tensor.dtype.bits = 32;
    f->dl_tensor.dtype.lanes = 1;
    return f;
}

static void dlpack_both_ways(void) {
    /* Out: a versioned tensor over the array's host memory, alive past the array. */
    uint64_t shape[2] = {2, 3};
    double data[6] = {1, 2, 3, 4, 5, 6};
    memarray_array* a = NULL;
    OK(memarray_array_from_data(MEMARRAY_DTYPE_F64, 2, shape, data, sizeof data, &a));
    struct DLManagedTensorVersioned* t = NULL;
    OK(memarray_array_to_dlpack(a, NULL, 0, &t));
    CHECK(t->version.major == 1 && t->deleter != NULL);
    CHECK(t->dl_tensor.ndim == 2 && t->dl_tensor.shape[0] == 2 && t->dl_tensor.shape[1] == 3);
    CHECK(t->dl_tensor.dtype.code == kDLFloat && t->dl_tensor.dtype.bits == 64);
    CHECK(t->dl_tensor.device.device_type == kDLCPU);
    memarray_array_free(a);
    CHECK(((double*)t->dl_tensor.data)[5] == 6.0);
    /* In again: shared zero-copy (writes through one are seen by the other). */
    OK(memarray_array_from_dlpack(t, NULL, &a));
    double* p = (double*)t->dl_tensor.data;
    p[0] = 100.0;
    double back[6];
    OK(memarray_array_read(a, back, sizeof back, 0));
    CHECK(back[0] == 100.0 && back[5] == 6.0);
    memarray_array_free(a); /* runs the tensor's deleter */

    /* A foreign tensor: its deleter runs exactly once, when the array lets go. */
    struct DLManagedTensorVersioned* f = calloc(1, sizeof *f);
    f->version.major = 1;
    f->deleter = count_delete;
    f->dl_tensor.data = calloc(4, sizeof(int32_t));
    ((int32_t*)f->dl_tensor.data)[3] = 7;
    f->dl_tensor.device.device_type = kDLCPU;
    f->dl_tensor.ndim = 1;
    f->dl_tensor.shape = malloc(sizeof(int64_t));
    f->dl_tensor.shape[0] = 4;
    f->dl_tensor.dtype.code = kDLInt;
    f->dl_tensor.dtype.bits = 32;
    f->dl_tensor.dtype.lanes = 1;
    OK(memarray_array_from_dlpack(f, NULL, &a));
    CHECK(deleted == 0);
    int32_t got[4];
    OK(memarray_array_read(a, got, sizeof got, 0));
    CHECK(got[3] == 7);
    memarray_array_free(a);
    CHECK(deleted == 1);

    /* A malformed one is refused, and still ended. */
    f = calloc(1, sizeof *f);
    f->version.major = 1;
    f->deleter = count_delete;
    f->dl_tensor.data = calloc(4, 1);
    f->dl_tensor.device.device_type = kDLCPU;
    f->dl_tensor.ndim = 1;
    f->dl_tensor.shape = malloc(sizeof(int64_t));
    f->dl_tensor.shape[0] = -3;
    f->dl_tensor.dtype.code = kDLInt;
    f->dl_tensor.dtype.bits = 8;
    f->dl_tensor.dtype.lanes = 1;
    a = NULL;
    CHECK(memarray_array_from_dlpack(f, NULL, &a) != MEMARRAY_STATUS_OK);
    CHECK(a == NULL && deleted == 2);

    /* A strided one (a 2 x 3 view in Fortran order) is copied into C order, as Python's
       from_dlpack does; the copy is the array's, so the tensor ends at once. */
    f = strided_tensor(1, 2);
    OK(memarray_array_from_dlpack(f, NULL, &a));
    CHECK(deleted == 3);
    int32_t c_order[6];
    OK(memarray_array_read(a, c_order, sizeof c_order, 0));
    CHECK(c_order[0] == 0 && c_order[1] == 2 && c_order[2] == 4);
    CHECK(c_order[3] == 1 && c_order[4] == 3 && c_order[5] == 5);
    memarray_array_free(a);

    /* Overlapping strides (a broadcast) are refused, by the same rule as Python's. */
    f = strided_tensor(0, 1);
    a = NULL;
    FAILS(memarray_array_from_dlpack(f, NULL, &a), MEMARRAY_STATUS_INVALID_ARGUMENT,
          "same element");
    CHECK(a == NULL && deleted == 4);
}

/* Forged tensors whose struct, shape, strides or data lie in a mapped page this process
   cannot read (PROT_NONE, as a thread stack's guard page): refused with INVALID_ARGUMENT,
   never a fault; the deleter runs once where the struct could be read. */
static int guard_deleted = 0;
static void guard_delete(struct DLManagedTensorVersioned* self) {
    ++guard_deleted;
    free(self->manager_ctx);
    free(self);
}

/* A 2 x 3 int32 tensor whose shape (field 0), strides (field 1) or data (field 2) is `bad`;
   the rest in one block its deleter frees. */
static struct DLManagedTensorVersioned* forged_tensor(int field, int64_t* bad) {
    struct DLManagedTensorVersioned* f = calloc(1, sizeof *f);
    int64_t* block = calloc(8, sizeof(int64_t));
    f->version.major = 1;
    f->manager_ctx = block;
    f->deleter = guard_delete;
    f->dl_tensor.device.device_type = kDLCPU;
    f->dl_tensor.ndim = 2;
    f->dl_tensor.dtype.code = kDLInt;
    f->dl_tensor.dtype.bits = 32;
    f->dl_tensor.dtype.lanes = 1;
    f->dl_tensor.shape = field == 0 ? bad : block;
    f->dl_tensor.strides = field == 1 ? bad : block + 2;
    f->dl_tensor.data = field == 2 ? (void*)bad : (void*)(block + 4);
    block[0] = 2;
    block[1] = 3;
    block[2] = 3;
    block[3] = 1;
    return f;
}

static void unreadable_tensors_are_refused(void) {
    long page = 4096;
    char* m = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    CHECK(mprotect(m + page, page, PROT_NONE) == 0);
    int64_t* guard = (int64_t*)(m + page);
    memarray_array* a = NULL;

    FAILS(memarray_array_from_dlpack((struct DLManagedTensorVersioned*)guard, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "readable");
    CHECK(a == NULL);

    for (int field = 0; field < 3; ++field) {
        FAILS(memarray_array_from_dlpack(forged_tensor(field, guard), NULL, &a),
              MEMARRAY_STATUS_INVALID_ARGUMENT, "readable");
        CHECK(a == NULL && guard_deleted == field + 1);
    }
    CHECK(munmap(m, 2 * page) == 0);

    /* The same fields pointing at memory that is not mapped at all (the page just
       unmapped): the readability probe hands the kernel those addresses, which valgrind
       reports unless scripts/valgrind.supp names the probe's frame, in the release
       library too (the valgrind stage runs this program against both). */
    for (int field = 0; field < 3; ++field) {
        CHECK(memarray_array_from_dlpack(forged_tensor(field, (int64_t*)m), NULL, &a) ==
              MEMARRAY_STATUS_INVALID_ARGUMENT);
        CHECK(a == NULL && guard_deleted == 3 + field + 1);
    }
}

static void resources_limit_and_count(void) {
    memarray_resource *host = NULL, *stats = NULL, *limited = NULL, *pool = NULL;
    OK(memarray_resource_host(&host));
    OK(memarray_resource_statistics(host, &stats));
    OK(memarray_resource_limiting(stats, 1000, &limited));
    OK(memarray_resource_pool(host, MEMARRAY_HOST, 1 << 20, &pool));
    memarray_statistics s;
    FAILS(memarray_resource_get_statistics(host, &s), MEMARRAY_STATUS_INVALID_ARGUMENT, "counts nothing");

    uint64_t small[1] = {100}, big[1] = {300};
    memarray_array *a = NULL, *b = NULL, *c = NULL;
    OK(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, small, MEMARRAY_HOST, 0, limited, NULL, &a));
    OK(memarray_resource_get_statistics(stats, &s));
    CHECK(s.current_count == 1 && s.current_bytes >= 400);
    /* 400 + 1200 bytes exceed the 1000-byte limit. */
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, big, MEMARRAY_HOST, 0, limited, NULL, &b),
          MEMARRAY_STATUS_OUT_OF_MEMORY, "");
    CHECK(b == NULL);
    OK(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, big, MEMARRAY_HOST, 0, pool, NULL, &c));
    memarray_resource_free(limited); /* the array keeps its resource */
    memarray_array_free(a);
    OK(memarray_resource_get_statistics(stats, &s));
    CHECK(s.current_count == 0 && s.total_count == 1 && s.peak_bytes >= 400);
    memarray_array_free(c);
    memarray_resource_free(pool);
    memarray_resource_free(stats);
    memarray_resource_free(host);
}

/* The seed's kernel (PTX from MEMARRAY_TEST_PTX) as a user module: a launch on a stream
 * other than the array's orders itself; bad argument lists are refused. */
static void launch_a_user_kernel(void) {
    /* A missing NVRTC is a clear status (NVRTC is looked for once, on first use). */
    setenv("MEMARRAY_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so", 1);
    memarray_module* nv = NULL;
    FAILS(memarray_module_from_source(0, "extern \"C\" __global__ void k() {}", "k.cu", NULL, 0, &nv),
          MEMARRAY_STATUS_CUDA_UNAVAILABLE, "/nonexistent/libnvrtc.so");
    CHECK(nv == NULL);
    const char* path = getenv("MEMARRAY_TEST_PTX");
    CHECK(path != NULL);
    FILE* f = fopen(path, "rb");
    CHECK(f != NULL);
    static char ptx[1 << 20];
    size_t len = fread(ptx, 1, sizeof ptx, f);
    fclose(f);
    memarray_module* m = NULL;
    memarray_function* fn = NULL;
    OK(memarray_module_load(0, ptx, len, &m));
    FAILS(memarray_module_function(m, "no_such_kernel", &fn), MEMARRAY_STATUS_INVALID_ARGUMENT, "no_such_kernel");
    OK(memarray_module_function(m, "add_index_f32_n2", &fn));
    memarray_module_free(m); /* the function keeps it loaded */
    size_t count = 0, sizes[4];
    OK(memarray_function_params(fn, &count, sizes, 4));
    CHECK(count == 1 && sizes[0] == 24);

    enum { R = 37, C = 29 };
    static float v[R * C], back[R * C];
    for (int i = 0; i < R * C; ++i) v[i] = (float)i;
    uint64_t shape[2] = {R, C};
    memarray_array* a = NULL;
    memarray_stream *s1 = NULL, *s2 = NULL;
    OK(memarray_stream_create(0, &s1));
    OK(memarray_stream_create(0, &s2));
    OK(memarray_array_from_data(MEMARRAY_DTYPE_F32, 2, shape, v, sizeof v, &a));
    OK(memarray_array_move(a, 0, s1, false, 0));
    memarray_launch_config cfg;
    OK(memarray_function_config_for(fn, R * C, &cfg));
    /* The default covers every element; grid-stride is capped by name. */
    memarray_launch_config big, stride;
    OK(memarray_function_config_for(fn, 2100000, &big));
    CHECK((uint64_t)big.grid[0] * big.block[0] >= 2100000);
    OK(memarray_function_config_grid_stride(fn, 2100000, &stride));
    CHECK(stride.grid[0] >= 1 && stride.grid[0] <= big.grid[0] && stride.block[0] == big.block[0]);
    memarray_kernel_arg arg = {MEMARRAY_ARG_KIND_WRITE, a, 0, NULL, 0};
    OK(memarray_launch(fn, &cfg, s2, &arg, 1));
    OK(memarray_launch(fn, &cfg, s1, &arg, 1));
    OK(memarray_array_read(a, back, sizeof back, 0));
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) CHECK(back[r * C + c] == (float)(r * C + c) + 2.0f * (float)(r + c));

    /* Refusals: count, sizes, kinds, a locked array, a zero grid. */
    float k = 1.0f;
    memarray_kernel_arg two[2] = {arg, {MEMARRAY_ARG_KIND_VALUE, NULL, 0, &k, 4}};
    FAILS(memarray_launch(fn, &cfg, s2, two, 2), MEMARRAY_STATUS_INVALID_ARGUMENT, "takes 1 parameters, 2 given");
    memarray_kernel_arg val = {MEMARRAY_ARG_KIND_VALUE, NULL, 0, &k, 4};
    FAILS(memarray_launch(fn, &cfg, s2, &val, 1), MEMARRAY_STATUS_INVALID_ARGUMENT, "parameter 0 is 24 bytes");
    memarray_kernel_arg bad = {7, a, 0, NULL, 0};
    FAILS(memarray_launch(fn, &cfg, s2, &bad, 1), MEMARRAY_STATUS_INVALID_ARGUMENT, "kind 7");
    memarray_kernel_arg none = {MEMARRAY_ARG_KIND_READ, NULL, 0, NULL, 0};
    FAILS(memarray_launch(fn, &cfg, s2, &none, 1), MEMARRAY_STATUS_INVALID_ARGUMENT, "array is NULL");
    uint64_t token = 0;
    OK(memarray_array_lock(a, &token));
    FAILS(memarray_launch(fn, &cfg, s2, &arg, 1), MEMARRAY_STATUS_LOCKED, "");
    arg.token = token; /* the holder may launch */
    OK(memarray_launch(fn, &cfg, s2, &arg, 1));
    OK(memarray_array_unlock(a, token));
    memarray_launch_config zero = cfg;
    zero.grid[0] = 0;
    arg.token = 0;
    FAILS(memarray_launch(fn, &zero, s2, &arg, 1), MEMARRAY_STATUS_INVALID_ARGUMENT, "at least 1");
    FAILS(memarray_module_load(0, NULL, 10, &m), MEMARRAY_STATUS_INVALID_ARGUMENT, "image is NULL");
    memarray_function_free(fn);
    memarray_array_free(a);
    memarray_stream_free(s1);
    memarray_stream_free(s2);
}

static void device_calls(void) {
    int n = memarray_device_count();
    memarray_stream* s = NULL;
    memarray_resource* r = NULL;
    memarray_module* m = NULL;
    uint64_t shape[1] = {8};
    memarray_array* a = NULL;
    if (n == 0) {
        /* No GPU: every device call says so. */
        FAILS(memarray_stream_create(0, &s), MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        FAILS(memarray_resource_device(0, &r), MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        FAILS(memarray_module_load(0, "x", 1, &m), MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        FAILS(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, shape, 0, 0, NULL, NULL, &a),
              MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        OK(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, shape, MEMARRAY_HOST, 0, NULL, NULL, &a));
        FAILS(memarray_array_move(a, 0, NULL, true, 0), MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        memarray_access* acc = NULL;
        FAILS(memarray_access_begin(a, 0, NULL, true, 0, &acc), MEMARRAY_STATUS_CUDA_UNAVAILABLE, "");
        memarray_array_info info;
        OK(memarray_array_get_info(a, &info));
        CHECK(info.lock_holder == 0); /* a failed begin leaves no lock behind */
        memarray_array_free(a);
        printf("no CUDA device: device calls refused as expected\n");
        return;
    }
    /* A GPU: a round trip through the device on a stream of memarray's. */
    OK(memarray_stream_create(0, &s));
    CHECK(memarray_stream_handle(s) != NULL);
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8];
    OK(memarray_array_from_data(MEMARRAY_DTYPE_F32, 1, shape, v, sizeof v, &a));
    OK(memarray_array_move(a, 0, s, false, 0));
    memarray_indexer ix;
    FAILS(memarray_array_host_indexer(a, 0, &ix), MEMARRAY_STATUS_WRONG_LOCATION, "");
    OK(memarray_array_read(a, back, sizeof back, 0));
    CHECK(memcmp(v, back, sizeof v) == 0);
    memarray_access* acc = NULL;
    OK(memarray_access_begin(a, 0, s, false, 0, &acc));
    OK(memarray_access_indexer(acc, &ix));
    CHECK(ix.data != NULL && ix.ndim == 1 && ix.shape[0] == 8);
    FAILS(memarray_array_move(a, MEMARRAY_HOST, NULL, true, 0), MEMARRAY_STATUS_LOCKED, "");
    OK(memarray_access_end(acc));
    OK(memarray_array_move(a, MEMARRAY_HOST, NULL, true, 0));
    memarray_array_free(a);
    memarray_stream_free(s);
    FAILS(memarray_module_load(0, "not ptx", 7, &m), MEMARRAY_STATUS_INVALID_ARGUMENT, "kernel module");
    launch_a_user_kernel();
    FAILS(memarray_stream_create(n + 3, &s), MEMARRAY_STATUS_INVALID_ARGUMENT, "");
    /* Refusing a host resource as a device's default, and as an array's
     * device resource, is INVALID_ARGUMENT (it was OUT_OF_MEMORY and FAILED). */
    memarray_resource* host = NULL;
    OK(memarray_resource_host(&host));
    FAILS(memarray_set_default_resource(0, host), MEMARRAY_STATUS_INVALID_ARGUMENT, "not accessible");
    FAILS(memarray_array_zeros(MEMARRAY_DTYPE_F32, 1, shape, 0, 0, host, NULL, &a),
          MEMARRAY_STATUS_INVALID_ARGUMENT, "not accessible");
    memarray_resource_free(host);
    printf("%d CUDA device(s): device round trip passed\n", n);
}

static void graphs(void) {
    memarray_capture* c = NULL;
    memarray_graph* g = NULL;
    /* Arguments are checked on any machine, before any device is touched. */
    FAILS(memarray_capture_begin(NULL, 1, &c), MEMARRAY_STATUS_INVALID_ARGUMENT, "stream is NULL");
    CHECK(c == NULL);
    FAILS(memarray_capture_end(NULL, &g), MEMARRAY_STATUS_INVALID_ARGUMENT, "capture is NULL");
    FAILS(memarray_graph_launch(NULL, NULL), MEMARRAY_STATUS_INVALID_ARGUMENT, "graph is NULL");
    CHECK(g == NULL && memarray_graph_node_count(NULL) == 0);
    memarray_capture_free(NULL);
    memarray_graph_free(NULL);
    if (memarray_device_count() == 0) {
        return;
    }
    memarray_stream *s = NULL, *legacy = NULL;
    OK(memarray_stream_create(0, &s));
    FAILS(memarray_capture_begin(s, 7, &c), MEMARRAY_STATUS_INVALID_ARGUMENT, "capture mode 7");
    OK(memarray_stream_wrap(0, NULL, &legacy));
    FAILS(memarray_capture_begin(legacy, 1, &c), MEMARRAY_STATUS_INVALID_ARGUMENT, "default stream");
    /* A capture that recorded nothing is an empty graph, launchable all the same. */
    OK(memarray_capture_begin(s, 1, &c));
    OK(memarray_capture_end(c, &g));
    CHECK(memarray_graph_node_count(g) == 0);
    OK(memarray_graph_upload(g, s));
    OK(memarray_graph_launch(g, s));
    OK(memarray_graph_launch(g, s));
    OK(memarray_stream_synchronize(s));
    memarray_graph_free(g);
    /* An abandoned capture ends: the stream works again. */
    OK(memarray_capture_begin(s, 2, &c));
    memarray_capture_free(c);
    OK(memarray_stream_synchronize(s));
    memarray_stream_free(legacy);
    memarray_stream_free(s);
}

int main(void) {
    CHECK(memarray_version() >= 100);
    arrays_round_trip();
    bad_input_is_refused();
    dlpack_both_ways();
    unreadable_tensors_are_refused();
    resources_limit_and_count();
    device_calls();
    graphs();
    printf("test_c: %d checks passed\n", checks);
    return 0;
}
