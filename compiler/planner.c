/* planner.c — the cost model and the exact search for per-layer TP placements.
 *
 * The model is read as a chain of sharded layers (the kinds with a `shard` rule,
 * compiler/layers/), each costed per rank by its kind; norms, residual adds and other ops "follow" the value they extend, exactly as the sharding pass
 * lowers them (docs/sharding.md). Every cost is then a function of one layer's placement
 * (its kernels, its reductions, the ops that follow it, the parameters it holds) or of two
 * consecutive layers' placements (the outputs of one moved to the other, counted by slice
 * intersection, the same rule as the compiler's `ensure`). That makes the search a shortest
 * path over layers, with memory as a knapsack constraint: a dynamic program over (layer,
 * placement, memory units used) is exact for it (docs/planner.md).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layer_kind.h"
#include "planner.h"
#include "shard.h"
#include "shard_internal.h"

#define INF_TIME INFINITY

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ======================================================================================
 * primitive costs
 * ====================================================================================== */

double plan_curve_at(const plan_curve *c, double x) {
  if (!c || c->n == 0) return 1;
  if (x <= c->x[0]) return c->y[0];
  if (x >= c->x[c->n - 1]) return c->y[c->n - 1];
  int i = 0;
  while (i + 1 < c->n && x >= c->x[i + 1]) i++;
  double a = log2(c->x[i]), b = log2(c->x[i + 1]), t = (log2(x) - a) / (b - a);
  return c->y[i] + t * (c->y[i + 1] - c->y[i]);
}

static double peak_flops(const plan_profile *p, ntp_dtype dt) {
  if (p->flops[dt] > 0) return p->flops[dt];
  if (dt == NTP_BF16 && p->flops[NTP_FP16] > 0) return p->flops[NTP_FP16];
  if (dt == NTP_FP16 && p->flops[NTP_BF16] > 0) return p->flops[NTP_BF16];
  double best = 0; /* a dtype the profile does not give: the slowest rate it gives */
  for (int i = 0; i < NTP_DTYPE_COUNT; i++)
    if (p->flops[i] > 0 && (best == 0 || p->flops[i] < best)) best = p->flops[i];
  return best > 0 ? best : 1e12;
}

static double mem_rate(const plan_profile *p) { return p->mem_bw * p->mem_eff; }

double plan_gemm_time(const plan_profile *p, ntp_dtype dt, double M, double N, double K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  double mn = M < N ? M : N;
  if (K < mn) mn = K;
  double eff = plan_curve_at(&p->gemm_eff, mn);
  double tc = 2 * M * N * K / (peak_flops(p, dt) * eff);
  double tm = (M * K + N * K + M * N) * (double)dtype_bytes(dt) / mem_rate(p);
  return p->launch + (tc > tm ? tc : tm);
}

double plan_stream_time(const plan_profile *p, double bytes) {
  if (bytes <= 0) return 0;
  return p->launch + bytes / mem_rate(p);
}

double plan_attention_time(const plan_profile *p, ntp_dtype dt, double b, double hq, double hk, double S, double HD,
                           bool causal) {
  if (b <= 0 || hq <= 0) return 0;
  double flops = 4 * b * hq * S * S * HD * (causal ? 0.5 : 1.0);
  double tc = flops / (peak_flops(p, dt) * p->attn_eff);
  double tm = b * S * (2 * hq + 2 * hk) * HD * (double)dtype_bytes(dt) / mem_rate(p);
  return p->launch + (tc > tm ? tc : tm);
}

double plan_coll_time(const plan_profile *p, plan_level lv, plan_coll c, double msg_bytes, double bytes_per_rank) {
  if (bytes_per_rank <= 0) return 0;
  double eff = plan_curve_at(&p->eff[lv][c], msg_bytes);
  return p->lat[lv][c] + bytes_per_rank / (p->link_bw[lv] * eff);
}

double plan_allreduce_time(const plan_profile *p, plan_level lv, int n, double bytes) {
  if (n <= 1) return 0;
  return plan_coll_time(p, lv, PLAN_ALL_REDUCE, bytes, 2.0 * (n - 1) / n * bytes);
}

/* ======================================================================================
 * placements
 * ====================================================================================== */

plan_place plan_place_balanced(int32_t w, int32_t k, bool sp) {
  plan_place pl = {.ngroups = k, .sp = sp};
  for (int32_t g = 0; g < k; g++) {
    int64_t lo, hi;
    split_range(w, k, g, &lo, &hi);
    pl.size[g] = (int32_t)(hi - lo);
  }
  return pl;
}

static int32_t place_max(const plan_place *pl) {
  int32_t t = 0;
  for (int g = 0; g < pl->ngroups; g++)
    if (pl->size[g] > t) t = pl->size[g];
  return t;
}

static bool place_equal_groups(const plan_place *pl) {
  for (int g = 1; g < pl->ngroups; g++)
    if (pl->size[g] != pl->size[0]) return false;
  return true;
}

static bool place_same_groups(const plan_place *a, const plan_place *b) {
  if (a->ngroups != b->ngroups) return false;
  for (int g = 0; g < a->ngroups; g++)
    if (a->size[g] != b->size[g] || (a->share[0] ? a->share[g] : a->size[g]) != (b->share[0] ? b->share[g] : b->size[g]))
      return false;
  return true;
}

/* rows of each group for a batch of `rows`: shares, else group sizes (shard_split_rows) */
static void place_rows(const plan_place *pl, int64_t rows, int64_t *row_start) {
  int64_t shares[NTP_MAX_GROUPS] = {0};
  for (int g = 0; g < pl->ngroups; g++) shares[g] = pl->share[0] ? pl->share[g] : pl->size[g];
  shard_split_rows(rows, shares, pl->ngroups, row_start);
}

static bool default_shares(const plan_place *pl, int64_t rows) {
  if (!pl->share[0]) return true;
  plan_place d = *pl;
  d.share[0] = 0;
  int64_t a[NTP_MAX_GROUPS + 1], b[NTP_MAX_GROUPS + 1];
  place_rows(pl, rows, a);
  place_rows(&d, rows, b);
  return memcmp(a, b, (size_t)(pl->ngroups + 1) * sizeof a[0]) == 0;
}

static void list_str(char *buf, size_t cap, const char *what, const int64_t *v, int n) {
  size_t len = strlen(buf);
  snprintf(buf + len, cap > len ? cap - len : 0, "%s(", what);
  for (int i = 0; i < n; i++) {
    len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, "%s%lld", i ? ", " : "", (long long)v[i]);
  }
  len = strlen(buf);
  snprintf(buf + len, cap > len ? cap - len : 0, ")");
}

static const char *place_str_rows(const plan_place *pl, int64_t rows, char *buf, size_t cap) {
  buf[0] = 0;
  if (place_equal_groups(pl)) {
    snprintf(buf, cap, "tp %d", pl->size[0]);
  } else {
    int64_t v[NTP_MAX_GROUPS];
    for (int g = 0; g < pl->ngroups; g++) v[g] = pl->size[g];
    list_str(buf, cap, "tp ", v, pl->ngroups);
  }
  if (pl->share[0] && (rows <= 0 || !default_shares(pl, rows))) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, ", ");
    list_str(buf, cap, "batch ", pl->share, pl->ngroups);
  }
  if (pl->sp) {
    size_t len = strlen(buf);
    snprintf(buf + len, cap > len ? cap - len : 0, ", sequence_parallel");
  }
  return buf;
}

const char *plan_place_str(const plan_place *pl, char *buf, size_t cap) { return place_str_rows(pl, -1, buf, cap); }

/* ======================================================================================
 * the model, read as a chain of sharded layers
 * ====================================================================================== */

enum { H_SOURCE, H_DEFAULT, H_LAYER };
/* Where a value's pieces are: nowhere (a source: read where needed), rows split over all
 * ranks (a value no layer placed), or a layer's placement: the group rows on every rank of
 * the group, with the sequence split over the group under sequence parallelism (seq) and/or
 * the last dim split over the group (cols: a column-parallel linear's output). */
typedef struct home {
  int8_t kind;
  bool cols, seq;
  int32_t layer; /* chain index */
} home;

enum { XF_SAME, XF_MM_A, XF_MM_B };

typedef struct fop { /* an op computed where its home is */
  home at;
  ir_opcode code;
  ntp_shape rs;
  int32_t nargs;
  ntp_shape as[NTP_MAX_ARGS];
  bool cst[NTP_MAX_ARGS];
  ntp_dtype dt;
} fop;

typedef struct move { /* a computed value needed at another home */
  home src, at;
  ntp_shape vs, rs;
  int8_t xf;
  ntp_dtype dt;
  int32_t op;    /* the reading op, or -1: a layer's input */
  int32_t value; /* the value moved */
  /* earlier moves of the same value within the layers this one depends on: their copies are
   * sources too (the compiler reuses them) */
  int32_t prior[4];
  int32_t nprior;
} move;

typedef struct sread { /* an input or parameter slice read at a home */
  home at;
  ntp_shape vs, rs;
  int8_t xf;
  ntp_dtype dt;
  int32_t value;
} sread;

typedef struct chain_layer {
  int32_t ir;
  const layer_kind *k;
  int32_t x;
  ntp_shape xs, out;
  ntp_dtype dt, wdt;
  int64_t rows, T; /* batch rows (dim 0 of the input), tokens per row */
  layer_dims d;    /* the kind's description: units, sizes */
  int32_t wval;    /* a weight split by units that another layer may share (a tied head), or -1 */
} chain_layer;

struct plan_model {
  const ir_module *m;
  int32_t n;
  chain_layer *L;
  fop *fops;
  size_t nfops, cfops;
  move *moves;
  size_t nmoves, cmoves;
  sread *reads;
  size_t nreads, creads;
  int64_t samples, tokens; /* per step: rows and tokens entering the first layer */
  /* indexes by layer (slot n: what no layer places): [off[i], off[i+1]) of ix */
  int32_t *fop_off, *fop_ix, *read_off, *read_ix, *umove_off, *umove_ix, *pmove_off, *pmove_ix;
};

int32_t plan_model_layers(const plan_model *pm) { return pm->n; }
const ir_layer *plan_model_layer(const plan_model *pm, int32_t i) { return &pm->m->layers[pm->L[i].ir]; }
int32_t plan_model_ir_layer(const plan_model *pm, int32_t i) { return pm->L[i].ir; }

void plan_model_free(plan_model *pm) {
  if (!pm) return;
  free(pm->L);
  free(pm->fops);
  free(pm->moves);
  free(pm->reads);
  free(pm->fop_off);
  free(pm->fop_ix);
  free(pm->read_off);
  free(pm->read_ix);
  free(pm->umove_off);
  free(pm->umove_ix);
  free(pm->pmove_off);
  free(pm->pmove_ix);
  free(pm);
}

static bool is_source(const ir_module *m, int32_t v) {
  ir_opcode c = m->ops[m->values[v].def].code;
  if (c == IR_INPUT || c == IR_PARAM || c == IR_CONST) return true;
  return c == IR_SLICE && m->ops[m->values[m->ops[m->values[v].def].args[0]].def].code == IR_PARAM;
}

static bool model_error(const ir_module *m, ntp_loc loc, diag_sink *diags, const char *msg) {
  diag_emit(diags, NTPC_ERROR, m->file, loc, "%s", msg);
  return false;
}

static bool home_eq(home a, home b) {
  return a.kind == b.kind && (a.kind != H_LAYER || (a.layer == b.layer && a.cols == b.cols && a.seq == b.seq));
}

static bool read_chain_layer(const ir_module *m, int32_t l, chain_layer *c, diag_sink *diags) {
  const ir_layer *ly = &m->layers[l];
  char msg[300];
  *c = (chain_layer){.ir = l, .k = layer_kind_of(ly)};
  c->x = ly->input;
  if (c->x < 0 || ly->core < 0) {
    snprintf(msg, sizeof msg, "layer '%s' has no recognisable core", ly->name);
    return model_error(m, ly->loc, diags, msg);
  }
  c->xs = m->values[c->x].shape;
  c->out = m->values[ly->core].shape;
  c->dt = m->values[ly->core].dtype;
  c->rows = c->xs.ndim ? c->xs.dim[0] : 1;
  c->T = 1;
  int tlast = c->k->index_input ? c->xs.ndim : c->xs.ndim - 1;
  for (int d = 1; d < tlast; d++) c->T *= c->xs.dim[d];
  layer_describe(m, ly, &c->d);
  c->wdt = c->d.wdt;
  c->wval = c->k->weight_role >= 0 ? ly->role[c->k->weight_role] : -1;
  return true;
}

typedef struct builder {
  plan_model *pm;
  const ir_module *m;
  home *home_of; /* per value */
  int32_t *chain_of;
  diag_sink *diags;
  bool failed;
} builder;

static bool check_pair(builder *B, home src, home at, int32_t op, ntp_loc loc) {
  if (src.kind != H_LAYER || at.kind != H_LAYER) return true;
  int32_t d = src.layer > at.layer ? src.layer - at.layer : at.layer - src.layer;
  if (d <= 1) return true;
  char msg[400];
  snprintf(msg, sizeof msg,
           "the planner plans chains of layers: %s reads an output of layer '%s', %d layers before '%s' (a layer "
           "may read model inputs and the outputs of the layer just before it)",
           op >= 0 ? "this operation" : "this layer", plan_model_layer(B->pm, src.layer < at.layer ? src.layer : at.layer)->name,
           d, plan_model_layer(B->pm, src.layer < at.layer ? at.layer : src.layer)->name);
  model_error(B->m, loc, B->diags, msg);
  B->failed = true;
  return false;
}

static void add_move(builder *B, home src, home at, ntp_shape vs, ntp_shape rs, int8_t xf, ntp_dtype dt, int32_t op,
                     int32_t value, ntp_loc loc) {
  if (!check_pair(B, src, at, op, loc)) return;
  if (home_eq(src, at) && xf == XF_SAME && shape_eq(&vs, &rs)) return; /* already where it is needed */
  move mv = {src, at, vs, rs, xf, dt, op, value, {0}, 0};
  VEC_PUSH(B->pm->moves, B->pm->nmoves, B->pm->cmoves, mv);
}

static void add_read(builder *B, home at, ntp_shape vs, ntp_shape rs, int8_t xf, ntp_dtype dt, int32_t value) {
  if (B->m->ops[B->m->values[value].def].code == IR_CONST) return;
  sread rd = {at, vs, rs, xf, dt, value};
  VEC_PUSH(B->pm->reads, B->pm->nreads, B->pm->creads, rd);
}

/* An op outside a layer's core: computed where its latest same-shape operand is. */
static void follow_op(builder *B, const ir_op *op) {
  const ir_module *m = B->m;
  int32_t r = op->result;
  ntp_shape rs = m->values[r].shape;
  int32_t a = -1;
  if (op->code == IR_MATMUL) {
    a = op->args[0];
  } else {
    for (int i = 0; i < op->nargs; i++) {
      int32_t v = op->args[i];
      ntp_shape vs = m->values[v].shape;
      if (m->ops[m->values[v].def].code != IR_CONST && shape_eq(&vs, &rs) && v > a) a = v;
    }
  }
  home at = {.kind = H_DEFAULT};
  if (a >= 0 && B->home_of[a].kind != H_SOURCE) at = B->home_of[a];
  if (op->code == IR_MATMUL || op->code == IR_LAYERNORM || op->code == IR_RMSNORM || op->code == IR_SOFTMAX)
    at.cols = false; /* whole rows */
  fop f = {.at = at, .code = op->code, .rs = rs, .nargs = op->nargs, .dt = m->values[r].dtype};
  for (int i = 0; i < op->nargs; i++) {
    int32_t v = op->args[i];
    f.as[i] = m->values[v].shape;
    f.cst[i] = m->ops[m->values[v].def].code == IR_CONST;
    int8_t xf = op->code == IR_MATMUL ? (i == 0 ? XF_MM_A : XF_MM_B) : XF_SAME;
    if (is_source(m, v)) add_read(B, at, m->values[v].shape, rs, xf, m->values[v].dtype, v);
    else
      add_move(B, B->home_of[v], at, m->values[v].shape, rs, xf, m->values[v].dtype, (int32_t)(op - m->ops), v, op->loc);
  }
  VEC_PUSH(B->pm->fops, B->pm->nfops, B->pm->cfops, f);
  B->home_of[r] = at;
}

static int32_t slot_of_home(const plan_model *pm, home h) { return h.kind == H_LAYER ? h.layer : pm->n; }

/* slot of a move: unary for a layer (both ends in that layer or unplaced), the pair slot of
 * the later of two consecutive layers (pair = true), or n when neither end is placed */
static int32_t slot_of_move(const plan_model *pm, const move *mv, bool *pair) {
  *pair = false;
  if (mv->src.kind == H_LAYER && mv->at.kind == H_LAYER && mv->src.layer != mv->at.layer) {
    *pair = true;
    return mv->src.layer > mv->at.layer ? mv->src.layer : mv->at.layer;
  }
  if (mv->src.kind == H_LAYER) return mv->src.layer;
  if (mv->at.kind == H_LAYER) return mv->at.layer;
  return pm->n;
}

static bool csr(int32_t nslots, size_t nitems, const int32_t *slot, int32_t **off_out, int32_t **ix_out) {
  int32_t *off = calloc((size_t)nslots + 2, sizeof *off), *ix = malloc((nitems + 1) * sizeof *ix);
  if (!off || !ix) {
    free(off);
    free(ix);
    return false;
  }
  for (size_t k = 0; k < nitems; k++)
    if (slot[k] >= 0) off[slot[k] + 1]++;
  for (int32_t i = 0; i <= nslots; i++) off[i + 1] += off[i];
  int32_t *fill = calloc((size_t)nslots + 1, sizeof *fill);
  if (!fill) {
    free(off);
    free(ix);
    return false;
  }
  for (size_t k = 0; k < nitems; k++)
    if (slot[k] >= 0) ix[off[slot[k]] + fill[slot[k]]++] = (int32_t)k;
  free(fill);
  *off_out = off;
  *ix_out = ix;
  return true;
}

static bool build_index(plan_model *pm) {
  size_t most = pm->nfops > pm->nreads ? pm->nfops : pm->nreads;
  if (pm->nmoves > most) most = pm->nmoves;
  int32_t *slot = malloc((most + 1) * sizeof *slot), *slot2 = malloc((most + 1) * sizeof *slot2);
  bool ok = slot && slot2;
  for (size_t k = 0; ok && k < pm->nfops; k++) slot[k] = slot_of_home(pm, pm->fops[k].at);
  ok = ok && csr(pm->n + 1, pm->nfops, slot, &pm->fop_off, &pm->fop_ix);
  for (size_t k = 0; ok && k < pm->nreads; k++) slot[k] = slot_of_home(pm, pm->reads[k].at);
  ok = ok && csr(pm->n + 1, pm->nreads, slot, &pm->read_off, &pm->read_ix);
  for (size_t k = 0; ok && k < pm->nmoves; k++) {
    bool pair;
    int32_t sl = slot_of_move(pm, &pm->moves[k], &pair);
    slot[k] = pair ? -1 : sl;
    slot2[k] = pair ? sl : -1;
  }
  ok = ok && csr(pm->n + 1, pm->nmoves, slot, &pm->umove_off, &pm->umove_ix);
  ok = ok && csr(pm->n + 1, pm->nmoves, slot2, &pm->pmove_off, &pm->pmove_ix);
  /* priors: earlier copies of the same value at homes this move's cost already depends on */
  for (size_t k = 0; ok && k < pm->nmoves; k++) {
    move *mv = &pm->moves[k];
    bool pair;
    int32_t sl = slot_of_move(pm, mv, &pair);
    for (size_t j = 0; j < k && mv->nprior < 4; j++) {
      const move *p = &pm->moves[j];
      if (p->value != mv->value) continue;
      bool in = p->at.kind == H_DEFAULT ||
                (p->at.kind == H_LAYER && (p->at.layer == sl || (pair && p->at.layer == sl - 1)));
      if (in) mv->prior[mv->nprior++] = (int32_t)j;
    }
  }
  free(slot);
  free(slot2);
  return ok;
}

static plan_model *plan_model_new_unguarded(const ir_module *m, diag_sink *diags) {
  plan_model *pm = calloc(1, sizeof *pm);
  if (!pm) {
    diag_out_of_memory(diags);
    return NULL;
  }
  pm->m = m;
  for (size_t v = 0; v < m->n_values; v++)
    if (m->values[v].layout.mesh >= 0) {
      model_error(m, m->ops[m->values[v].def].loc, diags,
                  "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      plan_model_free(pm);
      return NULL;
    }
  for (size_t o = 0; o < m->n_outputs; o++)
    if (m->outputs[o].has_layout) {
      model_error(m, m->outputs[o].loc, diags, "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      plan_model_free(pm);
      return NULL;
    }
  /* every box and byte count below stays far from int64 overflow: at most 1 TiB per tensor */
  for (size_t v = 0; v < m->n_values; v++) {
    double bytes = (double)dtype_bytes(m->values[v].dtype);
    for (int d = 0; d < m->values[v].shape.ndim; d++) bytes *= (double)m->values[v].shape.dim[d];
    if (bytes > 1099511627776.0) {
      char msg[200];
      snprintf(msg, sizeof msg, "a tensor of %.3g bytes: the planner plans tensors of at most 1 TiB",
               bytes);
      model_error(m, m->ops[m->values[v].def].loc, diags, msg);
      plan_model_free(pm);
      return NULL;
    }
  }
  builder B = {.pm = pm, .m = m, .diags = diags};
  B.home_of = calloc(m->n_values + 1, sizeof *B.home_of);
  B.chain_of = malloc((m->n_layers + 1) * sizeof *B.chain_of);
  pm->L = calloc(m->n_layers + 1, sizeof *pm->L);
  if (!B.home_of || !B.chain_of || !pm->L) {
    diag_out_of_memory(diags);
    B.failed = true;
  }
  for (size_t l = 0; !B.failed && l < m->n_layers; l++) {
    B.chain_of[l] = -1;
    if (!layer_is_sharded(&m->layers[l])) continue;
    if (!read_chain_layer(m, (int32_t)l, &pm->L[pm->n], diags)) B.failed = true;
    B.chain_of[l] = pm->n++;
  }
  if (!B.failed && pm->n == 0) {
    char msg[256];
    char kinds[200] = "";
    for (int32_t k = 0; k < layer_nkinds; k++)
      if (layer_kinds[k]->shard)
        snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", kinds[0] ? ", " : "", layer_kinds[k]->name);
    snprintf(msg, sizeof msg, "model '%s' has no layer with a TP degree (%s): nothing to plan", m->name, kinds);
    model_error(m, NTP_NOLOC, diags, msg);
    B.failed = true;
  }
  for (size_t i = 0; !B.failed && i < m->n_ops;) {
    const ir_op *op = &m->ops[i];
    if (op->layer >= 0 && B.chain_of[op->layer] >= 0) {
      int32_t ci = B.chain_of[op->layer];
      chain_layer *c = &pm->L[ci];
      const ir_layer *ly = &m->layers[c->ir];
      home at = {.kind = H_LAYER, .layer = ci};
      if (is_source(m, c->x)) add_read(&B, at, c->xs, c->xs, XF_SAME, m->values[c->x].dtype, c->x);
      else add_move(&B, B.home_of[c->x], at, c->xs, c->xs, XF_SAME, m->values[c->x].dtype, -1, c->x, ly->loc);
      int32_t end = m->values[ly->core].def;
      B.home_of[ly->core] = (home){.kind = H_LAYER, .layer = ci, .cols = !c->k->reduces, .seq = c->k->reduces};
      for (int32_t k = end + 1; k < ly->first_op + ly->nops && !B.failed; k++) {
        const ir_op *f = &m->ops[k];
        if (f->code != IR_PARAM && f->code != IR_SLICE) follow_op(&B, f);
      }
      /* values inside the core are the layer's own: nothing outside may read them */
      for (int32_t k = ly->first_op; k < end && !B.failed; k++)
        if (!is_source(m, m->ops[k].result)) B.home_of[m->ops[k].result].kind = -1;
      i = (size_t)(ly->first_op + ly->nops);
      continue;
    }
    if (op->code != IR_INPUT && op->code != IR_PARAM && op->code != IR_CONST && op->code != IR_SLICE) {
      for (int a = 0; a < op->nargs; a++)
        if (B.home_of[op->args[a]].kind < 0) {
          model_error(m, op->loc, diags, "this operation reads a value inside a layer; the planner cannot place it");
          B.failed = true;
        }
      if (!B.failed) follow_op(&B, op);
    }
    i++;
  }
  if (!B.failed) {
    const chain_layer *c0 = &pm->L[0];
    pm->samples = c0->rows;
    pm->tokens = c0->rows * c0->T;
    if (!build_index(pm)) {
      diag_out_of_memory(diags);
      B.failed = true;
    }
  }
  free(B.home_of);
  free(B.chain_of);
  if (B.failed) {
    plan_model_free(pm);
    return NULL;
  }
  return pm;
}

/* ======================================================================================
 * cost tables of one world
 * ====================================================================================== */

typedef struct trans_entry {
  char *key;
  size_t keylen;
  double *time, *bytes; /* [S*S] */
  float *ftime;         /* the search's copy */
} trans_entry;

struct plan_tables {
  const plan_model *pm;
  const plan_profile *prof;
  int32_t W;
  int32_t *node; /* [W]: node of each rank (intra- vs inter-node links) */
  int32_t S;
  plan_place *st;
  int32_t *pin;   /* [n]: the one state a layer may take, or -1 */
  uint8_t *legal; /* [n*S] */
  double *tcomp, *tcomm, *pmax, *amax, *rbytes, *ubytes; /* [n*S] */
  const double **trans, **tbytes;                        /* [n] */
  const float **ftrans;                                  /* [n] */
  trans_entry *cache;
  size_t ncache, ccache;
  double const_time, const_mem;
  double act_reserve;
  double act_extra; /* added to every layer's working set */
  /* the problem's buffers */
  float *ptime;
  int64_t *punits;
  double quantum;
};

const plan_place *plan_tables_state(const plan_tables *t, int32_t s) { return &t->st[s]; }
int32_t plan_tables_nstates(const plan_tables *t) { return t->S; }
double plan_tables_param_bytes(const plan_tables *t, int32_t layer, int32_t s) { return t->pmax[(size_t)layer * t->S + s]; }
double plan_tables_fixed_bytes(const plan_tables *t) { return t->act_reserve + t->const_mem; }
double plan_tables_act_bytes(const plan_tables *t, int32_t layer, int32_t s) { return t->amax[(size_t)layer * t->S + s]; }
double plan_tables_const_bytes(const plan_tables *t) { return t->const_mem; }

typedef rank_box rbox; /* shard.h */

static void group_starts(const plan_place *pl, int32_t *gs) {
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
  place_rows(pl, c->rows, rows);
  group_starts(pl, gs);
  for (int g = 0; g < pl->ngroups; g++) {
    if (rows[g + 1] == rows[g]) continue;
    int t = pl->size[g];
    for (int i = 0; i < t; i++) {
      ntp_box b = box_full(&s);
      if (s.ndim >= 1) {
        b.lo[0] = rows[g];
        b.hi[0] = rows[g + 1] < s.dim[0] ? rows[g + 1] : s.dim[0];
      }
      if (h.seq && pl->sp && t > 1 && s.ndim >= 2) split_range(s.dim[1], t, i, &b.lo[1], &b.hi[1]);
      if (h.cols && t > 1 && s.ndim >= 1) split_range(s.dim[s.ndim - 1], t, i, &b.lo[s.ndim - 1], &b.hi[s.ndim - 1]);
      out[n++] = (rbox){gs[g] + i, b};
    }
  }
  return n;
}

/* What an operand of shape vs must hold for a result piece rb. */
static ntp_box need_box(ntp_box rb, ntp_shape vs, int8_t xf) {
  if (xf == XF_MM_A) {
    ntp_box b = rb;
    b.lo[vs.ndim - 1] = 0;
    b.hi[vs.ndim - 1] = vs.dim[vs.ndim - 1];
    return b;
  }
  if (xf == XF_MM_B) {
    ntp_box b = box_full(&vs);
    for (int d = 0; d + 2 < vs.ndim && d < rb.ndim; d++) {
      b.lo[d] = rb.lo[d];
      b.hi[d] = rb.hi[d];
    }
    return b;
  }
  return box_project(rb, vs);
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
static void traffic(const plan_tables *T, const rbox *src, int nsrc, const rbox *need, int nneed, double eb, double *in,
                    double *out) {
  int *hit = malloc((size_t)(nsrc + 1) * sizeof *hit);
  ntp_box *hb = malloc((size_t)(nsrc + 1) * sizeof *hb);
  for (int k = 0; hit && hb && k < nneed; k++) {
    const ntp_box *nb = &need[k].box;
    int32_t r = need[k].rank;
    if (box_volume(nb) == 0) continue;
    int nh = 0;
    bool local = false;
    for (int p = 0; p < nsrc && !local; p++) {
      ntp_box x;
      if (!box_intersect(&src[p].box, nb, &x)) continue;
      local = src[p].rank == r && box_eq(&x, nb);
      hb[nh] = src[p].box;
      hit[nh++] = p;
    }
    if (local) continue;
    box_grid grid; /* the compiler's slice intersection (shard.c ensure), cell by cell */
    if (!box_grid_init(&grid, nb, hb, (size_t)nh)) break;
    ntp_box cell;
    while (box_grid_next(&grid, &cell)) {
      int best = -1, bestd = 0;
      for (int h = 0; h < nh; h++) {
        const rbox *sp = &src[hit[h]];
        if (!box_contains(&sp->box, &cell)) continue;
        int dist = abs(sp->rank - r);
        if (best < 0 || dist < bestd) {
          best = hit[h];
          bestd = dist;
        }
      }
      if (best >= 0 && src[best].rank != r) {
        double b = (double)box_volume(&cell) * eb;
        int lv = level_of_pair(T, src[best].rank, r);
        in[lv * T->W + r] += b;
        out[lv * T->W + src[best].rank] += b;
      }
    }
    box_grid_free(&grid);
  }
  free(hit);
  free(hb);
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
static double move_eval(const plan_tables *T, const move *mv, int32_t lo, int32_t s_lo, int32_t s_hi, double *bytes,
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
    bool gather = mv->src.kind == H_LAYER && mv->at.kind == H_LAYER && place_same_groups(&T->st[ss], &T->st[sa]) &&
                  T->pm->L[mv->src.layer].rows == T->pm->L[mv->at.layer].rows;
    t = traffic_time(T, in, out, gather ? PLAN_ALL_GATHER : PLAN_SEND_RECV, &mi);
    if (per_rank_in)
      for (int32_t r = 0; r < W; r++) per_rank_in[r] += in[r] + in[W + r];
  }
  free(src);
  free(need);
  free(buf);
  if (bytes) *bytes = mi;
  return t;
}

/* Rank i of a group of t with b rows: kernel time, parameter bytes, activation bytes (the kind's cost). */
static void core_rank(const plan_tables *T, const chain_layer *c, int t, int i, int64_t b, bool sp, double *time,
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
static double group_reduce(const plan_tables *T, const chain_layer *c, const plan_place *pl, int32_t r0, int t, int64_t b,
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
  return plan_coll_time(T->prof, (plan_level)lv, scatter ? PLAN_REDUCE_SCATTER : PLAN_ALL_REDUCE, (double)(elems * eb),
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
static void add_reads(const plan_tables *T, home h, int32_t state, double *per_rank) {
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
static void add_reads_plan(const plan_tables *T, const int32_t *choice, double *per_rank) {
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

typedef struct unary_out {
  double comp, comm, pmax, amax, rbytes, ubytes;
} unary_out;

/* Everything that depends on layer i's state alone. per_rank: optional [W] parameter bytes. */
static void unary_eval(const plan_tables *T, int32_t i, int32_t s, unary_out *u, double *per_rank) {
  const chain_layer *c = &T->pm->L[i];
  const plan_place *pl = &T->st[s];
  int64_t rows[NTP_MAX_GROUPS + 1];
  int32_t gs[NTP_MAX_GROUPS + 1];
  place_rows(pl, c->rows, rows);
  group_starts(pl, gs);
  double *prm = calloc((size_t)T->W, sizeof *prm);
  *u = (unary_out){0};
  for (int g = 0; g < pl->ngroups && prm; g++) {
    int64_t b = rows[g + 1] - rows[g];
    if (b == 0) continue;
    int t = pl->size[g];
    double tg = 0, ag = 0, rb;
    for (int k = 0; k < t; k++) {
      double tm, pa, ac;
      core_rank(T, c, t, k, b, pl->sp, &tm, &pa, &ac);
      prm[gs[g] + k] += pa;
      if (tm > tg) tg = tm;
      if (ac > ag) ag = ac;
    }
    double tr = group_reduce(T, c, pl, gs[g], t, b, &rb);
    if (tg > u->comp) u->comp = tg;
    if (ag > u->amax) u->amax = ag;
    if (tr > u->comm) u->comm = tr;
    if (rb > u->rbytes) u->rbytes = rb;
  }
  home h = {.kind = H_LAYER, .layer = i};
  double fa = 0;
  u->comp += fops_at(T, h, s, &fa);
  u->amax += fa;
  if (prm) add_reads(T, h, s, prm);
  for (int32_t e = T->pm->umove_off[i]; e < T->pm->umove_off[i + 1]; e++) {
    const move *mv = &T->pm->moves[T->pm->umove_ix[e]];
    double mb;
    u->comm += move_eval(T, mv, i, s, s, &mb, NULL);
    u->ubytes += mb;
    u->amax += mb;
  }
  /* values alive across the layer at its own placement (the residual stream entering it and its
   * copy where the layer's output is added to it), 256-byte alignment of every tensor (the
   * compiler's arena), and what the caller adds (a measured shortfall). Tested: the compiler's
   * arena never exceeds this (tests/planner). */
  int64_t bmax = 0;
  for (int g = 0; g < pl->ngroups; g++)
    if (rows[g + 1] - rows[g] > bmax) bmax = rows[g + 1] - rows[g];
  int64_t width = c->d.width; /* the stream */
  double piece = (double)bmax * (double)c->T * (double)width * (double)dtype_bytes(c->dt);
  u->amax += 2 * piece + 256.0 * (2.0 * T->pm->m->layers[c->ir].nops + 32) + T->act_extra;
  for (int32_t r = 0; prm && r < T->W; r++)
    if (prm[r] > u->pmax) u->pmax = prm[r];
  if (per_rank && prm) memcpy(per_rank, prm, (size_t)T->W * sizeof *prm);
  free(prm);
}

static bool legal_state(const plan_tables *T, int32_t i, int32_t s, bool pinned) {
  const chain_layer *c = &T->pm->L[i];
  const plan_place *pl = &T->st[s];
  int64_t rows[NTP_MAX_GROUPS + 1];
  place_rows(pl, c->rows, rows);
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
static bool layers_alike(const chain_layer *a, const chain_layer *b) {
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
        t += move_eval(T, mv, hi - 1, s0, s1, &mb, NULL);
        by += mb;
      }
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

/* Builds every table for W ranks over the given states. pins: [n] pinned state or -1 (NULL: none).
 * node: [W] node of each rank (NULL: rank / nodes_of). */
static plan_tables *tables_build(const plan_model *pm, const plan_profile *prof, int32_t W, const int32_t *node,
                                 int32_t nodes_of, const plan_place *states, int32_t S, const int32_t *pins,
                                 double act_extra, diag_sink *diags) {
  plan_tables *T = calloc(1, sizeof *T);
  int32_t n = pm->n;
  if (!T) goto oom;
  T->pm = pm;
  T->prof = prof;
  T->W = W;
  T->S = S;
  T->act_extra = act_extra;
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
  T->trans = calloc((size_t)n, sizeof *T->trans);
  T->tbytes = calloc((size_t)n, sizeof *T->tbytes);
  T->ftrans = calloc((size_t)n, sizeof *T->ftrans);
  T->ptime = calloc(ns, sizeof(float));
  T->punits = calloc(ns, sizeof(int64_t));
  if (!T->node || !T->st || !T->pin || !T->legal || !T->tcomp || !T->tcomm || !T->pmax || !T->amax || !T->rbytes ||
      !T->ubytes || !T->trans || !T->tbytes || !T->ftrans || !T->ptime || !T->punits)
    goto oom;
  for (int32_t r = 0; r < W; r++) T->node[r] = node ? node[r] : r / (nodes_of > 0 ? nodes_of : 8);
  memcpy(T->st, states, (size_t)S * sizeof *states);
  for (int32_t i = 0; i < n; i++) T->pin[i] = pins ? pins[i] : -1;
  /* layers alike (kind, shapes, what follows them, their pin) share their unary entries */
  char **ukey = calloc((size_t)n, sizeof *ukey);
  size_t *ulen = calloc((size_t)n, sizeof *ulen);
  if (!ukey || !ulen) {
    free(ukey);
    free(ulen);
    goto oom;
  }
  for (int32_t i = 0; i < n; i++) {
    bool any = false;
    ukey[i] = unary_key(T, i, &ulen[i]);
    int32_t same = -1;
    for (int32_t j = 0; j < i && same < 0 && ukey[i]; j++)
      if (ukey[j] && ulen[j] == ulen[i] && memcmp(ukey[j], ukey[i], ulen[i]) == 0) same = j;
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
        any |= T->legal[k];
        continue;
      }
      if (T->pin[i] >= 0 && s != T->pin[i]) continue;
      if (!legal_state(T, i, s, T->pin[i] >= 0)) continue;
      T->legal[k] = 1;
      any = true;
      unary_out u;
      unary_eval(T, i, s, &u, NULL);
      T->tcomp[k] = u.comp;
      T->tcomm[k] = u.comm;
      T->pmax[k] = u.pmax;
      T->amax[k] = u.amax;
      T->rbytes[k] = u.rbytes;
      T->ubytes[k] = u.ubytes;
      if (u.amax > T->act_reserve) T->act_reserve = u.amax;
    }
    if (!any) {
      const chain_layer *c = &pm->L[i];
      const ir_layer *ly = &pm->m->layers[c->ir];
      if (T->pin[i] >= 0) {
        char pbuf[256], msg[512];
        snprintf(msg, sizeof msg, "layer '%s' cannot take placement %s: it has %lld %s (a group may not be larger), or "
                 "sequence parallelism needs as many positions as ranks", ly->name,
                 plan_place_str(&T->st[T->pin[i]], pbuf, sizeof pbuf), (long long)c->d.units, c->k->unit_name);
        model_error(pm->m, ly->loc, diags, msg);
      } else {
        char msg[300];
        snprintf(msg, sizeof msg, "layer '%s' has no placement on %d ranks", ly->name, W);
        model_error(pm->m, ly->loc, diags, msg);
      }
      for (int32_t j = 0; j <= i; j++) free(ukey[j]);
      free(ukey);
      free(ulen);
      plan_tables_free(T);
      return NULL;
    }
  }
  for (int32_t i = 0; i < n; i++) free(ukey[i]);
  free(ukey);
  free(ulen);
  for (int32_t i = 1; i < n; i++) trans_build(T, i);
  /* what no layer's state changes: ops on values no layer placed */
  home def = {.kind = H_DEFAULT};
  double fa = 0;
  T->const_time = fops_at(T, def, 0, &fa);
  double *prm = calloc((size_t)W, sizeof *prm);
  if (prm) {
    add_reads(T, def, 0, prm);
    for (int32_t r = 0; r < W; r++)
      if (prm[r] > T->const_mem) T->const_mem = prm[r];
  }
  free(prm);
  for (int32_t e = pm->umove_off[n]; e < pm->umove_off[n + 1]; e++)
    T->const_time += move_eval(T, &pm->moves[pm->umove_ix[e]], 0, 0, 0, NULL, NULL);
  if (fa > T->act_reserve) T->act_reserve = fa;
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

/* ======================================================================================
 * the search
 * ====================================================================================== */

double plan_problem_eval(const plan_problem *pb, const int32_t *choice, int64_t *units) {
  int32_t S = pb->nstates;
  float t = pb->time[choice[0]];
  int64_t u = pb->units[choice[0]];
  for (int32_t l = 1; l < pb->nlayers; l++) {
    size_t k = (size_t)l * S + choice[l];
    t = (t + pb->trans[l][(size_t)choice[l - 1] * S + choice[l]]) + pb->time[k];
    u += pb->units[k];
  }
  if (units) *units = u;
  return t;
}

/* The DP's inner loops: vectorised at O3, and on x86-64 also built for AVX2 and AVX-512,
 * chosen when the program loads (GCC function multiversioning). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define PLAN_HOT __attribute__((optimize("O3"), target_clones("avx512f", "avx2", "default")))
#elif defined(__GNUC__) && !defined(__clang__)
#define PLAN_HOT __attribute__((optimize("O3")))
#else
#define PLAN_HOT
#endif

/* row[m] = min(row[m], p[m - u] + r) for m in [u, Q] (vectorises: no branch, no index) */
static PLAN_HOT void relax(const float *restrict p, float r, int64_t u, int64_t Q, float *restrict row) {
  const float *q = p - u;
  for (int64_t m = u; m <= Q; m++) {
    float v = q[m] + r;
    row[m] = v < row[m] ? v : row[m];
  }
}

static PLAN_HOT void add_time(float *restrict row, int64_t lo, int64_t Q, float t) {
  for (int64_t m = lo; m <= Q; m++) row[m] += t;
}

static PLAN_HOT void fill(float *restrict row, int64_t lo, int64_t hi, float v) {
  for (int64_t m = lo; m <= hi; m++) row[m] = v;
}

/* a DP table reused by the searches of one plan (its pages are touched once) */
typedef struct dp_ws {
  float *D;
  size_t cap;
} dp_ws;

/* The largest DP table the search builds, in bytes (every layer's is kept to trace back). */
#define PLAN_DP_BYTES ((size_t)192 << 20)

/* D[l][s][m] = least time of layers 0..l ending in state s with at most m units; the memory
 * axis is [0, Q] (Q = 0 and use_units = false: the unconstrained problem). Layer l's rows stop
 * at hi[l], the most units layers 0..l can use (beyond, every row is constant). Every layer's
 * table is kept; the plan is traced back by finding, at each layer, a predecessor whose value
 * reproduces the entry exactly (the same float operations). */
static bool dp_core(const plan_problem *pb, int64_t Q, bool use_units, int32_t *choice, dp_ws *ws) {
  int32_t L = pb->nlayers, S = pb->nstates;
  int64_t *hi = malloc((size_t)L * sizeof *hi);
  size_t *off = malloc((size_t)L * sizeof *off);
  if (!hi || !off) {
    free(hi);
    free(off);
    return false;
  }
  size_t total = 0;
  for (int32_t l = 0; l < L; l++) {
    int64_t top = 0;
    for (int32_t s = 0; s < S && use_units; s++) {
      size_t k = (size_t)l * S + s;
      if (pb->legal[k] && pb->units[k] <= Q && pb->units[k] > top) top = pb->units[k];
    }
    hi[l] = (l ? hi[l - 1] : 0) + top < Q ? (l ? hi[l - 1] : 0) + top : Q;
    off[l] = total;
    total += (size_t)S * (size_t)(hi[l] + 1);
  }
  if ((double)total * sizeof(float) > (double)PLAN_DP_BYTES) {
    free(hi);
    free(off);
    return false;
  }
  if (ws->cap < total) {
    free(ws->D);
    ws->D = malloc(total * sizeof *ws->D);
    ws->cap = ws->D ? total : 0;
  }
  float *D = ws->D;
  if (!D) {
    free(hi);
    free(off);
    return false;
  }
  const float inf = INFINITY;
  for (int32_t s = 0; s < S; s++) {
    float *row = D + (size_t)s * (size_t)(hi[0] + 1);
    int64_t u = use_units ? pb->units[s] : 0;
    if (pb->legal[s] && u <= hi[0]) {
      fill(row, 0, u - 1, inf);
      fill(row, u, hi[0], pb->time[s]);
    } else {
      fill(row, 0, hi[0], inf);
    }
  }
  for (int32_t l = 1; l < L; l++) {
    const float *tr = pb->trans[l], *prev = D + off[l - 1];
    size_t ps = (size_t)(hi[l - 1] + 1), cs = (size_t)(hi[l] + 1);
    for (int32_t s = 0; s < S; s++) {
      float *row = D + off[l] + (size_t)s * cs;
      size_t k = (size_t)l * S + s;
      int64_t u = use_units ? pb->units[k] : 0;
      if (!pb->legal[k] || u > Q) {
        fill(row, 0, (int64_t)cs - 1, inf);
        continue;
      }
      int64_t end = hi[l - 1] + u < hi[l] ? hi[l - 1] + u : hi[l];
      fill(row, 0, end, inf);
      for (int32_t s2 = 0; s2 < S; s2++)
        if (pb->legal[(size_t)(l - 1) * S + s2]) relax(prev + (size_t)s2 * ps, tr[(size_t)s2 * S + s], u, end, row);
      add_time(row, u, end, pb->time[k]);
      fill(row, end + 1, hi[l], row[end]);
    }
  }
  size_t ls = (size_t)(hi[L - 1] + 1);
  const float *last = D + off[L - 1];
  int32_t best = -1;
  for (int32_t s = 0; s < S; s++) {
    float v = last[(size_t)s * ls + (size_t)hi[L - 1]];
    if (v < inf && (best < 0 || v < last[(size_t)best * ls + (size_t)hi[L - 1]])) best = s;
  }
  bool ok = best >= 0;
  if (ok) {
    int64_t m = hi[L - 1];
    int32_t s = best;
    for (int32_t l = L - 1; l >= 1 && ok; l--) {
      choice[l] = s;
      size_t k = (size_t)l * S + s;
      int64_t u = use_units ? pb->units[k] : 0;
      int64_t end = hi[l - 1] + u < hi[l] ? hi[l - 1] + u : hi[l];
      if (m > end) m = end; /* the row is constant beyond its end */
      float want = D[off[l] + (size_t)s * (size_t)(hi[l] + 1) + (size_t)m];
      const float *prev = D + off[l - 1];
      size_t ps = (size_t)(hi[l - 1] + 1);
      int32_t from = -1;
      for (int32_t s2 = 0; s2 < S && from < 0; s2++) {
        if (!pb->legal[(size_t)(l - 1) * S + s2]) continue;
        float v = prev[(size_t)s2 * ps + (size_t)(m - u)] + pb->trans[l][(size_t)s2 * S + s];
        v = v + pb->time[k];
        if (v == want) from = s2;
      }
      ok = from >= 0;
      m -= u;
      s = from;
    }
    if (ok) choice[0] = s;
  }
  free(hi);
  free(off);
  return ok;
}

static bool dp_solve_ws(const plan_problem *pb, int32_t *choice, double *time, int64_t *units, dp_ws *ws) {
  if (pb->nlayers <= 0 || pb->nstates <= 0 || pb->nstates > 255 || pb->budget < 0) return false;
  int64_t u;
  /* memory that does not bind: the unconstrained optimum fits */
  if (!dp_core(pb, 0, false, choice, ws)) return false;
  double t = plan_problem_eval(pb, choice, &u);
  if (u > pb->budget) {
    int64_t most = 0; /* no plan uses more units than the sum of each layer's largest */
    for (int32_t l = 0; l < pb->nlayers; l++) {
      int64_t mx = 0;
      for (int32_t s = 0; s < pb->nstates; s++)
        if (pb->legal[(size_t)l * pb->nstates + s] && pb->units[(size_t)l * pb->nstates + s] > mx)
          mx = pb->units[(size_t)l * pb->nstates + s];
      most += mx;
    }
    int64_t Q = pb->budget < most ? pb->budget : most;
    if (!dp_core(pb, Q, true, choice, ws)) return false;
    t = plan_problem_eval(pb, choice, &u);
  }
  if (time) *time = t;
  if (units) *units = u;
  return true;
}

bool plan_dp_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units) {
  dp_ws ws = {0};
  bool ok = dp_solve_ws(pb, choice, time, units, &ws);
  free(ws.D);
  return ok;
}

bool plan_exhaustive_solve(const plan_problem *pb, int32_t *choice, double *time, int64_t *units) {
  int32_t L = pb->nlayers, S = pb->nstates;
  if (L <= 0 || S <= 0 || pb->budget < 0) return false;
  int32_t *c = calloc((size_t)L, sizeof *c);
  if (!c) return false;
  bool found = false;
  double best = 0;
  /* the same float sums as the DP, so that ties and values compare exactly */
  int64_t bu = 0;
  for (int32_t l = 0; l < L; l++) { /* first legal state of every layer */
    while (c[l] < S && !pb->legal[(size_t)l * S + c[l]]) c[l]++;
    if (c[l] == S) {
      free(c);
      return false;
    }
  }
  for (;;) {
    int64_t u;
    double t = plan_problem_eval(pb, c, &u);
    if (u <= pb->budget && (!found || t < best)) {
      found = true;
      best = t;
      bu = u;
      memcpy(choice, c, (size_t)L * sizeof *c);
    }
    int32_t l = L - 1;
    for (; l >= 0; l--) {
      do c[l]++;
      while (c[l] < S && !pb->legal[(size_t)l * S + c[l]]);
      if (c[l] < S) break;
      c[l] = 0;
      while (!pb->legal[(size_t)l * S + c[l]]) c[l]++;
    }
    if (l < 0) break;
  }
  free(c);
  if (found) {
    if (time) *time = best;
    if (units) *units = bu;
  }
  return found;
}

/* ======================================================================================
 * planning: states, pins, the solution
 * ====================================================================================== */

void plan_solution_free(plan_solution *s) {
  if (!s) return;
  free(s->phys);
  free(s->layers);
  free(s->rank_params);
  free(s->rank_act);
  memset(s, 0, sizeof *s);
}

static int32_t add_state(plan_place **st, int32_t *n, int32_t *cap, const plan_place *pl) {
  for (int32_t i = 0; i < *n; i++)
    if (memcmp(&(*st)[i], pl, sizeof *pl) == 0) return i;
  if (*n == *cap) {
    int32_t nc = *cap ? *cap * 2 : 64;
    plan_place *ns = realloc(*st, (size_t)nc * sizeof *ns);
    if (!ns) return -1;
    *st = ns;
    *cap = nc;
  }
  (*st)[*n] = *pl;
  return (*n)++;
}

/* The placement a rule or annotation fixes for a layer (the sharding pass's resolution); *auto_
 * when the planner decides. Without an active plan every layer is the planner's. */
static bool resolve_pin(const ir_module *m, const ir_layer *ly, int32_t W, plan_place *pl, bool *auto_, diag_sink *diags) {
  const ir_plan *plan = m->active_plan >= 0 ? &m->plans[m->active_plan] : NULL;
  *auto_ = true;
  if (!plan) return true;
  const ir_rule *rule = NULL;
  int best = -1;
  for (size_t r = 0; r < plan->nrules; r++) {
    if (!ir_glob_match(plan->rules[r].pattern, ly->name)) continue;
    int s = ir_pattern_specificity(plan->rules[r].pattern); /* as the sharding pass */
    if (s >= best) {
      best = s;
      rule = &plan->rules[r];
    }
  }
  ir_tp tp = rule ? rule->tp : ly->tp;
  const char *file = rule ? plan->file : m->file;
  ntp_loc loc = tp.loc.first_line ? tp.loc : (rule ? rule->loc : ly->loc);
  if (tp.kind == TP_AUTO) return true;
  *auto_ = false;
  *pl = (plan_place){.sp = rule && rule->seq_parallel};
  char msg[300];
  if (tp.kind == TP_NONE || tp.n == 1) {
    int64_t t = tp.kind == TP_NONE ? 1 : tp.groups[0];
    if (t > W || W % t || W / t > NTP_MAX_GROUPS) {
      if (t > W) snprintf(msg, sizeof msg, "TP degree %lld is larger than the world (%d ranks)", (long long)t, W);
      else if (W % t) snprintf(msg, sizeof msg, "TP degree %lld does not divide the world (%d ranks)", (long long)t, W);
      else snprintf(msg, sizeof msg, "%lld groups: at most %d are supported", (long long)(W / t), NTP_MAX_GROUPS);
      diag_emit(diags, NTPC_ERROR, file, loc, "%s", msg);
      return false;
    }
    pl->ngroups = (int32_t)(W / t);
    for (int g = 0; g < pl->ngroups; g++) pl->size[g] = (int32_t)t;
  } else {
    int64_t sum = 0;
    for (int g = 0; g < tp.n; g++) sum += pl->size[g] = (int32_t)tp.groups[g];
    pl->ngroups = tp.n;
    if (sum != W) {
      diag_emit(diags, NTPC_ERROR, file, loc, "groups sum to %lld ranks, but the world has %d", (long long)sum, W);
      return false;
    }
  }
  if (rule && rule->nbatch) {
    if (rule->nbatch != pl->ngroups) {
      diag_emit(diags, NTPC_ERROR, plan->file, rule->loc, "batch split has %d shares but the layer has %d groups", rule->nbatch, pl->ngroups);
      return false;
    }
    for (int g = 0; g < pl->ngroups; g++) pl->share[g] = rule->batch[g];
  }
  return true;
}

/* Bytes per GPU the DP's memory model gives an assignment (parameters of every layer on its
 * most-loaded rank, the activation reserve, what no layer places). */
static double model_bytes(const plan_tables *T, const int32_t *choice) {
  double need = T->act_reserve + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) need += T->pmax[(size_t)i * T->S + choice[i]];
  return need;
}

/* Byte-exact local improvement of a plan that fits: while some layer can change its state,
 * keeping the plan within the cap, and the step gets faster, make the best such change. The
 * quantised search rounds every layer's memory up; this spends the memory that rounding left. */
static void improve(const plan_tables *T, double cap, int32_t *choice) {
  int32_t n = T->pm->n, S = T->S;
  double bytes = model_bytes(T, choice);
  for (int32_t iter = 0; iter < 8 * n + 8; iter++) {
    double best = 0;
    int32_t bl = -1, bs = -1;
    for (int32_t l = 0; l < n; l++) {
      int32_t c = choice[l];
      size_t kc = (size_t)l * S + c;
      for (int32_t s = 0; s < S; s++) {
        size_t k = (size_t)l * S + s;
        if (s == c || !T->legal[k] || bytes + T->pmax[k] - T->pmax[kc] > cap) continue;
        double dt = (T->tcomp[k] + T->tcomm[k]) - (T->tcomp[kc] + T->tcomm[kc]);
        if (l > 0) dt += T->trans[l][(size_t)choice[l - 1] * S + s] - T->trans[l][(size_t)choice[l - 1] * S + c];
        if (l + 1 < n) dt += T->trans[l + 1][(size_t)s * S + choice[l + 1]] - T->trans[l + 1][(size_t)c * S + choice[l + 1]];
        if (dt < best) {
          best = dt;
          bl = l;
          bs = s;
        }
      }
    }
    if (bl < 0 || best > -1e-12) break;
    bytes += T->pmax[(size_t)bl * S + bs] - T->pmax[(size_t)bl * S + choice[bl]];
    choice[bl] = bs;
  }
}

/* min over plans of time + lam * bytes (no memory constraint): a DP over layers and states in
 * double; the plan in choice. */
static double lagrange_dp(const plan_tables *T, double lam, int32_t *choice, double *scratch, int32_t *from) {
  int32_t n = T->pm->n, S = T->S;
  double *prev = scratch, *cur = scratch + S;
  for (int32_t s = 0; s < S; s++)
    prev[s] = T->legal[s] ? T->tcomp[s] + T->tcomm[s] + lam * T->pmax[s] : INFINITY;
  for (int32_t l = 1; l < n; l++) {
    for (int32_t s = 0; s < S; s++) {
      size_t k = (size_t)l * S + s;
      double best = INFINITY;
      int32_t arg = -1;
      if (T->legal[k])
        for (int32_t s2 = 0; s2 < S; s2++) {
          double v = prev[s2] + T->trans[l][(size_t)s2 * S + s];
          if (v < best) {
            best = v;
            arg = s2;
          }
        }
      cur[s] = best + T->tcomp[k] + T->tcomm[k] + lam * T->pmax[k];
      from[(size_t)l * S + s] = arg;
    }
    double *t = prev;
    prev = cur;
    cur = t;
  }
  int32_t bs = -1;
  for (int32_t s = 0; s < S; s++)
    if (prev[s] < INFINITY && (bs < 0 || prev[s] < prev[bs])) bs = s;
  if (bs < 0) return INFINITY;
  double v = prev[bs];
  for (int32_t l = n - 1; l >= 0; l--) {
    choice[l] = bs;
    if (l) bs = from[(size_t)l * S + bs];
  }
  return v;
}

static double plan_time(const plan_tables *T, const int32_t *choice) {
  int32_t S = T->S;
  double t = 0;
  for (int32_t l = 0; l < T->pm->n; l++) {
    size_t k = (size_t)l * S + choice[l];
    t += T->tcomp[k] + T->tcomm[k] + (l ? T->trans[l][(size_t)choice[l - 1] * S + choice[l]] : 0);
  }
  return t;
}

/* The Lagrangian dual of the memory constraint: for every lam >= 0, min over plans of
 * time + lam (bytes - cap) is a lower bound on the best time within the cap; the bound is
 * maximised over lam by bisection on its slope (bytes - cap of the minimising plan). The
 * minimising plans that fit are candidates; the best is left in `best` (best_t: its time). */
static double lagrange_bound(const plan_tables *T, double cap, int32_t *best, double *best_t, double *lam_best) {
  int32_t n = T->pm->n, S = T->S;
  double *scratch = malloc(2 * (size_t)S * sizeof *scratch);
  int32_t *from = malloc((size_t)n * (size_t)S * sizeof *from), *c = malloc((size_t)n * sizeof *c);
  double bound = -INFINITY;
  *best_t = INFINITY;
  if (!scratch || !from || !c) goto done;
  double lo = 0, hi = 0;
  for (int it = 0; it < 200; it++) {
    double lam = it == 0 ? 0 : hi > 0 && lo < hi ? 0.5 * (lo + hi) : (hi > 0 ? hi : 1e-12);
    double v = lagrange_dp(T, lam, c, scratch, from);
    if (!(v < INFINITY)) break;
    double bytes = model_bytes(T, c), b = v - lam * (cap - T->act_reserve - T->const_mem);
    if (b > bound) {
      bound = b;
      if (lam_best) *lam_best = lam;
    }
    if (bytes <= cap) {
      double t = plan_time(T, c);
      if (t < *best_t) {
        *best_t = t;
        memcpy(best, c, (size_t)n * sizeof *c);
      }
      if (it == 0) break; /* memory does not bind */
      hi = lam;
    } else {
      lo = lam;
      if (hi == 0 || lam >= hi) hi = lam > 0 ? lam * 4 : 1e-12; /* no upper end yet: grow */
    }
    if (hi > 0 && lo > 0 && hi - lo <= 1e-6 * hi) break;
  }
done:
  free(scratch);
  free(from);
  free(c);
  return bound;
}

/* The activation peak of a plan (its layers' working sets, the largest), and its bytes per GPU
 * with that peak: what a plan needs to fit. */
static double plan_peak(const plan_tables *T, const int32_t *choice) {
  double a = 0;
  for (int32_t i = 0; i < T->pm->n; i++)
    if (T->amax[(size_t)i * T->S + choice[i]] > a) a = T->amax[(size_t)i * T->S + choice[i]];
  return a;
}

static double peak_bytes(const plan_tables *T, const int32_t *choice) {
  double need = plan_peak(T, choice) + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) need += T->pmax[(size_t)i * T->S + choice[i]];
  return need;
}

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

/* Solves the tables. A plan fits when its parameters (each layer's on its most-loaded rank),
 * its activation peak (the largest working set of its layers) and the unplaced slices fit the
 * cap. The peak is a maximum, not a sum, so the search runs once per candidate peak theta (the
 * distinct working sets, largest first): states whose working set exceeds theta are excluded,
 * theta is reserved, and the parameters are the DP's knapsack (memory in units rounded up:
 * every plan it accepts fits), improved byte for byte by local moves. A theta is skipped when
 * even its smallest parameters do not fit, or when its unconstrained optimum is no faster than
 * the best plan so far. The Lagrangian dual (with the smallest possible peak) bounds every plan
 * that fits; a plan as fast as the bound is certified optimal. */
static bool solve_tables(plan_tables *T, double mem_cap, int32_t quanta, int32_t *choice, plan_solution *out) {
  int32_t n = T->pm->n, S = T->S;
  size_t ns = (size_t)n * S;
  int32_t *alt = malloc((size_t)n * sizeof *alt);
  uint8_t *legal = malloc(ns);
  double *thetas = malloc((ns + 1) * sizeof *thetas);
  double t0 = now_ms(), reserve = T->act_reserve;
  if (quanta <= 0) quanta = 1024;
  bool ok = false;
  dp_ws ws = {0};
  out->exact = true;
  out->quantum = 0;
  int64_t fit = (int64_t)(PLAN_DP_BYTES / (ns * sizeof(float))) - 1; /* every layer's DP table is kept */
  if (quanta > fit) quanta = fit > 16 ? (int32_t)fit : 16;
  double ta = INFINITY;
  int nt = 0, full = 0;
  double *scratch = malloc(2 * (size_t)S * sizeof *scratch);
  int32_t *from = malloc((ns + (size_t)n) * sizeof *from);
  /* the bound first: with the smallest activation peak any plan can have, and every state;
   * its multiplier then bounds each peak's search from below */
  double lam = 0, lb = -INFINITY, tl = INFINITY;
  if (alt && legal && thetas && scratch && from) {
    memcpy(legal, T->legal, ns);
    for (size_t k = 0; k < ns; k++)
      if (legal[k]) thetas[nt++] = T->amax[k];
    qsort(thetas, (size_t)nt, sizeof *thetas, cmp_desc);
    double floor_act = 0;
    for (int32_t i = 0; i < n; i++) {
      double mn = INFINITY;
      for (int32_t k = 0; k < S; k++)
        if (T->legal[(size_t)i * S + k] && T->amax[(size_t)i * S + k] < mn) mn = T->amax[(size_t)i * S + k];
      if (mn > floor_act && mn < INFINITY) floor_act = mn;
    }
    T->act_reserve = floor_act;
    lb = lagrange_bound(T, mem_cap, alt, &tl, &lam);
    T->act_reserve = reserve;
    if (tl < INFINITY && peak_bytes(T, alt) <= mem_cap) { /* a Lagrangian plan that fits: the first incumbent */
      ta = tl;
      memcpy(choice, alt, (size_t)n * sizeof *alt);
      ok = true;
    }
  } else {
    nt = 0;
  }
  /* small problems get a finer memory resolution (up to 65536 units) while searching every
   * candidate peak stays under 2e7 DP cells */
  int distinct = 0;
  for (int it = 0; it < nt; it++) distinct += !it || thetas[it] != thetas[it - 1];
  double finer = 2e7 / ((double)(distinct > 0 ? distinct : 1) * n * S * S);
  if (finer > quanta) quanta = finer > 65536 ? 65536 : (int32_t)finer;
  if (quanta > fit) quanta = fit > 16 ? (int32_t)fit : 16;
  /* every peak is searched when that is cheap; past the budget only the incumbent's own peak */
  double work = (double)n * S * S * (quanta + 1), budget_dps = 1e8 / (work > 1 ? work : 1);
  int max_full = budget_dps > 1 ? (int)budget_dps : 1;
  out->peaks_exact = true;
  for (int it = 0; it < nt; it++) {
    double theta = thetas[it];
    if (it && theta == thetas[it - 1]) continue;
    if (full >= max_full) { /* over budget: jump to the incumbent's peak, if it is below */
      double peak = ok ? plan_peak(T, choice) : -1;
      out->peaks_exact = false;
      while (it < nt && thetas[it] > peak) it++;
      if (it >= nt || thetas[it] != peak) break;
      theta = thetas[it];
    }
    bool any_layer = true;
    double least = theta + T->const_mem;
    for (int32_t i = 0; i < n && any_layer; i++) {
      double mn = INFINITY;
      for (int32_t k = 0; k < S; k++) {
        size_t q = (size_t)i * S + k;
        T->legal[q] = legal[q] && T->amax[q] <= theta;
        if (T->legal[q] && T->pmax[q] < mn) mn = T->pmax[q];
      }
      any_layer = mn < INFINITY;
      least += mn;
    }
    if (!any_layer) break;       /* a lower theta leaves a layer no state either */
    if (least > mem_cap) continue; /* nothing fits with this peak */
    T->act_reserve = theta;
    plan_problem pb = plan_tables_problem(T, mem_cap, quanta, true);
    if (!dp_core(&pb, 0, false, alt, &ws)) continue;
    double tu = plan_time(T, alt);
    if (tu >= ta) continue; /* not even without a memory limit */
    if (lam > 0) { /* the Lagrangian bound at this peak, with the multiplier found above */
      double v = lagrange_dp(T, lam, from /* as a plan buffer */, scratch, from + n);
      if (v - lam * (mem_cap - theta - T->const_mem) >= ta * (1 - 1e-12)) continue;
    }
    if (model_bytes(T, alt) <= mem_cap) { /* the unconstrained optimum at this peak fits */
      ta = tu;
      memcpy(choice, alt, (size_t)n * sizeof *alt);
      ok = true;
      continue;
    }
    for (int32_t qn = quanta; qn <= quanta * 16 && qn <= fit; qn *= 4) {
      pb = plan_tables_problem(T, mem_cap, qn, true);
      if (T->quantum > out->quantum) out->quantum = T->quantum;
      full++;
      if (dp_solve_ws(&pb, alt, NULL, NULL, &ws)) {
        improve(T, mem_cap, alt);
        double t = plan_time(T, alt);
        if (t < ta) {
          ta = t;
          memcpy(choice, alt, (size_t)n * sizeof *alt);
          ok = true;
        }
        break;
      }
    }
    if (work < 1e7) { /* cheap: the relaxation (units rounded down); its plan, if it fits, is optimal at this peak */
      pb = plan_tables_problem(T, mem_cap, quanta, false);
      if (dp_solve_ws(&pb, alt, NULL, NULL, &ws) && model_bytes(T, alt) <= mem_cap) {
        double t = plan_time(T, alt);
        if (t < ta) {
          ta = t;
          memcpy(choice, alt, (size_t)n * sizeof *alt);
          ok = true;
        }
      }
    }
  }
  if (legal) memcpy(T->legal, legal, ns);
  T->act_reserve = reserve;
  if (ok) {
    out->lower_bound_s = (lb < ta ? lb : ta) + T->const_time;
    out->exact = out->quantum == 0 || ta <= lb * (1 + 1e-12);
  }
  out->full_dps = full;
  out->search_ms = now_ms() - t0;
  free(ws.D);
  free(alt);
  free(legal);
  free(thetas);
  free(scratch);
  free(from);
  return ok;
}

/* The report's numbers for an assignment of states. */
static void fill_solution(plan_tables *T, const int32_t *choice, double mem_cap, plan_solution *out) {
  int32_t n = T->pm->n, S = T->S, W = T->W;
  out->feasible = true;
  out->world = W;
  out->nlayers = n;
  out->layers = calloc((size_t)n, sizeof *out->layers);
  out->rank_params = calloc((size_t)W, sizeof *out->rank_params);
  out->rank_act = calloc((size_t)W, sizeof *out->rank_act);
  out->act_reserve = plan_peak(T, choice);
  out->mem_cap = mem_cap;
  out->states = S;
  if (!out->phys) {
    out->phys = malloc((size_t)W * sizeof *out->phys);
    for (int32_t r = 0; out->phys && r < W; r++) out->phys[r] = r;
  }
  double *pr = calloc((size_t)W, sizeof *pr);
  if (!out->layers || !out->rank_params || !out->rank_act || !pr) {
    out->feasible = false;
    snprintf(out->why, sizeof out->why, "out of memory");
    free(pr);
    return;
  }
  double act = 0, step = T->const_time;
  for (int32_t i = 0; i < n; i++) {
    int32_t s = choice[i];
    size_t k = (size_t)i * S + s;
    plan_layer_out *lo = &out->layers[i];
    lo->place = T->st[s];
    lo->pinned = T->pin[i] >= 0;
    lo->compute_s = T->tcomp[k];
    lo->comm_s = T->tcomm[k];
    lo->redist_s = i ? T->trans[i][(size_t)choice[i - 1] * S + s] : 0;
    lo->param_bytes = T->pmax[k];
    lo->act_bytes = T->amax[k];
    lo->reduce_bytes = T->rbytes[k];
    lo->redist_bytes = T->ubytes[k] + (i ? T->tbytes[i][(size_t)choice[i - 1] * S + s] : 0);
    step += lo->compute_s + lo->comm_s + lo->redist_s;
    out->compute_s += lo->compute_s;
    out->comm_s += lo->comm_s + lo->redist_s;
    unary_out u;
    memset(pr, 0, (size_t)W * sizeof *pr);
    unary_eval(T, i, s, &u, pr);
    for (int32_t r = 0; r < W; r++) out->rank_params[r] += pr[r];
    memset(pr, 0, (size_t)W * sizeof *pr); /* its slices read by ops: counted once below, across layers */
    add_reads(T, (home){.kind = H_LAYER, .layer = i}, s, pr);
    for (int32_t r = 0; r < W; r++) out->rank_params[r] -= pr[r];
    if (T->amax[k] > act) act = T->amax[k];
  }
  memset(pr, 0, (size_t)W * sizeof *pr);
  add_reads_plan(T, choice, pr);
  for (int32_t r = 0; r < W; r++) out->rank_params[r] += pr[r];
  /* a head tied to an earlier layer's table: where a rank holds the same rows of it for both,
   * the compiler keeps one slice (the search counts both, to stay additive) */
  for (int32_t j = 0; j < n; j++) {
    const chain_layer *h = &T->pm->L[j];
    if (h->wval < 0) continue;
    for (int32_t i = 0; i < n; i++) {
      const chain_layer *e = &T->pm->L[i];
      if (i == j || T->pm->m->layers[e->ir].weight != h->wval) continue;
      const ir_value *w = &T->pm->m->values[h->wval];
      for (int32_t r = 0; r < W; r++) {
        int64_t rl[2], rh[2];
        bool held[2];
        for (int side = 0; side < 2; side++) {
          const plan_place *pl = &T->st[choice[side ? j : i]];
          const chain_layer *c = side ? h : e;
          int64_t rows[NTP_MAX_GROUPS + 1];
          int32_t gs[NTP_MAX_GROUPS + 1];
          place_rows(pl, c->rows, rows);
          group_starts(pl, gs);
          held[side] = false;
          for (int g = 0; g < pl->ngroups; g++)
            if (r >= gs[g] && r < gs[g + 1] && rows[g + 1] > rows[g]) {
              layer_slice sl;
              c->k->split(&c->d, pl->size[g], r - gs[g], &sl);
              rl[side] = sl.lo;
              rh[side] = sl.hi;
              held[side] = true;
            }
        }
        if (held[0] && held[1] && rl[0] == rl[1] && rh[0] == rh[1])
          out->rank_params[r] -= plan_tensor_bytes((double)(rh[0] - rl[0]) * (double)w->shape.dim[1] *
                                                   (double)dtype_bytes(w->dtype));
      }
    }
  }
  out->mem_peak = 0;
  for (int32_t r = 0; r < W; r++) {
    out->rank_act[r] = act;
    if (out->rank_params[r] + act > out->mem_peak) out->mem_peak = out->rank_params[r] + act;
  }
  out->const_s = T->const_time;
  out->compute_s += T->const_time;
  out->step_s = step;
  free(pr);
}

static const char *fmt_bytes(double b, char *buf, size_t cap);

static void infeasible(plan_tables *T, double mem_cap, plan_solution *out) {
  double need = T->act_reserve + T->const_mem;
  for (int32_t i = 0; i < T->pm->n; i++) {
    double pmin = INFINITY;
    for (int32_t s = 0; s < T->S; s++)
      if (T->legal[(size_t)i * T->S + s] && T->pmax[(size_t)i * T->S + s] < pmin) pmin = T->pmax[(size_t)i * T->S + s];
    need += pmin;
  }
  out->feasible = false;
  out->world = T->W;
  out->mem_cap = mem_cap;
  out->act_reserve = T->act_reserve;
  char b1[32], b2[32], b3[32];
  snprintf(out->why, sizeof out->why,
           "does not fit: the smallest plan needs %s per GPU (parameters at the highest degrees, plus %s of "
           "activations and unplaced slices), the cap is %s",
           fmt_bytes(need, b1, sizeof b1), fmt_bytes(T->act_reserve + T->const_mem, b2, sizeof b2),
           fmt_bytes(mem_cap, b3, sizeof b3));
}

static double cap_of(const plan_request *rq) { return rq->mem_cap > 0 ? rq->mem_cap : rq->prof->mem_capacity; }

static bool plan_solve_unguarded(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out,
                                 diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world, n = pm->n;
  if (W < 1) {
    diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "the world must have at least one rank");
    return false;
  }
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  int32_t *pins = malloc((size_t)n * sizeof *pins);
  bool ok = pins != NULL;
  for (int32_t k = 1; ok && k <= W && k <= NTP_MAX_GROUPS; k++) {
    plan_place a = plan_place_balanced(W, k, false), b = plan_place_balanced(W, k, true);
    ok = add_state(&st, &ns, &cs, &a) >= 0 && (k == W || add_state(&st, &ns, &cs, &b) >= 0);
  }
  for (int32_t i = 0; ok && i < n; i++) {
    plan_place pl;
    bool a;
    pins[i] = -1;
    if (rq->fixed) {
      const sh_placement *f = &rq->fixed[plan_model_ir_layer(pm, i)];
      if ((a = f->is_auto) == false) {
        pl = (plan_place){.ngroups = f->ngroups, .sp = f->seq_parallel};
        for (int g = 0; g < f->ngroups; g++) {
          pl.size[g] = f->group_start[g + 1] - f->group_start[g];
          pl.share[g] = f->shares_given ? f->share[g] : 0;
        }
      }
    } else if (!resolve_pin(m, plan_model_layer(pm, i), W, &pl, &a, diags)) {
      free(pins);
      free(st);
      return false;
    }
    if (!a) ok = (pins[i] = add_state(&st, &ns, &cs, &pl)) >= 0;
  }
  if (!ok || ns > 255) {
    if (ok) diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "too many placements to search (%d)", ns);
    else diag_out_of_memory(diags);
    free(pins);
    free(st);
    return false;
  }
  double t0 = now_ms();
  plan_tables *T = tables_build(pm, rq->prof, W, NULL, rq->nodes_of, st, ns, pins, rq->act_extra, diags);
  free(pins);
  free(st);
  if (!T) return false;
  out->tables_ms = now_ms() - t0;
  int32_t *choice = malloc((size_t)n * sizeof *choice);
  double mem_cap = cap_of(rq);
  double tms = out->tables_ms;
  if (choice && solve_tables(T, mem_cap, rq->quanta, choice, out)) {
    double sms = out->search_ms, q = out->quantum, lb = out->lower_bound_s;
    bool exact = out->exact;
    int fd = out->full_dps;
    bool pe = out->peaks_exact;
    fill_solution(T, choice, mem_cap, out);
    out->full_dps = fd;
    out->peaks_exact = pe;
    out->search_ms = sms;
    out->quantum = q;
    out->lower_bound_s = lb;
    out->exact = exact;
  } else {
    infeasible(T, mem_cap, out);
  }
  out->tables_ms = tms;
  free(choice);
  plan_tables_free(T);
  return true;
}

static plan_tables *plan_tables_new_unguarded(const plan_model *pm, const plan_request *rq, diag_sink *diags) {
  int32_t W = rq->world;
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  for (int32_t k = 1; k <= W && k <= NTP_MAX_GROUPS; k++) {
    plan_place a = plan_place_balanced(W, k, false), b = plan_place_balanced(W, k, true);
    add_state(&st, &ns, &cs, &a);
    if (k < W) add_state(&st, &ns, &cs, &b);
  }
  plan_tables *T = tables_build(pm, rq->prof, W, NULL, rq->nodes_of, st, ns, NULL, rq->act_extra, diags);
  free(st);
  return T;
}

void plan_tables_bytes_in(plan_tables *T, const int32_t *choice, double *per_rank) {
  int32_t n = T->pm->n, W = T->W;
  memset(per_rank, 0, (size_t)W * sizeof *per_rank);
  for (int32_t i = 0; i < n; i++) {
    const chain_layer *c = &T->pm->L[i];
    const plan_place *pl = &T->st[choice[i]];
    int64_t rows[NTP_MAX_GROUPS + 1];
    int32_t gs[NTP_MAX_GROUPS + 1];
    place_rows(pl, c->rows, rows);
    group_starts(pl, gs);
    for (int g = 0; g < pl->ngroups; g++) {
      double b;
      group_reduce(T, c, pl, gs[g], pl->size[g], rows[g + 1] - rows[g], &b);
      for (int k = 0; k < pl->size[g] && b > 0; k++) per_rank[gs[g] + k] += b;
    }
    const plan_model *pm = T->pm;
    for (int32_t e = pm->umove_off[i]; e < pm->umove_off[i + 1]; e++)
      move_eval(T, &pm->moves[pm->umove_ix[e]], i, choice[i], choice[i], NULL, per_rank);
    for (int32_t e = pm->pmove_off[i]; i > 0 && e < pm->pmove_off[i + 1]; e++)
      move_eval(T, &pm->moves[pm->pmove_ix[e]], i - 1, choice[i - 1], choice[i], NULL, per_rank);
  }
  for (int32_t e = T->pm->umove_off[n]; e < T->pm->umove_off[n + 1]; e++)
    move_eval(T, &T->pm->moves[T->pm->umove_ix[e]], 0, 0, 0, NULL, per_rank);
}

/* ======================================================================================
 * output: the plan file, the report, the picture
 * ====================================================================================== */

/* A layer's family: every all-digit component of its dotted name replaced by '*'. */
static void family_of(const char *name, char *buf, size_t cap) {
  size_t o = 0;
  const char *p = name;
  while (*p && o + 2 < cap) {
    size_t n = strcspn(p, ".");
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits) buf[o++] = '*';
    else
      for (size_t i = 0; i < n && o + 2 < cap; i++) buf[o++] = p[i];
    p += n;
    if (*p == '.') buf[o++] = *p++;
  }
  buf[o] = 0;
}

/* the number in a family member's name (its first all-digit component), or -1 */
static long member_index(const char *name) {
  const char *p = name;
  while (*p) {
    size_t n = strcspn(p, ".");
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
    if (digits) return strtol(p, NULL, 10);
    p += n;
    if (*p == '.') p++;
  }
  return -1;
}

/* The plan file. Layers whose names differ only in numbers (blk.N.attn) form a family: one
 * rule for the family's most common placement (blk.*.attn, when that pattern matches exactly the
 * family), then the members that differ, consecutive ones as a range (blk.{58..95}.attn:
 * more specific than blk.*.attn, less than any single name). */
void plan_write_plan(FILE *out, const plan_model *pm, const ir_module *m, const plan_solution *s, const char *name,
                     const char *header) {
  int32_t n = pm->n;
  if (header && *header) {
    const char *p = header;
    while (*p) {
      size_t k = strcspn(p, "\n");
      fprintf(out, "// %.*s\n", (int)k, p);
      p += k + (p[k] == '\n');
    }
  }
  fprintf(out, "plan %s for %s {\n  world %d;\n\n", name, m->name, s->world);
  /* layers without a degree (norms) take their inline annotation, or one rank each; the
   * compiler still resolves them: give them the whole world when that would not fit */
  bool base = false;
  for (size_t l = 0; l < m->n_layers && !base; l++) {
    if (layer_is_sharded(&m->layers[l])) continue;
    const ir_tp *tp = &m->layers[l].tp;
    int64_t sum = 0;
    for (int g = 0; tp->kind == TP_DEGREES && g < tp->n; g++) sum += tp->groups[g];
    if (tp->kind == TP_NONE || (tp->kind == TP_DEGREES && tp->n == 1 && tp->groups[0] == 1)) base = s->world > NTP_MAX_GROUPS;
    else if (tp->kind == TP_DEGREES && tp->n == 1) base = s->world % tp->groups[0] || s->world / tp->groups[0] > NTP_MAX_GROUPS;
    else base = tp->kind == TP_AUTO || sum != s->world;
  }
  if (base) fprintf(out, "  *  tp %d;  // layers without a degree of their own\n", s->world);
  char (*fam)[512] = malloc((size_t)n * sizeof *fam);
  char (*spec)[2048] = malloc((size_t)n * sizeof *spec);
  bool *done = calloc((size_t)n + 1, 1);
  typedef struct line {
    const char *pat, *spec;
  } line;
  line *lines = calloc((size_t)(2 * n + 2), sizeof *lines);
  char (*range)[600] = malloc((size_t)(n + 1) * sizeof *range);
  int nl = 0, nfirst = 0, ranges = 0;
  if (!fam || !spec || !done || !lines || !range) goto out;
  for (int32_t i = 0; i < n; i++) {
    family_of(plan_model_layer(pm, i)->name, fam[i], sizeof fam[i]);
    place_str_rows(&s->layers[i].place, pm->L[i].rows, spec[i], sizeof spec[i]);
  }
  /* the broad rules first, in layer order; then the exceptions */
  for (int32_t i = 0; i < n; i++) {
    if (done[i]) continue;
    int members = 0;
    for (int32_t j = i; j < n; j++) members += strcmp(fam[j], fam[i]) == 0;
    bool pattern = members > 1 && strchr(fam[i], '*');
    for (size_t l = 0; pattern && l < m->n_layers; l++) /* the pattern matches only the family */
      if (ir_glob_match(fam[i], m->layers[l].name)) {
        bool member = false;
        for (int32_t j = i; j < n && !member; j++) member = pm->L[j].ir == (int32_t)l && strcmp(fam[j], fam[i]) == 0;
        pattern = member;
      }
    if (!pattern) {
      done[i] = true;
      lines[nl++] = (line){plan_model_layer(pm, i)->name, spec[i]};
      continue;
    }
    int32_t best = i, bestc = 0; /* the family's most common placement */
    for (int32_t j = i; j < n; j++) {
      if (strcmp(fam[j], fam[i]) != 0) continue;
      int c = 0;
      for (int32_t k = i; k < n; k++) c += strcmp(fam[k], fam[i]) == 0 && strcmp(spec[k], spec[j]) == 0;
      if (c > bestc) {
        bestc = c;
        best = j;
      }
    }
    lines[nl++] = (line){fam[i], spec[best]};
    /* the exceptions: consecutive members with one placement become a range, blk.{58..95}.attn */
    for (int32_t j = i; j < n; j++) {
      if (strcmp(fam[j], fam[i]) != 0 || done[j]) continue;
      done[j] = true;
      if (strcmp(spec[j], spec[best]) == 0) continue;
      long first = member_index(plan_model_layer(pm, j)->name), last = first;
      for (int32_t k = j + 1; k < n; k++) {
        if (strcmp(fam[k], fam[i]) != 0) continue;
        if (strcmp(spec[k], spec[j]) != 0 || member_index(plan_model_layer(pm, k)->name) != last + 1) break;
        done[k] = true;
        last++;
      }
      const char *pat = plan_model_layer(pm, j)->name;
      if (last > first && first >= 0 && ranges < n) {
        const char *star = strchr(fam[i], '*');
        snprintf(range[ranges], sizeof range[ranges], "%.*s{%ld..%ld}%s", (int)(star - fam[i]), fam[i], first, last,
                 star + 1);
        pat = range[ranges++];
      }
      lines[n + 1 + nfirst++] = (line){pat, spec[j]};
    }
  }
  for (int k = 0; k < nfirst; k++) lines[nl++] = lines[n + 1 + k];
  int width = 0;
  for (int k = 0; k < nl; k++)
    if ((int)strlen(lines[k].pat) > width) width = (int)strlen(lines[k].pat);
  for (int k = 0; k < nl; k++) fprintf(out, "  %-*s  %s;\n", width, lines[k].pat, lines[k].spec);
out:
  fprintf(out, "}\n");
  free(fam);
  free(spec);
  free(done);
  free(lines);
  free(range);
}

static const char *fmt_bytes(double b, char *buf, size_t cap) {
  if (b >= 1073741824.0) snprintf(buf, cap, "%.2f GiB", b / 1073741824.0);
  else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
  else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
  else snprintf(buf, cap, "%.0f B", b);
  return buf;
}

static const char *fmt_time(double s, char *buf, size_t cap) {
  if (s == 0) snprintf(buf, cap, "0");
  else if (s >= 1) snprintf(buf, cap, "%.3f s", s);
  else if (s >= 1e-3) snprintf(buf, cap, "%.3f ms", s * 1e3);
  else snprintf(buf, cap, "%.1f us", s * 1e6);
  return buf;
}

void plan_write_report(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof) {
  int32_t n = pm->n;
  typedef struct row {
    char fam[128], cells[512];
    int32_t first, count;
    long lo, hi, idx[6];
    bool contiguous;
  } row;
  row *rows = calloc((size_t)n, sizeof *rows);
  int nr = 0;
  if (!rows) return;
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    char fam[128], sp[320], b1[32], b2[32], b3[32], t1[32], t2[32], t3[32], t4[32], cells[512];
    family_of(plan_model_layer(pm, i)->name, fam, sizeof fam);
    place_str_rows(&lo->place, pm->L[i].rows, sp, sizeof sp);
    if (lo->pinned) snprintf(sp + strlen(sp), sizeof sp - strlen(sp), " (fixed)");
    snprintf(cells, sizeof cells, "%-10s %-30s %11s %11s %11s %10s %10s %10s %10s", pm->L[i].k->name,
             sp, fmt_bytes(lo->param_bytes, b1, sizeof b1), fmt_bytes(lo->act_bytes, b2, sizeof b2),
             fmt_bytes(lo->reduce_bytes + lo->redist_bytes, b3, sizeof b3), fmt_time(lo->compute_s, t1, sizeof t1),
             fmt_time(lo->comm_s, t2, sizeof t2), fmt_time(lo->redist_s, t3, sizeof t3),
             fmt_time(lo->compute_s + lo->comm_s + lo->redist_s, t4, sizeof t4));
    long idx = member_index(plan_model_layer(pm, i)->name);
    int k = 0;
    for (; k < nr; k++)
      if (strchr(fam, '*') && strcmp(rows[k].fam, fam) == 0 && strcmp(rows[k].cells, cells) == 0) break;
    if (k == nr) {
      rows[nr] = (row){.first = i, .count = 0, .lo = idx, .hi = idx - 1, .contiguous = true};
      snprintf(rows[nr].fam, sizeof rows[nr].fam, "%s", fam);
      snprintf(rows[nr].cells, sizeof rows[nr].cells, "%s", cells);
      nr++;
    }
    rows[k].contiguous &= idx == rows[k].hi + 1;
    rows[k].hi = idx;
    if (rows[k].count < 6) rows[k].idx[rows[k].count] = idx;
    rows[k].count++;
  }
  char b1[32], b2[32], t1[32], t2[32];
  fprintf(out, "%-24s %5s %-10s %-30s %11s %11s %11s %10s %10s %10s %10s\n", "layer", "count", "kind", "placement",
          "params/GPU", "activ./GPU", "moved/GPU", "compute", "comm", "redist", "per layer");
  for (int k = 0; k < nr; k++) {
    char name[160];
    const char *full = plan_model_layer(pm, rows[k].first)->name;
    if (rows[k].count == 1) {
      snprintf(name, sizeof name, "%s", full);
    } else {
      char range[96] = "{";
      if (rows[k].contiguous) {
        snprintf(range, sizeof range, "{%ld..%ld}", rows[k].lo, rows[k].hi);
      } else {
        for (int j = 0; j < rows[k].count && j < 6; j++)
          snprintf(range + strlen(range), sizeof range - strlen(range), "%s%ld", j ? "," : "", rows[k].idx[j]);
        snprintf(range + strlen(range), sizeof range - strlen(range), "%s}", rows[k].count > 6 ? ",..." : "");
      }
      /* the family pattern with its '*' replaced by the range */
      const char *star = strchr(rows[k].fam, '*');
      snprintf(name, sizeof name, "%.*s%s%s", (int)(star - rows[k].fam), rows[k].fam, range, star + 1);
    }
    fprintf(out, "%-24s %5d %s\n", name, rows[k].count, rows[k].cells);
  }
  free(rows);
  double maxp = 0, sent = 0;
  for (int32_t r = 0; r < s->world; r++)
    if (s->rank_params[r] > maxp) maxp = s->rank_params[r];
  for (int32_t i = 0; i < n; i++) sent += s->layers[i].reduce_bytes + s->layers[i].redist_bytes;
  fprintf(out, "\npredicted step time (forward): %s = compute %s + communication %s", fmt_time(s->step_s, t1, sizeof t1),
          fmt_time(s->compute_s, t2, sizeof t2), fmt_time(s->comm_s, b1, sizeof b1));
  fprintf(out, "; %.0f tokens/s (%lld tokens per step)\n", (double)pm->tokens / s->step_s, (long long)pm->tokens);
  fprintf(out, "memory per GPU: parameters %s + activations %s = %s of %s (%s; busiest rank)\n",
          fmt_bytes(maxp, b1, sizeof b1), fmt_bytes(s->rank_act[0], b2, sizeof b2), fmt_bytes(s->mem_peak, t1, sizeof t1),
          fmt_bytes(s->mem_cap, t2, sizeof t2), prof->device);
  fprintf(out, "communication per step: %s moved by the busiest GPU of each layer, summed\n", fmt_bytes(sent, b1, sizeof b1));
  if (s->quantum > 0) {
    fprintf(out, "memory binds: DP over memory in units of %s; ", fmt_bytes(s->quantum, b1, sizeof b1));
    if (s->exact) fprintf(out, "the plan is optimal for the byte-exact memory cap\n");
    else
      fprintf(out, "no plan within the cap is faster than %s (%.2f%% below this one)\n",
              fmt_time(s->lower_bound_s, t1, sizeof t1), 100 * (s->step_s - s->lower_bound_s) / s->step_s);
  } else {
    fprintf(out, "memory does not bind: the plan is the unconstrained optimum\n");
  }
  fprintf(out, "search: %d layers x %d placements; cost tables %.1f ms, search %.2f ms (%d memory DP%s)\n", n,
          s->states, s->tables_ms, s->search_ms, s->full_dps, s->full_dps == 1 ? "" : "s");
}

static void svg_text(FILE *out, double x, double y, const char *anchor, int size, const char *fill, const char *text) {
  fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\" fill=\"%s\">", x, y, size, anchor, fill);
  for (const char *p = text; *p; p++) {
    if (*p == '&') fputs("&amp;", out);
    else if (*p == '<') fputs("&lt;", out);
    else if (*p == '>') fputs("&gt;", out);
    else if (*p == '"') fputs("&quot;", out);
    else fputc(*p, out);
  }
  fputs("</text>\n", out);
}

static double nice_ceil(double v) {
  if (v <= 0) return 1;
  double e = pow(10, floor(log10(v))), f = v / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

void plan_write_svg(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof,
                    const char *title) {
  int32_t n = pm->n, W = s->world;
  const double left = 70, right = 20, pw = 900, ph = 150, gap = 90, top = 100;
  double width = left + pw + right, height = top + 3 * ph + 2 * gap + 50;
  char buf[1024], b1[32], b2[32], b3[32], b4[32];
  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"Helvetica, Arial, sans-serif\">\n", width, height, width, height);
  fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", width, height);
  svg_text(out, left, 26, "start", 16, "#000", title);
  snprintf(buf, sizeof buf, "predicted step %s (compute %s), %.0f tokens/s; peak %s of %s per GPU (%s)",
           fmt_time(s->step_s, b1, sizeof b1), fmt_time(s->compute_s, b2, sizeof b2), (double)pm->tokens / s->step_s,
           fmt_bytes(s->mem_peak, b3, sizeof b3), fmt_bytes(s->mem_cap, b4, sizeof b4), prof->device);
  svg_text(out, left, 48, "start", 12, "#333", buf);
  double bw = pw / (n > 0 ? n : 1);
  /* 1: degree per layer */
  double y0 = top;
  int32_t tmax = 1;
  for (int32_t i = 0; i < n; i++)
    if (place_max(&s->layers[i].place) > tmax) tmax = place_max(&s->layers[i].place);
  svg_text(out, left, y0 - 26, "start", 13, "#000", "TP degree per layer (largest group; dark top: sequence parallel)");
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", left, y0, pw, ph);
  for (int32_t t = 1; t <= tmax; t = t < 4 ? t + 1 : t * 2) {
    double y = y0 + ph - ph * t / tmax;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left, y, left + pw, y);
    snprintf(buf, sizeof buf, "%d", t);
    svg_text(out, left - 6, y + 4, "end", 10, "#333", buf);
  }
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    double h = ph * place_max(&lo->place) / tmax, x = left + i * bw;
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%s: %s</title></rect>\n",
            x, y0 + ph - h, bw > 2 ? bw - 0.5 : bw, h, pm->L[i].k->color, plan_model_layer(pm, i)->name,
            place_str_rows(&lo->place, pm->L[i].rows, buf, sizeof buf));
    if (lo->place.sp)
      fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#000\" fill-opacity=\"0.35\"/>\n", x,
              y0 + ph - h, bw > 2 ? bw - 0.5 : bw, h < 6 ? h : 6);
  }
  double lx = left;
  for (int32_t k = 0, shown = 0; k < layer_nkinds; k++) {
    if (!layer_kinds[k]->color) continue;
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", lx + shown * 95,
            y0 - 16, layer_kinds[k]->color);
    svg_text(out, lx + shown * 95 + 14, y0 - 7, "start", 11, "#333", layer_kinds[k]->name);
    shown++;
  }
  /* 2: time per layer, compute and communication */
  y0 += ph + gap;
  double tmaxs = 0;
  for (int32_t i = 0; i < n; i++) {
    double t = s->layers[i].compute_s + s->layers[i].comm_s + s->layers[i].redist_s;
    if (t > tmaxs) tmaxs = t;
  }
  double scale = nice_ceil(tmaxs * 1e3);
  svg_text(out, left, y0 - 26, "start", 13, "#000", "predicted time per layer (ms)");
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", left, y0, pw, ph);
  for (int k = 0; k <= 4; k++) {
    double y = y0 + ph - ph * k / 4;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left, y, left + pw, y);
    snprintf(buf, sizeof buf, "%.3g", scale * k / 4);
    svg_text(out, left - 6, y + 4, "end", 10, "#333", buf);
  }
  const char *tc[3] = {"#4c78a8", "#f58518", "#e45756"};
  const char *tn[3] = {"compute", "reductions", "redistribution"};
  for (int32_t i = 0; i < n; i++) {
    const plan_layer_out *lo = &s->layers[i];
    double v[3] = {lo->compute_s, lo->comm_s, lo->redist_s}, y = y0 + ph;
    for (int k = 0; k < 3; k++) {
      double h = ph * v[k] * 1e3 / scale;
      if (h <= 0) continue;
      y -= h;
      fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%s %s: %s</title></rect>\n",
              left + i * bw, y, bw > 2 ? bw - 0.5 : bw, h, tc[k], plan_model_layer(pm, i)->name, tn[k],
              fmt_time(v[k], b1, sizeof b1));
    }
  }
  for (int k = 0; k < 3; k++) {
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>\n", lx + k * 120, y0 - 16, tc[k]);
    svg_text(out, lx + k * 120 + 14, y0 - 7, "start", 11, "#333", tn[k]);
  }
  svg_text(out, left + pw / 2, y0 + ph + 16, "middle", 11, "#333", "layers, in order");
  /* 3: memory per rank against capacity */
  y0 += ph + gap;
  double mmax = s->mem_cap;
  for (int32_t r = 0; r < W; r++)
    if (s->rank_params[r] + s->rank_act[r] > mmax) mmax = s->rank_params[r] + s->rank_act[r];
  double gib = nice_ceil(mmax / 1073741824.0);
  svg_text(out, left, y0 - 26, "start", 13, "#000", "memory per GPU (GiB) against capacity");
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", left, y0, pw, ph);
  for (int k = 0; k <= 4; k++) {
    double y = y0 + ph - ph * k / 4;
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left, y, left + pw, y);
    snprintf(buf, sizeof buf, "%.3g", gib * k / 4);
    svg_text(out, left - 6, y + 4, "end", 10, "#333", buf);
  }
  double rw = pw / (W > 0 ? W : 1);
  for (int32_t r = 0; r < W; r++) {
    double hp = ph * s->rank_params[r] / 1073741824.0 / gib, ha = ph * s->rank_act[r] / 1073741824.0 / gib;
    double x = left + r * rw + rw * 0.15, w = rw * 0.7;
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#4c78a8\"><title>rank %d (GPU %d): "
                 "parameters %s</title></rect>\n", x, y0 + ph - hp, w, hp, r, s->phys ? s->phys[r] : r,
            fmt_bytes(s->rank_params[r], b1, sizeof b1));
    fprintf(out, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#9ecae9\"><title>rank %d: activations "
                 "%s</title></rect>\n", x, y0 + ph - hp - ha, w, ha, r, fmt_bytes(s->rank_act[r], b1, sizeof b1));
    if (W <= 64) {
      snprintf(buf, sizeof buf, "%d", s->phys ? s->phys[r] : r);
      svg_text(out, x + w / 2, y0 + ph + 14, "middle", 10, "#333", buf);
    }
  }
  double yc = y0 + ph - ph * s->mem_cap / 1073741824.0 / gib;
  fprintf(out, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-width=\"2\" "
               "stroke-dasharray=\"6,4\"/>\n", left, yc, left + pw, yc);
  snprintf(buf, sizeof buf, "capacity %s", fmt_bytes(s->mem_cap, b1, sizeof b1));
  svg_text(out, left + pw - 4, yc - 4, "end", 11, "#d62728", buf);
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#4c78a8\"/>\n", lx, y0 - 16);
  svg_text(out, lx + 14, y0 - 7, "start", 11, "#333", "parameters");
  fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"#9ecae9\"/>\n", lx + 120, y0 - 16);
  svg_text(out, lx + 134, y0 - 7, "start", 11, "#333", "activations (reserved)");
  svg_text(out, left + pw / 2, y0 + ph + 30, "middle", 11, "#333", "GPUs (physical rank)");
  fprintf(out, "</svg>\n");
}

/* ======================================================================================
 * failure re-planning
 * ====================================================================================== */

/* Batch rows of each group in proportion to its predicted throughput on the whole model
 * (every layer at that group size): rows by throughput, then the remainder one row at a time
 * to the group that finishes soonest with it. Equal to the default split: no shares. */
static void throughput_shares(const plan_model *pm, const plan_profile *prof, int32_t W, int32_t *node, plan_place *pl) {
  int64_t B = pm->L[0].rows;
  int ng = pl->ngroups;
  pl->share[0] = 0;
  if (ng < 2 || B < ng) return;
  plan_tables T = {.pm = pm, .prof = prof, .W = W, .node = node};
  int32_t gs[NTP_MAX_GROUPS + 1];
  group_starts(pl, gs);
  /* distinct layers, with counts */
  int32_t *rep = malloc((size_t)pm->n * sizeof *rep), *cnt = calloc((size_t)pm->n, sizeof *cnt), nd = 0;
  if (!rep || !cnt) {
    free(rep);
    free(cnt);
    return;
  }
  for (int32_t i = 0; i < pm->n; i++) {
    int32_t k = 0;
    for (; k < nd; k++)
      if (layers_alike(&pm->L[i], &pm->L[rep[k]])) break;
    if (k == nd) rep[nd++] = i;
    cnt[k]++;
  }
#define GROUP_TIME(g, r, out)                                                                    \
  do {                                                                                           \
    double acc_ = 0;                                                                             \
    for (int32_t k_ = 0; k_ < nd; k_++) {                                                        \
      double tm_, rb_;                                                                           \
      core_rank(&T, &pm->L[rep[k_]], pl->size[g], 0, (r), pl->sp, &tm_, NULL, NULL);             \
      acc_ += cnt[k_] * (tm_ + group_reduce(&T, &pm->L[rep[k_]], pl, gs[g], pl->size[g], (r), &rb_)); \
    }                                                                                            \
    (out) = acc_;                                                                                \
  } while (0)
  double theta[NTP_MAX_GROUPS], sum = 0;
  int64_t rows[NTP_MAX_GROUPS], given = 0;
  for (int g = 0; g < ng; g++) {
    int64_t guess = B * pl->size[g] / W > 0 ? B * pl->size[g] / W : 1;
    double t;
    GROUP_TIME(g, guess, t);
    theta[g] = t > 0 ? (double)guess / t : 1;
    sum += theta[g];
  }
  for (int g = 0; g < ng; g++) {
    rows[g] = (int64_t)floor((double)B * theta[g] / sum);
    if (rows[g] < 1) rows[g] = 1;
    given += rows[g];
  }
  while (given > B) { /* the floor of 1 row each may overshoot: take from the largest */
    int big = 0;
    for (int g = 1; g < ng; g++)
      if (rows[g] > rows[big]) big = g;
    rows[big]--;
    given--;
  }
  while (given < B) {
    int best = -1;
    double bt = 0;
    for (int g = 0; g < ng; g++) {
      double t;
      GROUP_TIME(g, rows[g] + 1, t);
      if (best < 0 || t < bt) {
        best = g;
        bt = t;
      }
    }
    rows[best]++;
    given++;
  }
#undef GROUP_TIME
  free(rep);
  free(cnt);
  for (int g = 0; g < ng; g++) pl->share[g] = rows[g];
  if (default_shares(pl, B)) pl->share[0] = 0;
}

/* Degrade a healthy group structure (physical ranges) for the survivors: intact groups stay,
 * a group that lost GPUs keeps its survivors as one group, or as balanced groups of at most
 * `cap` GPUs. False when nothing is left or too many groups. */
static bool degrade(const int32_t *start, int ng, const bool *gone, int32_t cap, plan_place *pl) {
  *pl = (plan_place){0};
  for (int g = 0; g < ng; g++) {
    int32_t s = 0, t = start[g + 1] - start[g];
    for (int32_t p = start[g]; p < start[g + 1]; p++) s += !gone[p];
    if (s == 0) continue;
    int32_t parts = s == t || cap <= 0 ? 1 : (s + cap - 1) / cap;
    for (int32_t k = 0; k < parts; k++) {
      if (pl->ngroups == NTP_MAX_GROUPS) return false;
      int64_t lo, hi;
      split_range(s, parts, k, &lo, &hi);
      pl->size[pl->ngroups++] = (int32_t)(hi - lo);
    }
  }
  return pl->ngroups > 0;
}

static bool survivors_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, const plan_solution *healthy,
                            const bool *gone, plan_solution *out, diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world, N = 0, n = pm->n, nodes_of = rq->nodes_of > 0 ? rq->nodes_of : 8;
  for (int32_t p = 0; p < W; p++) N += !gone[p];
  out->mem_cap = cap_of(rq);
  if (N == 0) {
    out->feasible = false;
    snprintf(out->why, sizeof out->why, "no GPU left");
    return true;
  }
  int32_t *phys = malloc((size_t)N * sizeof *phys), *node = malloc((size_t)N * sizeof *node);
  int32_t *pins = malloc((size_t)n * sizeof *pins);
  plan_place *st = NULL;
  int32_t ns = 0, cs = 0;
  bool ok = phys && node && pins;
  for (int32_t p = 0, k = 0; ok && p < W; p++)
    if (!gone[p]) {
      phys[k] = p;
      node[k++] = p / nodes_of;
    }
  /* healthy structures: every divisor degree, and the healthy plan's own placements */
  int32_t nstruct = 0, (*starts)[NTP_MAX_GROUPS + 1] = malloc((size_t)(W + n + 1) * sizeof *starts);
  int32_t *nstart = malloc((size_t)(W + n + 1) * sizeof *nstart);
  ok &= starts && nstart;
  for (int32_t t = 1; ok && t <= W; t++) {
    if (W % t || W / t > NTP_MAX_GROUPS) continue;
    nstart[nstruct] = W / t;
    for (int32_t g = 0; g <= W / t; g++) starts[nstruct][g] = g * t;
    nstruct++;
  }
  for (int32_t i = 0; ok && healthy && healthy->feasible && i < n; i++) {
    group_starts(&healthy->layers[i].place, starts[nstruct]);
    nstart[nstruct++] = healthy->layers[i].place.ngroups;
  }
  for (int32_t k = 0; ok && k < nstruct; k++) {
    int32_t tmax = 0;
    for (int32_t g = 0; g < nstart[k]; g++)
      if (starts[k][g + 1] - starts[k][g] > tmax) tmax = starts[k][g + 1] - starts[k][g];
    for (int32_t c = 0; c < tmax; c++) { /* c = 0: one group per replica; else groups of at most c */
      if (c > 0 && (W % c || c >= tmax)) continue;
      plan_place pl;
      if (!degrade(starts[k], nstart[k], gone, c, &pl)) continue;
      ok &= add_state(&st, &ns, &cs, &pl) >= 0;
    }
  }
  for (int32_t k = 1; ok && k <= N && k <= NTP_MAX_GROUPS; k++) {
    plan_place pl = plan_place_balanced(N, k, false);
    ok &= add_state(&st, &ns, &cs, &pl) >= 0;
  }
  /* pins: the pinned placement's groups, degraded */
  for (int32_t i = 0; ok && i < n; i++) {
    plan_place hp, pl;
    bool a;
    pins[i] = -1;
    if (!resolve_pin(m, plan_model_layer(pm, i), W, &hp, &a, diags)) {
      ok = false;
      break;
    }
    if (a) continue;
    int32_t gs[NTP_MAX_GROUPS + 1];
    group_starts(&hp, gs);
    if (!degrade(gs, hp.ngroups, gone, 0, &pl)) continue;
    pl.sp = hp.sp;
    int32_t idx = add_state(&st, &ns, &cs, &pl);
    ok &= idx >= 0;
    pins[i] = -2 - idx; /* resolved below, after the sp copies */
  }
  /* every structure with and without sequence parallelism, batch rows by throughput */
  int32_t base = ns;
  for (int32_t k = 0; ok && k < base; k++) {
    if (st[k].sp) continue;
    plan_place b = st[k];
    b.sp = true;
    if (place_max(&b) > 1) ok &= add_state(&st, &ns, &cs, &b) >= 0;
  }
  for (int32_t k = 0; ok && k < ns; k++) throughput_shares(pm, rq->prof, N, node, &st[k]);
  for (int32_t i = 0; ok && i < n; i++)
    if (pins[i] <= -2) pins[i] = -2 - pins[i];
  free(starts);
  free(nstart);
  if (!ok || ns > 255) {
    if (ok) diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "too many placements to search (%d)", ns);
    else if (!diags->errors) diag_out_of_memory(diags);
    free(phys);
    free(node);
    free(pins);
    free(st);
    return false;
  }
  double t0 = now_ms();
  plan_tables *T = tables_build(pm, rq->prof, N, node, nodes_of, st, ns, pins, rq->act_extra, diags);
  free(pins);
  free(st);
  free(node);
  if (!T) {
    free(phys);
    return false;
  }
  double tms = now_ms() - t0;
  int32_t *choice = malloc((size_t)n * sizeof *choice);
  out->phys = phys;
  if (choice && solve_tables(T, cap_of(rq), rq->quanta, choice, out)) {
    double sms = out->search_ms, q = out->quantum, lb = out->lower_bound_s;
    bool exact = out->exact;
    int fd = out->full_dps;
    bool pe = out->peaks_exact;
    fill_solution(T, choice, cap_of(rq), out);
    out->full_dps = fd;
    out->peaks_exact = pe;
    out->search_ms = sms;
    out->quantum = q;
    out->lower_bound_s = lb;
    out->exact = exact;
  } else {
    infeasible(T, cap_of(rq), out);
  }
  out->tables_ms = tms;
  free(choice);
  plan_tables_free(T);
  return true;
}

void plan_failover_free(plan_failover *f) {
  if (!f) return;
  plan_solution_free(&f->healthy);
  plan_solution_free(&f->survivors);
  for (int i = 0; i <= f->ndegraded && i <= NTP_MAX_GROUPS; i++) plan_solution_free(&f->drop[i]);
  memset(f, 0, sizeof *f);
}

static bool plan_failover_solve_unguarded(const plan_model *pm, const ir_module *m, const plan_request *rq,
                                          plan_failover *out, diag_sink *diags) {
  memset(out, 0, sizeof *out);
  int32_t W = rq->world;
  bool *gone = calloc((size_t)W + 1, 1);
  if (!gone) {
    diag_out_of_memory(diags);
    return false;
  }
  for (int32_t k = 0; k < rq->nfailed; k++) {
    int32_t r = rq->failed[k];
    if (r < 0 || r >= W) {
      diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "failed rank %d is not in the world (ranks 0 to %d)", r, W - 1);
      free(gone);
      return false;
    }
    if (gone[r]) {
      diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "failed rank %d is listed twice", r);
      free(gone);
      return false;
    }
    gone[r] = true;
  }
  if (rq->nfailed >= W) {
    diag_emit(diags, NTPC_ERROR, NULL, NTP_NOLOC, "every GPU failed: nothing to plan");
    free(gone);
    return false;
  }
  plan_request h = *rq;
  h.failed = NULL;
  h.nfailed = 0;
  if (!plan_solve(pm, m, &h, &out->healthy, diags)) {
    free(gone);
    return false;
  }
  /* replicas: the groups of the healthy plan's widest placement */
  plan_place rp = plan_place_balanced(W, 1, false);
  if (out->healthy.feasible) {
    int32_t best = -1;
    for (int32_t i = 0; i < out->healthy.nlayers; i++)
      if (best < 0 || place_max(&out->healthy.layers[i].place) > place_max(&out->healthy.layers[best].place)) best = i;
    rp = out->healthy.layers[best].place;
  }
  out->nreplicas = rp.ngroups;
  out->replica_size = place_max(&rp);
  group_starts(&rp, out->replica_start);
  for (int32_t g = 0; g < rp.ngroups; g++) {
    bool hit = false;
    for (int32_t p = out->replica_start[g]; p < out->replica_start[g + 1]; p++) hit |= gone[p];
    if (hit) out->degraded[out->ndegraded++] = g;
  }
  bool ok = survivors_solve(pm, m, rq, out->healthy.feasible ? &out->healthy : NULL, gone, &out->survivors, diags);
  bool *drop = malloc((size_t)W + 1);
  for (int32_t d = 0; ok && drop && d <= out->ndegraded; d++) {
    if (d == out->ndegraded && out->ndegraded < 2) break; /* "all of them" is the one already listed */
    memcpy(drop, gone, (size_t)W);
    for (int32_t j = 0; j < out->ndegraded; j++) {
      if (d < out->ndegraded && j != d) continue;
      int32_t g = out->degraded[j];
      for (int32_t p = out->replica_start[g]; p < out->replica_start[g + 1]; p++) drop[p] = true;
    }
    ok = survivors_solve(pm, m, rq, out->healthy.feasible ? &out->healthy : NULL, drop, &out->drop[d], diags);
  }
  free(drop);
  free(gone);
  return ok;
}

double plan_model_tokens(const plan_model *pm) { return (double)pm->tokens; }

/* "heads 0-13, 14-27, ..." for the ranks of a group of t */
static void slices_str(const chain_layer *c, int t, char *buf, size_t cap) {
  snprintf(buf, cap, "%s ", c->k->unit_name);
  for (int i = 0; i < t; i++) {
    layer_slice sl;
    c->k->split(&c->d, t, i, &sl);
    size_t len = strlen(buf);
    if (len + 40 >= cap) {
      snprintf(buf + len, cap - len, ", ...");
      return;
    }
    snprintf(buf + len, cap - len, "%s%lld-%lld", i ? ", " : "", (long long)sl.lo, (long long)sl.hi - 1);
  }
}

void plan_write_reshard(FILE *out, const plan_model *pm, const plan_solution *s, const plan_solution *healthy) {
  int32_t n = pm->n;
  bool *done = calloc((size_t)n, 1);
  if (!done) return;
  for (int32_t i = 0; i < n; i++) {
    if (done[i]) continue;
    char fam[128], sp[320], hp[320], f2[128], s2[320], h2[320];
    family_of(plan_model_layer(pm, i)->name, fam, sizeof fam);
    place_str_rows(&s->layers[i].place, pm->L[i].rows, sp, sizeof sp);
    if (healthy && healthy->feasible) place_str_rows(&healthy->layers[i].place, pm->L[i].rows, hp, sizeof hp);
    else snprintf(hp, sizeof hp, "?");
    int count = 0;
    for (int32_t j = i; j < n; j++) {
      family_of(plan_model_layer(pm, j)->name, f2, sizeof f2);
      place_str_rows(&s->layers[j].place, pm->L[j].rows, s2, sizeof s2);
      if (healthy && healthy->feasible) place_str_rows(&healthy->layers[j].place, pm->L[j].rows, h2, sizeof h2);
      else snprintf(h2, sizeof h2, "?");
      if (strcmp(f2, fam) == 0 && strcmp(s2, sp) == 0 && strcmp(h2, hp) == 0 &&
          pm->L[j].d.units == pm->L[i].d.units) {
        done[j] = true;
        count++;
      }
    }
    if (count > 1) fprintf(out, "  %s (%d layers): %s (healthy: %s)\n", fam, count, sp, hp);
    else fprintf(out, "  %s: %s (healthy: %s)\n", plan_model_layer(pm, i)->name, sp, hp);
    const plan_place *pl = &s->layers[i].place;
    int64_t rows[NTP_MAX_GROUPS + 1];
    int32_t gs[NTP_MAX_GROUPS + 1];
    place_rows(pl, pm->L[i].rows, rows);
    group_starts(pl, gs);
    for (int g = 0; g < pl->ngroups; g++) {
      char gpus[512] = "", sl[512];
      for (int32_t r = gs[g]; r < gs[g + 1]; r++) {
        size_t len = strlen(gpus);
        snprintf(gpus + len, sizeof gpus - len, "%s%d", r > gs[g] ? "," : "", s->phys ? s->phys[r] : r);
      }
      slices_str(&pm->L[i], pl->size[g], sl, sizeof sl);
      if (rows[g + 1] > rows[g])
        fprintf(out, "    GPUs {%s} (ranks %d-%d), batch rows %lld-%lld: %s\n", gpus, gs[g], gs[g + 1] - 1,
                (long long)rows[g], (long long)rows[g + 1] - 1, sl);
      else
        fprintf(out, "    GPUs {%s} (ranks %d-%d): no batch rows, idle\n", gpus, gs[g], gs[g + 1] - 1);
    }
  }
  free(done);
}

/* ---- the entry points: out of memory in a table returns an error instead of aborting ---- */

#define OOM_GUARDED(call, fail)              \
  do {                                       \
    ntp_oom_guard g_;                        \
    ntp_oom_push(&g_);                       \
    if (setjmp(g_.jb)) {                     \
      diag_out_of_memory(diags);           \
      return fail;                           \
    }                                        \
    __typeof__(call) r_ = call;              \
    ntp_oom_pop(&g_);                        \
    return r_;                               \
  } while (0)

plan_model *plan_model_new(const ir_module *m, diag_sink *diags) {
  OOM_GUARDED(plan_model_new_unguarded(m, diags), NULL);
}

bool plan_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_solution *out, diag_sink *diags) {
  OOM_GUARDED(plan_solve_unguarded(pm, m, rq, out, diags), false);
}

bool plan_failover_solve(const plan_model *pm, const ir_module *m, const plan_request *rq, plan_failover *out,
                         diag_sink *diags) {
  OOM_GUARDED(plan_failover_solve_unguarded(pm, m, rq, out, diags), false);
}

plan_tables *plan_tables_new(const plan_model *pm, const plan_request *rq, diag_sink *diags) {
  OOM_GUARDED(plan_tables_new_unguarded(pm, rq, diags), NULL);
}
