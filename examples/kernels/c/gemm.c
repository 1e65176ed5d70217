/*
 * Matrix multiply: c[M][N] = a[M][K] x b[K][N] (row-major, no transposes).
 *
 * Defines, all optional:
 *   DTYPE     element type (float; double; _Float16)      default float
 *   ACC       accumulation type (float or double)          default float
 *   M, K, N   shapes                                       default 64, 64, 64
 * Entry: gemm_kernel(const DTYPE *a, const DTYPE *b, DTYPE *c).
 */
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

_Static_assert(M >= 1 && K >= 1 && N >= 1, "gemm needs non-empty shapes");

void gemm_kernel(const DTYPE *restrict a, const DTYPE *restrict b, DTYPE *restrict c)
{
    for (long i = 0; i < M; ++i) {
        for (long j = 0; j < N; ++j) {
            ACC acc = 0;
            for (long k = 0; k < K; ++k)
                acc += (ACC)a[i * K + k] * (ACC)b[k * N + j];
            c[i * N + j] = (DTYPE)acc;
        }
    }
}
