/* embedding.c — embedding(tokens, vocab = V, dim = D [, positions = P]): a table lookup, plus
 * learned positions. Sharded vocabulary-parallel: rank i of a group holds rows [lo, hi) of the
 * table, looks up the tokens that fall there (zeros elsewhere), and the group sums. */
#include <string.h>

#include "layer_kind.h"
#include "planner.h"
#include "sema.h"
#include "shard_lower.h"

enum { WTE, WPE };                         /* roles */
static const char *const roles[] = {"wte", "wpe", NULL};
enum { V, DM };                            /* layer_dims.size slots */

static int32_t lower(sema *s, layer_call *c) {
  int32_t tok = c->x;
  /* copies: creating the parameters below grows the value table and moves it */
  const ntp_dtype tok_dtype = s->m->values[tok].dtype;
  const ntp_shape tok_shape = s->m->values[tok].shape;
  if (tok_dtype != NTP_I32) {
    sema_error(s, c->x_loc, "embedding indices must be i32, got %s", sema_type_str(s, tok));
    return -1;
  }
  int64_t Vn = c->arg[0].i, D = c->arg[1].i;
  ntp_loc loc = c->call->loc;
  int32_t wte = layer_param(s, WTE, layer_shape2(Vn, D), 0, 1.0f, loc);
  if (wte < 0) return -1;
  s->m->layers[s->cur_layer].weight = wte;
  ir_op *def = ir_def(s->m, tok);
  /* token ids default to [0, V): the first embedding that reads an input sets its range (the
   * declaration's 1000 is only for inputs no embedding reads), later ones can only narrow it */
  if (def->code == IR_INPUT) {
    int32_t range = (int32_t)(Vn < INT32_MAX ? Vn : INT32_MAX);
    const char *key = s->m->values[tok].name;
    if (!strmap_get(&s->narrowed, key, NULL) || def->attr.init.int_range > range) def->attr.init.int_range = range;
    strmap_put(&s->narrowed, key, 1);
  }
  int32_t x = layer_op2(s, IR_GATHER, wte, tok, loc);
  layer_set_core(s, x);
  if (c->arg[2].set) {
    int64_t P = c->arg[2].i, S = tok_shape.ndim ? tok_shape.dim[tok_shape.ndim - 1] : 1;
    if (S > P) {
      sema_error(s, c->arg[2].loc, "positions = %lld is shorter than the sequence (%lld tokens)", (long long)P,
                 (long long)S);
      return -1;
    }
    int32_t wpe = layer_param(s, WPE, layer_shape2(P, D), 0, 0.5f, loc);
    if (P > S && wpe >= 0) {
      ir_op attrs = {.attr.slice = {.axis = 0, .start = 0, .len = S}};
      wpe = sema_op(s, IR_SLICE, &wpe, 1, loc, &attrs);
    }
    x = layer_op2(s, IR_ADD, x, wpe, loc);
  }
  return x;
}

static void describe(const ir_module *m, const ir_layer *ly, layer_dims *d) {
  const ir_value *w = &m->values[ly->role[WTE]];
  d->units = d->size[V] = w->shape.dim[0];
  d->size[DM] = d->width = w->shape.dim[1];
  d->wdt = w->dtype;
}

static void split(const layer_dims *d, int t, int i, layer_slice *out) {
  *out = (layer_slice){0};
  split_range(d->size[V], t, i, &out->lo, &out->hi);
}

static void shard(shard_lowering *L, const shard_group *g) {
  const ir_module *m = shard_module(L);
  int32_t wte = g->ly->role[WTE], parts[NTP_MAX_GROUPS * 8];
  for (int i = 0; i < g->t; i++) {
    int32_t rank = g->r0 + i;
    layer_slice sl;
    split(g->d, g->t, i, &sl);
    ir_op attrs = {.attr.gather = {sl.lo, sl.hi}};
    int32_t args[2] = {shard_ensure(L, wte, rank, shard_weight_box(L, wte, 0, sl.lo, sl.hi)),
                       shard_ensure(L, g->x, rank, shard_rows_box(L, g->x, g))};
    ntp_box rb = shard_rows_box(L, g->core, g);
    parts[i] = shard_temp(L, rank, IR_GATHER, args, 2, &attrs, box_shape(&rb), m->values[wte].dtype);
  }
  shard_group_reduce(L, g, parts, "embedding: vocabulary-parallel lookups summed");
}

static void cost(const layer_cost_in *in, layer_cost *out) {
  layer_slice sl;
  split(in->d, in->t, in->i, &sl);
  double eb = (double)dtype_bytes(in->dt), wb = (double)dtype_bytes(in->d->wdt), M = in->M;
  double D = (double)in->d->size[DM], out_div = in->sp && in->t > 1 ? in->t : 1;
  out->time = plan_stream_time(in->prof, 2 * M * D * eb + M * 4);
  out->params = plan_tensor_bytes((double)(sl.hi - sl.lo) * D * wb);
  out->act = M * D * eb + (in->t > 1 ? M * D * eb / out_div : 0);
}

const layer_kind layer_embedding = {
    .name = "embedding",
    .args = {{"vocab", LA_DIM, true, NULL, NULL}, {"dim", LA_DIM, true, NULL, NULL}, {"positions", LA_DIM, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .unit_name = "vocabulary rows",
    .describe = describe,
    .split = split,
    .shard = shard,
    .cost = cost,
    .reduces = true,
    .index_input = true,
    .weight_role = WTE,
    .tie_source = true,
    .color = "#8c6bb1",
};
