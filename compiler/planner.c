/* planner.c — the cost model and the exact search for per-layer TP placements.
 *
 * The model is read as a chain of sharded layers (embedding, linear, attention, mlp); norms,
 * residual adds and other ops "follow" the value they extend, exactly as the sharding pass
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

static int32_t place_world(const plan_place *pl) {
  int32_t w = 0;
  for (int g = 0; g < pl->ngroups; g++) w += pl->size[g];
  return w;
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
  int64_t shares[NTP_MAX_GROUPS];
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
  int32_t op; /* the reading op, or -1: a layer's input */
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
  ir_layer_kind kind;
  int32_t x;
  ntp_shape xs, out;
  ntp_dtype dt, wdt;
  int64_t rows, T; /* batch rows (dim 0 of the input), tokens per row */
  int64_t units;
  const char *unit_name;
  int64_t V, Dm;                 /* embedding */
  int64_t N, K;                  /* linear */
  int64_t H, KV, HD, Din, Dout;  /* attention, mlp (Din, Dout) */
  int64_t S;                     /* attention: positions */
  bool qkv_bias, rope, causal;
  int64_t F;
  bool gated, up_bias;
  bool reduces;
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
  free(pm);
}

static bool sharded_kind(ir_layer_kind k) {
  return k == LAYER_EMBEDDING || k == LAYER_LINEAR || k == LAYER_ATTENTION || k == LAYER_MLP;
}

static int32_t find_param(const ir_module *m, const ir_layer *ly, const char *suffix) {
  size_t n = strlen(ly->name);
  for (int32_t i = ly->first_op; i < ly->first_op + ly->nops; i++) {
    const ir_op *op = &m->ops[i];
    const char *name = m->values[op->result].name;
    if (op->code == IR_PARAM && name && strncmp(name, ly->name, n) == 0 && name[n] == '.' &&
        strcmp(name + n + 1, suffix) == 0)
      return op->result;
  }
  return -1;
}

static int32_t last_op(const ir_module *m, const ir_layer *ly, ir_opcode code) {
  int32_t last = -1;
  for (int32_t i = ly->first_op; i < ly->first_op + ly->nops; i++)
    if (m->ops[i].code == code) last = i;
  return last;
}

static int32_t layer_input_value(const ir_module *m, const ir_layer *ly) {
  for (int32_t i = ly->first_op; i < ly->first_op + ly->nops; i++) {
    const ir_op *op = &m->ops[i];
    for (int a = 0; a < op->nargs; a++) {
      int32_t v = op->args[a];
      if (m->values[v].def < ly->first_op && m->ops[m->values[v].def].code != IR_PARAM) return v;
    }
  }
  return -1;
}

static bool is_source(const ir_module *m, int32_t v) {
  ir_opcode c = m->ops[m->values[v].def].code;
  if (c == IR_INPUT || c == IR_PARAM || c == IR_CONST) return true;
  return c == IR_SLICE && m->ops[m->values[m->ops[m->values[v].def].args[0]].def].code == IR_PARAM;
}

static bool model_error(const ir_module *m, ntp_loc loc, char *err, size_t cap, const char *msg) {
  if (loc.first_line > 0)
    snprintf(err, cap, "%s:%d:%d: error: %s", m->file ? m->file : "<model>", loc.first_line, loc.first_column, msg);
  else
    snprintf(err, cap, "%s: error: %s", m->file ? m->file : "<model>", msg);
  return false;
}

static bool home_eq(home a, home b) {
  return a.kind == b.kind && (a.kind != H_LAYER || (a.layer == b.layer && a.cols == b.cols && a.seq == b.seq));
}

static bool read_chain_layer(const ir_module *m, int32_t l, chain_layer *c, char *err, size_t cap) {
  const ir_layer *ly = &m->layers[l];
  char msg[300];
  *c = (chain_layer){.ir = l, .kind = ly->kind};
  c->x = layer_input_value(m, ly);
  int32_t end = last_op(m, ly, ly->kind == LAYER_EMBEDDING ? IR_GATHER : IR_MATMUL);
  if (c->x < 0 || end < 0) {
    snprintf(msg, sizeof msg, "layer '%s' has no recognisable core", ly->name);
    return model_error(m, ly->loc, err, cap, msg);
  }
  c->xs = m->values[c->x].shape;
  c->out = m->values[m->ops[end].result].shape;
  c->dt = m->values[m->ops[end].result].dtype;
  c->rows = c->xs.ndim ? c->xs.dim[0] : 1;
  c->T = 1;
  int tlast = ly->kind == LAYER_EMBEDDING ? c->xs.ndim : c->xs.ndim - 1;
  for (int d = 1; d < tlast; d++) c->T *= c->xs.dim[d];
  c->reduces = ly->kind != LAYER_LINEAR;
  switch (ly->kind) {
  case LAYER_EMBEDDING: {
    int32_t w = find_param(m, ly, "wte");
    if (w < 0) return model_error(m, ly->loc, err, cap, "embedding without its table");
    c->V = m->values[w].shape.dim[0];
    c->Dm = m->values[w].shape.dim[1];
    c->wdt = m->values[w].dtype;
    c->units = c->V;
    c->unit_name = "vocabulary rows";
    break;
  }
  case LAYER_LINEAR: {
    int32_t w = m->ops[end].args[1];
    c->N = m->values[w].shape.dim[0];
    c->K = m->values[w].shape.dim[1];
    c->wdt = m->values[w].dtype;
    c->units = c->N;
    c->unit_name = "output columns";
    break;
  }
  case LAYER_ATTENTION: {
    int32_t att = last_op(m, ly, IR_ATTENTION);
    int32_t wq = find_param(m, ly, "wq"), wo = find_param(m, ly, "wo");
    if (att < 0 || wq < 0 || wo < 0) return model_error(m, ly->loc, err, cap, "attention without its projections");
    const ntp_shape qs = m->values[m->ops[att].args[0]].shape, ks = m->values[m->ops[att].args[1]].shape;
    c->H = qs.dim[2];
    c->KV = ks.dim[2];
    c->HD = qs.dim[3];
    c->S = qs.dim[1];
    c->Din = m->values[wq].shape.dim[1];
    c->Dout = m->values[wo].shape.dim[0];
    c->wdt = m->values[wq].dtype;
    c->qkv_bias = find_param(m, ly, "bq") >= 0;
    c->rope = last_op(m, ly, IR_ROPE) >= 0;
    c->causal = m->ops[att].attr.attn.causal;
    c->units = c->H;
    c->unit_name = "heads";
    break;
  }
  case LAYER_MLP: {
    int32_t up = find_param(m, ly, "w_up"), down = find_param(m, ly, "w_down");
    if (up < 0 || down < 0) return model_error(m, ly->loc, err, cap, "mlp without its projections");
    c->F = m->values[up].shape.dim[0];
    c->Din = m->values[up].shape.dim[1];
    c->Dout = m->values[down].shape.dim[0];
    c->wdt = m->values[up].dtype;
    c->gated = find_param(m, ly, "w_gate") >= 0;
    c->up_bias = find_param(m, ly, "b_up") >= 0;
    c->units = c->F;
    c->unit_name = "hidden columns";
    break;
  }
  default: break;
  }
  return true;
}

/* The box of operand shape `os` that a result box needs, broadcasting undone (shard.c's project). */
static ntp_box project(ntp_box rb, ntp_shape os) {
  ntp_box b = {.ndim = os.ndim};
  for (int i = 0; i < os.ndim; i++) {
    int r = rb.ndim - os.ndim + i;
    if (os.dim[i] == 1 || r < 0) {
      b.lo[i] = 0;
      b.hi[i] = os.dim[i];
    } else {
      b.lo[i] = rb.lo[r];
      b.hi[i] = rb.hi[r];
    }
  }
  return b;
}

typedef struct builder {
  plan_model *pm;
  const ir_module *m;
  home *home_of; /* per value */
  int32_t *chain_of;
  char *err;
  size_t cap;
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
  model_error(B->m, loc, B->err, B->cap, msg);
  B->failed = true;
  return false;
}

static void add_move(builder *B, home src, home at, ntp_shape vs, ntp_shape rs, int8_t xf, ntp_dtype dt, int32_t op,
                     ntp_loc loc) {
  if (!check_pair(B, src, at, op, loc)) return;
  if (home_eq(src, at) && xf == XF_SAME && shape_eq(&vs, &rs)) return; /* already where it is needed */
  move mv = {src, at, vs, rs, xf, dt, op};
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
    else add_move(B, B->home_of[v], at, m->values[v].shape, rs, xf, m->values[v].dtype, (int32_t)(op - m->ops), op->loc);
  }
  VEC_PUSH(B->pm->fops, B->pm->nfops, B->pm->cfops, f);
  B->home_of[r] = at;
}

plan_model *plan_model_new(const ir_module *m, char *err, size_t cap) {
  if (cap) err[0] = 0;
  plan_model *pm = calloc(1, sizeof *pm);
  if (!pm) {
    snprintf(err, cap, "out of memory");
    return NULL;
  }
  pm->m = m;
  for (size_t v = 0; v < m->n_values; v++)
    if (m->values[v].layout.mesh >= 0) {
      model_error(m, m->ops[m->values[v].def].loc, err, cap,
                  "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      plan_model_free(pm);
      return NULL;
    }
  for (size_t o = 0; o < m->n_outputs; o++)
    if (m->outputs[o].has_layout) {
      model_error(m, m->outputs[o].loc, err, cap, "explicit layouts are not planned: the planner chooses the TP degrees of layers");
      plan_model_free(pm);
      return NULL;
    }
  builder B = {.pm = pm, .m = m, .err = err, .cap = cap};
  B.home_of = calloc(m->n_values + 1, sizeof *B.home_of);
  B.chain_of = malloc((m->n_layers + 1) * sizeof *B.chain_of);
  pm->L = calloc(m->n_layers + 1, sizeof *pm->L);
  if (!B.home_of || !B.chain_of || !pm->L) {
    snprintf(err, cap, "out of memory");
    B.failed = true;
  }
  for (size_t l = 0; !B.failed && l < m->n_layers; l++) {
    B.chain_of[l] = -1;
    if (!sharded_kind(m->layers[l].kind)) continue;
    if (!read_chain_layer(m, (int32_t)l, &pm->L[pm->n], err, cap)) B.failed = true;
    B.chain_of[l] = pm->n++;
  }
  if (!B.failed && pm->n == 0) {
    char msg[256];
    snprintf(msg, sizeof msg, "model '%s' has no layer with a TP degree (embedding, linear, attention, mlp): nothing to plan",
             m->name);
    model_error(m, NTP_NOLOC, err, cap, msg);
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
      else add_move(&B, B.home_of[c->x], at, c->xs, c->xs, XF_SAME, m->values[c->x].dtype, -1, ly->loc);
      int32_t end = last_op(m, ly, ly->kind == LAYER_EMBEDDING ? IR_GATHER : IR_MATMUL);
      B.home_of[m->ops[end].result] = (home){.kind = H_LAYER, .layer = ci, .cols = ly->kind == LAYER_LINEAR,
                                             .seq = ly->kind != LAYER_LINEAR};
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
          model_error(m, op->loc, err, cap, "this operation reads a value inside a layer; the planner cannot place it");
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
  }
  free(B.home_of);
  free(B.chain_of);
  if (B.failed) {
    plan_model_free(pm);
    return NULL;
  }
  return pm;
}
