/* layernorm.c — layernorm(x [, eps]): (x - mean) / sqrt(var + eps) * g + b over the last dim;
 * also home of the lowering rmsnorm shares (norm.h). Not split: it follows its input's rows. */
#include "norm.h"
#include "sema.h"

int32_t layer_lower_norm(sema *s, layer_call *c, ir_opcode code) {
  ntp_loc loc = c->call->loc;
  int64_t D = layer_last_dim(s, c->x);
  ir_op attrs = {.attr.norm.eps = c->arg[0].set ? (float)c->arg[0].f : 1e-5f};
  if (attrs.attr.norm.eps <= 0) {
    sema_error(s, c->arg[0].loc, "eps must be positive, got %g", c->arg[0].f);
    return -1;
  }
  int32_t y = sema_op(s, code, &c->x, 1, loc, &attrs);
  y = layer_op2(s, IR_MUL, y, layer_param(s, NORM_G, layer_shape1(D), 1.0f, 0.1f, loc), loc);
  if (code == IR_LAYERNORM) y = layer_op2(s, IR_ADD, y, layer_param(s, NORM_B, layer_shape1(D), 0, 0.1f, loc), loc);
  return y;
}

static int32_t lower(sema *s, layer_call *c) { return layer_lower_norm(s, c, IR_LAYERNORM); }

static const char *const roles[] = {"g", "b", NULL};

const layer_kind layer_layernorm = {
    .name = "layernorm",
    .args = {{"eps", LA_FLOAT, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .weight_role = -1,
};
