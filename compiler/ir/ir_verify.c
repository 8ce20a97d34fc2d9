/* ir_verify.c — invariants every pass must keep; run after each pass. */
#include <stdio.h>

#include "ir.h"

bool ir_verify(const ir_module *m, char *err, size_t cap) {
  if (m->n_ops != m->n_values) return ir_fail(err, cap, "%zu ops define %zu values", m->n_ops, m->n_values);
  for (size_t i = 0; i < m->n_ops; i++) {
    const ir_op *op = &m->ops[i];
    if ((unsigned)op->code >= IR_OP_COUNT) return ir_fail(err, cap, "op %zu: bad opcode", i);
    if (op->result < 0 || (size_t)op->result >= m->n_values || m->values[op->result].def != (int32_t)i)
      return ir_fail(err, cap, "op %zu (%s): result/def link broken", i, ir_op_name(op->code));
    if (op->nargs != ir_op_arity(op->code))
      return ir_fail(err, cap, "op %zu (%s): %d operands, expected %d", i, ir_op_name(op->code), op->nargs,
                  ir_op_arity(op->code));
    for (int a = 0; a < op->nargs; a++)
      if (op->args[a] < 0 || op->args[a] >= op->result)
        return ir_fail(err, cap, "op %zu (%s): operand %%%d is not an earlier value", i, ir_op_name(op->code),
                    op->args[a]);
    if (op->layer < -1 || op->layer >= (int32_t)m->n_layers) return ir_fail(err, cap, "op %zu: bad layer", i);
    const ir_value *v = &m->values[op->result];
    if (v->shape.ndim < 0 || v->shape.ndim > NTP_MAX_RANK) return ir_fail(err, cap, "%%%d: bad rank", op->result);
    for (int d = 0; d < v->shape.ndim; d++)
      if (v->shape.dim[d] < 1) return ir_fail(err, cap, "%%%d: dim %d is %lld", op->result, d, (long long)v->shape.dim[d]);
    ntp_shape s;
    ntp_dtype dt;
    char why[256];
    if (!ir_infer(m, op, &s, &dt, why, sizeof why))
      return ir_fail(err, cap, "op %zu (%s): %s", i, ir_op_name(op->code), why);
    if (!shape_eq(&s, &v->shape) || dt != v->dtype)
      return ir_fail(err, cap, "op %zu (%s): stored type differs from inferred", i, ir_op_name(op->code));
    if ((op->code == IR_INPUT || op->code == IR_PARAM) && !v->name)
      return ir_fail(err, cap, "%%%d: %s without a name", op->result, ir_op_name(op->code));
    if (v->layout.mesh >= (int32_t)m->n_meshes) return ir_fail(err, cap, "%%%d: bad mesh", op->result);
  }
  /* inputs and params have unique names */
  strmap names = {0};
  for (size_t i = 0; i < m->n_ops; i++) {
    const ir_op *op = &m->ops[i];
    if (op->code != IR_INPUT && op->code != IR_PARAM) continue;
    const char *name = m->values[op->result].name;
    if (strmap_get(&names, name, NULL)) {
      strmap_free(&names);
      return ir_fail(err, cap, "two tensors named '%s'", name);
    }
    strmap_put(&names, name, op->result);
  }
  strmap_free(&names);
  for (size_t l = 0; l < m->n_layers; l++) {
    const ir_layer *ly = &m->layers[l];
    for (int32_t k = ly->first_op; k < ly->first_op + ly->nops; k++)
      if (k < 0 || (size_t)k >= m->n_ops || m->ops[k].layer != (int32_t)l)
        return ir_fail(err, cap, "layer %s: ops not contiguous", ly->name);
  }
  for (size_t i = 0; i < m->n_outputs; i++)
    if (m->outputs[i].value < 0 || (size_t)m->outputs[i].value >= m->n_values)
      return ir_fail(err, cap, "output %s: bad value", m->outputs[i].name);
  if (m->n_outputs == 0) return ir_fail(err, cap, "no outputs");
  return true;
}
