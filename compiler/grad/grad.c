/* grad.c — the gradient pass: reverse-mode differentiation of the global IR.
 *
 * Walks the ops from the loss back to the parameters and appends, for every op on a path
 * between them, its vector-Jacobian product as primitive ops (the backward ops of ntp_types.h:
 * sum_to, act_grad, softmax_grad, the norms', attention_grad, scatter_add, pad,
 * cross_entropy_grad, and matmul with a transposed operand). A value read by several ops sums
 * the gradients they send back. Every parameter the loss depends on gets an output
 * "grad.NAME", its gradient, in the parameter's shape and dtype; the forward outputs stay
 * first. The result is a module like any other: the same verifier checks it and the CPU
 * reference runs it. Backward ops are model-level ops (layer -1) with the location of the
 * forward op they differentiate, so an error in one points at the source. */
#include "grad.h"

#include <stdlib.h>
#include <string.h>

typedef struct gpass {
  ir_module *m;
  arena *pool;
  diag_sink *diags;
  int32_t *grad; /* per forward value: the value holding its gradient so far, -1: none */
  bool *needs;   /* per forward value: it depends on a parameter (so its gradient is wanted) */
  ntp_loc loc;   /* of the forward op being differentiated */
} gpass;

static int32_t emit(gpass *G, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                    const ntp_op_attr *attr) {
  int32_t v = ir_emit(G->m, code, args, nargs, shape, dt, -1, G->loc);
  if (attr) ir_def(G->m, v)->attr = *attr;
  return v;
}
static const ntp_shape *shape_of(gpass *G, int32_t v) { return &G->m->values[v].shape; }
static ntp_dtype dtype_of(gpass *G, int32_t v) { return G->m->values[v].dtype; }

static int32_t op2(gpass *G, ir_opcode code, int32_t a, int32_t b, ntp_shape shape) {
  int32_t args[2] = {a, b};
  return emit(G, code, args, 2, shape, dtype_of(G, a), NULL);
}
static int32_t reshape(gpass *G, int32_t x, ntp_shape to) {
  return shape_eq(shape_of(G, x), &to) ? x : emit(G, IR_RESHAPE, &x, 1, to, dtype_of(G, x), NULL);
}
/* g summed to the shape of v (broadcasting undone) */
static int32_t sum_to(gpass *G, int32_t g, int32_t v) {
  ntp_shape to = *shape_of(G, v);
  return shape_eq(shape_of(G, g), &to) ? g : emit(G, IR_SUM_TO, &g, 1, to, dtype_of(G, g), NULL);
}

static void add_grad(gpass *G, int32_t v, int32_t g) {
  if (!G->needs[v]) return;
  G->grad[v] = G->grad[v] < 0 ? g : op2(G, IR_ADD, G->grad[v], g, *shape_of(G, v));
}

/* [P, last]: x with its leading dims flattened */
static ntp_shape rows2(const ntp_shape *s) {
  int64_t last = s->ndim ? s->dim[s->ndim - 1] : 1, p = 1;
  for (int d = 0; d + 1 < s->ndim; d++) p *= s->dim[d];
  return (ntp_shape){2, {p, last}};
}

static void matmul_grad(gpass *G, const ir_op *op, int32_t g) {
  int32_t a = op->args[0], b = op->args[1];
  bool tb = op->attr.mm.trans_b;
  if (G->needs[a]) { /* da = g b^T (or g b when b is stored transposed) */
    ntp_op_attr at = {.mm = {.trans_b = !tb}};
    int32_t args[2] = {g, b};
    add_grad(G, a, emit(G, IR_MATMUL, args, 2, *shape_of(G, a), dtype_of(G, a), &at));
  }
  if (G->needs[b]) { /* db = a^T g (or g^T a), summed over the batch */
    ntp_op_attr at = {.mm = {.trans_a = true}};
    int32_t x = a, y = g;
    if (shape_of(G, b)->ndim == 2) { /* one b for every row: the rows of a and g as one batch */
      x = reshape(G, a, rows2(shape_of(G, a)));
      y = reshape(G, g, rows2(shape_of(G, g)));
    }
    int32_t args[2] = {tb ? y : x, tb ? x : y};
    add_grad(G, b, emit(G, IR_MATMUL, args, 2, *shape_of(G, b), dtype_of(G, b), &at));
  }
}

static void binary_grad(gpass *G, const ir_op *op, int32_t g) {
  int32_t a = op->args[0], b = op->args[1], y = op->result;
  ntp_shape ys = *shape_of(G, y);
  if (G->needs[a]) {
    int32_t ga = g;
    if (op->code == IR_MUL) ga = op2(G, IR_MUL, g, b, ys);
    if (op->code == IR_DIV) ga = op2(G, IR_DIV, g, b, ys);
    add_grad(G, a, sum_to(G, ga, a));
  }
  if (G->needs[b]) {
    int32_t gb = g;
    if (op->code == IR_SUB) gb = emit(G, IR_NEG, &g, 1, ys, dtype_of(G, g), NULL);
    if (op->code == IR_MUL) gb = op2(G, IR_MUL, g, a, ys);
    if (op->code == IR_DIV) { /* d(a/b)/db = -a/b^2 = -y/b */
      int32_t gy = op2(G, IR_MUL, g, y, ys);
      int32_t q = op2(G, IR_DIV, gy, b, ys);
      gb = emit(G, IR_NEG, &q, 1, ys, dtype_of(G, q), NULL);
    }
    add_grad(G, b, sum_to(G, gb, b));
  }
}

/* The op's vector-Jacobian product for the gradient g of its result. false: no rule (reported). */
static bool op_grad(gpass *G, const ir_op *op, int32_t g) {
  const int32_t *x = op->args;
  int32_t y = op->result;
  ntp_shape xs = op->nargs ? *shape_of(G, x[0]) : (ntp_shape){0};
  ntp_dtype dt = op->nargs ? dtype_of(G, x[0]) : NTP_FP32;
  switch (op->code) {
  case IR_INPUT: case IR_PARAM: case IR_CONST: return true;
  case IR_GATHER: {
    int32_t args[2] = {x[1], g};
    add_grad(G, x[0], emit(G, IR_SCATTER_ADD, args, 2, xs, dt, &op->attr));
    return true;
  }
  case IR_SLICE: add_grad(G, x[0], emit(G, IR_PAD, &g, 1, xs, dt, &op->attr)); return true;
  case IR_RESHAPE: add_grad(G, x[0], reshape(G, g, xs)); return true;
  case IR_MATMUL:
    if (op->attr.mm.trans_a) break;
    matmul_grad(G, op, g);
    return true;
  case IR_ADD: case IR_SUB: case IR_MUL: case IR_DIV: binary_grad(G, op, g); return true;
  case IR_NEG: add_grad(G, x[0], emit(G, IR_NEG, &g, 1, xs, dt, NULL)); return true;
  case IR_GELU: case IR_RELU: case IR_SILU: case IR_SIGMOID: case IR_TANH: case IR_EXP: {
    /* tanh', sigmoid' and exp' are cheapest from the result */
    bool from_y = op->code == IR_SIGMOID || op->code == IR_TANH || op->code == IR_EXP;
    ntp_op_attr at = {.grad.of = (int32_t)op->code};
    int32_t args[2] = {from_y ? y : x[0], g};
    add_grad(G, x[0], emit(G, IR_ACT_GRAD, args, 2, xs, dt, &at));
    return true;
  }
  case IR_SOFTMAX: {
    int32_t args[2] = {y, g};
    add_grad(G, x[0], emit(G, IR_SOFTMAX_GRAD, args, 2, xs, dt, NULL));
    return true;
  }
  case IR_LAYERNORM: case IR_RMSNORM: {
    int32_t args[2] = {x[0], g};
    add_grad(G, x[0], emit(G, op->code == IR_LAYERNORM ? IR_LAYERNORM_GRAD : IR_RMSNORM_GRAD, args, 2, xs, dt, &op->attr));
    return true;
  }
  case IR_ROPE: { /* a rotation: its transpose rotates back */
    ntp_op_attr at = op->attr;
    at.rope.inverse = !at.rope.inverse;
    add_grad(G, x[0], emit(G, IR_ROPE, &g, 1, xs, dt, &at));
    return true;
  }
  case IR_ATTENTION:
    for (int j = 0; j < 3; j++) {
      if (!G->needs[x[j]]) continue;
      ntp_op_attr at = op->attr;
      at.attn.which = (uint8_t)j;
      int32_t args[4] = {x[0], x[1], x[2], g};
      add_grad(G, x[j], emit(G, IR_ATTENTION_GRAD, args, 4, *shape_of(G, x[j]), dt, &at));
    }
    return true;
  case IR_CROSS_ENTROPY: {
    int32_t args[3] = {x[0], x[1], g};
    add_grad(G, x[0], emit(G, IR_CROSS_ENTROPY_GRAD, args, 3, xs, dt, &op->attr));
    return true;
  }
  default: break;
  }
  diag_emit(G->diags, NTPC_ERROR, G->m->file, op->loc, "no gradient rule for op '%s'", ir_op_name(op->code));
  return false;
}

/* The loss: the model's one scalar float output, or of several the one named "loss". */
static int32_t find_loss(const ir_module *m, diag_sink *diags, ntp_loc model_loc) {
  int32_t found = -1, named = -1, scalars = 0;
  for (size_t o = 0; o < m->n_outputs; o++) {
    const ir_value *v = &m->values[m->outputs[o].value];
    if (v->shape.ndim != 0 || !dtype_is_float(v->dtype)) continue;
    scalars++;
    found = (int32_t)o;
    if (strcmp(m->outputs[o].name, "loss") == 0) named = (int32_t)o;
  }
  if (scalars == 1) return found;
  if (named >= 0) return named;
  diag_emit(diags, NTPC_ERROR, m->file, model_loc,
            scalars ? "training needs one loss: the model has %d scalar outputs and none is named 'loss'"
                    : "training needs a scalar loss output, as in 'output loss = cross_entropy(logits, targets);'%.0d",
            scalars);
  return -1;
}

bool ir_grad(ir_module *m, arena *pool, ntp_loc model_loc, diag_sink *diags) {
  int32_t lo = find_loss(m, diags, model_loc);
  if (lo < 0) return false;
  size_t nv = m->n_values, nops = m->n_ops;
  gpass G = {.m = m, .pool = pool, .diags = diags};
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
    G.grad[loss] = emit(&G, IR_CONST, NULL, 0, (ntp_shape){0}, m->values[loss].dtype, &one);
    for (size_t i = nops; i-- > 0 && ok;) {
      ir_op op = m->ops[i]; /* a copy: emitting grows the table */
      if (G.grad[op.result] < 0 || !G.needs[op.result]) continue;
      G.loc = op.loc;
      ok = op_grad(&G, &op, G.grad[op.result]);
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
  free(G.grad);
  free(G.needs);
  return ok;
}
