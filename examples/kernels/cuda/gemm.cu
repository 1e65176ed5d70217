/*
 * Matrix multiply: c[M][N] = a[M][K] x b[K][N] (row-major, no transposes), shared-memory tiles.
 *
 * Defines, all optional:
 *   DTYPE     element type (float; double; __half)        default float
 *   ACC       accumulation type (float or double)          default float
 *   M, K, N   shapes                                       default 64, 64, 64
 *   TILE      tile edge; blocks are TILE x TILE threads    default 16
 * Entry: gemm_kernel(const DTYPE *a, const DTYPE *b, DTYPE *c);
 * launch <<<dim3((N + TILE - 1) / TILE, (M + TILE - 1) / TILE), dim3(TILE, TILE)>>>.
 */
#include <cuda_fp16.h>

#ifndef DTYPE
#define DTYPE float
#endif
#ifndef ACC
#define ACC float
#endif
#ifndef M
#define M 64
#endif
#ifndef K
#define K 64
#endif
#ifndef N
#define N 64
#endif
#ifndef TILE
#define TILE 16
#endif

static_assert(M >= 1 && K >= 1 && N >= 1, "gemm needs non-empty shapes");
static_assert(TILE >= 1 && TILE * TILE <= 1024, "TILE x TILE threads must fit in a block");

extern "C" __global__ void gemm_kernel(const DTYPE *__restrict__ a, const DTYPE *__restrict__ b,
                                       DTYPE *__restrict__ c)
{
    __shared__ ACC tile_a[TILE][TILE];
    __shared__ ACC tile_b[TILE][TILE];
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    ACC acc = 0;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int ka = k0 + threadIdx.x;
        const int kb = k0 + threadIdx.y;
        tile_a[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? (ACC)a[row * K + ka] : (ACC)0;
        tile_b[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? (ACC)b[kb * N + col] : (ACC)0;
        __syncthreads();
        for (int k = 0; k < TILE; ++k)
            acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N)
        c[row * N + col] = (DTYPE)acc;
}
