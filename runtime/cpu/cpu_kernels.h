/* CPU reference kernels: the numeric oracle every GPU / sharded result is
 * compared against. C17, fp32 in and out; GEMMs through the BLAS (OpenBLAS), the
 * other kernels OpenMP loops over rows or elements. Every result is independent of
 * the number of threads except where a function says otherwise (the BLAS's
 * summation order within a GEMM).
 *
 * Conventions shared by all kernels:
 *   - tensors are dense, row-major; sizes and strides are in elements;
 *   - sizes <= 0 mean "nothing to do" (no output is written);
 *   - inputs and outputs must not overlap unless a function says in-place is
 *     allowed. */
#ifndef NTP_CPU_KERNELS_H
#define NTP_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Work below this many elements (or multiply-adds) stays on one thread. Waking the pool
 * costs microseconds on an idle machine, and on a machine whose cores are busy with other
 * processes each parallel region can cost a scheduler time slice: the tests' toy models,
 * thousands of small ops, ran 4x slower threaded than serial there. 2^17 elements are
 * some 0.1 ms of single-thread work, where threads start to pay. */
enum { NTP_CPU_PAR_MIN = 1 << 17 };

/* ---- storage-dtype rounding ------------------------------------------- */

typedef enum { NTP_ROUND_NONE, NTP_ROUND_BF16, NTP_ROUND_FP16 } ntp_round_mode;

/* Round-to-nearest-even to bf16, returned as a float. NaN stays NaN (quiet,
 * sign kept), +-inf stays +-inf, finite values past the bf16 max round to inf. */
float ntp_round_bf16(float x);
/* Round-to-nearest-even to IEEE binary16, incl. subnormals (quantum 2^-24);
 * |x| >= 65520 rounds to +-inf; underflow keeps the sign (-0). */
float ntp_round_fp16(float x);
/* Rounds x[0..n) in place; NTP_ROUND_NONE leaves it untouched. */
void ntp_round_buf(float *x, size_t n, ntp_round_mode m);

/* ---- deterministic, counter-based init --------------------------------- */
/* Values depend only on (seed, name, global element index), so every shard
 * regenerates exactly its slice of the same global tensor. */

/* FNV-1a 64-bit hash of a NUL-terminated name (NULL hashes like ""). */
uint64_t ntp_name_hash(const char *name);
/* Uniform in the open interval (-1, 1) on a grid of 2^-23 offset by 2^-24:
 * symmetric about 0, never exactly 0, and exactly representable in fp32. */
float ntp_init_uniform(uint64_t seed, uint64_t name_hash, uint64_t index);
/* Uniform in [0, range); returns 0 when range <= 0. */
int32_t ntp_init_int(uint64_t seed, uint64_t name_hash, uint64_t index, int32_t range);
/* The same with the (seed, name) part computed once per tensor: ntp_init_uniform(seed, h, i) ==
 * ntp_init_uniform_key(ntp_init_key(seed, h), i), and likewise for the integers. */
uint64_t ntp_init_key(uint64_t seed, uint64_t name_hash);
float ntp_init_uniform_key(uint64_t key, uint64_t index);
/* A standard normal draw for element `index` of the tensor keyed `key` (counter-based, as the
 * uniform one: the same value whatever the sharding). */
double ntp_init_normal_key(uint64_t key, uint64_t index);
uint64_t ntp_init_int_key(uint64_t seed, uint64_t name_hash);
int32_t ntp_init_int_at(uint64_t key, uint64_t index, int32_t range);
/* out[j] = center + scale * ntp_init_uniform_key(key, index0 + j) for j < n (fp32 arithmetic). */
void ntp_init_uniform_run(uint64_t key, uint64_t index0, int64_t n, float center, float scale, float *out);

/* ---- elementwise scalar functions (fp32) ------------------------------- */

/* tanh approximation (GPT-2): 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))) */
float ntp_gelu(float x);
float ntp_relu(float x);
float ntp_silu(float x);    /* x * sigmoid(x) */
float ntp_sigmoid(float x); /* overflow-free for any finite x */

/* ---- matmul ------------------------------------------------------------ */
/* c[bt][m][n] = sum_k a[bt][m][k] * B(bt)[k][n], B(bt) = b + bt*b_batch_stride
 * (stride 0 = one B shared by the whole batch: done as one GEMM of batch*m rows).
 * trans_b: b is stored [n][k]. sgemm of the BLAS: fp32 products and fp32
 * accumulation, in the BLAS's blocked order over k (fused multiply-adds). a and c
 * are dense batches (strides m*k and m*n). c must not overlap a or b. k and n must
 * fit an int (the BLAS's index type); m may not (rows go in chunks). */
void ntp_cpu_matmul(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t k,
                    int64_t n, bool trans_b, int64_t b_batch_stride);

/* ---- row-wise normalisations over the last dim (in-place allowed) ------ */
/* Statistics are accumulated in double so the oracle is as exact as fp32
 * output allows. */

/* (x - mean) / sqrt(var + eps), biased variance, no affine. */
void ntp_cpu_layernorm(const float *x, float *y, int64_t rows, int64_t d, float eps);
/* x / sqrt(mean(x^2) + eps), no affine. */
void ntp_cpu_rmsnorm(const float *x, float *y, int64_t rows, int64_t d, float eps);
/* Max-subtracted softmax. -inf entries get 0; a row that is all -inf gets
 * all zeros (rather than NaN) so fully masked rows stay finite. */
void ntp_cpu_softmax(const float *x, float *y, int64_t rows, int64_t d);

/* ---- rotary position embedding (in-place allowed) ---------------------- */
/* x, y: [b][s][h][hd]. Rotate-half (HF / Llama) convention: for i < hd/2 the
 * pair (i, i+hd/2) is rotated by angle = pos * theta^(-2i/hd), pos = the s
 * index:  y[i] = x[i]cos - x[i+hd/2]sin,  y[i+hd/2] = x[i+hd/2]cos + x[i]sin.
 * Angles are computed in double. hd must be even (the checker guarantees it);
 * for odd hd the last element is passed through unrotated. */
void ntp_cpu_rope(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta);
/* The same with positions pos0 .. pos0+s-1: a shard holding a slice of the sequence. */
void ntp_cpu_rope_at(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta,
                     int64_t pos0);
/* The same, or with inverse the rotation by the opposite angles (RoPE's backward: a rotation's
 * transpose is its inverse). */
void ntp_cpu_rope_turn(const float *x, float *y, int64_t b, int64_t s, int64_t h, int64_t hd, float theta,
                       int64_t pos0, bool inverse);

/* ---- attention --------------------------------------------------------- */
/* q [b][s][h][hd], k, v [b][s][kv][hd], out [b][s][h][hd]. Query head j uses
 * kv head j / (h / kv). Scores = scale * q.k (fp32 GEMM over a tile of 64 query
 * rows), optional causal mask (key t <= query s), fp32 softmax per row, out = P V
 * (fp32 GEMM). 64*s floats of scratch per thread. out must not overlap q, k or v.
 * Returns 0 on success, -1 if kv <= 0 or h % kv != 0 or scratch allocation
 * fails (out is then not written). */
int ntp_cpu_attention(const float *q, const float *k, const float *v, float *out, int64_t b, int64_t s,
                      int64_t h, int64_t kv, int64_t hd, bool causal, float scale);

/* A head-sharded slice of the same: q holds global query heads q_off .. q_off+h-1, k and v
 * hold kv heads kv_off .. kv_off+kv-1, and query head n uses kv head n / group. Returns -1
 * if a query head's kv head is not held. */
int ntp_cpu_attention_heads(const float *q, const float *k, const float *v, float *out, int64_t b, int64_t s,
                            int64_t h, int64_t kv, int64_t hd, bool causal, float scale, int64_t q_off,
                            int64_t group, int64_t kv_off);

/* ---- embedding gather -------------------------------------------------- */
/* out[i][:] = table[idx[i]][:]. Returns -1 at the first idx outside
 * [0, vocab) (rows before it are written, nothing after), else 0. */
int ntp_cpu_gather(const float *table, const int32_t *idx, float *out, int64_t n_idx, int64_t d,
                   int64_t vocab);

/* Vocabulary-parallel gather: this shard holds table rows lo .. hi-1; indices outside
 * give zero rows (another shard supplies them; a sum over shards completes the lookup). */
void ntp_cpu_gather_range(const float *table, const int32_t *idx, float *out, int64_t n_idx, int64_t d, int64_t lo,
                          int64_t hi);

/* ---- backward kernels (cpu_grad.c) ------------------------------------ */
/* The vector-Jacobian products of the ops above, for the gradient pass's ops. Sums over
 * many terms (reductions, scatter-adds, attention) accumulate in double, so the oracle's
 * gradients are as exact as fp32 output allows; every result is independent of the number
 * of threads. */

/* c[bt][m][n] = sum_k a[bt][k][m] * B(bt)[k][n] (a transposed: stored [k][m]); trans_b and
 * b_batch_stride as in ntp_cpu_matmul. */
void ntp_cpu_matmul_ta(const float *a, const float *b, float *c, int64_t batch, int64_t m, int64_t k, int64_t n,
                       bool trans_b, int64_t b_batch_stride);
/* y (dims ydim[0..nd), right-aligned to x's, each 1 or equal) = x summed over the dims it
 * broadcasts along. */
void ntp_cpu_sum_to(const float *x, const int64_t *xdim, int xnd, float *y, const int64_t *ydim, int ynd);
/* dx = dy * f'(u), u the forward op's input x, or for tanh, sigmoid and exp its result y. of:
 * 'g' gelu, 'r' relu, 's' silu, 'S' sigmoid, 't' tanh, 'e' exp, 'n' neg. */
void ntp_cpu_act_grad(char of, const float *u, const float *dy, float *dx, int64_t n);
/* softmax's: dx = y * (dy - sum(dy * y)) per row of d */
void ntp_cpu_softmax_grad(const float *y, const float *dy, float *dx, int64_t rows, int64_t d);
void ntp_cpu_layernorm_grad(const float *x, const float *dy, float *dx, int64_t rows, int64_t d, float eps);
void ntp_cpu_rmsnorm_grad(const float *x, const float *dy, float *dx, int64_t rows, int64_t d, float eps);
/* One of attention's three gradients (which: 0 dq [b][s][h][hd], 1 dk, 2 dv [b][s][kv][hd]), for
 * the head mapping of ntp_cpu_attention_heads. -1 when a query head's kv head is not held or
 * scratch memory fails. */
int ntp_cpu_attention_grad(const float *q, const float *k, const float *v, const float *dy, float *out, int which,
                           int64_t b, int64_t s, int64_t h, int64_t kv, int64_t hd, bool causal, float scale,
                           int64_t q_off, int64_t group, int64_t kv_off);
/* table[v][:] = sum of rows[i][:] over i with idx[i] == v + lo, for table rows lo .. lo+vrows-1
 * (a gather's backward; other indices belong to other shards). -1 when memory fails. */
int ntp_cpu_scatter_add(const int32_t *idx, const float *rows, float *table, int64_t n_idx, int64_t d, int64_t lo,
                        int64_t vrows);
/* Mean over rows (of v logits) whose target is not `ignore` of logsumexp - logit[target];
 * *count: those rows. -1 at a target outside [0, v) (other than ignore): *bad is its row. */
int ntp_cpu_cross_entropy(const float *logits, const int32_t *targets, int64_t rows, int64_t v, int64_t ignore,
                          double *loss, int64_t *count, int64_t *bad);
/* dlogits = (softmax(row) - onehot(target)) * g / count; ignored rows 0. */
void ntp_cpu_cross_entropy_grad(const float *logits, const int32_t *targets, float g, float *dlogits, int64_t rows,
                                int64_t v, int64_t ignore);

/* ---- the vocabulary-parallel loss (cpu_loss.c; the ops' definitions: ntp_types.h) ---- */
/* per row of a slice of v logits from vocabulary row lo: max, sum exp(l - max), the target's
 * logit if held (else 0), held (1 or 0) */
void ntp_cpu_ce_stats(const float *logits, const int32_t *targets, float *stats, int64_t rows, int64_t v, int64_t lo,
                      int64_t ignore);
/* part = (sum over rows not ignored of logsumexp - target logit, their count), from t ranks'
 * stats per row; the sum is NaN when a counted row's target is held by no rank */
void ntp_cpu_ce_rows(const float *stats, const int32_t *targets, float *part, int64_t rows, int64_t t, int64_t ignore);
float ntp_cpu_ce_mean(const float *parts, int64_t blocks);
void ntp_cpu_ce_stats_grad(const float *logits, const int32_t *targets, const float *dstats, float *dlogits,
                           int64_t rows, int64_t v, int64_t lo, int64_t ignore);
void ntp_cpu_ce_rows_grad(const float *stats, const int32_t *targets, const float *dpart, float *dstats, int64_t rows,
                          int64_t t, int64_t ignore);
void ntp_cpu_ce_mean_grad(const float *parts, float dloss, float *dparts, int64_t blocks);
void ntp_cpu_ce_count(const int32_t *targets, float *out, int64_t rows, int64_t ignore);
void ntp_cpu_ce_seed(const float *counts, float *out, int64_t n_counts);

#ifdef __cplusplus
}
#endif

#endif /* NTP_CPU_KERNELS_H */
