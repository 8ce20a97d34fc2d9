/* cpu_ref.c — the CPU reference executor: runs the global IR op by op in fp32,
 * rounding every stored value to its storage dtype as the GPU stores it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cpu_threads.h"
#include "ntprt.h"

static ntp_round_mode round_mode(ntp_dtype dt) {
  return dt == NTP_BF16 ? NTP_ROUND_BF16 : dt == NTP_FP16 ? NTP_ROUND_FP16 : NTP_ROUND_NONE;
}

enum { PAR_MIN = NTP_CPU_PAR_MIN };

/* This thread's share [lo, hi) of [0, n) in a parallel region: one contiguous chunk per thread,
 * so each thread sets up its odometer once at its chunk's start and then does what the serial
 * loop does. */
static void chunk_of(int64_t n, int64_t *lo, int64_t *hi) {
  int t = omp_get_thread_num(), nt = omp_get_num_threads();
  *lo = n * t / nt;
  *hi = n * (t + 1) / nt;
}

/* The multi-index of element k of a row-major box with extents ext[0..nd). */
static void unravel(int64_t k, int nd, const int64_t *ext, int64_t *idx) {
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = ext[d] ? k % ext[d] : 0;
    k = ext[d] ? k / ext[d] : 0;
  }
}

void ntp_init_slice(const ntp_module *m, int32_t value, const ntp_box *box, uint64_t seed, ntp_host_tensor *t) {
  const ntp_value *v = &m->values[value];
  const ntp_op *op = &m->ops[v->def];
  uint64_t h = ntp_name_hash(v->name);
  int nd = box->ndim;
  int64_t stride[NTP_MAX_RANK], ext[NTP_MAX_RANK], n = box_volume(box);
  int64_t st = 1; /* tensors may exceed 2^31 elements: 64-bit strides */
  for (int d = nd - 1; d >= 0; d--) {
    stride[d] = st;
    st *= v->shape.dim[d];
    ext[d] = box->hi[d] - box->lo[d];
  }
  int32_t range = op->attr.init.int_range > 0 ? op->attr.init.int_range : 1000;
  float center = op->code == IR_PARAM ? op->attr.init.center : 0.0f;
  float scale = op->code == IR_PARAM ? op->attr.init.scale : 1.0f;
  uint64_t key = v->dtype == NTP_I32 ? ntp_init_int_key(seed, h) : ntp_init_key(seed, h);
  const int64_t inner = nd ? ext[nd - 1] : 1;
  /* each element depends only on its global index, so chunks of the box are independent; a
   * chunk goes by runs along the last dim, where global indices are consecutive */
#pragma omp parallel if (n >= PAR_MIN)
  {
    int64_t idx[NTP_MAX_RANK] = {0}, k, k1;
    chunk_of(n, &k, &k1);
    unravel(k, nd, ext, idx);
    while (k < k1) {
      int64_t run = nd ? inner - idx[nd - 1] : 1;
      if (run > k1 - k) run = k1 - k;
      uint64_t g = 0; /* global index of element k */
      for (int d = 0; d < nd; d++) g += (uint64_t)((box->lo[d] + idx[d]) * stride[d]);
      if (v->dtype == NTP_I32)
        for (int64_t j = 0; j < run; j++) t->i[k + j] = ntp_init_int_at(key, g + (uint64_t)j, range);
      else ntp_init_uniform_run(key, g, run, center, scale, t->f + k);
      k += run;
      if (nd) idx[nd - 1] += run;
      for (int d = nd - 1; d > 0 && idx[d] >= ext[d]; d--) {
        idx[d] = 0;
        idx[d - 1]++;
      }
    }
  }
  if (v->dtype != NTP_I32) ntp_round_buf(t->f, (size_t)n, round_mode(v->dtype));
}

void ntp_init_tensor(const ntp_module *m, int32_t value, uint64_t seed, ntp_host_tensor *t) {
  ntp_box full = box_full(&m->values[value].shape);
  ntp_init_slice(m, value, &full, seed, t);
}

static bool alloc_tensor(const ntp_module *m, int32_t value, ntp_host_tensor *t) {
  const ntp_value *v = &m->values[value];
  size_t n = (size_t)shape_numel(&v->shape), bytes;
  *t = (ntp_host_tensor){.name = v->name, .dtype = v->dtype, .shape = v->shape};
  if (__builtin_mul_overflow(n ? n : 1, (size_t)4, &bytes)) return false; /* int32 and fp32 slots: 4 bytes */
  if (v->dtype == NTP_I32) t->i = malloc(bytes);
  else t->f = malloc(bytes);
  return t->i || t->f;
}

static void free_tensor(ntp_host_tensor *t) {
  free(t->f);
  free(t->i);
  t->f = NULL;
  t->i = NULL;
}

/* o[j] = x[j*ix] (op) y[j*iy], ix and iy 0 or 1: one loop per case, so that each vectorises */
static void binary_run(ir_opcode code, const float *x, int64_t ix, const float *y, int64_t iy, float *o, int64_t n) {
#define NTP_BIN_LOOP(EXPR)                                                  \
  do {                                                                      \
    if (ix && iy)                                                           \
      for (int64_t j = 0; j < n; j++) { float l = x[j], r = y[j]; o[j] = EXPR; } \
    else if (ix)                                                            \
      for (int64_t j = 0; j < n; j++) { float l = x[j], r = y[0]; o[j] = EXPR; } \
    else if (iy)                                                            \
      for (int64_t j = 0; j < n; j++) { float l = x[0], r = y[j]; o[j] = EXPR; } \
    else                                                                    \
      for (int64_t j = 0; j < n; j++) { float l = x[0], r = y[0]; o[j] = EXPR; } \
  } while (0)
  switch (code) {
  case IR_ADD: NTP_BIN_LOOP(l + r); break;
  case IR_SUB: NTP_BIN_LOOP(l - r); break;
  case IR_MUL: NTP_BIN_LOOP(l * r); break;
  default: NTP_BIN_LOOP(l / r); break;
  }
#undef NTP_BIN_LOOP
}

/* out = a (op) b with NumPy broadcasting, through per-dim strides (0 on broadcast dims). */
static void broadcast_binary(ir_opcode code, const ntp_host_tensor *a, const ntp_host_tensor *b, ntp_host_tensor *o) {
  int nd = o->shape.ndim;
  int64_t sa[NTP_MAX_RANK] = {0}, sb[NTP_MAX_RANK] = {0};
  int64_t stride_a = 1, stride_b = 1;
  for (int i = nd - 1; i >= 0; i--) {
    int ia = a->shape.ndim - nd + i, ib = b->shape.ndim - nd + i;
    int64_t da = ia >= 0 ? a->shape.dim[ia] : 1, db = ib >= 0 ? b->shape.dim[ib] : 1;
    sa[i] = da == 1 ? 0 : stride_a;
    sb[i] = db == 1 ? 0 : stride_b;
    stride_a *= da;
    stride_b *= db;
  }
  int64_t n = shape_numel(&o->shape);
  /* by runs along the last dim, where each operand either steps by 1 or stays (broadcast) */
  const int64_t inner = nd ? o->shape.dim[nd - 1] : 1, ia = nd ? sa[nd - 1] : 0, ib = nd ? sb[nd - 1] : 0;
#pragma omp parallel if (n >= PAR_MIN)
  {
    int64_t idx[NTP_MAX_RANK] = {0}, pa = 0, pb = 0, k, k1;
    chunk_of(n, &k, &k1);
    unravel(k, nd, o->shape.dim, idx);
    while (k < k1) {
      int64_t run = nd ? inner - idx[nd - 1] : 1;
      if (run > k1 - k) run = k1 - k;
      pa = pb = 0;
      for (int d = 0; d < nd; d++) {
        pa += idx[d] * sa[d];
        pb += idx[d] * sb[d];
      }
      binary_run(code, a->f + pa, ia, b->f + pb, ib, o->f + k, run);
      k += run;
      if (nd) idx[nd - 1] += run;
      for (int d = nd - 1; d > 0 && idx[d] >= o->shape.dim[d]; d--) {
        idx[d] = 0;
        idx[d - 1]++;
      }
    }
  }
}

static float unary(ir_opcode code, float x) {
  switch (code) {
  case IR_NEG: return -x;
  case IR_GELU: return ntp_gelu(x);
  case IR_RELU: return ntp_relu(x);
  case IR_SILU: return ntp_silu(x);
  case IR_SIGMOID: return ntp_sigmoid(x);
  case IR_TANH: return tanhf(x);
  default: return expf(x);
  }
}

/* ---- the ops: one small function per op, or per group of ops sharing a kernel, in a table
 * indexed by op code ---- */

/* One op's call: its result o, its arguments (a and b the first two), the result's element count
 * n and its last dim `last` (the row length of the row-wise ops); err and cap for a failure. */
typedef struct op_call {
  const ntp_op *op;
  ntp_host_tensor *o;
  const ntp_host_tensor *const *args;
  const ntp_host_tensor *a, *b;
  int64_t n, last;
  char *err;
  size_t cap;
} op_call;

/* An op's kernel: 0, or -1 with the message in c->err. */
typedef int (*op_kernel)(const op_call *c);

static int op_init(const op_call *c) {
  snprintf(c->err, c->cap, "%s is an initialisation, not an op", ir_op_name(c->op->code));
  return -1;
}

static int op_const(const op_call *c) {
  for (int64_t i = 0; i < c->n; i++) c->o->f[i] = (float)c->op->attr.cst.value;
  return 0;
}

static int op_gather(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  int64_t V = a->shape.dim[0], D = a->shape.dim[1];
  if (c->op->attr.gather.hi) { /* vocabulary-parallel shard */
    ntp_cpu_gather_range(a->f, b->i, c->o->f, c->n / D, D, c->op->attr.gather.lo, c->op->attr.gather.hi);
    return 0;
  }
  if (ntp_cpu_gather(a->f, b->i, c->o->f, c->n / D, D, V) != 0) {
    snprintf(c->err, c->cap, "token index out of range [0, %lld) in %s", (long long)V, b->name ? b->name : "gather");
    return -1;
  }
  return 0;
}

static int op_slice(const op_call *c) {
  const ntp_host_tensor *a = c->a;
  int ax = c->op->attr.slice.axis;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < ax; i++) outer *= a->shape.dim[i];
  for (int i = ax + 1; i < a->shape.ndim; i++) inner *= a->shape.dim[i];
  int64_t len = c->op->attr.slice.len, full = a->shape.dim[ax];
  for (int64_t i = 0; i < outer; i++)
    memcpy(c->o->f + i * len * inner, a->f + (i * full + c->op->attr.slice.start) * inner, (size_t)(len * inner) * sizeof(float));
  return 0;
}

static int op_reshape(const op_call *c) {
  memcpy(c->o->f, c->a->f, (size_t)c->n * sizeof(float));
  return 0;
}

static int op_matmul(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  bool tb = c->op->attr.mm.trans_b, ta = c->op->attr.mm.trans_a;
  int64_t K = a->shape.dim[a->shape.ndim - (ta ? 2 : 1)];
  int64_t M = ta ? a->shape.dim[a->shape.ndim - 1] : a->shape.ndim >= 2 ? a->shape.dim[a->shape.ndim - 2] : 1;
  int64_t N = b->shape.dim[b->shape.ndim - (tb ? 2 : 1)];
  int64_t batch = shape_numel(&a->shape) / (M * K);
  int64_t bstride = b->shape.ndim > 2 ? K * N : 0;
  if (ta) ntp_cpu_matmul_ta(a->f, b->f, c->o->f, batch, M, K, N, tb, bstride);
  else ntp_cpu_matmul(a->f, b->f, c->o->f, batch, M, K, N, tb, bstride);
  return 0;
}

/* add, sub, mul, div */
static int op_binary(const op_call *c) {
  broadcast_binary(c->op->code, c->a, c->b, c->o);
  return 0;
}

/* neg, gelu, relu, silu, sigmoid, tanh, exp */
static int op_unary(const op_call *c) {
  const ir_opcode code = c->op->code;
  const float *x = c->a->f;
  float *y = c->o->f;
  const int64_t n = c->n;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
  for (int64_t i = 0; i < n; i++) y[i] = unary(code, x[i]);
  return 0;
}

static int op_softmax(const op_call *c) {
  ntp_cpu_softmax(c->a->f, c->o->f, c->n / c->last, c->last);
  return 0;
}

static int op_layernorm(const op_call *c) {
  ntp_cpu_layernorm(c->a->f, c->o->f, c->n / c->last, c->last, c->op->attr.norm.eps);
  return 0;
}

static int op_rmsnorm(const op_call *c) {
  ntp_cpu_rmsnorm(c->a->f, c->o->f, c->n / c->last, c->last, c->op->attr.norm.eps);
  return 0;
}

static int op_rope(const op_call *c) {
  const ntp_host_tensor *a = c->a;
  ntp_cpu_rope_turn(a->f, c->o->f, a->shape.dim[0], a->shape.dim[1], a->shape.dim[2], a->shape.dim[3],
                    c->op->attr.rope.theta, c->op->attr.rope.pos0, c->op->attr.rope.inverse);
  return 0;
}

static int op_attention(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b, *v = c->args[2];
  const ntp_op *op = c->op;
  int64_t group = op->attr.attn.group ? op->attr.attn.group : a->shape.dim[2] / b->shape.dim[2];
  if (ntp_cpu_attention_heads(a->f, b->f, v->f, c->o->f, a->shape.dim[0], a->shape.dim[1], a->shape.dim[2],
                              b->shape.dim[2], a->shape.dim[3], op->attr.attn.causal, op->attr.attn.scale,
                              op->attr.attn.q_off, group, op->attr.attn.kv_off) != 0) {
    snprintf(c->err, c->cap, "attention: out of memory or kv heads not held");
    return -1;
  }
  return 0;
}

static int op_cross_entropy(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  double loss;
  int64_t count, bad = 0, v = a->shape.dim[a->shape.ndim - 1];
  if (ntp_cpu_cross_entropy(a->f, b->i, shape_numel(&b->shape), v, c->op->attr.ce.ignore, &loss, &count, &bad) != 0) {
    snprintf(c->err, c->cap, "cross_entropy: target %d (element %lld of %s) is outside [0, %lld)", b->i[bad],
             (long long)bad, b->name ? b->name : "the targets", (long long)v);
    return -1;
  }
  c->o->f[0] = (float)loss;
  return 0;
}

static int op_cross_entropy_grad(const op_call *c) {
  ntp_cpu_cross_entropy_grad(c->a->f, c->b->i, c->args[2]->f[0], c->o->f, c->n / c->last, c->last, c->op->attr.ce.ignore);
  return 0;
}

/* the vocabulary-parallel loss, forward and backward */
static int op_ce_stats(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  ntp_cpu_ce_stats(a->f, b->i, c->o->f, shape_numel(&b->shape), a->shape.dim[a->shape.ndim - 1], c->op->attr.ce.lo,
                   c->op->attr.ce.ignore);
  return 0;
}

static int op_ce_rows(const op_call *c) {
  ntp_cpu_ce_rows(c->a->f, c->b->i, c->o->f, c->a->shape.dim[0], c->a->shape.dim[1] / 4, c->op->attr.ce.ignore);
  return 0;
}

static int op_ce_mean(const op_call *c) {
  c->o->f[0] = ntp_cpu_ce_mean(c->a->f, c->a->shape.dim[0]);
  return 0;
}

static int op_ce_stats_grad(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  ntp_cpu_ce_stats_grad(a->f, b->i, c->args[2]->f, c->o->f, shape_numel(&b->shape), a->shape.dim[a->shape.ndim - 1],
                        c->op->attr.ce.lo, c->op->attr.ce.ignore);
  return 0;
}

static int op_ce_rows_grad(const op_call *c) {
  ntp_cpu_ce_rows_grad(c->a->f, c->b->i, c->args[2]->f, c->o->f, c->a->shape.dim[0], c->a->shape.dim[1] / 4,
                       c->op->attr.ce.ignore);
  return 0;
}

static int op_ce_mean_grad(const op_call *c) {
  ntp_cpu_ce_mean_grad(c->a->f, c->b->f[0], c->o->f, c->a->shape.dim[0]);
  return 0;
}

static int op_ce_count(const op_call *c) {
  ntp_cpu_ce_count(c->a->i, c->o->f, shape_numel(&c->a->shape), c->op->attr.ce.ignore);
  return 0;
}

static int op_ce_seed(const op_call *c) {
  ntp_cpu_ce_seed(c->a->f, c->o->f, c->a->shape.dim[0]);
  return 0;
}

static int op_sum_to(const op_call *c) {
  ntp_cpu_sum_to(c->a->f, c->a->shape.dim, c->a->shape.ndim, c->o->f, c->o->shape.dim, c->o->shape.ndim);
  return 0;
}

static int op_act_grad(const op_call *c) {
  static const char of[IR_OP_COUNT] = {[IR_GELU] = 'g', [IR_RELU] = 'r', [IR_SILU] = 's', [IR_SIGMOID] = 'S',
                                       [IR_TANH] = 't', [IR_EXP] = 'e', [IR_NEG] = 'n'};
  ntp_cpu_act_grad(of[c->op->attr.grad.of], c->a->f, c->b->f, c->o->f, c->n);
  return 0;
}

static int op_softmax_grad(const op_call *c) {
  ntp_cpu_softmax_grad(c->a->f, c->b->f, c->o->f, c->n / c->last, c->last);
  return 0;
}

static int op_layernorm_grad(const op_call *c) {
  ntp_cpu_layernorm_grad(c->a->f, c->b->f, c->o->f, c->n / c->last, c->last, c->op->attr.norm.eps);
  return 0;
}

static int op_rmsnorm_grad(const op_call *c) {
  ntp_cpu_rmsnorm_grad(c->a->f, c->b->f, c->o->f, c->n / c->last, c->last, c->op->attr.norm.eps);
  return 0;
}

static int op_attention_grad(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  const ntp_op *op = c->op;
  int64_t group = op->attr.attn.group ? op->attr.attn.group : a->shape.dim[2] / b->shape.dim[2];
  if (ntp_cpu_attention_grad(a->f, b->f, c->args[2]->f, c->args[3]->f, c->o->f, op->attr.attn.which, a->shape.dim[0],
                             a->shape.dim[1], a->shape.dim[2], b->shape.dim[2], a->shape.dim[3], op->attr.attn.causal,
                             op->attr.attn.scale, op->attr.attn.q_off, group, op->attr.attn.kv_off) != 0) {
    snprintf(c->err, c->cap, "attention_grad: out of memory or kv heads not held");
    return -1;
  }
  return 0;
}

static int op_scatter_add(const op_call *c) {
  const ntp_host_tensor *a = c->a, *b = c->b;
  ntp_host_tensor *o = c->o;
  int64_t d = o->shape.dim[1], lo = c->op->attr.gather.hi ? c->op->attr.gather.lo : 0;
  if (ntp_cpu_scatter_add(a->i, b->f, o->f, shape_numel(&a->shape), d, lo, o->shape.dim[0]) != 0) {
    snprintf(c->err, c->cap, "scatter_add: out of memory");
    return -1;
  }
  return 0;
}

static int op_pad(const op_call *c) {
  ntp_host_tensor *o = c->o;
  int ax = c->op->attr.slice.axis;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < ax; i++) outer *= o->shape.dim[i];
  for (int i = ax + 1; i < o->shape.ndim; i++) inner *= o->shape.dim[i];
  int64_t len = c->op->attr.slice.len, full = o->shape.dim[ax];
  memset(o->f, 0, (size_t)c->n * sizeof(float));
  for (int64_t i = 0; i < outer; i++)
    memcpy(o->f + (i * full + c->op->attr.slice.start) * inner, c->a->f + i * len * inner, (size_t)(len * inner) * sizeof(float));
  return 0;
}

static const op_kernel op_kernels[IR_OP_COUNT] = {
    [IR_INPUT] = op_init,
    [IR_PARAM] = op_init,
    [IR_CONST] = op_const,
    [IR_GATHER] = op_gather,
    [IR_SLICE] = op_slice,
    [IR_RESHAPE] = op_reshape,
    [IR_MATMUL] = op_matmul,
    [IR_ADD] = op_binary,
    [IR_SUB] = op_binary,
    [IR_MUL] = op_binary,
    [IR_DIV] = op_binary,
    [IR_NEG] = op_unary,
    [IR_GELU] = op_unary,
    [IR_RELU] = op_unary,
    [IR_SILU] = op_unary,
    [IR_SIGMOID] = op_unary,
    [IR_TANH] = op_unary,
    [IR_EXP] = op_unary,
    [IR_SOFTMAX] = op_softmax,
    [IR_LAYERNORM] = op_layernorm,
    [IR_RMSNORM] = op_rmsnorm,
    [IR_ROPE] = op_rope,
    [IR_ATTENTION] = op_attention,
    [IR_CROSS_ENTROPY] = op_cross_entropy,
    [IR_SUM_TO] = op_sum_to,
    [IR_ACT_GRAD] = op_act_grad,
    [IR_SOFTMAX_GRAD] = op_softmax_grad,
    [IR_LAYERNORM_GRAD] = op_layernorm_grad,
    [IR_RMSNORM_GRAD] = op_rmsnorm_grad,
    [IR_ATTENTION_GRAD] = op_attention_grad,
    [IR_SCATTER_ADD] = op_scatter_add,
    [IR_PAD] = op_pad,
    [IR_CROSS_ENTROPY_GRAD] = op_cross_entropy_grad,
    [IR_CE_STATS] = op_ce_stats,
    [IR_CE_ROWS] = op_ce_rows,
    [IR_CE_MEAN] = op_ce_mean,
    [IR_CE_COUNT] = op_ce_count,
    [IR_CE_SEED] = op_ce_seed,
    [IR_CE_STATS_GRAD] = op_ce_stats_grad,
    [IR_CE_ROWS_GRAD] = op_ce_rows_grad,
    [IR_CE_MEAN_GRAD] = op_ce_mean_grad,
};

int ntp_exec_op(const ntp_op *op, ntp_host_tensor *o, const ntp_host_tensor *const *args, char *err, size_t cap) {
  op_call c = {.op = op, .o = o, .args = args, .err = err, .cap = cap};
  c.a = op->nargs > 0 ? args[0] : NULL;
  c.b = op->nargs > 1 ? args[1] : NULL;
  c.n = shape_numel(&o->shape);
  c.last = o->shape.ndim ? o->shape.dim[o->shape.ndim - 1] : 1;
  if ((unsigned)op->code < IR_OP_COUNT) { /* a code past the table: nothing, as IR_OP_COUNT was */
    op_kernel k = op_kernels[op->code];
    if (!k) { /* an op added to the IR without its entry above */
      snprintf(err, cap, "%s has no CPU kernel", ir_op_name(op->code));
      return -1;
    }
    if (k(&c) != 0) return -1;
  }
  ntp_round_buf(o->f, (size_t)c.n, round_mode(o->dtype));
  return 0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool ntp_host_tensor_copy(const ntp_host_tensor *src, const char *name, ntp_host_tensor *dst) {
  size_t n = (size_t)shape_numel(&src->shape), bytes = (n ? n : 1) * 4;
  *dst = *src;
  dst->name = name;
  dst->f = NULL;
  dst->i = NULL;
  void *p = malloc(bytes);
  if (!p) return false;
  memcpy(p, src->f ? (void *)src->f : (void *)src->i, bytes);
  if (src->f) dst->f = p;
  else dst->i = p;
  return true;
}

int ntp_cpu_run(const ntp_module *m, uint64_t seed, int keep_all, ntp_cpu_result *res, char *err, size_t cap) {
  return ntp_cpu_run_params(m, seed, keep_all, NULL, res, err, cap);
}

int ntp_cpu_run_params(const ntp_module *m, uint64_t seed, int keep_all, const ntp_safetensors *params,
                       ntp_cpu_result *res, char *err, size_t cap) {
  return ntp_cpu_run_given(m, seed, keep_all, params, NULL, res, err, cap);
}

/* A given global tensor as value v's: its shape checked, its values rounded to v's dtype. */
static int take_given(const ntp_module *m, int32_t v, const ntp_host_tensor *g, ntp_host_tensor *t, char *err,
                      size_t cap) {
  const ntp_value *val = &m->values[v];
  if (!shape_eq(&g->shape, &val->shape) || (val->dtype == NTP_I32) != (g->i != NULL)) {
    char a[96], b[96];
    snprintf(err, cap, "'%s': given %s%s, the model has %s%s", val->name ? val->name : "?",
             g->i ? "i32" : "float", shape_str(&g->shape, a, sizeof a), dtype_name(val->dtype),
             shape_str(&val->shape, b, sizeof b));
    return -1;
  }
  size_t n = (size_t)shape_numel(&val->shape);
  if (g->i) {
    memcpy(t->i, g->i, n * sizeof *t->i);
  } else {
    memcpy(t->f, g->f, n * sizeof *t->f);
    ntp_round_buf(t->f, n, round_mode(val->dtype));
  }
  return 0;
}

/* liveness: the op after which each value is read no more (INT32_MAX: kept to the end) */
static void last_uses(const ntp_module *m, int keep_all, int32_t *last_use) {
  for (size_t v = 0; v < m->n_values; v++) last_use[v] = (int32_t)m->values[v].def;
  for (size_t i = 0; i < m->n_ops; i++)
    for (int a = 0; a < m->ops[i].nargs; a++) last_use[m->ops[i].args[a]] = (int32_t)i;
  for (size_t o = 0; o < m->n_outputs; o++) last_use[m->outputs[o].value] = INT32_MAX;
  if (keep_all)
    for (size_t i = 0; i < m->n_ops; i++)
      if (m->ops[i].code == IR_INPUT || m->ops[i].code == IR_PARAM) last_use[m->ops[i].result] = INT32_MAX;
}

static double op_cost(const ntp_module *m, const ntp_op *op) {
  return ntp_op_cost(op, &m->values[op->result].shape, op->nargs ? &m->values[op->args[0]].shape : NULL);
}

/* The message for an op's value that the host has no memory for. */
static void out_of_host_memory(const ntp_module *m, const ntp_op *op, char *err, size_t cap) {
  const ntp_value *v = &m->values[op->result];
  char dims[160];
  size_t k = 0;
  for (int d = 0; d < v->shape.ndim && k < sizeof dims; d++)
    k += (size_t)snprintf(dims + k, sizeof dims - k, "%s%lld", d ? ", " : "", (long long)v->shape.dim[d]);
  snprintf(err, cap, "out of host memory for '%s' %s[%s] (%.3g bytes as fp32 values)%s%s",
           v->name && *v->name ? v->name : "a temporary", dtype_name(v->dtype), v->shape.ndim ? dims : "",
           (double)shape_numel(&v->shape) * 4.0, op->layer >= 0 ? " in layer " : "",
           op->layer >= 0 ? m->layers[op->layer] : "");
}

/* Op op's value into its allocated t[op->result]: an input or parameter given, read from params or
 * initialised; any other op executed on its operands. */
static int produce(const ntp_module *m, const ntp_op *op, uint64_t seed, const ntp_safetensors *params,
                   const ntp_host_tensor *const *given, ntp_host_tensor *t, char *err, size_t cap) {
  if ((op->code == IR_PARAM || op->code == IR_INPUT) && given && given[op->result]) {
    if (take_given(m, op->result, given[op->result], &t[op->result], err, cap) != 0) return -1;
  } else if (op->code == IR_PARAM && params) {
    const ntp_value *v = &m->values[op->result];
    ntp_box full = box_full(&v->shape);
    if (ntp_safetensors_read_box(params, v->name, v->dtype, &v->shape, &full, t[op->result].f, err, cap) != 0) return -1;
  } else if (op->code == IR_INPUT || op->code == IR_PARAM) {
    ntp_init_tensor(m, op->result, seed, &t[op->result]);
  } else {
    const ntp_host_tensor *args[NTP_MAX_ARGS];
    for (int a = 0; a < op->nargs; a++) args[a] = &t[op->args[a]];
    if (ntp_exec_op(op, &t[op->result], args, err, cap) != 0) return -1;
  }
  return 0;
}

/* Frees the operands of op i that no later op reads; the seconds spent freeing inputs and
 * parameters. */
static double free_dead_operands(const ntp_module *m, size_t i, const int32_t *last_use, ntp_host_tensor *t) {
  const ntp_op *op = &m->ops[i];
  double init_time = 0;
  for (int a = 0; a < op->nargs; a++)
    if (last_use[op->args[a]] == (int32_t)i) {
      /* returning a parameter's pages to the system is teardown of the initialisation, not
       * forward work (a framework keeps its weights), so it is timed with the init: on the
       * Llama-3 8B architecture at 2 blocks, freeing its 6 GB of fp32 weights took 1.3 s
       * beside 5.6 s of forward on a loaded 2-core machine (GPT-2 124M: 0.02 s). */
      ir_opcode c = m->ops[m->values[op->args[a]].def].code;
      double tf = c == IR_PARAM || c == IR_INPUT ? now_seconds() : 0;
      free_tensor(&t[op->args[a]]);
      if (tf) init_time += now_seconds() - tf;
    }
  return init_time;
}

/* The outputs into res, and with keep_all the inputs and parameters: copies of what t holds. */
static bool keep_results(const ntp_module *m, int keep_all, const ntp_host_tensor *t, ntp_cpu_result *res) {
  res->outputs = calloc(m->n_outputs ? m->n_outputs : 1, sizeof *res->outputs);
  if (!res->outputs) return false;
  for (size_t o = 0; o < m->n_outputs; o++) {
    if (!ntp_host_tensor_copy(&t[m->outputs[o].value], m->outputs[o].name, &res->outputs[o])) return false;
    res->n_outputs++;
  }
  if (keep_all) {
    res->inputs = calloc(m->n_ops, sizeof *res->inputs);
    res->params = calloc(m->n_ops, sizeof *res->params);
    if (!res->inputs || !res->params) return false;
    for (size_t i = 0; i < m->n_ops; i++) {
      const ntp_op *op = &m->ops[i];
      if (op->code == IR_INPUT && ntp_host_tensor_copy(&t[op->result], m->values[op->result].name, &res->inputs[res->n_inputs]))
        res->n_inputs++;
      if (op->code == IR_PARAM && ntp_host_tensor_copy(&t[op->result], m->values[op->result].name, &res->params[res->n_params]))
        res->n_params++;
    }
  }
  return true;
}

int ntp_cpu_run_given(const ntp_module *m, uint64_t seed, int keep_all, const ntp_safetensors *params,
                      const ntp_host_tensor *const *given, ntp_cpu_result *res, char *err, size_t cap) {
  *res = (ntp_cpu_result){0};
  size_t nv = m->n_values;
  ntp_host_tensor *t = calloc(nv ? nv : 1, sizeof *t);
  int32_t *last_use = malloc((nv ? nv : 1) * sizeof *last_use);
  int rc = -1;
  ntp_progress prog = {0};
  if (!t || !last_use) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  /* liveness: free each intermediate after its last reader */
  last_uses(m, keep_all, last_use);

  double t0 = 0, init_time = 0, total_cost = 0, cost_done = 0;
  for (size_t i = 0; i < m->n_ops; i++) total_cost += op_cost(m, &m->ops[i]);
  ntp_progress_begin(&prog, "cpu reference", total_cost, (int32_t)m->n_layers);
  t0 = now_seconds();
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    ntp_progress_update(&prog, cost_done, op->layer, op->layer >= 0 ? m->layers[op->layer] : NULL);
    cost_done += op_cost(m, op);
    if (!alloc_tensor(m, op->result, &t[op->result])) {
      out_of_host_memory(m, op, err, cap);
      goto done;
    }
    double ti = op->code == IR_INPUT || op->code == IR_PARAM ? now_seconds() : 0;
    if (produce(m, op, seed, params, given, t, err, cap) != 0) goto done;
    if (ti) init_time += now_seconds() - ti;
    init_time += free_dead_operands(m, i, last_use, t);
  }
  res->seconds = now_seconds() - t0 - init_time;
  ntp_progress_end(&prog);

  if (!keep_results(m, keep_all, t, res)) goto done;
  rc = 0;
done:
  ntp_progress_end(&prog);
  for (size_t v = 0; t && v < nv; v++) free_tensor(&t[v]);
  free(t);
  free(last_use);
  if (rc != 0) ntp_cpu_result_free(res);
  return rc;
}

void ntp_cpu_result_free(ntp_cpu_result *res) {
  ntp_host_tensor *lists[3] = {res->outputs, res->inputs, res->params};
  size_t counts[3] = {res->n_outputs, res->n_inputs, res->n_params};
  for (int l = 0; l < 3; l++) {
    for (size_t i = 0; lists[l] && i < counts[l]; i++) free_tensor(&lists[l][i]);
    free(lists[l]);
  }
  *res = (ntp_cpu_result){0};
}
