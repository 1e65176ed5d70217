/*
 * Sum over the last axis: y[i] = sum_j x[i][j] (ReduceSum with axes = [-1], keep_dims false).
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; _Float16)        default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x reduced length                          default 1 x 4096
 * Entry: reduce_sum_kernel(const DTYPE *x, DTYPE *y), x row-major M x N, y of M elements.
 */
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

_Static_assert(M >= 1 && N >= 1, "reduce_sum needs a non-empty M x N input");

void reduce_sum_kernel(const DTYPE *restrict x, DTYPE *restrict y)
{
    for (long i = 0; i < M; ++i) {
        ACC sum = 0;
        for (long j = 0; j < N; ++j)
            sum += (ACC)x[i * N + j];
        y[i] = (DTYPE)sum;
    }
}
