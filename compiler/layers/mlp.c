/* mlp.c — mlp(x, hidden = F, act = gelu | relu | silu | swiglu | geglu [, bias]): up (and gate)
 * projection, activation, down projection. Sharded Megatron style: rank i of a group computes
 * hidden columns [lo, hi) of the up/gate projections (in blocks of 64 columns when every rank
 * gets at least one, for GEMM-friendly shapes) and the matching rows of the down projection;
 * the group sums (row-parallel). */
#include <string.h>

#include "layer_kind.h"
#include "planner.h"
#include "sema.h"
#include "shard_lower.h"

enum { W_UP, B_UP, W_GATE, B_GATE, W_DOWN, B_DOWN, ACT }; /* roles: parameters, then internals */
static const char *const roles[] = {"w_up", "b_up", "w_gate", "b_gate", "w_down", "b_down", NULL};
enum { F, DIN, DOUT, GATED, UP_BIAS }; /* layer_dims.size slots */
static const char *const activations[] = {"gelu", "relu", "silu", "swiglu", "geglu", NULL};

static int32_t lower(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  int64_t D = layer_last_dim(s, c->x), Fn = c->arg[0].i;
  const char *act = c->arg[1].word;
  bool bias = c->arg[2].set && c->arg[2].b;
  bool glu = strcmp(act, "swiglu") == 0 || strcmp(act, "geglu") == 0;
  int32_t up = layer_dense(s, c->x, Fn, W_UP, B_UP, bias, loc, NULL);
  int32_t h;
  if (glu) {
    int32_t gate = layer_dense(s, c->x, Fn, W_GATE, B_GATE, bias, loc, NULL);
    int32_t a = layer_op1(s, act[0] == 's' ? IR_SILU : IR_GELU, gate, loc);
    layer_mark(s, ACT, a);
    h = layer_op2(s, IR_MUL, a, up, loc);
  } else {
    ir_opcode code = strcmp(act, "gelu") == 0 ? IR_GELU : strcmp(act, "relu") == 0 ? IR_RELU : IR_SILU;
    h = layer_op1(s, code, up, loc);
    layer_mark(s, ACT, h);
  }
  int32_t mm = -1, y = h < 0 ? -1 : layer_dense(s, h, D, W_DOWN, B_DOWN, bias, loc, &mm);
  layer_set_core(s, mm);
  return y;
}

static void describe(const ir_module *m, const ir_layer *ly, layer_dims *d) {
  const ntp_shape up = m->values[ly->role[W_UP]].shape;
  d->units = d->size[F] = up.dim[0];
  d->size[DIN] = d->width = up.dim[1];
  d->size[DOUT] = m->values[ly->role[W_DOWN]].shape.dim[0];
  d->size[GATED] = ly->role[W_GATE] >= 0;
  d->size[UP_BIAS] = ly->role[B_UP] >= 0;
  d->wdt = m->values[ly->role[W_UP]].dtype;
}

static void split(const layer_dims *d, int t, int i, layer_slice *out) {
  *out = (layer_slice){0};
  int64_t unit = d->size[F] >= 64 * t ? 64 : 1; /* GEMM-friendly column blocks */
  split_units(d->size[F], unit, t, i, &out->lo, &out->hi);
}

static void shard(shard_lowering *L, const shard_group *g) {
  const ir_module *m = shard_module(L);
  const ir_layer *ly = g->ly;
  int32_t up = ly->role[W_UP], gate = ly->role[W_GATE], down = ly->role[W_DOWN];
  ir_opcode act = ir_def(m, ly->role[ACT])->code;
  ntp_dtype dt = m->values[g->core].dtype;
  int32_t parts[NTP_MAX_GROUPS * 8];
  for (int i = 0; i < g->t; i++) {
    int32_t rank = g->r0 + i;
    layer_slice sl;
    split(g->d, g->t, i, &sl);
    int32_t xt = shard_ensure(L, g->x, rank, shard_rows_box(L, g->x, g));
    int32_t h = shard_col_linear(L, rank, xt, up, ly->role[B_UP], sl.lo, sl.hi, -1, (ntp_box){0});
    ntp_box hb = shard_tensor_box(L, h);
    ntp_shape hs = box_shape(&hb);
    if (gate >= 0) {
      int32_t gt = shard_col_linear(L, rank, xt, gate, ly->role[B_GATE], sl.lo, sl.hi, -1, (ntp_box){0});
      gt = shard_temp(L, rank, act, &gt, 1, NULL, hs, dt);
      int32_t a2[2] = {gt, h};
      h = shard_temp(L, rank, IR_MUL, a2, 2, NULL, hs, dt);
    } else {
      h = shard_temp(L, rank, act, &h, 1, NULL, hs, dt);
    }
    ir_op mm = {.attr.mm.trans_b = true};
    int32_t a2[2] = {h, shard_ensure(L, down, rank, shard_weight_box(L, down, 1, sl.lo, sl.hi))};
    ntp_shape ps = hs;
    ps.dim[ps.ndim - 1] = m->values[down].shape.dim[0];
    parts[i] = shard_temp(L, rank, IR_MATMUL, a2, 2, &mm, ps, dt);
  }
  shard_group_reduce(L, g, parts, "mlp: row-parallel down projection");
}

static void cost(const layer_cost_in *in, layer_cost *out) {
  const plan_profile *p = in->prof;
  const layer_dims *d = in->d;
  layer_slice sl;
  split(d, in->t, in->i, &sl);
  double eb = (double)dtype_bytes(in->dt), wb = (double)dtype_bytes(d->wdt), M = in->M;
  double out_div = in->sp && in->t > 1 ? in->t : 1;
  bool gated = d->size[GATED], up_bias = d->size[UP_BIAS];
  double f = (double)(sl.hi - sl.lo), Din = (double)d->size[DIN], Dout = (double)d->size[DOUT], ups = gated ? 2 : 1;
  double tm = ups * plan_gemm_time(p, in->dt, M, f, Din);
  if (up_bias) tm += ups * plan_stream_time(p, 2 * M * f * eb);
  tm += plan_stream_time(p, 2 * M * f * eb);
  if (gated) tm += plan_stream_time(p, 3 * M * f * eb);
  tm += plan_gemm_time(p, in->dt, M, Dout, f);
  out->time = tm;
  out->params = ups * plan_tensor_bytes(f * Din * wb) + plan_tensor_bytes(Dout * f * wb) +
                (up_bias ? ups * plan_tensor_bytes(f * wb) : 0);
  out->act = M * Din * eb + M * f * eb * (ups * (up_bias ? 2 : 1) + 1 + (gated ? 1 : 0)) + M * Dout * eb +
             (in->t > 1 ? M * Dout * eb / out_div : 0);
}

const layer_kind layer_mlp = {
    .name = "mlp",
    .args = {{"hidden", LA_DIM, true, NULL, NULL}, {"act", LA_WORD, true, activations, "activation"}, {"bias", LA_BOOL, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .unit_name = "hidden columns",
    .describe = describe,
    .split = split,
    .shard = shard,
    .cost = cost,
    .reduces = true,
    .weight_role = -1,
    .color = "#d95f02",
};
