/* linear.c — linear(x, out = N [, bias = true] [, tied = LAYER]): y = x @ w^T (+ b), w stored
 * [out, in] as PyTorch stores it, or shared with an earlier layer's table (a tied head).
 * Sharded column-parallel: rank i of a group computes output columns [lo, hi) and keeps them;
 * no reduction (the output stays split along its last dim over the group). */
#include <string.h>

#include "layer_kind.h"
#include "planner.h"
#include "sema.h"
#include "shard_lower.h"

enum { W, B };                             /* roles */
static const char *const roles[] = {"w", "b", NULL};
enum { N, K };                             /* layer_dims.size slots */

/* the weight a 'tied = ' names: the weight of an earlier layer of a kind that can be tied to */
static int32_t tied_weight(sema *s, layer_call *c, int64_t K_, int64_t *N_out) {
  const char *tied = c->arg[2].word;
  int64_t li = -1;
  const char *local = arena_printf(s->pool, "%s%s", s->prefix, tied);
  if (!strmap_get(&s->layers, local, &li) && !strmap_get(&s->layers, tied, &li)) {
    const char *cands[256];
    size_t n = 0;
    for (size_t l = 0; l < s->m->n_layers && n < 256; l++)
      if (layer_kind_of(&s->m->layers[l])->tie_source) cands[n++] = s->m->layers[l].name;
    const char *near = nearest_name(tied, cands, n);
    if (near) sema_error(s, c->arg[2].loc, "tied = '%s' names no earlier layer; did you mean '%s'?", tied, near);
    else sema_error(s, c->arg[2].loc, "tied = '%s' names no earlier layer", tied);
    return -1;
  }
  const ir_layer *l = &s->m->layers[li];
  if (!layer_kind_of(l)->tie_source || l->weight < 0) {
    char what[128];
    sema_error(s, c->arg[2].loc, "tied = '%s' must name %s layer; '%s' is a %s", tied,
               layer_tie_sources(what, sizeof what), l->name, layer_kind_of(l)->name);
    return -1;
  }
  int32_t w = l->weight;
  ntp_shape ws = s->m->values[w].shape;
  int64_t N_ = c->arg[0].set ? c->arg[0].i : ws.dim[0];
  if (ws.dim[0] != N_ || ws.dim[1] != K_) {
    char a[64];
    sema_error(s, c->arg[2].loc, "tied weight '%s' is %s, but this linear needs [out, in] = [%lld, %lld]",
               s->m->values[w].name, shape_str(&ws, a, sizeof a), (long long)N_, (long long)K_);
    return -1;
  }
  *N_out = N_;
  return w;
}

static int32_t lower(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  int64_t Kn = layer_last_dim(s, c->x), Nn;
  bool bias = c->arg[1].set && c->arg[1].b;
  int32_t w;
  if (c->arg[2].set) {
    if ((w = tied_weight(s, c, Kn, &Nn)) < 0) return -1;
    layer_mark(s, W, w);
  } else {
    if (!c->arg[0].set) {
      sema_error(s, c->call->call.callee_loc, "linear needs 'out = N' (or 'tied = LAYER')");
      return -1;
    }
    Nn = c->arg[0].i;
    w = layer_param(s, W, layer_shape2(Nn, Kn), 0, layer_fan_in_scale(Kn), loc);
  }
  int32_t y = layer_matmul_tb(s, c->x, w, loc);
  layer_set_core(s, y);
  if (bias) y = layer_op2(s, IR_ADD, y, layer_param(s, B, layer_shape1(Nn), 0, 0.1f, loc), loc);
  return y;
}

static void describe(const ir_module *m, const ir_layer *ly, layer_dims *d) {
  const ir_value *w = &m->values[ly->role[W]];
  d->units = d->size[N] = w->shape.dim[0];
  d->size[K] = d->width = w->shape.dim[1];
  d->wdt = w->dtype;
}

static void split(const layer_dims *d, int t, int i, layer_slice *out) {
  *out = (layer_slice){0};
  split_range(d->size[N], t, i, &out->lo, &out->hi);
}

static void shard(shard_lowering *L, const shard_group *g) {
  int32_t w = g->ly->role[W];
  for (int i = 0; i < g->t; i++) {
    int32_t rank = g->r0 + i;
    layer_slice sl;
    split(g->d, g->t, i, &sl);
    ntp_box out = shard_rows_box(L, g->core, g);
    out.lo[out.ndim - 1] = sl.lo;
    out.hi[out.ndim - 1] = sl.hi;
    int32_t xt = shard_ensure(L, g->x, rank, shard_rows_box(L, g->x, g));
    shard_add_home(L, g->core, shard_col_linear(L, rank, xt, w, -1, sl.lo, sl.hi, g->core, out));
  }
}

static void cost(const layer_cost_in *in, layer_cost *out) {
  layer_slice sl;
  split(in->d, in->t, in->i, &sl);
  double eb = (double)dtype_bytes(in->dt), wb = (double)dtype_bytes(in->d->wdt), M = in->M;
  double n = (double)(sl.hi - sl.lo), Kd = (double)in->d->size[K];
  out->time = plan_gemm_time(in->prof, in->dt, M, n, Kd);
  out->params = plan_tensor_bytes(n * Kd * wb);
  out->act = M * Kd * eb + M * n * eb;
}

const layer_kind layer_linear = {
    .name = "linear",
    .args = {{"out", LA_DIM, false, NULL, NULL}, {"bias", LA_BOOL, false, NULL, NULL}, {"tied", LA_LAYER, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .unit_name = "output columns",
    .describe = describe,
    .split = split,
    .shard = shard,
    .cost = cost,
    .reduces = false,
    .weight_role = W,
    .color = "#e7298a",
};
