/* ir_shape.c — shape and dtype rules of every op, shared by lowering (which reports
 * errors at the source) and the verifier (which re-derives every result).
 *
 * One rule per op, as a table indexed by the op (built from the op table's X-macro, so an op
 * without a rule does not compile); ops that obey the same rule share its function. */
#include <stdio.h>

#include "ir.h"

/* What a rule reads (the op, its module for the declared result and the operands past the
 * second, its first two operands, NULL when absent) and where it writes. */
typedef struct shape_query {
  const ir_module *m;
  const ir_op *op;
  const ir_value *a, *b;
  ntp_shape *shape;
  ntp_dtype *dt;
  char *err;
  size_t cap;
} shape_query;

typedef bool shape_rule(const shape_query *q);

/* NumPy broadcasting of two shapes. */
static bool broadcast(const ntp_shape *a, const ntp_shape *b, ntp_shape *out) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  out->ndim = n;
  for (int i = 0; i < n; i++) {
    int ia = a->ndim - n + i, ib = b->ndim - n + i;
    int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out->dim[i] = da == 1 ? db : da;
  }
  return true;
}

/* a's leading dims (all but its last) equal b's dims */
static bool same_lead(const ntp_shape *a, const ntp_shape *b) {
  if (a->ndim < 1 || b->ndim != a->ndim - 1) return false;
  for (int i = 0; i < b->ndim; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

static const ir_value *operand(const shape_query *q, int i) { return &q->m->values[q->op->args[i]]; }
static ntp_shape declared(const shape_query *q) { return q->m->values[q->op->result].shape; }
static const char *name(const shape_query *q) { return ir_op_name(q->op->code); }

static bool result(const shape_query *q, ntp_shape shape, ntp_dtype dt) {
  *q->shape = shape;
  *q->dt = dt;
  return true;
}

/* ---- sources and data movement ---------------------------------------------------------- */

/* inputs, params and constants are what they were declared */
static bool infer_declared(const shape_query *q) { return result(q, declared(q), q->m->values[q->op->result].dtype); }

static bool infer_gather(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  char sa[96];
  if (b->dtype != NTP_I32)
    return ir_fail(q->err, q->cap, "embedding indices must be i32, got %s", dtype_name(b->dtype));
  if (a->shape.ndim != 2)
    return ir_fail(q->err, q->cap, "embedding table must be 2-D, got %s", shape_str(&a->shape, sa, sizeof sa));
  if (b->shape.ndim + 1 > NTP_MAX_RANK) return ir_fail(q->err, q->cap, "too many dims");
  ntp_shape s = b->shape;
  s.dim[s.ndim++] = a->shape.dim[1];
  return result(q, s, a->dtype);
}

static bool infer_slice(const shape_query *q) {
  const ir_value *a = q->a;
  int ax = q->op->attr.slice.axis;
  int64_t start = q->op->attr.slice.start, len = q->op->attr.slice.len;
  if (ax < 0 || ax >= a->shape.ndim) return ir_fail(q->err, q->cap, "slice axis %d out of range", ax);
  if (start < 0 || len < 1 || start + len > a->shape.dim[ax])
    return ir_fail(q->err, q->cap, "slice [%lld, %lld) outside dim of size %lld", (long long)start,
                   (long long)(start + len), (long long)a->shape.dim[ax]);
  ntp_shape s = a->shape;
  s.dim[ax] = len;
  return result(q, s, a->dtype);
}

static bool infer_reshape(const shape_query *q) {
  ntp_shape s = declared(q);
  char sa[96], sb[96];
  if (shape_numel(&s) != shape_numel(&q->a->shape))
    return ir_fail(q->err, q->cap, "cannot reshape %s to %s", shape_str(&q->a->shape, sa, sizeof sa),
                   shape_str(&s, sb, sizeof sb));
  return result(q, s, q->a->dtype);
}

/* the result shape must be one that broadcasts to the operand's */
static bool infer_sum_to(const shape_query *q) {
  ntp_shape r = declared(q), bc;
  char sa[96], sb[96];
  if (!broadcast(&r, &q->a->shape, &bc) || !shape_eq(&bc, &q->a->shape))
    return ir_fail(q->err, q->cap, "sum_to %s from %s: not a broadcast of it", shape_str(&r, sb, sizeof sb),
                   shape_str(&q->a->shape, sa, sizeof sa));
  return result(q, r, q->a->dtype);
}

/* the operand placed at [start, start + len) of the declared result's axis */
static bool infer_pad(const shape_query *q) {
  const ir_value *a = q->a;
  const ntp_op_attr *at = &q->op->attr;
  ntp_shape r = declared(q);
  int ax = at->slice.axis;
  char sa[96], sb[96];
  bool ok = ax >= 0 && ax < r.ndim && r.ndim == a->shape.ndim && at->slice.len == a->shape.dim[ax] &&
            at->slice.start >= 0 && at->slice.start + at->slice.len <= r.dim[ax];
  for (int d = 0; ok && d < r.ndim; d++) ok = d == ax || r.dim[d] == a->shape.dim[d];
  if (!ok)
    return ir_fail(q->err, q->cap, "pad %s into %s: not a slice of it", shape_str(&a->shape, sa, sizeof sa),
                   shape_str(&r, sb, sizeof sb));
  return result(q, r, a->dtype);
}

static bool infer_scatter_add(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  ntp_shape r = declared(q);
  if (a->dtype != NTP_I32 || r.ndim != 2 || b->shape.ndim != a->shape.ndim + 1 || !same_lead(&b->shape, &a->shape) ||
      b->shape.dim[b->shape.ndim - 1] != r.dim[1])
    return ir_fail(q->err, q->cap, "scatter_add needs i32 indices [...], rows [..., D] and a table [V, D]");
  return result(q, r, b->dtype);
}

/* ---- arithmetic ------------------------------------------------------------------------- */

static bool infer_matmul(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  const bool ta = q->op->attr.mm.trans_a, tb = q->op->attr.mm.trans_b;
  char sa[96], sb[96];
  if (a->dtype != b->dtype || !dtype_is_float(a->dtype))
    return ir_fail(q->err, q->cap, "matmul operands must share a float dtype, got %s and %s", dtype_name(a->dtype),
                   dtype_name(b->dtype));
  if (a->shape.ndim < 1) return ir_fail(q->err, q->cap, "matmul needs a left operand with at least 1 dim");
  if (b->shape.ndim < 2)
    return ir_fail(q->err, q->cap, "matmul right operand must have at least 2 dims, got %s",
                   shape_str(&b->shape, sb, sizeof sb));
  if (ta && a->shape.ndim < 2) return ir_fail(q->err, q->cap, "a transposed matmul operand needs at least 2 dims");
  int64_t bk = b->shape.dim[b->shape.ndim - (tb ? 1 : 2)];
  int64_t bn = b->shape.dim[b->shape.ndim - (tb ? 2 : 1)];
  int64_t ak = a->shape.dim[a->shape.ndim - (ta ? 2 : 1)];
  if (ak != bk)
    return ir_fail(q->err, q->cap, "matmul inner dims differ: %s @ %s%s (%lld vs %lld)",
                   shape_str(&a->shape, sa, sizeof sa), shape_str(&b->shape, sb, sizeof sb), tb ? " transposed" : "",
                   (long long)ak, (long long)bk);
  if (b->shape.ndim > 2) {
    /* batched right operand: leading dims must equal the left operand's */
    bool ok = a->shape.ndim == b->shape.ndim;
    for (int i = 0; ok && i < a->shape.ndim - 2; i++) ok = a->shape.dim[i] == b->shape.dim[i];
    if (!ok)
      return ir_fail(q->err, q->cap, "matmul batch dims differ: %s @ %s", shape_str(&a->shape, sa, sizeof sa),
                     shape_str(&b->shape, sb, sizeof sb));
  }
  ntp_shape s = a->shape;
  if (ta) s.dim[s.ndim - 2] = a->shape.dim[a->shape.ndim - 1];
  s.dim[s.ndim - 1] = bn;
  return result(q, s, a->dtype);
}

/* add, sub, mul, div: one float dtype, NumPy broadcasting */
static bool infer_binary(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  char sa[96], sb[96];
  if (a->dtype != b->dtype)
    return ir_fail(q->err, q->cap, "operands of '%s' have different dtypes: %s%s and %s%s", name(q),
                   dtype_name(a->dtype), shape_str(&a->shape, sa, sizeof sa), dtype_name(b->dtype),
                   shape_str(&b->shape, sb, sizeof sb));
  if (!dtype_is_float(a->dtype)) return ir_fail(q->err, q->cap, "'%s' needs float operands", name(q));
  ntp_shape s;
  if (!broadcast(&a->shape, &b->shape, &s))
    return ir_fail(q->err, q->cap, "shapes do not broadcast in '%s': %s%s vs %s%s", name(q), dtype_name(a->dtype),
                   shape_str(&a->shape, sa, sizeof sa), dtype_name(b->dtype), shape_str(&b->shape, sb, sizeof sb));
  return result(q, s, a->dtype);
}

/* elementwise functions of one float operand: its shape and dtype */
static bool infer_unary(const shape_query *q) {
  if (!dtype_is_float(q->a->dtype))
    return ir_fail(q->err, q->cap, "'%s' needs a float operand, got %s", name(q), dtype_name(q->a->dtype));
  return result(q, q->a->shape, q->a->dtype);
}

/* softmax and the norms: unary, over the last dim, which must exist */
static bool infer_over_last_dim(const shape_query *q) {
  if (!infer_unary(q)) return false;
  if (q->a->shape.ndim < 1) return ir_fail(q->err, q->cap, "'%s' needs at least one dim", name(q));
  return true;
}

static bool infer_rope(const shape_query *q) {
  const ir_value *a = q->a;
  char sa[96];
  if (a->shape.ndim != 4)
    return ir_fail(q->err, q->cap, "rope needs [B, S, H, HD], got %s", shape_str(&a->shape, sa, sizeof sa));
  if (a->shape.dim[3] % 2)
    return ir_fail(q->err, q->cap, "rope needs an even head dim, got %lld", (long long)a->shape.dim[3]);
  return result(q, a->shape, a->dtype);
}

static bool infer_attention(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b, *v = operand(q, 2);
  const ntp_op_attr *at = &q->op->attr;
  char sa[96], sb[96];
  if (a->shape.ndim != 4 || b->shape.ndim != 4 || !shape_eq(&b->shape, &v->shape))
    return ir_fail(q->err, q->cap, "attention needs q [B, S, H, HD] and k, v [B, S, KV, HD] of one shape");
  if (a->shape.dim[0] != b->shape.dim[0] || a->shape.dim[1] != b->shape.dim[1] || a->shape.dim[3] != b->shape.dim[3])
    return ir_fail(q->err, q->cap, "attention q %s and k %s disagree", shape_str(&a->shape, sa, sizeof sa),
                   shape_str(&b->shape, sb, sizeof sb));
  if (at->attn.group > 0) {
    /* a head-sharded slice: every query head's kv head must be held */
    const int64_t g = at->attn.group, q0 = at->attn.q_off, k0 = at->attn.kv_off;
    if (g < 1 || q0 / g < k0 || (q0 + a->shape.dim[2] - 1) / g - k0 >= b->shape.dim[2])
      return ir_fail(q->err, q->cap, "query heads %lld.. need kv heads this shard does not hold", (long long)q0);
  } else if (a->shape.dim[2] % b->shape.dim[2]) {
    return ir_fail(q->err, q->cap, "heads (%lld) must be a multiple of kv heads (%lld)", (long long)a->shape.dim[2],
                   (long long)b->shape.dim[2]);
  }
  if (a->dtype != b->dtype || a->dtype != v->dtype)
    return ir_fail(q->err, q->cap, "attention operands differ in dtype");
  return result(q, a->shape, a->dtype);
}

/* ---- the loss ---------------------------------------------------------------------------- */

static bool infer_cross_entropy(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  char sa[96], sb[96];
  if (!dtype_is_float(a->dtype) || a->shape.ndim < 1)
    return ir_fail(q->err, q->cap, "cross_entropy needs float logits [..., V], got %s%s", dtype_name(a->dtype),
                   shape_str(&a->shape, sa, sizeof sa));
  if (b->dtype != NTP_I32)
    return ir_fail(q->err, q->cap, "cross_entropy targets must be i32, got %s", dtype_name(b->dtype));
  if (b->shape.ndim != a->shape.ndim - 1 || !same_lead(&a->shape, &b->shape))
    return ir_fail(q->err, q->cap, "cross_entropy targets %s must be the logits' shape %s without its last dim",
                   shape_str(&b->shape, sb, sizeof sb), shape_str(&a->shape, sa, sizeof sa));
  return result(q, (ntp_shape){0}, NTP_FP32);
}

/* The vocabulary-parallel loss: [R, 4] stats per rank, [R, 4t] a row block's, [1, 2] its part. */

/* float logits [..., V] and i32 targets [...] */
static bool logits_and_targets(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  return dtype_is_float(a->dtype) && b->dtype == NTP_I32 && b->shape.ndim == a->shape.ndim - 1 &&
         same_lead(&a->shape, &b->shape);
}

static bool infer_ce_stats(const shape_query *q) {
  if (!logits_and_targets(q)) return ir_fail(q->err, q->cap, "'%s' needs logits [..., V] and targets [...]", name(q));
  return result(q, (ntp_shape){2, {shape_numel(&q->b->shape), 4}}, NTP_FP32);
}

static bool infer_ce_stats_grad(const shape_query *q) {
  if (!logits_and_targets(q)) return ir_fail(q->err, q->cap, "'%s' needs logits [..., V] and targets [...]", name(q));
  const ir_value *g = operand(q, 2);
  if (g->shape.ndim != 2 || g->shape.dim[0] != shape_numel(&q->b->shape) || g->shape.dim[1] != 4)
    return ir_fail(q->err, q->cap, "ce_stats_grad needs the stats' gradient [R, 4]");
  return result(q, q->a->shape, q->a->dtype);
}

/* fp32 stats [R, 4t] of R i32 targets */
static bool stats_and_targets(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  return a->shape.ndim == 2 && a->dtype == NTP_FP32 && a->shape.dim[1] % 4 == 0 && a->shape.dim[1] != 0 &&
         b->dtype == NTP_I32 && a->shape.dim[0] == shape_numel(&b->shape);
}

static bool infer_ce_rows(const shape_query *q) {
  if (!stats_and_targets(q)) return ir_fail(q->err, q->cap, "'%s' needs stats [R, 4t] and R targets", name(q));
  return result(q, (ntp_shape){2, {1, 2}}, NTP_FP32);
}

static bool infer_ce_rows_grad(const shape_query *q) {
  if (!stats_and_targets(q)) return ir_fail(q->err, q->cap, "'%s' needs stats [R, 4t] and R targets", name(q));
  const ir_value *g = operand(q, 2);
  if (g->shape.ndim != 2 || g->shape.dim[0] != 1 || g->shape.dim[1] != 2)
    return ir_fail(q->err, q->cap, "ce_rows_grad needs the part's gradient [1, 2]");
  return result(q, q->a->shape, NTP_FP32);
}

/* fp32 parts [blocks, 2] */
static bool parts(const shape_query *q) {
  return q->a->shape.ndim == 2 && q->a->shape.dim[1] == 2 && q->a->dtype == NTP_FP32;
}

static bool infer_ce_mean(const shape_query *q) {
  if (!parts(q)) return ir_fail(q->err, q->cap, "'%s' needs parts [blocks, 2]", name(q));
  return result(q, (ntp_shape){0}, NTP_FP32);
}

static bool infer_ce_mean_grad(const shape_query *q) {
  if (!parts(q)) return ir_fail(q->err, q->cap, "'%s' needs parts [blocks, 2]", name(q));
  if (q->b->shape.ndim != 0) return ir_fail(q->err, q->cap, "ce_mean_grad needs a scalar gradient");
  return result(q, q->a->shape, NTP_FP32);
}

static bool infer_ce_count(const shape_query *q) {
  if (q->a->dtype != NTP_I32) return ir_fail(q->err, q->cap, "'%s' needs i32 targets", name(q));
  return result(q, (ntp_shape){2, {1, 2}}, NTP_FP32);
}

static bool infer_ce_seed(const shape_query *q) {
  if (!parts(q)) return ir_fail(q->err, q->cap, "'%s' needs counts [n, 2]", name(q));
  return result(q, (ntp_shape){2, {1, 2}}, NTP_FP32);
}

/* ---- gradients --------------------------------------------------------------------------- */

/* (x or y, dy) -> dx: two float operands of one shape and dtype */
static bool infer_pair_grad(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b;
  char sa[96], sb[96];
  if (!shape_eq(&a->shape, &b->shape) || a->dtype != b->dtype || !dtype_is_float(a->dtype))
    return ir_fail(q->err, q->cap, "'%s' needs two float operands of one shape and dtype, got %s%s and %s%s",
                   name(q), dtype_name(a->dtype), shape_str(&a->shape, sa, sizeof sa), dtype_name(b->dtype),
                   shape_str(&b->shape, sb, sizeof sb));
  return result(q, a->shape, a->dtype);
}

/* a pair gradient of an elementwise function (grad.of) */
static bool infer_act_grad(const shape_query *q) {
  if (!infer_pair_grad(q)) return false;
  ir_opcode of = (ir_opcode)q->op->attr.grad.of;
  if (!ir_op_is_unary_elementwise(of)) return ir_fail(q->err, q->cap, "act_grad of '%s'", ir_op_name(of));
  return true;
}

static bool infer_attention_grad(const shape_query *q) {
  const ir_value *a = q->a, *b = q->b, *v = operand(q, 2), *dy = operand(q, 3);
  int which = q->op->attr.attn.which;
  if (a->shape.ndim != 4 || b->shape.ndim != 4 || !shape_eq(&b->shape, &v->shape) || !shape_eq(&dy->shape, &a->shape))
    return ir_fail(q->err, q->cap, "attention_grad needs q, dy [B, S, H, HD] and k, v [B, S, KV, HD]");
  if (which > 2) return ir_fail(q->err, q->cap, "attention_grad: which %d", which);
  return result(q, which == 0 ? a->shape : b->shape, a->dtype);
}

static bool infer_cross_entropy_grad(const shape_query *q) {
  if (!logits_and_targets(q) || operand(q, 2)->shape.ndim != 0)
    return ir_fail(q->err, q->cap, "cross_entropy_grad needs logits [..., V], targets [...] and a scalar gradient");
  return result(q, q->a->shape, q->a->dtype);
}

/* ---- the table --------------------------------------------------------------------------- */

/* RULE_op: the rule of every op of IR_OPS (runtime/core/ntp_types.h). */
#define RULE_INPUT infer_declared
#define RULE_PARAM infer_declared
#define RULE_CONST infer_declared
#define RULE_GATHER infer_gather
#define RULE_SLICE infer_slice
#define RULE_RESHAPE infer_reshape
#define RULE_MATMUL infer_matmul
#define RULE_ADD infer_binary
#define RULE_SUB infer_binary
#define RULE_MUL infer_binary
#define RULE_DIV infer_binary
#define RULE_NEG infer_unary
#define RULE_GELU infer_unary
#define RULE_RELU infer_unary
#define RULE_SILU infer_unary
#define RULE_SIGMOID infer_unary
#define RULE_TANH infer_unary
#define RULE_EXP infer_unary
#define RULE_SOFTMAX infer_over_last_dim
#define RULE_LAYERNORM infer_over_last_dim
#define RULE_RMSNORM infer_over_last_dim
#define RULE_ROPE infer_rope
#define RULE_ATTENTION infer_attention
#define RULE_CROSS_ENTROPY infer_cross_entropy
#define RULE_SUM_TO infer_sum_to
#define RULE_ACT_GRAD infer_act_grad
#define RULE_SOFTMAX_GRAD infer_pair_grad
#define RULE_LAYERNORM_GRAD infer_pair_grad
#define RULE_RMSNORM_GRAD infer_pair_grad
#define RULE_ATTENTION_GRAD infer_attention_grad
#define RULE_SCATTER_ADD infer_scatter_add
#define RULE_PAD infer_pad
#define RULE_CROSS_ENTROPY_GRAD infer_cross_entropy_grad
#define RULE_CE_STATS infer_ce_stats
#define RULE_CE_ROWS infer_ce_rows
#define RULE_CE_MEAN infer_ce_mean
#define RULE_CE_STATS_GRAD infer_ce_stats_grad
#define RULE_CE_ROWS_GRAD infer_ce_rows_grad
#define RULE_CE_MEAN_GRAD infer_ce_mean_grad
#define RULE_CE_COUNT infer_ce_count
#define RULE_CE_SEED infer_ce_seed

static shape_rule *const rules[IR_OP_COUNT] = {
#define X(e, s, n) [IR_##e] = RULE_##e,
    IR_OPS(X)
#undef X
};

bool ir_infer(const ir_module *m, const ir_op *op, ntp_shape *shape, ntp_dtype *dt, char *err, size_t cap) {
  if ((unsigned)op->code >= IR_OP_COUNT) return ir_fail(err, cap, "unknown op %d", (int)op->code);
  shape_query q = {.m = m,
                   .op = op,
                   .a = op->nargs > 0 ? &m->values[op->args[0]] : NULL,
                   .b = op->nargs > 1 ? &m->values[op->args[1]] : NULL,
                   .shape = shape,
                   .dt = dt,
                   .err = err,
                   .cap = cap};
  return rules[op->code](&q);
}
