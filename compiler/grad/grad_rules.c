/* grad_rules.c — every primitive op's vector-Jacobian product, written once. The gradient
 * pass applies them to the global IR (grad.c) and the sharded backward to each rank's local
 * steps (compiler/shard/shard_grad.c): the rules only emit ops through a grad_emitter, on
 * whatever the ids name (global values, or one rank's tensors). */
#include "grad.h"

static ntp_shape shp(const grad_emitter *E, int32_t v) { return E->shape(E->ctx, v); }
static ntp_dtype dty(const grad_emitter *E, int32_t v) { return E->dtype(E->ctx, v); }
static int32_t emit(const grad_emitter *E, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape,
                    ntp_dtype dt, const ntp_op_attr *attr) {
  return E->emit(E->ctx, code, args, nargs, shape, dt, attr);
}
static int32_t op2(const grad_emitter *E, ir_opcode code, int32_t a, int32_t b, ntp_shape shape) {
  int32_t args[2] = {a, b};
  return emit(E, code, args, 2, shape, dty(E, a), NULL);
}
static int32_t reshape(const grad_emitter *E, int32_t x, ntp_shape to) {
  ntp_shape xs = shp(E, x);
  return shape_eq(&xs, &to) ? x : emit(E, IR_RESHAPE, &x, 1, to, dty(E, x), NULL);
}
/* g summed to the shape of v (broadcasting undone) */
static int32_t sum_to(const grad_emitter *E, int32_t g, int32_t v) {
  ntp_shape to = shp(E, v), gs = shp(E, g);
  return shape_eq(&gs, &to) ? g : emit(E, IR_SUM_TO, &g, 1, to, dty(E, g), NULL);
}
static void add(const grad_emitter *E, int32_t v, int32_t g) {
  if (E->needs(E->ctx, v)) E->add(E->ctx, v, g);
}
static bool needs(const grad_emitter *E, int32_t v) { return E->needs(E->ctx, v); }

/* [P, last]: a shape with its leading dims flattened */
static ntp_shape rows2(ntp_shape s) {
  int64_t last = s.ndim ? s.dim[s.ndim - 1] : 1, p = 1;
  for (int d = 0; d + 1 < s.ndim; d++) p *= s.dim[d];
  return (ntp_shape){2, {p, last}};
}

static void matmul_grad(const grad_emitter *E, const ir_op *op, int32_t g) {
  int32_t a = op->args[0], b = op->args[1];
  bool tb = op->attr.mm.trans_b;
  if (needs(E, a)) { /* da = g b^T (or g b when b is stored transposed) */
    ntp_op_attr at = {.mm = {.trans_b = !tb}};
    int32_t args[2] = {g, b};
    add(E, a, emit(E, IR_MATMUL, args, 2, shp(E, a), dty(E, a), &at));
  }
  if (needs(E, b)) { /* db = a^T g (or g^T a), summed over the batch */
    ntp_op_attr at = {.mm = {.trans_a = true}};
    int32_t x = a, y = g;
    if (shp(E, b).ndim == 2) { /* one b for every row: the rows of a and g as one batch */
      x = reshape(E, a, rows2(shp(E, a)));
      y = reshape(E, g, rows2(shp(E, g)));
    }
    int32_t args[2] = {tb ? y : x, tb ? x : y};
    add(E, b, emit(E, IR_MATMUL, args, 2, shp(E, b), dty(E, b), &at));
  }
}

static void binary_grad(const grad_emitter *E, const ir_op *op, int32_t g) {
  int32_t a = op->args[0], b = op->args[1], y = op->result;
  ntp_shape ys = shp(E, y);
  if (needs(E, a)) {
    int32_t ga = g;
    if (op->code == IR_MUL) ga = op2(E, IR_MUL, g, b, ys);
    if (op->code == IR_DIV) ga = op2(E, IR_DIV, g, b, ys);
    add(E, a, sum_to(E, ga, a));
  }
  if (needs(E, b)) {
    int32_t gb = g;
    if (op->code == IR_SUB) gb = emit(E, IR_NEG, &g, 1, ys, dty(E, g), NULL);
    if (op->code == IR_MUL) gb = op2(E, IR_MUL, g, a, ys);
    if (op->code == IR_DIV) { /* d(a/b)/db = -a/b^2 = -y/b */
      int32_t gy = op2(E, IR_MUL, g, y, ys);
      int32_t q = op2(E, IR_DIV, gy, b, ys);
      gb = emit(E, IR_NEG, &q, 1, ys, dty(E, q), NULL);
    }
    add(E, b, sum_to(E, gb, b));
  }
}

bool grad_rule(const grad_emitter *E, const ir_op *op, int32_t g) {
  const int32_t *x = op->args;
  int32_t y = op->result;
  ntp_shape xs = op->nargs ? shp(E, x[0]) : (ntp_shape){0};
  ntp_dtype dt = op->nargs ? dty(E, x[0]) : NTP_FP32;
  switch (op->code) {
  case IR_INPUT: case IR_PARAM: case IR_CONST: return true;
  case IR_GATHER: {
    int32_t args[2] = {x[1], g};
    add(E, x[0], emit(E, IR_SCATTER_ADD, args, 2, xs, dt, &op->attr));
    return true;
  }
  case IR_SLICE: add(E, x[0], emit(E, IR_PAD, &g, 1, xs, dt, &op->attr)); return true;
  case IR_RESHAPE: add(E, x[0], reshape(E, g, xs)); return true;
  case IR_MATMUL:
    if (op->attr.mm.trans_a) break;
    matmul_grad(E, op, g);
    return true;
  case IR_ADD: case IR_SUB: case IR_MUL: case IR_DIV: binary_grad(E, op, g); return true;
  case IR_NEG: add(E, x[0], emit(E, IR_NEG, &g, 1, xs, dt, NULL)); return true;
  case IR_GELU: case IR_RELU: case IR_SILU: case IR_SIGMOID: case IR_TANH: case IR_EXP: {
    /* tanh', sigmoid' and exp' are cheapest from the result */
    bool from_y = op->code == IR_SIGMOID || op->code == IR_TANH || op->code == IR_EXP;
    ntp_op_attr at = {.grad.of = (int32_t)op->code};
    int32_t args[2] = {from_y ? y : x[0], g};
    add(E, x[0], emit(E, IR_ACT_GRAD, args, 2, xs, dt, &at));
    return true;
  }
  case IR_SOFTMAX: {
    int32_t args[2] = {y, g};
    add(E, x[0], emit(E, IR_SOFTMAX_GRAD, args, 2, xs, dt, NULL));
    return true;
  }
  case IR_LAYERNORM: case IR_RMSNORM: {
    int32_t args[2] = {x[0], g};
    add(E, x[0], emit(E, op->code == IR_LAYERNORM ? IR_LAYERNORM_GRAD : IR_RMSNORM_GRAD, args, 2, xs, dt, &op->attr));
    return true;
  }
  case IR_ROPE: { /* a rotation: its transpose rotates back */
    ntp_op_attr at = op->attr;
    at.rope.inverse = !at.rope.inverse;
    add(E, x[0], emit(E, IR_ROPE, &g, 1, xs, dt, &at));
    return true;
  }
  case IR_ATTENTION:
    for (int j = 0; j < 3; j++) {
      if (!needs(E, x[j])) continue;
      ntp_op_attr at = op->attr;
      at.attn.which = (uint8_t)j;
      int32_t args[4] = {x[0], x[1], x[2], g};
      add(E, x[j], emit(E, IR_ATTENTION_GRAD, args, 4, shp(E, x[j]), dt, &at));
    }
    return true;
  case IR_CROSS_ENTROPY: {
    int32_t args[3] = {x[0], x[1], g};
    add(E, x[0], emit(E, IR_CROSS_ENTROPY_GRAD, args, 3, xs, dt, &op->attr));
    return true;
  }
  /* the vocabulary-parallel loss (sharded programs only): each piece's gradient from the one after */
  case IR_CE_STATS: case IR_CE_ROWS: {
    int32_t args[3] = {x[0], x[1], g};
    add(E, x[0], emit(E, op->code == IR_CE_STATS ? IR_CE_STATS_GRAD : IR_CE_ROWS_GRAD, args, 3, xs, dt, &op->attr));
    return true;
  }
  case IR_CE_MEAN: {
    int32_t args[2] = {x[0], g};
    add(E, x[0], emit(E, IR_CE_MEAN_GRAD, args, 2, xs, dt, NULL));
    return true;
  }
  default: break;
  }
  return false;
}
