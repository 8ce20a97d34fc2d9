/* attention.c — attention(x, heads = H [, kv_heads] [, head_dim] [, rope = theta] [, causal]
 * [, bias]): q, k, v projections, rotary positions, scaled dot-product attention with grouped
 * KV heads, output projection. Sharded head-parallel: rank i of a group computes whole heads
 * (whole KV groups when there are at least as many KV heads as ranks, else a share of the query
 * heads and the KV heads they read, replicated) and its slice of the output projection's input;
 * the group sums (row-parallel). */
#include <math.h>

#include "layer_kind.h"
#include "planner.h"
#include "sema.h"
#include "shard_lower.h"

enum { WQ, BQ, WK, BK, WV, BV, WO, BO, ATT, ROPE_Q }; /* roles: parameters, then internals */
static const char *const roles[] = {"wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", NULL};
enum { H, KV, HD, S, DIN, DOUT, QKV_BIAS, ROPE, CAUSAL }; /* layer_dims.size slots */

static int32_t lower(sema *s, layer_call *c) {
  ntp_loc loc = c->call->loc;
  ntp_shape xs = s->m->values[c->x].shape;
  if (xs.ndim != 3) {
    sema_error(s, c->x_loc, "attention needs x of shape [B, S, D], got %s", sema_type_str(s, c->x));
    return -1;
  }
  int64_t Bn = xs.dim[0], Sn = xs.dim[1], D = xs.dim[2];
  int64_t Hn = c->arg[0].i, KVn = c->arg[1].set ? c->arg[1].i : Hn;
  if (Hn % KVn) {
    sema_error(s, c->arg[1].loc, "heads = %lld is not a multiple of kv_heads = %lld", (long long)Hn, (long long)KVn);
    return -1;
  }
  int64_t HDn;
  if (c->arg[2].set) {
    HDn = c->arg[2].i;
  } else if (D % Hn) {
    sema_error(s, c->arg[0].loc, "model dim %lld does not split into heads = %lld; give head_dim", (long long)D,
               (long long)Hn);
    return -1;
  } else {
    HDn = D / Hn;
  }
  bool rope = c->arg[3].set;
  if (rope && (c->arg[3].f <= 0)) {
    sema_error(s, c->arg[3].loc, "rope theta must be positive, got %g", c->arg[3].f);
    return -1;
  }
  if (rope && HDn % 2) {
    sema_error(s, c->arg[3].loc, "rope needs an even head_dim, got %lld", (long long)HDn);
    return -1;
  }
  int64_t width;
  if (__builtin_mul_overflow(Hn, HDn, &width) || width > NTP_MAX_TENSOR_ELEMS) {
    sema_error(s, c->arg[0].loc, "heads = %lld times head_dim = %lld is too large (at most 2^40)", (long long)Hn,
               (long long)HDn);
    return -1;
  }
  bool causal = c->arg[4].set && c->arg[4].b, bias = c->arg[5].set && c->arg[5].b;
  int32_t q = layer_dense(s, c->x, Hn * HDn, WQ, BQ, bias, loc, NULL);
  int32_t k = layer_dense(s, c->x, KVn * HDn, WK, BK, bias, loc, NULL);
  int32_t v = layer_dense(s, c->x, KVn * HDn, WV, BV, bias, loc, NULL);
  q = layer_reshape(s, q, (ntp_shape){4, {Bn, Sn, Hn, HDn}}, loc);
  k = layer_reshape(s, k, (ntp_shape){4, {Bn, Sn, KVn, HDn}}, loc);
  v = layer_reshape(s, v, (ntp_shape){4, {Bn, Sn, KVn, HDn}}, loc);
  if (rope) {
    ir_op attrs = {.attr.rope.theta = (float)c->arg[3].f};
    if (q >= 0) q = sema_op(s, IR_ROPE, &q, 1, loc, &attrs);
    if (k >= 0) k = sema_op(s, IR_ROPE, &k, 1, loc, &attrs);
    if (q >= 0) layer_mark(s, ROPE_Q, q);
  }
  if (q < 0 || k < 0 || v < 0) return -1;
  ir_op attrs = {.attr.attn = {.causal = causal, .scale = (float)(1.0 / sqrt((double)HDn)), .group = Hn / KVn}};
  int32_t args[3] = {q, k, v};
  int32_t o = sema_op(s, IR_ATTENTION, args, 3, loc, &attrs);
  if (o >= 0) layer_mark(s, ATT, o);
  o = layer_reshape(s, o, (ntp_shape){3, {Bn, Sn, Hn * HDn}}, loc);
  int32_t mm = -1, y = o < 0 ? -1 : layer_dense(s, o, D, WO, BO, bias, loc, &mm);
  layer_set_core(s, mm);
  return y;
}

static void describe(const ir_module *m, const ir_layer *ly, layer_dims *d) {
  const ir_op *att = ir_def(m, ly->role[ATT]);
  const ntp_shape qs = m->values[att->args[0]].shape, ks = m->values[att->args[1]].shape;
  d->units = d->size[H] = qs.dim[2];
  d->size[KV] = ks.dim[2];
  d->size[HD] = qs.dim[3];
  d->size[S] = qs.dim[1];
  d->size[DIN] = d->width = m->values[ly->role[WQ]].shape.dim[1];
  d->size[DOUT] = m->values[ly->role[WO]].shape.dim[0];
  d->size[QKV_BIAS] = ly->role[BQ] >= 0;
  d->size[ROPE] = ly->role[ROPE_Q] >= 0;
  d->size[CAUSAL] = att->attr.attn.causal;
  d->wdt = m->values[ly->role[WQ]].dtype;
}

/* query heads [lo, hi) and the KV heads [lo2, hi2) they read */
static void split(const layer_dims *d, int t, int i, layer_slice *out) {
  int64_t grp = d->size[H] / d->size[KV];
  if (t <= d->size[KV]) { /* whole KV groups per rank: no KV head is computed twice */
    split_range(d->size[KV], t, i, &out->lo2, &out->hi2);
    out->lo = out->lo2 * grp;
    out->hi = out->hi2 * grp;
  } else { /* more ranks than KV heads: split query heads, replicate the KV heads they need */
    split_range(d->size[H], t, i, &out->lo, &out->hi);
    out->lo2 = out->lo / grp;
    out->hi2 = (out->hi - 1) / grp + 1;
  }
}

static void shard(shard_lowering *L, const shard_group *g) {
  const ir_module *m = shard_module(L);
  const ir_layer *ly = g->ly;
  const ir_op *att = ir_def(m, ly->role[ATT]);
  const ir_op *rope = ly->role[ROPE_Q] >= 0 ? ir_def(m, ly->role[ROPE_Q]) : NULL;
  int64_t HDn = g->d->size[HD], Sn = g->d->size[S], grp = g->d->size[H] / g->d->size[KV];
  int32_t wo = ly->role[WO];
  ntp_dtype dt = m->values[g->core].dtype;
  int32_t parts[NTP_MAX_GROUPS * 8];
  for (int i = 0; i < g->t; i++) {
    int32_t rank = g->r0 + i;
    layer_slice sl;
    split(g->d, g->t, i, &sl);
    int64_t qlo = sl.lo, qhi = sl.hi, klo = sl.lo2, khi = sl.hi2;
    int64_t b = g->b1 - g->b0, hq = qhi - qlo, hk = khi - klo;
    int32_t xt = shard_ensure(L, g->x, rank, shard_rows_box(L, g->x, g));
    int32_t q = shard_col_linear(L, rank, xt, ly->role[WQ], ly->role[BQ], qlo * HDn, qhi * HDn, -1, (ntp_box){0});
    int32_t k = shard_col_linear(L, rank, xt, ly->role[WK], ly->role[BK], klo * HDn, khi * HDn, -1, (ntp_box){0});
    int32_t v = shard_col_linear(L, rank, xt, ly->role[WV], ly->role[BV], klo * HDn, khi * HDn, -1, (ntp_box){0});
    q = shard_temp(L, rank, IR_RESHAPE, &q, 1, NULL, (ntp_shape){4, {b, Sn, hq, HDn}}, dt);
    k = shard_temp(L, rank, IR_RESHAPE, &k, 1, NULL, (ntp_shape){4, {b, Sn, hk, HDn}}, dt);
    v = shard_temp(L, rank, IR_RESHAPE, &v, 1, NULL, (ntp_shape){4, {b, Sn, hk, HDn}}, dt);
    if (rope) {
      q = shard_temp(L, rank, IR_ROPE, &q, 1, rope, (ntp_shape){4, {b, Sn, hq, HDn}}, dt);
      k = shard_temp(L, rank, IR_ROPE, &k, 1, rope, (ntp_shape){4, {b, Sn, hk, HDn}}, dt);
    }
    ir_op attrs = *att;
    attrs.attr.attn.q_off = qlo;
    attrs.attr.attn.kv_off = klo;
    attrs.attr.attn.group = grp;
    int32_t qkv[3] = {q, k, v};
    int32_t o = shard_temp(L, rank, IR_ATTENTION, qkv, 3, &attrs, (ntp_shape){4, {b, Sn, hq, HDn}}, dt);
    o = shard_temp(L, rank, IR_RESHAPE, &o, 1, NULL, (ntp_shape){3, {b, Sn, hq * HDn}}, dt);
    ir_op mm = {.attr.mm.trans_b = true};
    int32_t a2[2] = {o, shard_ensure(L, wo, rank, shard_weight_box(L, wo, 1, qlo * HDn, qhi * HDn))};
    parts[i] = shard_temp(L, rank, IR_MATMUL, a2, 2, &mm, (ntp_shape){3, {b, Sn, m->values[wo].shape.dim[0]}}, dt);
  }
  shard_group_reduce(L, g, parts, "attention: row-parallel output projection");
}

static void cost(const layer_cost_in *in, layer_cost *out) {
  const plan_profile *p = in->prof;
  const layer_dims *d = in->d;
  layer_slice sl;
  split(d, in->t, in->i, &sl);
  int64_t hq = sl.hi - sl.lo, hk = sl.hi2 - sl.lo2;
  double eb = (double)dtype_bytes(in->dt), wb = (double)dtype_bytes(d->wdt), M = in->M;
  double out_div = in->sp && in->t > 1 ? in->t : 1;
  bool qkv_bias = d->size[QKV_BIAS], rope = d->size[ROPE];
  double q = (double)(hq * d->size[HD]), k = (double)(hk * d->size[HD]), Din = (double)d->size[DIN],
         Dout = (double)d->size[DOUT];
  double tm = plan_gemm_time(p, in->dt, M, q, Din) + 2 * plan_gemm_time(p, in->dt, M, k, Din);
  if (qkv_bias) tm += 3 * plan_stream_time(p, 2 * M * (q + 2 * k) / 3 * eb);
  if (rope) tm += 2 * plan_stream_time(p, M * (q + k) * eb);
  tm += plan_attention_time(p, in->dt, (double)in->b, (double)hq, (double)hk, (double)d->size[S], (double)d->size[HD],
                            d->size[CAUSAL]);
  tm += plan_gemm_time(p, in->dt, M, Dout, q);
  out->time = tm;
  out->params = plan_tensor_bytes(q * Din * wb) + 2 * plan_tensor_bytes(k * Din * wb) +
                plan_tensor_bytes(Dout * q * wb) +
                (qkv_bias ? plan_tensor_bytes(q * wb) + 2 * plan_tensor_bytes(k * wb) : 0);
  out->act = M * Din * eb + M * (q + 2 * k) * eb * (qkv_bias ? 2 : 1) + (rope ? M * (q + k) * eb : 0) +
             M * (2 * q + 2 * k) * eb + M * q * eb + M * Dout * eb + (in->t > 1 ? M * Dout * eb / out_div : 0);
}

const layer_kind layer_attention = {
    .name = "attention",
    .args = {{"heads", LA_DIM, true, NULL, NULL}, {"kv_heads", LA_DIM, false, NULL, NULL}, {"head_dim", LA_DIM, false, NULL, NULL},
             {"rope", LA_FLOAT, false, NULL, NULL}, {"causal", LA_FLAG, false, NULL, NULL}, {"bias", LA_BOOL, false, NULL, NULL}},
    .roles = roles,
    .lower = lower,
    .unit_name = "heads",
    .describe = describe,
    .split = split,
    .shard = shard,
    .cost = cost,
    .reduces = true,
    .weight_role = -1,
    .color = "#1b9e77",
};
