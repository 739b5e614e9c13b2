/* memarray from plain C: a kernel written in CUDA C++, compiled at run time by NVRTC
 * through memarray, launched on arrays memarray moves and orders; every call's status
 * checked. Without a GPU it runs the host part and says so.
 *
 *   cc -std=c11 examples/c/saxpy.c -Icrates/memarray-c/include -Ltarget/release -lmemarray \
 *      -Wl,-rpath,$PWD/target/release -o saxpy && ./saxpy
 */
#include <stdio.h>
#include <stdlib.h>

#include "memarray.h"

#define TRY(call)                                                                     \
    do {                                                                              \
        memarray_status s_ = (call);                                                  \
        if (s_ != MEMARRAY_STATUS_OK) {                                               \
            fprintf(stderr, "%s failed (%d): %s\n", #call, (int)s_, memarray_last_error()); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* An Indexer<1> is a pointer and one extent. */
static const char* kSource =
    "struct Ix1 { float* data; unsigned long long n; };\n"
    "extern \"C\" __global__ void saxpy(Ix1 y, Ix1 x, float a) {\n"
    "    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "         i < y.n; i += (unsigned long long)gridDim.x * blockDim.x)\n"
    "        y.data[i] = a * x.data[i] + y.data[i];\n"
    "}\n";

int main(void) {
    enum { N = 100000 };
    static float xs[N], ys[N];
    for (int i = 0; i < N; ++i) {
        xs[i] = (float)i;
        ys[i] = 1.0f;
    }
    uint64_t shape[1] = {N};
    memarray_array *x = NULL, *y = NULL;
    TRY(memarray_array_from_data(MEMARRAY_DTYPE_F32, 1, shape, xs, sizeof xs, &x));
    TRY(memarray_array_from_data(MEMARRAY_DTYPE_F32, 1, shape, ys, sizeof ys, &y));
    if (memarray_device_count() == 0) {
        TRY(memarray_array_read(y, ys, sizeof ys, 0));
        printf("saxpy: no CUDA device; host arrays made and read back (y[0] = %g)\n", ys[0]);
        memarray_array_free(x);
        memarray_array_free(y);
        return 0;
    }
    memarray_module* m = NULL;
    memarray_function* f = NULL;
    memarray_stream* s = NULL;
    TRY(memarray_module_from_source(0, kSource, "saxpy.cu", NULL, 0, &m));
    TRY(memarray_module_function(m, "saxpy", &f));
    TRY(memarray_stream_create(0, &s));
    memarray_launch_config cfg;
    TRY(memarray_function_config_for(f, N, &cfg));
    float a = 2.0f;
    memarray_kernel_arg args[3] = {
        {MEMARRAY_ARG_KIND_WRITE, y, 0, NULL, 0},
        {MEMARRAY_ARG_KIND_READ, x, 0, NULL, 0},
        {MEMARRAY_ARG_KIND_VALUE, NULL, 0, &a, sizeof a},
    };
    TRY(memarray_launch(f, &cfg, s, args, 3)); /* x and y move to the device themselves */
    TRY(memarray_array_read(y, ys, sizeof ys, 0)); /* waits for the kernel */
    int wrong = 0;
    for (int i = 0; i < N; ++i) wrong += ys[i] != 2.0f * (float)i + 1.0f;
    printf("saxpy: %d elements on the device, %d wrong\n", N, wrong);
    memarray_function_free(f);
    memarray_module_free(m);
    memarray_stream_free(s);
    memarray_array_free(x);
    memarray_array_free(y);
    return wrong != 0;
}
