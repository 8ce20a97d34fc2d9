/* ir_shape.c — shape and dtype rules of every op, shared by lowering (which reports
 * errors at the source) and the verifier (which re-derives every result). */
#include <stdio.h>

#include "ir.h"

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

bool ir_infer(const ir_module *m, const ir_op *op, ntp_shape *shape, ntp_dtype *dt, char *err, size_t cap) {
  const ir_value *a = op->nargs > 0 ? &m->values[op->args[0]] : NULL;
  const ir_value *b = op->nargs > 1 ? &m->values[op->args[1]] : NULL;
  char sa[96], sb[96];
  switch (op->code) {
  case IR_INPUT:
  case IR_PARAM:
  case IR_CONST:
    *shape = m->values[op->result].shape;
    *dt = m->values[op->result].dtype;
    return true;

  case IR_GATHER:
    if (b->dtype != NTP_I32) return ir_fail(err, cap, "embedding indices must be i32, got %s", dtype_name(b->dtype));
    if (a->shape.ndim != 2) return ir_fail(err, cap, "embedding table must be 2-D, got %s", shape_str(&a->shape, sa, 96));
    if (b->shape.ndim + 1 > NTP_MAX_RANK) return ir_fail(err, cap, "too many dims");
    *shape = b->shape;
    shape->dim[shape->ndim++] = a->shape.dim[1];
    *dt = a->dtype;
    return true;

  case IR_SLICE: {
    int ax = op->attr.slice.axis;
    if (ax < 0 || ax >= a->shape.ndim) return ir_fail(err, cap, "slice axis %d out of range", ax);
    if (op->attr.slice.start < 0 || op->attr.slice.len < 1 ||
        op->attr.slice.start + op->attr.slice.len > a->shape.dim[ax])
      return ir_fail(err, cap, "slice [%lld, %lld) outside dim of size %lld", (long long)op->attr.slice.start,
                  (long long)(op->attr.slice.start + op->attr.slice.len), (long long)a->shape.dim[ax]);
    *shape = a->shape;
    shape->dim[ax] = op->attr.slice.len;
    *dt = a->dtype;
    return true;
  }

  case IR_RESHAPE:
    *shape = m->values[op->result].shape;
    if (shape_numel(shape) != shape_numel(&a->shape))
      return ir_fail(err, cap, "cannot reshape %s to %s", shape_str(&a->shape, sa, 96), shape_str(shape, sb, 96));
    *dt = a->dtype;
    return true;

  case IR_MATMUL: {
    if (a->dtype != b->dtype || !dtype_is_float(a->dtype))
      return ir_fail(err, cap, "matmul operands must share a float dtype, got %s and %s", dtype_name(a->dtype),
                  dtype_name(b->dtype));
    if (a->shape.ndim < 1)
      return ir_fail(err, cap, "matmul needs a left operand with at least 1 dim");
    if (b->shape.ndim < 2) return ir_fail(err, cap, "matmul right operand must have at least 2 dims, got %s",
                                       shape_str(&b->shape, sb, 96));
    bool ta = op->attr.mm.trans_a;
    if (ta && a->shape.ndim < 2) return ir_fail(err, cap, "a transposed matmul operand needs at least 2 dims");
    int64_t bk = b->shape.dim[b->shape.ndim - (op->attr.mm.trans_b ? 1 : 2)];
    int64_t bn = b->shape.dim[b->shape.ndim - (op->attr.mm.trans_b ? 2 : 1)];
    int64_t ak = a->shape.dim[a->shape.ndim - (ta ? 2 : 1)];
    if (ak != bk)
      return ir_fail(err, cap, "matmul inner dims differ: %s @ %s%s (%lld vs %lld)", shape_str(&a->shape, sa, 96),
                  shape_str(&b->shape, sb, 96), op->attr.mm.trans_b ? " transposed" : "", (long long)ak,
                  (long long)bk);
    if (b->shape.ndim > 2) {
      /* batched right operand: leading dims must equal the left operand's */
      bool ok = a->shape.ndim == b->shape.ndim;
      for (int i = 0; ok && i < a->shape.ndim - 2; i++) ok = a->shape.dim[i] == b->shape.dim[i];
      if (!ok)
        return ir_fail(err, cap, "matmul batch dims differ: %s @ %s", shape_str(&a->shape, sa, 96),
                    shape_str(&b->shape, sb, 96));
    }
    *shape = a->shape;
    if (ta) shape->dim[shape->ndim - 2] = a->shape.dim[a->shape.ndim - 1];
    shape->dim[shape->ndim - 1] = bn;
    *dt = a->dtype;
    return true;
  }

  case IR_ADD:
  case IR_SUB:
  case IR_MUL:
  case IR_DIV:
    if (a->dtype != b->dtype)
      return ir_fail(err, cap, "operands of '%s' have different dtypes: %s%s and %s%s", ir_op_name(op->code),
                  dtype_name(a->dtype), shape_str(&a->shape, sa, 96), dtype_name(b->dtype),
                  shape_str(&b->shape, sb, 96));
    if (!dtype_is_float(a->dtype)) return ir_fail(err, cap, "'%s' needs float operands", ir_op_name(op->code));
    if (!broadcast(&a->shape, &b->shape, shape))
      return ir_fail(err, cap, "shapes do not broadcast in '%s': %s%s vs %s%s", ir_op_name(op->code),
                  dtype_name(a->dtype), shape_str(&a->shape, sa, 96), dtype_name(b->dtype),
                  shape_str(&b->shape, sb, 96));
    *dt = a->dtype;
    return true;

  case IR_NEG: case IR_GELU: case IR_RELU: case IR_SILU: case IR_SIGMOID: case IR_TANH: case IR_EXP:
  case IR_SOFTMAX: case IR_LAYERNORM: case IR_RMSNORM:
    if (!dtype_is_float(a->dtype)) return ir_fail(err, cap, "'%s' needs a float operand, got %s", ir_op_name(op->code),
                                               dtype_name(a->dtype));
    if ((op->code == IR_SOFTMAX || op->code == IR_LAYERNORM || op->code == IR_RMSNORM) && a->shape.ndim < 1)
      return ir_fail(err, cap, "'%s' needs at least one dim", ir_op_name(op->code));
    *shape = a->shape;
    *dt = a->dtype;
    return true;

  case IR_ROPE:
    if (a->shape.ndim != 4) return ir_fail(err, cap, "rope needs [B, S, H, HD], got %s", shape_str(&a->shape, sa, 96));
    if (a->shape.dim[3] % 2)
      return ir_fail(err, cap, "rope needs an even head dim, got %lld", (long long)a->shape.dim[3]);
    *shape = a->shape;
    *dt = a->dtype;
    return true;

  case IR_ATTENTION: {
    const ir_value *v = &m->values[op->args[2]];
    if (a->shape.ndim != 4 || b->shape.ndim != 4 || !shape_eq(&b->shape, &v->shape))
      return ir_fail(err, cap, "attention needs q [B, S, H, HD] and k, v [B, S, KV, HD] of one shape");
    if (a->shape.dim[0] != b->shape.dim[0] || a->shape.dim[1] != b->shape.dim[1] || a->shape.dim[3] != b->shape.dim[3])
      return ir_fail(err, cap, "attention q %s and k %s disagree", shape_str(&a->shape, sa, 96),
                  shape_str(&b->shape, sb, 96));
    if (op->attr.attn.group > 0) {
      /* a head-sharded slice: every query head's kv head must be held */
      const int64_t g = op->attr.attn.group, q0 = op->attr.attn.q_off, k0 = op->attr.attn.kv_off;
      if (g < 1 || q0 / g < k0 || (q0 + a->shape.dim[2] - 1) / g - k0 >= b->shape.dim[2])
        return ir_fail(err, cap, "query heads %lld.. need kv heads this shard does not hold", (long long)q0);
    } else if (a->shape.dim[2] % b->shape.dim[2]) {
      return ir_fail(err, cap, "heads (%lld) must be a multiple of kv heads (%lld)", (long long)a->shape.dim[2],
                  (long long)b->shape.dim[2]);
    }
    if (a->dtype != b->dtype || a->dtype != v->dtype) return ir_fail(err, cap, "attention operands differ in dtype");
    *shape = a->shape;
    *dt = a->dtype;
    return true;
  }
  case IR_CROSS_ENTROPY:
    if (!dtype_is_float(a->dtype) || a->shape.ndim < 1)
      return ir_fail(err, cap, "cross_entropy needs float logits [..., V], got %s%s", dtype_name(a->dtype),
                     shape_str(&a->shape, sa, 96));
    if (b->dtype != NTP_I32) return ir_fail(err, cap, "cross_entropy targets must be i32, got %s", dtype_name(b->dtype));
    if (b->shape.ndim != a->shape.ndim - 1 || !same_lead(&a->shape, &b->shape))
      return ir_fail(err, cap, "cross_entropy targets %s must be the logits' shape %s without its last dim",
                     shape_str(&b->shape, sb, 96), shape_str(&a->shape, sa, 96));
    *shape = (ntp_shape){0};
    *dt = NTP_FP32;
    return true;

  case IR_SUM_TO: {
    /* the result's shape must be one that broadcasts to the operand's */
    ntp_shape r = m->values[op->result].shape, bc;
    if (!broadcast(&r, &a->shape, &bc) || !shape_eq(&bc, &a->shape))
      return ir_fail(err, cap, "sum_to %s from %s: not a broadcast of it", shape_str(&r, sb, 96), shape_str(&a->shape, sa, 96));
    *shape = r;
    *dt = a->dtype;
    return true;
  }

  case IR_ACT_GRAD: case IR_SOFTMAX_GRAD: case IR_LAYERNORM_GRAD: case IR_RMSNORM_GRAD:
    if (!shape_eq(&a->shape, &b->shape) || a->dtype != b->dtype || !dtype_is_float(a->dtype))
      return ir_fail(err, cap, "'%s' needs two float operands of one shape and dtype, got %s%s and %s%s",
                     ir_op_name(op->code), dtype_name(a->dtype), shape_str(&a->shape, sa, 96), dtype_name(b->dtype),
                     shape_str(&b->shape, sb, 96));
    if (op->code == IR_ACT_GRAD && !ir_op_is_unary_elementwise((ir_opcode)op->attr.grad.of))
      return ir_fail(err, cap, "act_grad of '%s'", ir_op_name((ir_opcode)op->attr.grad.of));
    *shape = a->shape;
    *dt = a->dtype;
    return true;

  case IR_ATTENTION_GRAD: {
    const ir_value *v = &m->values[op->args[2]], *dy = &m->values[op->args[3]];
    if (a->shape.ndim != 4 || b->shape.ndim != 4 || !shape_eq(&b->shape, &v->shape) || !shape_eq(&dy->shape, &a->shape))
      return ir_fail(err, cap, "attention_grad needs q, dy [B, S, H, HD] and k, v [B, S, KV, HD]");
    if (op->attr.attn.which > 2) return ir_fail(err, cap, "attention_grad: which %d", op->attr.attn.which);
    *shape = op->attr.attn.which == 0 ? a->shape : b->shape;
    *dt = a->dtype;
    return true;
  }

  case IR_SCATTER_ADD: {
    ntp_shape r = m->values[op->result].shape;
    if (a->dtype != NTP_I32 || r.ndim != 2 || b->shape.ndim != a->shape.ndim + 1 || !same_lead(&b->shape, &a->shape) ||
        b->shape.dim[b->shape.ndim - 1] != r.dim[1])
      return ir_fail(err, cap, "scatter_add needs i32 indices [...], rows [..., D] and a table [V, D]");
    *shape = r;
    *dt = b->dtype;
    return true;
  }

  case IR_PAD: {
    ntp_shape r = m->values[op->result].shape;
    int ax = op->attr.slice.axis;
    bool ok = ax >= 0 && ax < r.ndim && r.ndim == a->shape.ndim && op->attr.slice.len == a->shape.dim[ax] &&
              op->attr.slice.start >= 0 && op->attr.slice.start + op->attr.slice.len <= r.dim[ax];
    for (int d = 0; ok && d < r.ndim; d++) ok = d == ax || r.dim[d] == a->shape.dim[d];
    if (!ok) return ir_fail(err, cap, "pad %s into %s: not a slice of it", shape_str(&a->shape, sa, 96), shape_str(&r, sb, 96));
    *shape = r;
    *dt = a->dtype;
    return true;
  }

  case IR_CROSS_ENTROPY_GRAD: {
    const ir_value *g = &m->values[op->args[2]];
    if (!dtype_is_float(a->dtype) || b->dtype != NTP_I32 || b->shape.ndim != a->shape.ndim - 1 ||
        !same_lead(&a->shape, &b->shape) || g->shape.ndim != 0)
      return ir_fail(err, cap, "cross_entropy_grad needs logits [..., V], targets [...] and a scalar gradient");
    *shape = a->shape;
    *dt = a->dtype;
    return true;
  }

  /* the vocabulary-parallel loss: [R, 4] stats per rank, [R, 4t] a row block's, [1, 2] its part */
  case IR_CE_STATS: case IR_CE_STATS_GRAD:
    if (!dtype_is_float(a->dtype) || b->dtype != NTP_I32 || b->shape.ndim != a->shape.ndim - 1 ||
        !same_lead(&a->shape, &b->shape))
      return ir_fail(err, cap, "'%s' needs logits [..., V] and targets [...]", ir_op_name(op->code));
    if (op->code == IR_CE_STATS_GRAD) {
      const ir_value *g = &m->values[op->args[2]];
      if (g->shape.ndim != 2 || g->shape.dim[0] != shape_numel(&b->shape) || g->shape.dim[1] != 4)
        return ir_fail(err, cap, "ce_stats_grad needs the stats' gradient [R, 4]");
      *shape = a->shape;
      *dt = a->dtype;
      return true;
    }
    *shape = (ntp_shape){2, {shape_numel(&b->shape), 4}};
    *dt = NTP_FP32;
    return true;
  case IR_CE_ROWS: case IR_CE_ROWS_GRAD:
    if (a->shape.ndim != 2 || a->dtype != NTP_FP32 || a->shape.dim[1] % 4 || a->shape.dim[1] == 0 ||
        b->dtype != NTP_I32 || a->shape.dim[0] != shape_numel(&b->shape))
      return ir_fail(err, cap, "'%s' needs stats [R, 4t] and R targets", ir_op_name(op->code));
    if (op->code == IR_CE_ROWS_GRAD) {
      const ir_value *g = &m->values[op->args[2]];
      if (g->shape.ndim != 2 || g->shape.dim[0] != 1 || g->shape.dim[1] != 2)
        return ir_fail(err, cap, "ce_rows_grad needs the part's gradient [1, 2]");
      *shape = a->shape;
    } else {
      *shape = (ntp_shape){2, {1, 2}};
    }
    *dt = NTP_FP32;
    return true;
  case IR_CE_MEAN: case IR_CE_MEAN_GRAD:
    if (a->shape.ndim != 2 || a->shape.dim[1] != 2 || a->dtype != NTP_FP32)
      return ir_fail(err, cap, "'%s' needs parts [blocks, 2]", ir_op_name(op->code));
    if (op->code == IR_CE_MEAN_GRAD && b->shape.ndim != 0) return ir_fail(err, cap, "ce_mean_grad needs a scalar gradient");
    *shape = op->code == IR_CE_MEAN ? (ntp_shape){0} : a->shape;
    *dt = NTP_FP32;
    return true;

  case IR_OP_COUNT:
    break;
  }
  return ir_fail(err, cap, "unknown op %d", (int)op->code);
}
