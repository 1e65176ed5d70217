/*
 * Sum over the last axis: y[i] = sum_j x[i][j] (ReduceSum with axes = [-1], keep_dims false).
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; __half)          default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x reduced length                          default 1 x 4096
 *   BLOCK   threads per block, a power of two <= 1024      default 256
 * Entry: reduce_sum_kernel(const DTYPE *x, DTYPE *y); launch <<<M, BLOCK>>> (one block per row).
 */
#include <cuda_fp16.h>

#ifndef DTYPE
#define DTYPE float
#endif
#ifndef ACC
#define ACC float
#endif
#ifndef M
#define M 1
#endif
#ifndef N
#define N 4096
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

static_assert(M >= 1 && N >= 1, "reduce_sum needs a non-empty M x N input");
static_assert(BLOCK >= 1 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK: power of 2");

extern "C" __global__ void reduce_sum_kernel(const DTYPE *__restrict__ x, DTYPE *__restrict__ y)
{
    __shared__ ACC buf[BLOCK];
    const DTYPE *row = x + (long)blockIdx.x * N;
    ACC acc = 0;
    for (int j = threadIdx.x; j < N; j += BLOCK)
        acc += (ACC)row[j];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        y[blockIdx.x] = (DTYPE)buf[0];
}
