/*
 * Layer normalisation over the last axis:
 *   y[i][j] = (x[i][j] - mean_i) / sqrt(var_i + EPS) * gamma[j] + beta[j]
 * with mean_i and the biased variance var_i taken over row i.
 *
 * Defines, all optional:
 *   DTYPE   element type (float; double; _Float16)        default float
 *   ACC     accumulation type (float or double)            default float
 *   M, N    rows x normalised length                       default 1 x 1024
 *   EPS     epsilon added to the variance                  default 1e-5
 * Entry: layernorm_kernel(const DTYPE *x, const DTYPE *gamma, const DTYPE *beta, DTYPE *y).
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
#ifndef EPS
#define EPS 1e-5
#endif

_Static_assert(M >= 1 && N >= 1, "layer norm needs a non-empty M x N input");

void layernorm_kernel(const DTYPE *restrict x, const DTYPE *restrict gamma,
                      const DTYPE *restrict beta, DTYPE *restrict y)
{
    for (long i = 0; i < M; ++i) {
        const DTYPE *row = x + i * N;
        ACC mean = 0;
        for (long j = 0; j < N; ++j)
            mean += (ACC)row[j];
        mean /= (ACC)N;
        ACC var = 0;
        for (long j = 0; j < N; ++j) {
            ACC d = (ACC)row[j] - mean;
            var += d * d;
        }
        var /= (ACC)N;
        ACC inv_std = (ACC)1 / sqrt(var + (ACC)EPS);
        for (long j = 0; j < N; ++j) {
            ACC norm = ((ACC)row[j] - mean) * inv_std;
            y[i * N + j] = (DTYPE)(norm * (ACC)gamma[j] + (ACC)beta[j]);
        }
    }
}
