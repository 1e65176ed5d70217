/*
 * Softmax over the last axis: y[i][j] = exp(x[i][j] - max_i) / sum_k exp(x[i][k] - max_i).
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; _Float16)        default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x length of the softmax axis              default 1 x 1024
 * Entry: softmax_kernel(const DTYPE *x, DTYPE *y), row-major M x N buffers.
 */
#include <tgmath.h>

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

_Static_assert(M >= 1 && N >= 1, "softmax needs a non-empty M x N input");

void softmax_kernel(const DTYPE *restrict x, DTYPE *restrict y)
{
    for (long i = 0; i < M; ++i) {
        const DTYPE *row = x + i * N;
        ACC max = (ACC)row[0];
        for (long j = 1; j < N; ++j) {
            if ((ACC)row[j] > max)
                max = (ACC)row[j];
        }
        ACC sum = 0;
        for (long j = 0; j < N; ++j)
            sum += exp((ACC)row[j] - max);
        for (long j = 0; j < N; ++j)
            y[i * N + j] = (DTYPE)(exp((ACC)row[j] - max) / sum);
    }
}
