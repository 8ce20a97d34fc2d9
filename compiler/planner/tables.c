/* tables.c — the cost tables of one world: per layer and placement its time and memory, per pair
 * of consecutive layers the transition (redistribution) times; shared between identical layers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner_internal.h"

/* ======================================================================================
 * cost tables of one world
 * ====================================================================================== */


const plan_place *plan_tables_state(const plan_tables *t, int32_t s) { return &t->st[s]; }
int32_t plan_tables_nstates(const plan_tables *t) { return t->S; }
double plan_tables_param_bytes(const plan_tables *t, int32_t layer, int32_t s) { return t->pmax[(size_t)layer * t->S + s]; }
double plan_tables_fixed_bytes(const plan_tables *t) { return t->act_reserve + t->const_mem; }
double plan_tables_act_bytes(const plan_tables *t, int32_t layer, int32_t s) { return t->amax[(size_t)layer * t->S + s]; }
double plan_tables_const_bytes(const plan_tables *t) { return t->const_mem; }


void pl_group_starts(const plan_place *pl, int32_t *gs) {
  gs[0] = 0;
  for (int g = 0; g < pl->ngroups; g++) gs[g + 1] = gs[g] + pl->size[g];
}

/* The pieces of a value of shape s that lives at home h (state `state` of h's layer). */
static int home_pieces(const plan_tables *T, home h, int32_t state, ntp_shape s, rbox *out) {
  int n = 0;
  if (h.kind == H_DEFAULT) return box_default_split(s, T->W, out); /* as the compiler places it */
  const plan_place *pl = &T->st[state];
  const chain_layer *c = &T->pm->L[h.layer];
  int64_t rows[NTP_MAX_GROUPS + 1];
  int32_t gs[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, c->rows, rows);
  pl_group_starts(pl, gs);
  for (int g = 0; g < pl->ngroups; g++) {
    if (rows[g + 1] == rows[g]) continue;
    int t = pl->size[g];
    for (int i = 0; i < t; i++)
      out[n++] = (rbox){gs[g] + i, geom_group_piece(s, rows[g], rows[g + 1], c->whole, t, i, h.seq && pl->sp, h.cols)};
  }
  return n;
}

/* What an operand of shape vs must hold for a result piece rb. */
static ntp_box need_box(ntp_box rb, ntp_shape vs, int8_t xf) {
  /* xf: the left or right operand of a matmul, or an operand of any other op */
  return geom_operand_need(xf == XF_SAME ? IR_ADD : IR_MATMUL, xf == XF_MM_B, rb, vs);
}

static int need_pieces(const plan_tables *T, home at, int32_t state, ntp_shape rs, ntp_shape vs, int8_t xf, rbox *out) {
  int n = home_pieces(T, at, state, rs, out), u = 0;
  for (int i = 0; i < n; i++) {
    rbox nb = {out[i].rank, need_box(out[i].box, vs, xf)};
    bool dup = false;
    for (int j = 0; j < u && !dup; j++) dup = out[j].rank == nb.rank && box_eq(&out[j].box, &nb.box);
    if (!dup) out[u++] = nb;
  }
  return u;
}

static int level_of_pair(const plan_tables *T, int32_t a, int32_t b) { return T->node[a] == T->node[b] ? PLAN_INTRA : PLAN_INTER; }

/* Bytes each rank receives and sends, by link level, when every need is served from the
 * pieces: a need is cut along every piece boundary and each cell comes from the rank itself
 * if it holds it, else from the nearest rank that does (the compiler's `ensure`). */
typedef struct traffic_ctx {
  const plan_tables *T;
  const rbox *src;
  int32_t rank;
  double eb, *in, *out;
} traffic_ctx;

static void count_cell(void *vc, int k, const ntp_box *cell) {
  traffic_ctx *c = vc;
  if (k < 0 || c->src[k].rank == c->rank) return;
  double b = (double)box_volume(cell) * c->eb;
  int lv = level_of_pair(c->T, c->src[k].rank, c->rank), W = c->T->W;
  c->in[lv * W + c->rank] += b;
  c->out[lv * W + c->src[k].rank] += b;
}

static void traffic(const plan_tables *T, const rbox *src, int nsrc, const rbox *need, int nneed, double eb, double *in,
                    double *out) {
  for (int k = 0; k < nneed; k++) {
    const ntp_box *nb = &need[k].box;
    int32_t r = need[k].rank;
    bool local = false; /* a piece on the rank holds it all: nothing moves (a fast path) */
    for (int p = 0; p < nsrc && !local; p++) local = src[p].rank == r && box_contains(&src[p].box, nb);
    if (local) continue;
    traffic_ctx c = {T, src, r, eb, in, out};
    if (!geom_serve(src, nsrc, r, nb, count_cell, &c)) break;
  }
}

/* A redistribution step: every rank's links run in parallel; the slowest rank sets the time. */
static double traffic_time(const plan_tables *T, const double *in, const double *out, plan_coll kind, double *max_in) {
  const plan_profile *p = T->prof;
  double msg[PLAN_NLEVELS] = {0}, worst = 0, mi = 0;
  bool used[PLAN_NLEVELS] = {0};
  for (int lv = 0; lv < PLAN_NLEVELS; lv++)
    for (int32_t r = 0; r < T->W; r++) {
      double b = in[lv * T->W + r] > out[lv * T->W + r] ? in[lv * T->W + r] : out[lv * T->W + r];
      if (b > msg[lv]) msg[lv] = b;
      if (b > 0) used[lv] = true;
    }
  for (int32_t r = 0; r < T->W; r++) {
    double tr = 0, rin = 0;
    for (int lv = 0; lv < PLAN_NLEVELS; lv++) {
      double b = in[lv * T->W + r] > out[lv * T->W + r] ? in[lv * T->W + r] : out[lv * T->W + r];
      rin += in[lv * T->W + r];
      if (b > 0) {
        double t = b / (p->link_bw[lv] * plan_curve_at(&p->eff[lv][kind], msg[lv]));
        if (t > tr) tr = t;
      }
    }
    if (tr > worst) worst = tr;
    if (rin > mi) mi = rin;
  }
  if (max_in) *max_in = mi;
  if (worst == 0) return 0;
  double lat = 0;
  for (int lv = 0; lv < PLAN_NLEVELS; lv++)
    if (used[lv] && p->lat[lv][kind] > lat) lat = p->lat[lv][kind];
  return lat + worst;
}

static int state_of(home h, int32_t s_lo, int32_t s_hi, int32_t lo) {
  return h.kind == H_LAYER && h.layer != lo ? s_hi : s_lo;
}

/* One move's time (and bytes into its most-loaded rank); s_lo/s_hi: states of layers lo, lo+1
 * (for a move inside one layer both are that layer's state). per_rank_in: optional [W]. */
double pl_move_eval(const plan_tables *T, const move *mv, int32_t lo, int32_t s_lo, int32_t s_hi, double *bytes,
                        double *per_rank_in) {
  int32_t W = T->W;
  size_t cap = (size_t)(mv->nprior + 1) * ((size_t)W * 4 + 8);
  rbox *src = malloc(cap * sizeof *src), *need = malloc(cap * sizeof *need);
  double *buf = calloc((size_t)4 * PLAN_NLEVELS * (size_t)W, sizeof *buf);
  double t = 0, mi = 0;
  if (src && need && buf) {
    int32_t ss = state_of(mv->src, s_lo, s_hi, lo), sa = state_of(mv->at, s_lo, s_hi, lo);
    int ns = home_pieces(T, mv->src, ss, mv->vs, src);
    for (int32_t k = 0; k < mv->nprior; k++) { /* copies made by earlier moves of the value */
      const move *p = &T->pm->moves[mv->prior[k]];
      ns += need_pieces(T, p->at, state_of(p->at, s_lo, s_hi, lo), p->rs, p->vs, p->xf, src + ns);
    }
    int nn = need_pieces(T, mv->at, sa, mv->rs, mv->vs, mv->xf, need);
    double *in = buf, *out = buf + PLAN_NLEVELS * W;
    traffic(T, src, ns, need, nn, (double)dtype_bytes(mv->dt), in, out);
    bool gather = mv->src.kind == H_LAYER && mv->at.kind == H_LAYER && pl_place_same_groups(&T->st[ss], &T->st[sa]) &&
                  T->pm->L[mv->src.layer].rows == T->pm->L[mv->at.layer].rows;
    t = traffic_time(T, in, out, gather ? COMM_ALL_GATHER : COMM_SEND_RECV, &mi);
    if (per_rank_in)
      for (int32_t r = 0; r < W; r++) per_rank_in[r] += in[r] + in[W + r];
  }
  free(src);
  free(need);
  free(buf);
  if (bytes) *bytes = mi;
  return t;
}

/* The 3D search: the bytes the busiest rank of layer i at state s receives when every value moved
 * into it comes from another stage's GPUs (nothing is local there): a stage boundary's
 * point-to-point transfer of one micro-batch, each way. */
double pl_stage_input_bytes(const plan_tables *T, int32_t i, int32_t s) {
  const plan_model *pm = T->pm;
  double *per = calloc((size_t)T->W, sizeof *per), most = 0;
  rbox *need = malloc(((size_t)T->W * 4 + 8) * sizeof *need);
  for (int32_t e = pm->pmove_off[i]; per && need && e < pm->pmove_off[i + 1]; e++) {
    const move *mv = &pm->moves[pm->pmove_ix[e]];
    if (mv->at.kind != H_LAYER || mv->at.layer != i || mv->nprior) continue; /* once per value */
    int nn = need_pieces(T, mv->at, s, mv->rs, mv->vs, mv->xf, need);
    for (int k = 0; k < nn; k++) per[need[k].rank] += (double)box_volume(&need[k].box) * (double)dtype_bytes(mv->dt);
  }
  for (int32_t r = 0; per && r < T->W; r++)
    if (per[r] > most) most = per[r];
  free(per);
  free(need);
  return most;
}

/* Rank i of a group of t with b rows: kernel time, parameter bytes, activation bytes (the kind's cost). */
void pl_core_rank(const plan_tables *T, const chain_layer *c, int t, int i, int64_t b, bool sp, double *time,
                      double *params, double *act) {
  layer_cost lc = {0};
  if (b > 0) {
    layer_cost_in in = {T->prof, &c->d, c->dt, t, i, b, (double)b * (double)c->T, sp};
    c->k->cost(&in, &lc);
  }
  if (time) *time = lc.time;
  if (params) *params = lc.params;
  if (act) *act = lc.act;
}

/* The ring reduction of a group: per-rank bytes as the compiler counts them, and its time. */
double pl_group_reduce(const plan_tables *T, const chain_layer *c, const plan_place *pl, int32_t r0, int t, int64_t b,
                           double *bytes) {
  *bytes = 0;
  if (!c->k->reduces || t <= 1 || b == 0) return 0;
  int64_t elems = b;
  for (int d = 1; d < c->out.ndim; d++) elems *= c->out.dim[d];
  bool scatter = pl->sp && c->out.ndim >= 2;
  int64_t eb = (int64_t)dtype_bytes(c->dt);
  int64_t per = elems * eb * (t - 1) / t * (scatter ? 1 : 2);
  int lv = PLAN_INTRA;
  for (int i = 1; i < t; i++)
    if (T->node[r0 + i] != T->node[r0]) lv = PLAN_INTER;
  *bytes = (double)per;
  return plan_coll_time(T->prof, (plan_level)lv, scatter ? COMM_REDUCE_SCATTER : COMM_ALL_REDUCE, (double)(elems * eb),
                        (double)per);
}

/* the time of an op that follows, on one piece */
static double fop_piece_time(const plan_profile *p, const fop *f, const ntp_box *rb) {
  ntp_shape ps = box_shape(rb);
  if (f->code == IR_MATMUL) {
    double M = 1;
    for (int d = 0; d + 1 < ps.ndim; d++) M *= (double)ps.dim[d];
    double K = (double)f->as[0].dim[f->as[0].ndim - 1], N = ps.ndim ? (double)ps.dim[ps.ndim - 1] : 1;
    return plan_gemm_time(p, f->dt, M, N, K);
  }
  double eb = (double)dtype_bytes(f->dt), bytes = (double)box_volume(rb) * eb;
  for (int i = 0; i < f->nargs; i++)
    if (!f->cst[i]) {
      ntp_box nb = need_box(*rb, f->as[i], XF_SAME);
      bytes += (double)box_volume(&nb) * eb;
    }
  return plan_stream_time(p, bytes);
}


/* Distinct (value, rank, box) slices, each counted once in its rank's bytes. */
typedef struct read_set {
  struct read_seen {
    int32_t value, rank;
    ntp_box box;
  } *done;
  size_t nd, cd;
} read_set;

static void read_set_add(read_set *rs, const sread *rd, const rbox *nb, int n, double *per_rank) {
  for (int i = 0; i < n; i++) {
    bool dup = false;
    for (size_t j = 0; j < rs->nd && !dup; j++)
      dup = rs->done[j].value == rd->value && rs->done[j].rank == nb[i].rank && box_eq(&rs->done[j].box, &nb[i].box);
    if (dup) continue;
    struct read_seen seen = {rd->value, nb[i].rank, nb[i].box};
    VEC_PUSH(rs->done, rs->nd, rs->cd, seen);
    per_rank[nb[i].rank] += plan_tensor_bytes((double)box_volume(&nb[i].box) * (double)dtype_bytes(rd->dt));
  }
}

/* Source slices read at a home, per rank (each distinct box once). */
void pl_add_reads(const plan_tables *T, home h, int32_t state, double *per_rank) {
  const plan_model *pm = T->pm;
  size_t cap = (size_t)T->W * 4 + 8;
  rbox *nb = malloc(cap * sizeof *nb);
  read_set rs = {0};
  int32_t slot = h.kind == H_LAYER ? h.layer : pm->n;
  for (int32_t e = pm->read_off[slot]; nb && e < pm->read_off[slot + 1]; e++) {
    const sread *rd = &pm->reads[pm->read_ix[e]];
    read_set_add(&rs, rd, nb, need_pieces(T, rd->at, state, rd->rs, rd->vs, rd->xf, nb), per_rank);
  }
  free(rs.done);
  free(nb);
}

/* Source slices read anywhere in a plan, per rank, each distinct (value, box) once across all
 * layers (the compiler materialises a slice once per rank). */
void pl_add_reads_plan(const plan_tables *T, const int32_t *choice, double *per_rank) {
  const plan_model *pm = T->pm;
  size_t cap = (size_t)T->W * 4 + 8;
  rbox *nb = malloc(cap * sizeof *nb);
  read_set rs = {0};
  for (size_t k = 0; nb && k < pm->nreads; k++) {
    const sread *rd = &pm->reads[k];
    int32_t state = rd->at.kind == H_LAYER ? choice[rd->at.layer] : 0;
    read_set_add(&rs, rd, nb, need_pieces(T, rd->at, state, rd->rs, rd->vs, rd->xf, nb), per_rank);
  }
  free(rs.done);
  free(nb);
}

/* Fops at a home: time of the slowest piece of each, summed; the largest piece bytes. */
static double fops_at(const plan_tables *T, home h, int32_t state, double *act) {
  const plan_model *pm = T->pm;
  size_t cap = (size_t)T->W * 4 + 8;
  rbox *pc = malloc(cap * sizeof *pc);
  double total = 0, ac = 0;
  int32_t slot = h.kind == H_LAYER ? h.layer : pm->n;
  for (int32_t e = pm->fop_off[slot]; pc && e < pm->fop_off[slot + 1]; e++) {
    const fop *f = &pm->fops[pm->fop_ix[e]];
    int n = home_pieces(T, f->at, state, f->rs, pc);
    double worst = 0, big = 0;
    for (int i = 0; i < n; i++) {
      double t = fop_piece_time(T->prof, f, &pc[i].box), b = (double)box_volume(&pc[i].box) * (double)dtype_bytes(f->dt);
      if (t > worst) worst = t;
      if (b > big) big = b;
    }
    total += worst;
    ac += big;
  }
  free(pc);
  if (act) *act = ac;
  return total;
}


/* Everything that depends on layer i's state alone. per_rank: optional [W] parameter bytes. */
void pl_unary_eval(const plan_tables *T, int32_t i, int32_t s, unary_out *u, double *per_rank) {
  const chain_layer *c = &T->pm->L[i];
  const plan_place *pl = &T->st[s];
  int64_t rows[NTP_MAX_GROUPS + 1];
  int32_t gs[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, c->rows, rows);
  pl_group_starts(pl, gs);
  double *prm = calloc((size_t)T->W, sizeof *prm);
  *u = (unary_out){0};
  for (int g = 0; g < pl->ngroups && prm; g++) {
    int64_t b = rows[g + 1] - rows[g];
    if (b == 0) continue;
    int t = pl->size[g];
    double tg = 0, ag = 0, rb;
    for (int k = 0; k < t; k++) {
      double tm, pa, ac;
      pl_core_rank(T, c, t, k, b, pl->sp, &tm, &pa, &ac);
      prm[gs[g] + k] += pa;
      if (tm > tg) tg = tm;
      if (ac > ag) ag = ac;
    }
    double tr = pl_group_reduce(T, c, pl, gs[g], t, b, &rb);
    if (tg > u->comp) u->comp = tg;
    if (ag > u->amax) u->amax = ag;
    if (tr > u->comm) u->comm = tr;
    if (rb > u->rbytes) u->rbytes = rb;
  }
  home h = {.kind = H_LAYER, .layer = i};
  double fa = 0;
  u->comp += fops_at(T, h, s, &fa);
  u->amax += fa;
  if (prm) pl_add_reads(T, h, s, prm);
  for (int32_t e = T->pm->umove_off[i]; e < T->pm->umove_off[i + 1]; e++) {
    const move *mv = &T->pm->moves[T->pm->umove_ix[e]];
    double mb;
    u->comm += pl_move_eval(T, mv, i, s, s, &mb, NULL);
    u->ubytes += mb;
    u->amax += mb;
  }
  /* values alive across the layer at its own placement (the residual stream entering it and its
   * copy where the layer's output is added to it) and 256-byte alignment of every tensor (the
   * compiler's arena). An upper bound, tested (tests/planner): the compiler's arena never
   * exceeds it, and ntpc plan checks it once more on the plan it writes. */
  int64_t bmax = 0;
  for (int g = 0; g < pl->ngroups; g++)
    if (rows[g + 1] - rows[g] > bmax) bmax = rows[g + 1] - rows[g];
  int64_t width = c->d.width; /* the stream */
  double piece = (double)bmax * (double)c->T * (double)width * (double)dtype_bytes(c->dt);
  u->amax += 2 * piece + 256.0 * (2.0 * T->pm->m->layers[c->ir].nops + 32);
  for (int32_t r = 0; prm && r < T->W; r++)
    if (prm[r] > u->pmax) u->pmax = prm[r];
  if (per_rank && prm) memcpy(per_rank, prm, (size_t)T->W * sizeof *prm);
  free(prm);
}

static bool legal_state(const plan_tables *T, int32_t i, int32_t s, bool pinned) {
  const chain_layer *c = &T->pm->L[i];
  const plan_place *pl = &T->st[s];
  int64_t rows[NTP_MAX_GROUPS + 1];
  pl_place_rows(pl, c->rows, rows);
  bool split = false;
  for (int g = 0; g < pl->ngroups; g++) {
    if (rows[g + 1] == rows[g]) continue;
    if (pl->size[g] > c->d.units) return false;
    if (pl->size[g] > 1) {
      split = true;
      if (pl->sp && (c->xs.ndim < 2 || c->xs.dim[1] < pl->size[g])) return false;
    }
  }
  if (pl->sp && !pinned && (!c->k->reduces || !split)) return false; /* no-op: the same as without */
  return true;
}

typedef struct keybuf {
  char *p;
  size_t n, cap;
} keybuf;

static void key_add(keybuf *k, const void *data, size_t len) {
  if (k->n + len > k->cap) {
    size_t nc = k->cap ? k->cap * 2 : 256;
    while (nc < k->n + len) nc *= 2;
    char *np = realloc(k->p, nc);
    if (!np) return;
    k->p = np;
    k->cap = nc;
  }
  memcpy(k->p + k->n, data, len);
  k->n += len;
}

static void key_home(keybuf *k, home h, int32_t layer) {
  int8_t f[4] = {h.kind, h.cols, h.seq, (int8_t)(h.kind == H_LAYER ? h.layer - layer : 0)};
  key_add(k, f, sizeof f);
}

/* structs have padding: keys are built field by field */
static void key_i64(keybuf *k, int64_t v) { key_add(k, &v, sizeof v); }

static void key_shape(keybuf *k, const ntp_shape *sh) {
  key_i64(k, sh->ndim);
  for (int d = 0; d < sh->ndim; d++) key_i64(k, sh->dim[d]);
}

/* Everything about a move (and the moves it depends on) that its cost depends on. */
static void key_move(keybuf *k, const plan_model *pm, const move *mv, int32_t layer) {
  key_home(k, mv->src, layer);
  key_home(k, mv->at, layer);
  key_shape(k, &mv->vs);
  key_shape(k, &mv->rs);
  key_i64(k, mv->xf);
  key_i64(k, mv->dt);
  for (int32_t j = 0; j < mv->nprior; j++) {
    const move *p = &pm->moves[mv->prior[j]];
    key_home(k, p->at, layer);
    key_shape(k, &p->rs);
    key_shape(k, &p->vs);
    key_i64(k, p->xf);
  }
}

static void key_layer(keybuf *k, const chain_layer *c) {
  int64_t v[] = {(int64_t)(intptr_t)c->k, c->dt, c->wdt, c->rows, c->T, c->d.units, c->d.width};
  key_add(k, v, sizeof v);
  key_add(k, c->d.size, sizeof c->d.size);
  key_shape(k, &c->xs);
  key_shape(k, &c->out);
}

/* layers that cost the same at every placement (what throughput_shares groups) */
bool pl_layers_alike(const chain_layer *a, const chain_layer *b) {
  keybuf x = {0}, y = {0};
  key_layer(&x, a);
  key_layer(&y, b);
  bool same = x.p && y.p && x.n == y.n && memcmp(x.p, y.p, x.n) == 0;
  free(x.p);
  free(y.p);
  return same;
}


/* a transition table for layer hi (from hi-1), shared by every layer with the same key */
static void trans_build(plan_tables *T, int32_t hi) {
  const plan_model *pm = T->pm;
  int32_t S = T->S;
  keybuf kb = {0};
  const chain_layer *a = &pm->L[hi - 1], *b = &pm->L[hi];
  key_i64(&kb, a->rows);
  key_i64(&kb, b->rows);
  key_add(&kb, T->legal + (size_t)(hi - 1) * S, (size_t)S);
  key_add(&kb, T->legal + (size_t)hi * S, (size_t)S);
  for (int32_t e = pm->pmove_off[hi]; e < pm->pmove_off[hi + 1]; e++) key_move(&kb, pm, &pm->moves[pm->pmove_ix[e]], hi);
  char *key = kb.p;
  size_t klen = kb.n;
  for (size_t e = 0; e < T->ncache; e++)
    if (T->cache[e].keylen == klen && memcmp(T->cache[e].key, key, klen) == 0) {
      T->trans[hi] = T->cache[e].time;
      T->tbytes[hi] = T->cache[e].bytes;
      T->ftrans[hi] = T->cache[e].ftime;
      free(key);
      return;
    }
  trans_entry te = {key, klen, calloc((size_t)S * S, sizeof(double)), calloc((size_t)S * S, sizeof(double)),
                    calloc((size_t)S * S, sizeof(float))};
  for (int32_t s0 = 0; s0 < S && te.time && te.bytes && te.ftime; s0++) {
    if (!T->legal[(size_t)(hi - 1) * S + s0]) continue;
    for (int32_t s1 = 0; s1 < S; s1++) {
      if (!T->legal[(size_t)hi * S + s1]) continue;
      double t = 0, by = 0;
      for (int32_t e = pm->pmove_off[hi]; e < pm->pmove_off[hi + 1]; e++) {
        const move *mv = &pm->moves[pm->pmove_ix[e]];
        double mb;
        t += pl_move_eval(T, mv, hi - 1, s0, s1, &mb, NULL);
        by += mb;
      }
      if (T->train) t *= T->st[s1].rc ? 3 : 2; /* the backward sends the gradients back; a recomputed layer
                                                  moves its inputs once more */
      te.time[(size_t)s0 * S + s1] = t;
      te.ftime[(size_t)s0 * S + s1] = (float)t;
      te.bytes[(size_t)s0 * S + s1] = by;
    }
  }
  VEC_PUSH(T->cache, T->ncache, T->ccache, te);
  T->trans[hi] = te.time;
  T->tbytes[hi] = te.bytes;
  T->ftrans[hi] = te.ftime;
}

void plan_tables_free(plan_tables *t) {
  if (!t) return;
  for (size_t e = 0; e < t->ncache; e++) {
    free(t->cache[e].key);
    free(t->cache[e].time);
    free(t->cache[e].bytes);
    free(t->cache[e].ftime);
  }
  free(t->cache);
  free(t->node);
  free(t->st);
  free(t->pin);
  free(t->legal);
  free(t->tcomp);
  free(t->tcomm);
  free(t->pmax);
  free(t->amax);
  free(t->pbytes);
  free(t->tsync);
  free(t->tsaved);
  free(t->famax);
  free(t->tbase);
  free(t->rbytes);
  free(t->ubytes);
  free(t->trans);
  free(t->tbytes);
  free(t->ftrans);
  free(t->ptime);
  free(t->punits);
  free(t);
}

/* What layer i's unary entries depend on, as bytes (NULL when out of memory). */
static char *unary_key(const plan_tables *T, int32_t i, size_t *len) {
  const plan_model *pm = T->pm;
  keybuf k = {0};
  key_layer(&k, &pm->L[i]);
  key_i64(&k, T->pin[i]);
  for (int32_t e = pm->fop_off[i]; e < pm->fop_off[i + 1]; e++) {
    const fop *f = &pm->fops[pm->fop_ix[e]];
    key_home(&k, f->at, i);
    key_i64(&k, f->code);
    key_i64(&k, f->dt);
    key_shape(&k, &f->rs);
    key_i64(&k, f->nargs);
    for (int a = 0; a < f->nargs; a++) {
      key_shape(&k, &f->as[a]);
      key_i64(&k, f->cst[a]);
    }
  }
  int32_t mark = -1;
  key_add(&k, &mark, sizeof mark);
  for (int32_t e = pm->read_off[i]; e < pm->read_off[i + 1]; e++) {
    const sread *rd = &pm->reads[pm->read_ix[e]];
    key_home(&k, rd->at, i);
    key_shape(&k, &rd->vs);
    key_shape(&k, &rd->rs);
    key_i64(&k, rd->xf);
    key_i64(&k, rd->dt);
    int32_t first = e; /* the value's identity within the layer (what deduplicates) */
    for (int32_t f = pm->read_off[i]; f < e && first == e; f++)
      if (pm->reads[pm->read_ix[f]].value == rd->value) first = f;
    first -= pm->read_off[i];
    key_add(&k, &first, sizeof first);
  }
  key_add(&k, &mark, sizeof mark);
  for (int32_t e = pm->umove_off[i]; e < pm->umove_off[i + 1]; e++) key_move(&k, pm, &pm->moves[pm->umove_ix[e]], i);
  if (k.n == 0 || !k.p) {
    free(k.p);
    return NULL;
  }
  *len = k.n;
  return k.p;
}

/* T's tables for n layers and S states over W ranks, zeroed; false when out of memory. */
static bool tables_alloc(plan_tables *T, int32_t n, int32_t S, int32_t W) {
  T->node = malloc((size_t)W * sizeof *T->node);
  T->st = malloc((size_t)S * sizeof *T->st);
  T->pin = malloc((size_t)n * sizeof *T->pin);
  size_t ns = (size_t)n * (size_t)S;
  T->legal = calloc(ns, 1);
  T->tcomp = calloc(ns, sizeof(double));
  T->tcomm = calloc(ns, sizeof(double));
  T->pmax = calloc(ns, sizeof(double));
  T->amax = calloc(ns, sizeof(double));
  T->rbytes = calloc(ns, sizeof(double));
  T->ubytes = calloc(ns, sizeof(double));
  T->pbytes = calloc(ns, sizeof(double));
  T->tsync = calloc(ns, sizeof(double));
  T->tsaved = calloc(ns, sizeof(double));
  T->famax = calloc(ns, sizeof(double));
  T->tbase = calloc(ns, sizeof(double));
  T->trans = calloc((size_t)n, sizeof *T->trans);
  T->tbytes = calloc((size_t)n, sizeof *T->tbytes);
  T->ftrans = calloc((size_t)n, sizeof *T->ftrans);
  T->ptime = calloc(ns, sizeof(float));
  T->punits = calloc(ns, sizeof(int64_t));
  return T->node && T->st && T->pin && T->legal && T->tcomp && T->tcomm && T->pmax && T->amax && T->rbytes &&
         T->ubytes && T->pbytes && T->tsync && T->tsaved && T->famax && T->tbase && T->trans && T->tbytes && T->ftrans && T->ptime && T->punits;
}

/* Layer i's unary entries at every state: those of an earlier layer alike (same >= 0), or
 * evaluated where the state is legal (and the layer's pin, if any); false: no state is legal. */
static bool unary_layer(plan_tables *T, int32_t i, int32_t same) {
  int32_t S = T->S;
  bool any = false;
  for (int32_t s = 0; s < S; s++) {
    size_t k = (size_t)i * S + s;
    if (same >= 0) {
      size_t kj = (size_t)same * S + s;
      T->legal[k] = T->legal[kj];
      T->tcomp[k] = T->tcomp[kj];
      T->tcomm[k] = T->tcomm[kj];
      T->pmax[k] = T->pmax[kj];
      T->amax[k] = T->amax[kj];
      T->rbytes[k] = T->rbytes[kj];
      T->ubytes[k] = T->ubytes[kj];
      T->pbytes[k] = T->pbytes[kj];
      T->tsync[k] = T->tsync[kj];
      T->tsaved[k] = T->tsaved[kj];
      T->famax[k] = T->famax[kj];
      T->tbase[k] = T->tbase[kj];
      any |= T->legal[k];
      continue;
    }
    if (T->pin[i] >= 0 && s != T->pin[i]) continue;
    if (!legal_state(T, i, s, T->pin[i] >= 0)) continue;
    T->legal[k] = 1;
    any = true;
    unary_out u;
    pl_unary_eval(T, i, s, &u, NULL);
    T->pbytes[k] = u.pmax;
    if (T->train) T->tsync[k] = pl_train_costs(T, i, s, &u);
    T->tcomp[k] = u.comp;
    T->tcomm[k] = u.comm;
    T->pmax[k] = u.pmax;
    T->amax[k] = u.amax;
    T->rbytes[k] = u.rbytes;
    T->ubytes[k] = u.ubytes;
    if (u.amax > T->act_reserve) T->act_reserve = u.amax;
  }
  return any;
}

static void report_no_placement(const plan_tables *T, int32_t i, diag_sink *diags) {
  const plan_model *pm = T->pm;
  const chain_layer *c = &pm->L[i];
  const ir_layer *ly = &pm->m->layers[c->ir];
  if (T->pin[i] >= 0) {
    char pbuf[256], msg[512];
    snprintf(msg, sizeof msg, "layer '%s' cannot take placement %s: it has %lld %s (a group may not be larger), or "
             "sequence parallelism needs as many positions as ranks", ly->name,
             plan_place_str(&T->st[T->pin[i]], pbuf, sizeof pbuf), (long long)c->d.units, c->k->unit_name);
    pl_model_error(pm->m, ly->loc, diags, msg);
  } else {
    char msg[300];
    snprintf(msg, sizeof msg, "layer '%s' has no placement on %d ranks", ly->name, T->W);
    pl_model_error(pm->m, ly->loc, diags, msg);
  }
}

/* Every layer's unary entries; layers alike (kind, shapes, what follows them, their pin) share
 * them. false when out of memory or a layer has no legal state (reported). */
static bool unary_tables(plan_tables *T, diag_sink *diags) {
  int32_t n = T->pm->n;
  char **ukey = calloc((size_t)n, sizeof *ukey);
  size_t *ulen = calloc((size_t)n, sizeof *ulen);
  bool ok = ukey && ulen;
  if (!ok) diag_out_of_memory(diags);
  for (int32_t i = 0; ok && i < n; i++) {
    ukey[i] = unary_key(T, i, &ulen[i]);
    int32_t same = -1;
    for (int32_t j = 0; j < i && same < 0 && ukey[i]; j++)
      if (ukey[j] && ulen[j] == ulen[i] && memcmp(ukey[j], ukey[i], ulen[i]) == 0) same = j;
    ok = unary_layer(T, i, same);
    if (!ok) report_no_placement(T, i, diags);
  }
  for (int32_t i = 0; ukey && i < n; i++) free(ukey[i]);
  free(ukey);
  free(ulen);
  return ok;
}

/* What no layer's state changes: ops on values no layer placed, and the moves between them. */
static void constant_costs(plan_tables *T) {
  const plan_model *pm = T->pm;
  int32_t n = pm->n, W = T->W;
  home def = {.kind = H_DEFAULT};
  double fa = 0;
  T->const_time = fops_at(T, def, 0, &fa) * (T->train ? 3 : 1);
  double *prm = calloc((size_t)W, sizeof *prm);
  if (prm) {
    pl_add_reads(T, def, 0, prm);
    for (int32_t r = 0; r < W; r++)
      if (prm[r] > T->const_mem) T->const_mem = prm[r];
  }
  free(prm);
  for (int32_t e = pm->umove_off[n]; e < pm->umove_off[n + 1]; e++)
    T->const_time += pl_move_eval(T, &pm->moves[pm->umove_ix[e]], 0, 0, 0, NULL, NULL);
  T->const_act = fa;
  if (fa > T->act_reserve) T->act_reserve = fa;
}

/* Builds every table for W ranks over the given states. pins: [n] pinned state or -1 (NULL: none).
 * node: [W] node of each rank (NULL: rank / nodes_of). */
plan_tables *pl_tables_build(const plan_model *pm, const plan_profile *prof, int32_t W, const int32_t *node,
                                 int32_t nodes_of, const plan_place *states, int32_t S, const int32_t *pins,
                                 bool train, diag_sink *diags) {
  plan_tables *T = calloc(1, sizeof *T);
  int32_t n = pm->n;
  if (!T) goto oom;
  T->train = train;
  T->red = 1;
  T->domain = nodes_of > 0 ? nodes_of : 8; /* a node, unless the request says otherwise */
  T->pm = pm;
  T->prof = prof;
  T->W = W;
  T->S = S;
  if (!tables_alloc(T, n, S, W)) goto oom;
  for (int32_t r = 0; r < W; r++) T->node[r] = node ? node[r] : r / (nodes_of > 0 ? nodes_of : 8);
  memcpy(T->st, states, (size_t)S * sizeof *states);
  for (int32_t i = 0; i < n; i++) T->pin[i] = pins ? pins[i] : -1;
  if (!unary_tables(T, diags)) {
    plan_tables_free(T);
    return NULL;
  }
  for (int32_t i = 1; i < n; i++) trans_build(T, i);
  constant_costs(T);
  return T;
oom:
  diag_out_of_memory(diags);
  plan_tables_free(T);
  return NULL;
}

plan_problem plan_tables_problem(plan_tables *T, double mem_cap, int32_t quanta, bool ceil_units) {
  int32_t n = T->pm->n, S = T->S;
  plan_problem pb = {.nlayers = n, .nstates = S, .legal = T->legal, .time = T->ptime, .units = T->punits,
                     .trans = (const float *const *)T->ftrans};
  if (quanta <= 0) quanta = 1024;
  double floor_sum = 0;
  for (int32_t i = 0; i < n; i++) {
    double pmin = INFINITY;
    for (int32_t s = 0; s < S; s++) {
      size_t k = (size_t)i * S + s;
      T->ptime[k] = (float)(T->tcomp[k] + T->tcomm[k]);
      if (T->legal[k] && T->pmax[k] < pmin) pmin = T->pmax[k];
    }
    floor_sum += pmin;
  }
  double slack = mem_cap - T->act_reserve - T->const_mem - floor_sum;
  T->quantum = slack > 0 ? slack / quanta : 0;
  pb.budget = slack >= 0 ? quanta : -1;
  for (int32_t i = 0; i < n; i++) {
    double pmin = INFINITY;
    for (int32_t s = 0; s < S; s++)
      if (T->legal[(size_t)i * S + s] && T->pmax[(size_t)i * S + s] < pmin) pmin = T->pmax[(size_t)i * S + s];
    for (int32_t s = 0; s < S; s++) {
      size_t k = (size_t)i * S + s;
      double x = T->pmax[k] - pmin;
      int64_t u;
      if (!T->legal[k] || x <= 0) u = 0;
      else if (T->quantum <= 0) u = (int64_t)quanta + 1;
      else {
        double q = x / T->quantum;
        q = ceil_units ? ceil(q * (1 + 1e-12)) : floor(q);
        u = q > (double)quanta + 1 ? (int64_t)quanta + 1 : (int64_t)q;
      }
      T->punits[k] = u;
    }
  }
  return pb;
}
