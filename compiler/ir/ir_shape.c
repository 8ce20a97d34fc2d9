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
    int64_t bk = b->shape.dim[b->shape.ndim - (op->attr.mm.trans_b ? 1 : 2)];
    int64_t bn = b->shape.dim[b->shape.ndim - (op->attr.mm.trans_b ? 2 : 1)];
    int64_t ak = a->shape.dim[a->shape.ndim - 1];
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
  case IR_OP_COUNT:
    break;
  }
  return ir_fail(err, cap, "unknown op %d", (int)op->code);
}
