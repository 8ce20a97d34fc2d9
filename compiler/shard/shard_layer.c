/* shard_layer.c — one layer, lowered by its kind (compiler/layers/) inside each of its TP
 * groups, Megatron style, and the kit the kinds shard with (shard_lower.h). */
#include "geometry.h"
#include "shard_lowering.h"

/* ---- the kit the kinds shard with (shard_lower.h) ---------------------------------------- */

const ir_module *shard_module(const shard_lowering *L) { return L->m; }

ntp_box shard_rows_box(const shard_lowering *L, int32_t v, const shard_group *g) {
  return geom_group_piece(L->m->values[v].shape, g->b0, g->b1, g->whole, g->t, 0, false, false);
}

ntp_box shard_weight_box(const shard_lowering *L, int32_t w, int dim, int64_t lo, int64_t hi) {
  ntp_box b = box_full(&L->m->values[w].shape);
  b.lo[dim] = lo;
  b.hi[dim] = hi;
  return b;
}

ntp_box shard_tensor_box(const shard_lowering *L, int32_t t) { return L->p->tensors[t].box; }

static ntp_shape with_last(ntp_shape s, int64_t last) {
  s.dim[s.ndim - 1] = last;
  return s;
}

int32_t shard_compute(shard_lowering *L, int32_t rank, ir_opcode code, const int32_t *args, int nargs,
                      const ir_op *attrs, int32_t global, ntp_box gbox, ntp_dtype dt) {
  return lw_compute(L, rank, code, args, nargs, attrs, global, gbox, dt, L->m->values[global].name);
}

int32_t shard_col_linear(lower *L, int32_t rank, int32_t xt, int32_t w, int32_t b, int64_t lo, int64_t hi,
                         int32_t global, ntp_box gbox) {
  ir_op mm = {.attr.mm.trans_b = true};
  int32_t args[2] = {xt, shard_ensure(L, w, rank, shard_weight_box(L, w, 0, lo, hi))};
  ntp_shape s = with_last(box_shape(&L->p->tensors[xt].box), hi - lo);
  ntp_dtype dt = L->p->tensors[args[1]].dtype;
  int32_t y = global >= 0 && b < 0 ? lw_compute(L, rank, IR_MATMUL, args, 2, &mm, global, gbox, dt, L->m->values[global].name)
                                   : shard_temp(L, rank, IR_MATMUL, args, 2, &mm, s, dt);
  if (b >= 0) {
    ntp_box bb = {.ndim = 1, .lo = {lo}, .hi = {hi}};
    int32_t a2[2] = {y, shard_ensure(L, b, rank, bb)};
    y = shard_temp(L, rank, IR_ADD, a2, 2, NULL, s, dt);
  }
  return y;
}

/* Row-parallel end of a layer: partial sums of the group's rows of g->core reduced inside the
 * group; with sequence parallelism each rank keeps a slice of the sequence (dim 1). */
void shard_group_reduce(lower *L, const shard_group *g, const int32_t *parts, const char *why) {
  int32_t value = g->core;
  ntp_box full = shard_rows_box(L, value, g);
  ntp_box boxes[NTP_MAX_GROUPS * 8];
  int32_t outs[NTP_MAX_GROUPS * 8];
  if (g->t == 1) {
    sh_tensor *t = &L->p->tensors[parts[0]];
    t->global = value;
    t->box = full;
    t->name = L->m->values[value].name;
    shard_add_home(L, value, parts[0]);
    return;
  }
  for (int i = 0; i < g->t; i++) {
    L->p->tensors[parts[i]].box = full; /* partial sums of this box of the value */
    boxes[i] = geom_group_piece(L->m->values[value].shape, g->b0, g->b1, g->whole, g->t, i, g->pl->seq_parallel, false);
  }
  lw_reduce(L, parts, g->t, boxes, value, outs, why);
  for (int i = 0; i < g->t; i++) shard_add_home(L, value, outs[i]);
}

/* Group g's batch rows [row_lo[g], row_hi[g]) in micro-batch k of M: the rows split
 * over the pipelines by their shares, each pipeline's cut into M, then over its groups. */
static void layer_rows(const sh_placement *pl, int64_t rows, int32_t M, int32_t k, int64_t *row_lo, int64_t *row_hi) {
  int32_t np = pl->npipes ? pl->npipes : 1;
  int64_t pipe_rows[NTP_MAX_PIPES + 1], one = 1;
  shard_split_rows(rows, pl->npipes ? pl->pipe_share : &one, np, pipe_rows);
  int g0 = 0;
  for (int32_t p = 0; p < np; p++) {
    int g1 = g0;
    while (g1 < pl->ngroups && (!pl->npipes || pl->group_pipe[g1] == p)) g1++;
    int64_t lo, hi;
    split_range(pipe_rows[p + 1] - pipe_rows[p], M, k, &lo, &hi);
    int64_t part[NTP_MAX_GROUPS + 1];
    if (g1 > g0) shard_split_rows(hi - lo, &pl->share[g0], g1 - g0, part);
    for (int g = g0; g < g1; g++) {
      row_lo[g] = pipe_rows[p] + lo + part[g - g0];
      row_hi[g] = pipe_rows[p] + lo + part[g - g0 + 1];
    }
    g0 = g1;
  }
}

/* ---- one layer ----------------------------------------------------------------------------- */

/* A layer's group size must leave every rank at least one unit of work. */
static bool check_degree(lower *L, const ir_layer *ly, const layer_dims *d, int t) {
  if (t <= d->units) return true;
  diag_emit(L->diags, NTPC_ERROR, L->m->file, ly->loc, "layer '%s' has %lld %s; it cannot be split over %d ranks",
            ly->name, (long long)d->units, layer_kind_of(ly)->unit_name, t);
  L->failed = true;
  return false;
}

void lw_lower_layer(lower *L, int32_t l) {
  const ir_layer *ly = &L->m->layers[l];
  const layer_kind *kind = layer_kind_of(ly);
  sh_placement *pl = &L->p->placements[l];
  int32_t x = ly->input, core = ly->core;
  if (x < 0 || core < 0) {
    lw_error(L, "layer '%s' has no recorded input or core", ly->name);
    return;
  }
  int32_t end = L->m->values[core].def;
  layer_dims d;
  layer_describe(L->m, ly, &d);
  ntp_shape xs = vshape(L, x);
  /* batch rows over the pipelines and their groups; a vector input has none (one group takes
   * it, the others idle). Micro-batches (pipelined programs) cut each pipeline's rows into M,
   * lowered from the last to the first, so that the backward, which runs the steps in reverse,
   * sums every weight's gradient in micro-batch order, as the schedules run them. */
  int64_t rows = xs.ndim >= 2 ? xs.dim[0] : 1;
  int32_t M = L->M > 1 && xs.ndim >= 2 ? L->M : 1;
  for (int32_t k = M; k-- > 0 && !L->failed;) {
    if (L->M) L->mb = k;
    int64_t lo[NTP_MAX_GROUPS], hi[NTP_MAX_GROUPS];
    layer_rows(pl, rows, M, k, lo, hi);
    L->why = arena_printf(&L->p->pool, "%s: input redistribution", ly->name);
    /* every group's input first, so the redistribution is one collective per set of ranks */
    for (int g = 0; g < pl->ngroups; g++) {
      shard_group gc = {.b0 = lo[g], .b1 = hi[g], .whole = xs.ndim < 2};
      if (gc.b1 > gc.b0)
        for (int32_t r = pl->group_start[g]; r < pl->group_end[g]; r++) shard_ensure(L, x, r, shard_rows_box(L, x, &gc));
    }
    for (int g = 0; g < pl->ngroups; g++) {
      shard_group gc = {ly, pl, g, pl->group_start[g], sh_group_size(pl, g), lo[g], hi[g], xs.ndim < 2, x, core, &d};
      if (gc.b1 == gc.b0) continue; /* a group without batch rows idles in this layer */
      if (!check_degree(L, ly, &d, gc.t)) return;
      if (pl->seq_parallel && gc.t > 1 && (xs.ndim < 2 || xs.dim[1] < gc.t)) {
        diag_emit(L->diags, NTPC_ERROR, L->m->file, ly->loc,
                  "layer '%s': sequence parallelism over %d ranks needs at least %d sequence positions", ly->name, gc.t,
                  gc.t);
        L->failed = true;
        return;
      }
      kind->shard(L, &gc);
      if (L->failed) return;
    }
    if (M > 1) lw_flush(L); /* no collective mixes two micro-batches */
  }
  if (L->M) L->mb = -1;
  int64_t lo[NTP_MAX_GROUPS], hi[NTP_MAX_GROUPS]; /* what reports show: the whole batch's rows */
  layer_rows(pl, rows, 1, 0, lo, hi);
  for (int g = 0; g < pl->ngroups; g++) pl->row_start[g] = lo[g], pl->row_start[g + 1] = hi[g];
  /* the rest of the layer (bias adds, position embeddings) follows the core's pieces */
  L->why = arena_printf(&L->p->pool, "%s: redistribution", ly->name);
  for (int32_t i = end + 1; i < ly->first_op + ly->nops; i++) {
    const ir_op *op = &L->m->ops[i];
    L->loc = op->loc;
    if (op->code != IR_PARAM && op->code != IR_SLICE) lw_follow(L, op);
  }
}
