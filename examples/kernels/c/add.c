/*
 * Elementwise sum with broadcast: out[M][N] = a[A_M][A_N] + b[B_M][B_N].
 *
 * Shapes are a rank-2 view of the op's tensors (a rank-1 tensor of n elements is 1 x n);
 * each input dim is either the output dim or 1 (numpy broadcast). Defines, all optional:
 *   DTYPE            element type (float; double; _Float16 for float16)   default float
 *   M, N             output shape                                          default 1 x 4096
 *   A_M, A_N         shape of a                                            default M, N
 *   B_M, B_N         shape of b                                            default M, N
 * Entry: add_kernel(const DTYPE *a, const DTYPE *b, DTYPE *out), row-major buffers.
 */
#ifndef DTYPE
#define DTYPE float
#endif
#ifndef M
#define M 1
#endif
#ifndef N
#define N 4096
#endif
#ifndef A_M
#define A_M M
#endif
#ifndef A_N
#define A_N N
#endif
#ifndef B_M
#define B_M M
#endif
#ifndef B_N
#define B_N N
#endif

_Static_assert((A_M == M || A_M == 1) && (A_N == N || A_N == 1), "a does not broadcast to M x N");
_Static_assert((B_M == M || B_M == 1) && (B_N == N || B_N == 1), "b does not broadcast to M x N");

/* Index of element (i, j) of an input of shape dm x dn broadcast to M x N. */
#define BCAST_INDEX(i, j, dm, dn) (((dm) == 1 ? 0 : (i)) * (dn) + ((dn) == 1 ? 0 : (j)))

void add_kernel(const DTYPE *restrict a, const DTYPE *restrict b, DTYPE *restrict out)
{
    for (long i = 0; i < M; ++i) {
        for (long j = 0; j < N; ++j) {
            DTYPE x = a[BCAST_INDEX(i, j, A_M, A_N)];
            DTYPE y = b[BCAST_INDEX(i, j, B_M, B_N)];
            out[i * N + j] = x + y;
        }
    }
}
