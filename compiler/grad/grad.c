/* grad.c — the gradient pass: reverse-mode differentiation of the global IR.
 *
 * Walks the ops from the loss back to the parameters and appends, for every op on a path
 * between them, its vector-Jacobian product (grad_rules.c) as primitive ops (the backward ops of ntp_types.h:
 * sum_to, act_grad, softmax_grad, the norms', attention_grad, scatter_add, pad,
 * cross_entropy_grad, and matmul with a transposed operand). A value read by several ops sums
 * the gradients they send back. Every parameter the loss depends on gets an output
 * "grad.NAME", its gradient, in the parameter's shape and dtype; the forward outputs stay
 * first. The result is a module like any other: the same verifier checks it and the CPU
 * reference runs it. Backward ops are model-level ops (layer -1) with the location of the
 * forward op they differentiate, so an error in one points at the source. */
#include "grad.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gpass {
  ir_module *m;
  int32_t *grad; /* per forward value: the value holding its gradient so far, -1: none */
  bool *needs;   /* per forward value: it depends on a parameter (so its gradient is wanted) */
  ntp_loc loc;   /* of the forward op being differentiated */
} gpass;

/* the emitter over the global IR: backward ops are model-level ops at the forward op's location */
static int32_t g_emit(void *ctx, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                      const ntp_op_attr *attr) {
  gpass *G = ctx;
  int32_t v = ir_emit(G->m, code, args, nargs, shape, dt, -1, G->loc);
  if (attr) ir_def(G->m, v)->attr = *attr;
  return v;
}
static ntp_shape g_shape(void *ctx, int32_t v) { return ((gpass *)ctx)->m->values[v].shape; }
static ntp_dtype g_dtype(void *ctx, int32_t v) { return ((gpass *)ctx)->m->values[v].dtype; }
static bool g_needs(void *ctx, int32_t v) { return ((gpass *)ctx)->needs[v]; }
static void g_add(void *ctx, int32_t v, int32_t g) {
  gpass *G = ctx;
  if (G->grad[v] < 0) {
    G->grad[v] = g;
    return;
  }
  int32_t args[2] = {G->grad[v], g};
  G->grad[v] = g_emit(G, IR_ADD, args, 2, G->m->values[v].shape, G->m->values[v].dtype, NULL);
}

/* The loss: the model's one scalar float output, or of several the one named "loss". */
int32_t ir_loss_output(const ir_module *m, diag_sink *diags, ntp_loc model_loc) {
  int32_t found = -1, named = -1, scalars = 0;
  for (size_t o = 0; o < m->n_outputs; o++) {
    const ir_value *v = &m->values[m->outputs[o].value];
    if (v->shape.ndim != 0 || !dtype_is_float(v->dtype)) continue;
    if (m->n_forward_ops && strncmp(m->outputs[o].name, "grad.", 5) == 0) continue; /* a scalar parameter's gradient */
    scalars++;
    found = (int32_t)o;
    if (strcmp(m->outputs[o].name, "loss") == 0) named = (int32_t)o;
  }
  if (scalars == 1) return found;
  if (named >= 0) return named;
  if (diags)
    diag_emit(diags, NTPC_ERROR, m->file, model_loc,
            scalars ? "training needs one loss: the model has %d scalar outputs and none is named 'loss'"
                    : "training needs a scalar loss output, as in 'output loss = cross_entropy(logits, targets);'%.0d",
            scalars);
  return -1;
}

int32_t ir_grad_output(const ir_module *m, int32_t param) {
  char name[512];
  snprintf(name, sizeof name, "grad.%s", m->values[param].name);
  for (size_t o = 0; o < m->n_outputs; o++)
    if (strcmp(m->outputs[o].name, name) == 0) return m->outputs[o].value;
  return -1;
}

bool ir_grad(ir_module *m, arena *pool, ntp_loc model_loc, diag_sink *diags) {
  int32_t lo = ir_loss_output(m, diags, model_loc);
  if (lo < 0) return false;
  size_t nv = m->n_values, nops = m->n_ops;
  gpass G = {.m = m};
  grad_emitter E = {&G, g_emit, g_shape, g_dtype, g_needs, g_add};
  G.grad = malloc((nv + 1) * sizeof *G.grad);
  G.needs = calloc(nv + 1, sizeof *G.needs);
  if (!G.grad || !G.needs) {
    free(G.grad);
    free(G.needs);
    diag_out_of_memory(diags);
    return false;
  }
  for (size_t v = 0; v < nv; v++) G.grad[v] = -1;
  for (size_t i = 0; i < nops; i++) {
    const ir_op *op = &m->ops[i];
    bool n = op->code == IR_PARAM;
    for (int a = 0; a < op->nargs; a++) n |= G.needs[op->args[a]];
    G.needs[op->result] = n;
  }
  int32_t loss = m->outputs[lo].value;
  bool ok = true;
  if (G.needs[loss]) {
    G.loc = m->ops[m->values[loss].def].loc;
    ntp_op_attr one = {.cst.value = 1.0};
    G.grad[loss] = g_emit(&G, IR_CONST, NULL, 0, (ntp_shape){0}, m->values[loss].dtype, &one);
    for (size_t i = nops; i-- > 0 && ok;) {
      ir_op op = m->ops[i]; /* a copy: emitting grows the table */
      if (G.grad[op.result] < 0 || !G.needs[op.result]) continue;
      G.loc = op.loc;
      if (!(ok = grad_rule(&E, &op, G.grad[op.result])))
        diag_emit(diags, NTPC_ERROR, m->file, op.loc, "no gradient rule for op '%s'", ir_op_name(op.code));
    }
  }
  for (size_t i = 0; i < nops && ok; i++) {
    const ir_op *op = &m->ops[i];
    if (op->code != IR_PARAM) continue;
    const char *name = m->values[op->result].name;
    if (G.grad[op->result] < 0) {
      diag_emit(diags, NTPC_WARNING, m->file, op->loc, "parameter '%s' does not affect the loss; its gradient is zero",
                name);
      continue;
    }
    ir_output out = {.name = arena_printf(pool, "grad.%s", name), .value = G.grad[op->result], .loc = op->loc};
    VEC_PUSH(m->outputs, m->n_outputs, m->cap_outputs, out);
  }
  m->n_forward_ops = nops;
  free(G.grad);
  free(G.needs);
  return ok;
}
