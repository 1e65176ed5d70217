/*
 * Softmax over the last axis: y[i][j] = exp(x[i][j] - max_i) / sum_k exp(x[i][k] - max_i).
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; __half)          default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x length of the softmax axis              default 1 x 1024
 *   BLOCK   threads per block, a power of two <= 1024      default 256
 * Entry: softmax_kernel(const DTYPE *x, DTYPE *y); launch <<<M, BLOCK>>> (one block per row).
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
#define N 1024
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

static_assert(M >= 1 && N >= 1, "softmax needs a non-empty M x N input");
static_assert(BLOCK >= 1 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK: power of 2");

/* Tree reduction over the block; every thread gets the result. */
__device__ ACC block_reduce(ACC v, ACC *buf, bool take_max)
{
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            ACC other = buf[threadIdx.x + s];
            buf[threadIdx.x] = take_max ? max(buf[threadIdx.x], other) : buf[threadIdx.x] + other;
        }
        __syncthreads();
    }
    ACC result = buf[0];
    __syncthreads();
    return result;
}

extern "C" __global__ void softmax_kernel(const DTYPE *__restrict__ x, DTYPE *__restrict__ y)
{
    __shared__ ACC buf[BLOCK];
    const DTYPE *row = x + (long)blockIdx.x * N;
    DTYPE *out = y + (long)blockIdx.x * N;

    ACC local_max = (ACC)row[0];
    for (int j = threadIdx.x; j < N; j += BLOCK)
        local_max = max(local_max, (ACC)row[j]);
    const ACC row_max = block_reduce(local_max, buf, true);

    ACC local_sum = 0;
    for (int j = threadIdx.x; j < N; j += BLOCK)
        local_sum += exp((ACC)row[j] - row_max);
    const ACC row_sum = block_reduce(local_sum, buf, false);

    for (int j = threadIdx.x; j < N; j += BLOCK)
        out[j] = (DTYPE)(exp((ACC)row[j] - row_max) / row_sum);
}
