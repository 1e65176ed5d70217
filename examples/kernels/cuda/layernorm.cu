/*
 * Layer normalisation over the last axis:
 *   y[i][j] = (x[i][j] - mean_i) / sqrt(var_i + EPS) * gamma[j] + beta[j]
 * with mean_i and the biased variance var_i taken over row i.
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; __half)          default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x normalised length                       default 1 x 1024
 *   EPS     epsilon added to the variance                  default 1e-5
 *   BLOCK   threads per block, a power of two <= 1024      default 256
 * Entry: layernorm_kernel(const DTYPE *x, const DTYPE *gamma, const DTYPE *beta, DTYPE *y);
 * launch <<<M, BLOCK>>> (one block per row).
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
#ifndef EPS
#define EPS 1e-5
#endif
#ifndef BLOCK
#define BLOCK 256
#endif

static_assert(M >= 1 && N >= 1, "layer norm needs a non-empty M x N input");
static_assert(BLOCK >= 1 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK: power of 2");

/* Tree sum over the block; every thread gets the result. */
__device__ ACC block_sum(ACC v, ACC *buf)
{
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    ACC result = buf[0];
    __syncthreads();
    return result;
}

extern "C" __global__ void layernorm_kernel(const DTYPE *__restrict__ x,
                                            const DTYPE *__restrict__ gamma,
                                            const DTYPE *__restrict__ beta,
                                            DTYPE *__restrict__ y)
{
    __shared__ ACC buf[BLOCK];
    const DTYPE *row = x + (long)blockIdx.x * N;
    DTYPE *out = y + (long)blockIdx.x * N;

    ACC local = 0;
    for (int j = threadIdx.x; j < N; j += BLOCK)
        local += (ACC)row[j];
    const ACC mean = block_sum(local, buf) / (ACC)N;

    local = 0;
    for (int j = threadIdx.x; j < N; j += BLOCK) {
        const ACC d = (ACC)row[j] - mean;
        local += d * d;
    }
    const ACC var = block_sum(local, buf) / (ACC)N;
    const ACC inv_std = (ACC)1 / sqrt(var + (ACC)EPS);

    for (int j = threadIdx.x; j < N; j += BLOCK) {
        const ACC norm = ((ACC)row[j] - mean) * inv_std;
        out[j] = (DTYPE)(norm * (ACC)gamma[j] + (ACC)beta[j]);
    }
}
