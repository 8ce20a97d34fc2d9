/* cpu_sim.c — the multi-rank CPU simulation: every rank of a sharded program in one
 * process. Each rank's tensors live in its own arena at the offsets of the memory plan
 * (so a wrong plan corrupts results and fails the equivalence tests), collectives are
 * done in memory with NCCL's semantics (reductions sum in fp32, then round). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cpu_threads.h"
#include "ntprt.h"

typedef struct rank_mem {
  unsigned char *arena, *persist;
} rank_mem;

/* The simulator holds every element in 4 bytes (fp32 math, rounded values) while the plan
 * counts real dtype sizes (2 bytes for bf16 / fp16): doubling every offset keeps the
 * plan's non-overlap, so the plan is exercised as it is. */
enum { SIM_SCALE = 2 };

static void *tensor_data(const ntp_program *p, rank_mem *rm, int32_t t) {
  const ntp_tensor *s = &p->tensors[t];
  return (s->persistent ? rm[s->rank].persist : rm[s->rank].arena) + SIM_SCALE * s->offset;
}

static ntp_host_tensor view(const ntp_program *p, rank_mem *rm, int32_t t) {
  const ntp_tensor *s = &p->tensors[t];
  ntp_host_tensor h = {.name = s->name, .dtype = s->dtype, .shape = box_shape(&s->box)};
  if (s->dtype == NTP_I32) h.i = tensor_data(p, rm, t);
  else h.f = tensor_data(p, rm, t);
  return h;
}

/* Calls fn(dst_off, src_off, run) for every contiguous run of `box` (global coordinates)
 * inside a tensor holding `dbox` and one holding `sbox`; offsets are in elements. */
static void for_runs(const ntp_box *box, const ntp_box *sbox, const ntp_box *dbox,
                     void (*fn)(void *ctx, int64_t d, int64_t s, int64_t n), void *ctx) {
  int nd = box->ndim;
  if (nd == 0) {
    fn(ctx, 0, 0, 1);
    return;
  }
  int64_t sst[NTP_MAX_RANK], dst[NTP_MAX_RANK], idx[NTP_MAX_RANK] = {0};
  for (int d = nd - 1, ss = 1, ds = 1; d >= 0; d--) {
    sst[d] = ss;
    dst[d] = ds;
    ss *= (int)(sbox->hi[d] - sbox->lo[d]);
    ds *= (int)(dbox->hi[d] - dbox->lo[d]);
  }
  int64_t run = box->hi[nd - 1] - box->lo[nd - 1];
  for (;;) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < nd; d++) {
      int64_t g = box->lo[d] + (d == nd - 1 ? 0 : idx[d]);
      so += (g - sbox->lo[d]) * sst[d];
      doff += (g - dbox->lo[d]) * dst[d];
    }
    fn(ctx, doff, so, run);
    int d = nd - 2;
    while (d >= 0 && ++idx[d] >= box->hi[d] - box->lo[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

typedef struct copy_ctx {
  unsigned char *dst;
  const unsigned char *src;
} copy_ctx;

static void copy_run(void *c, int64_t d, int64_t s, int64_t n) {
  copy_ctx *cc = c;
  memcpy(cc->dst + d * 4, cc->src + s * 4, (size_t)n * 4); /* every dtype is held in 4-byte elements */
}

typedef struct add_ctx {
  float *acc;
  const float *src;
} add_ctx;

static void add_run(void *c, int64_t d, int64_t s, int64_t n) {
  add_ctx *ac = c;
  for (int64_t i = 0; i < n; i++) ac->acc[d + i] += ac->src[s + i];
}

static ntp_round_mode round_mode(ntp_dtype dt) {
  return dt == NTP_BF16 ? NTP_ROUND_BF16 : dt == NTP_FP16 ? NTP_ROUND_FP16 : NTP_ROUND_NONE;
}

static int run_comm(const ntp_program *p, rank_mem *rm, const ntp_step *st, char *err, size_t cap) {
  bool reduce = st->comm == COMM_ALL_REDUCE || st->comm == COMM_REDUCE_SCATTER;
  if (!reduce) {
    /* copies read sources before any destination is written: destinations are new tensors */
    for (size_t i = 0; i < st->nxfers; i++) {
      const ntp_xfer *x = &st->xfers[i];
      copy_ctx cc = {tensor_data(p, rm, x->dst), tensor_data(p, rm, x->src)};
      for_runs(&x->box, &p->tensors[x->src].box, &p->tensors[x->dst].box, copy_run, &cc);
    }
    return 0;
  }
  /* each destination: the sum of its sources in participant order, in fp32, then rounded */
  bool *done = calloc(st->nxfers, 1);
  for (size_t i = 0; i < st->nxfers; i++) {
    if (done[i]) continue;
    int32_t dt = st->xfers[i].dst;
    const ntp_tensor *d = &p->tensors[dt];
    int64_t n = box_volume(&d->box);
    float *acc = calloc((size_t)(n ? n : 1), sizeof *acc);
    if (!acc) {
      snprintf(err, cap, "out of memory in a reduction");
      free(done);
      return -1;
    }
    for (size_t j = i; j < st->nxfers; j++) {
      if (st->xfers[j].dst != dt) continue;
      done[j] = 1;
      add_ctx ac = {acc, tensor_data(p, rm, st->xfers[j].src)};
      for_runs(&st->xfers[j].box, &p->tensors[st->xfers[j].src].box, &d->box, add_run, &ac);
    }
    ntp_round_buf(acc, (size_t)n, round_mode(d->dtype));
    memcpy(tensor_data(p, rm, dt), acc, (size_t)n * sizeof *acc);
    free(acc);
  }
  free(done);
  return 0;
}

/* Assembles global value v from its pieces (any piece serves; all hold equal data). */
static int assemble(const ntp_program *p, rank_mem *rm, int32_t v, const char *name, ntp_host_tensor *out, char *err,
                    size_t cap) {
  const ntp_value *gv = &p->global.values[v];
  int64_t n = shape_numel(&gv->shape);
  *out = (ntp_host_tensor){.name = name, .dtype = gv->dtype, .shape = gv->shape};
  void *buf = calloc((size_t)(n ? n : 1), 4);
  unsigned char *seen = calloc((size_t)(n ? n : 1), 1);
  if (!buf || !seen) {
    free(buf);
    free(seen);
    snprintf(err, cap, "out of memory");
    return -1;
  }
  if (gv->dtype == NTP_I32) out->i = buf;
  else out->f = buf;
  ntp_box full = box_full(&gv->shape);
  for (size_t k = 0; k < p->npieces[v]; k++) {
    int32_t t = p->pieces[v][k];
    const ntp_tensor *s = &p->tensors[t];
    if (s->def < 0) continue;
    copy_ctx cc = {buf, tensor_data(p, rm, t)};
    for_runs(&s->box, &s->box, &full, copy_run, &cc);
    /* mark coverage */
    int64_t idx[NTP_MAX_RANK] = {0}, vol = box_volume(&s->box);
    for (int64_t e = 0; e < vol; e++) {
      int64_t g = 0;
      for (int d = 0; d < full.ndim; d++) g = g * full.hi[d] + s->box.lo[d] + idx[d];
      seen[g] = 1;
      for (int d = full.ndim - 1; d >= 0; d--) {
        if (++idx[d] < s->box.hi[d] - s->box.lo[d]) break;
        idx[d] = 0;
      }
    }
  }
  for (int64_t e = 0; e < n; e++)
    if (!seen[e]) {
      snprintf(err, cap, "output %s: element %lld is held by no rank", name, (long long)e);
      free(seen);
      return -1;
    }
  free(seen);
  return 0;
}

struct ntp_sim {
  const ntp_program *p;
  rank_mem *rm;
  bool *filled; /* per tensor: a persistent slice already holds data (set or loaded) */
  double *step_seconds; /* ntp_sim_time_steps: each step's time, measured alone */
};

void ntp_sim_time_steps(ntp_sim *st, double *seconds) { st->step_seconds = seconds; }

void ntp_sim_free(ntp_sim *st) {
  if (!st) return;
  for (int r = 0; st->rm && r < st->p->world; r++) {
    free(st->rm[r].arena);
    free(st->rm[r].persist);
  }
  free(st->rm);
  free(st->filled);
  free(st);
}

int ntp_sim_new(const ntp_program *p, ntp_sim **out, char *err, size_t cap) {
  ntp_sim *st = calloc(1, sizeof *st);
  *out = NULL;
  if (!st) return -1;
  st->p = p;
  st->rm = calloc((size_t)p->world, sizeof *st->rm);
  st->filled = calloc(p->n_tensors + 1, sizeof *st->filled);
  if (!st->rm || !st->filled) goto oom;
  for (int r = 0; r < p->world; r++) {
    st->rm[r].arena = malloc(SIM_SCALE * (size_t)p->mem[r].arena_bytes + 1);
    st->rm[r].persist = malloc(SIM_SCALE * (size_t)(p->mem[r].param_bytes + p->mem[r].input_bytes) + 1);
    if (!st->rm[r].arena || !st->rm[r].persist) goto oom;
    /* poison: a tensor read before it is written shows up as NaN, not as a lucky zero */
    memset(st->rm[r].arena, 0xff, SIM_SCALE * (size_t)p->mem[r].arena_bytes + 1);
  }
  *out = st;
  return 0;
oom:
  snprintf(err, cap, "out of memory for the simulated ranks");
  ntp_sim_free(st);
  return -1;
}

/* Every slice of global value v, on every rank, from the global tensor g. */
float *ntp_sim_tensor(ntp_sim *st, int32_t t) {
  if (st->p->tensors[t].persistent) st->filled[t] = true;
  return tensor_data(st->p, st->rm, t);
}

int ntp_sim_set(ntp_sim *st, int32_t v, const ntp_host_tensor *g, char *err, size_t cap) {
  const ntp_program *p = st->p;
  ntp_box full = box_full(&p->global.values[v].shape);
  if (!shape_eq(&g->shape, &p->global.values[v].shape)) {
    snprintf(err, cap, "%s: shape does not match", p->global.values[v].name);
    return -1;
  }
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || s->init_value != v) continue;
    copy_ctx cc = {tensor_data(p, st->rm, (int32_t)t), g->f ? (void *)g->f : (void *)g->i};
    for_runs(&s->init_box, &full, &s->init_box, copy_run, &cc);
    st->filled[t] = true;
  }
  return 0;
}

int ntp_sim_load(ntp_sim *st, const ntp_safetensors *f, char *err, size_t cap) {
  const ntp_program *p = st->p;
  for (size_t t = 0; t < p->n_tensors; t++) {
    const ntp_tensor *s = &p->tensors[t];
    if (!s->persistent || p->global.ops[p->global.values[s->init_value].def].code != IR_PARAM) continue;
    ntp_host_tensor h = view(p, st->rm, (int32_t)t);
    const ntp_value *gv = &p->global.values[s->init_value];
    if (ntp_safetensors_read_box(f, gv->name, gv->dtype, &gv->shape, &s->init_box, h.f, err, cap) != 0) return -1;
    st->filled[t] = true;
  }
  return 0;
}

/* Ranks in parallel only for segments of this much work (ntp_op_cost units: about one per
 * element or multiply-add; some milliseconds): a parallel region of rank threads costs far more
 * than a kernel's when the machine is busy, and the tests run thousands of toy segments (see
 * NTP_CPU_PAR_MIN). */
#define SIM_PAR_MIN (16.0 * NTP_CPU_PAR_MIN)

static double step_cost(const ntp_program *p, const ntp_step *step) {
  if (step->kind == SH_COMM) return (double)step->elems;
  ntp_shape out = box_shape(&p->tensors[step->op.result].box), a;
  if (step->op.nargs) a = box_shape(&p->tensors[step->op.args[0]].box);
  return ntp_op_cost(&step->op, &out, step->op.nargs ? &a : NULL);
}

static const char *layer_name(const ntp_program *p, int32_t layer) {
  return layer >= 0 && (size_t)layer < p->global.n_layers ? p->global.layers[layer] : NULL;
}

static bool is_init(const ntp_step *step) { return step->op.code == IR_INPUT || step->op.code == IR_PARAM; }

/* An init step whose slice lives outside the arena: nothing else can overwrite it or be
 * overwritten by it, so it may run before the forward (ntp_sim_forward). */
static bool early_init(const ntp_program *p, const ntp_step *step) {
  return step->kind == SH_COMPUTE && is_init(step) && p->tensors[step->op.result].persistent;
}

/* One compute step on its rank's memory (an init step cannot fail). */
static int run_compute(ntp_sim *st, const ntp_step *step, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = st->p;
  ntp_host_tensor out = view(p, st->rm, step->op.result);
  const ntp_tensor *t = &p->tensors[step->op.result];
  if (is_init(step)) {
    /* set or loaded slices stay; the rest are generated (the default initialisation) */
    if (!st->filled[step->op.result]) ntp_init_slice(&p->global, t->init_value, &t->init_box, seed, &out);
    return 0;
  }
  ntp_host_tensor args[NTP_MAX_ARGS];
  const ntp_host_tensor *argp[NTP_MAX_ARGS];
  for (int a = 0; a < step->op.nargs; a++) {
    args[a] = view(p, st->rm, step->op.args[a]);
    argp[a] = &args[a];
  }
  return ntp_exec_op(&step->op, &out, argp, err, cap);
}

/* Steps [s, e), all compute. Between two collectives the ranks share nothing: every step
 * reads and writes tensors of its own rank only, each rank's steps keep their order, and
 * ranks are independent. So when two or more ranks have work the ranks run in parallel,
 * one thread each at a time, with every kernel (and the BLAS) single-threaded inside; a
 * segment with one rank's work runs in order with threaded kernels instead. The results
 * are the same either way: no kernel's result depends on its thread count. */
static int run_segment(ntp_sim *st, size_t s, size_t e, uint64_t seed, char *err, size_t cap) {
  const ntp_program *p = st->p;
  int32_t first = -1;
  bool several = false, own = true;
  for (size_t i = s; i < e; i++) {
    const ntp_step *step = &p->steps[i];
    if (early_init(p, step)) continue; /* done before the forward */
    if (first < 0) first = step->rank;
    several |= step->rank != first;
    own &= p->tensors[step->op.result].rank == step->rank;
    for (int a = 0; a < step->op.nargs; a++) own &= p->tensors[step->op.args[a]].rank == step->rank;
  }
  /* threads only when the segment outweighs waking them: tests run thousands of toy segments */
  double cost = 0;
  for (size_t i = s; i < e && cost < SIM_PAR_MIN; i++) cost += step_cost(p, &p->steps[i]);
  if (!several || !own || cost < SIM_PAR_MIN) { /* !own: not a program this reasoning covers; run it as written */
    for (size_t i = s; i < e; i++)
      if (!early_init(p, &p->steps[i]) && run_compute(st, &p->steps[i], seed, err, cap) != 0) return -1;
    return 0;
  }
  size_t bad = e; /* the first failing step, so the message is the one a serial run gives */
#pragma omp parallel for schedule(dynamic, 1)
  for (int32_t r = 0; r < p->world; r++) {
    char msg[256];
    for (size_t i = s; i < e; i++) {
      if (p->steps[i].rank != r || early_init(p, &p->steps[i])) continue;
      if (run_compute(st, &p->steps[i], seed, msg, sizeof msg) != 0) {
#pragma omp critical(ntp_sim_error)
        if (i < bad) {
          bad = i;
          snprintf(err, cap, "%s", msg);
        }
        break;
      }
    }
  }
  return bad < e ? -1 : 0;
}

int ntp_sim_get(ntp_sim *st, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t cap) {
  const ntp_program *p = st->p;
  const ntp_value *gv = &p->global.values[v];
  /* slices neither set nor loaded get their default initialisation first, as a forward with
   * this seed gives them (deterministic: the forward would write the same values) */
  for (size_t k = 0; k < p->n_steps; k++) {
    const ntp_step *step = &p->steps[k];
    if (step->kind == SH_COMM || !is_init(step) || p->tensors[step->op.result].init_value != v) continue;
    if (run_compute(st, step, seed, err, cap) != 0) return -1;
  }
  int64_t n = shape_numel(&gv->shape);
  *out = (ntp_host_tensor){.name = gv->name, .dtype = gv->dtype, .shape = gv->shape};
  void *buf = calloc((size_t)(n ? n : 1), 4);
  if (!buf) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  if (gv->dtype == NTP_I32) out->i = buf;
  else out->f = buf;
  ntp_box full = box_full(&gv->shape);
  for (size_t t = 0; t < p->n_tensors; t++) { /* every element is held by some rank's slice */
    const ntp_tensor *sl = &p->tensors[t];
    if (!sl->persistent || sl->init_value != v) continue;
    copy_ctx cc = {buf, tensor_data(p, st->rm, (int32_t)t)};
    for_runs(&sl->init_box, &sl->init_box, &full, copy_run, &cc);
  }
  return 0;
}

int ntp_sim_forward(ntp_sim *st, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  const ntp_program *p = st->p;
  rank_mem *rm = st->rm;
  *res = (ntp_cpu_result){0};
  double total = 0, done = 0;
  for (size_t s = 0; s < p->n_steps; s++) total += step_cost(p, &p->steps[s]);
  char stage[64];
  snprintf(stage, sizeof stage, "simulating %d ranks", p->world);
  ntp_progress prog;
  ntp_progress_begin(&prog, stage, total, (int32_t)p->global.n_layers);
  /* The initialisation first, outside the timed forward (as ntp_cpu_run times it): an input
   * or parameter step only writes its own persistent slice, which nothing but later steps
   * reads, so running them all before the rest changes nothing else. They are independent of
   * each other, hence one parallel loop over all of them. */
  double init_cost = 0;
  for (size_t s = 0; s < p->n_steps; s++)
    if (early_init(p, &p->steps[s])) init_cost += step_cost(p, &p->steps[s]);
#pragma omp parallel for schedule(dynamic, 1) if (init_cost >= SIM_PAR_MIN)
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *step = &p->steps[s];
    if (!early_init(p, step)) continue;
    run_compute(st, step, seed, NULL, 0);
    double c = step_cost(p, step), so_far;
#pragma omp atomic capture
    so_far = done += c;
    /* the line is drawn by one thread only, so its state needs no lock */
    if (omp_get_thread_num() == 0) ntp_progress_update(&prog, so_far, step->layer, layer_name(p, step->layer));
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = 0;
  for (size_t s = 0; s < p->n_steps && rc == 0;) {
    const ntp_step *step = &p->steps[s];
    ntp_progress_update(&prog, done, step->layer, layer_name(p, step->layer));
    size_t e = s + 1;
    struct timespec a, b;
    if (st->step_seconds) clock_gettime(CLOCK_MONOTONIC, &a);
    if (step->kind == SH_COMM) rc = run_comm(p, rm, step, err, cap);
    else {
      while (!st->step_seconds && e < p->n_steps && p->steps[e].kind != SH_COMM) e++;
      rc = run_segment(st, s, e, seed, err, cap);
    }
    if (st->step_seconds) { /* one step at a time: what it costs alone */
      clock_gettime(CLOCK_MONOTONIC, &b);
      st->step_seconds[s] = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    }
    for (; s < e; s++)
      if (!early_init(p, &p->steps[s])) done += step_cost(p, &p->steps[s]);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  ntp_progress_end(&prog);
  if (rc != 0) return -1;
  res->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  const ntp_module *m = &p->global;
  res->outputs = calloc(m->n_outputs + 1, sizeof *res->outputs);
  if (!res->outputs) return -1;
  for (size_t o = 0; o < m->n_outputs; o++) {
    if (assemble(p, rm, m->outputs[o].value, m->outputs[o].name, &res->outputs[o], err, cap) != 0) {
      ntp_cpu_result_free(res);
      return -1;
    }
    res->n_outputs++;
  }
  return 0;
}

int ntp_sim_run(const ntp_program *p, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  ntp_sim *st;
  *res = (ntp_cpu_result){0};
  if (ntp_sim_new(p, &st, err, cap) != 0) return -1;
  int rc = ntp_sim_forward(st, seed, res, err, cap);
  ntp_sim_free(st);
  return rc;
}

double ntp_max_rel_error(const ntp_host_tensor *a, const ntp_host_tensor *ref) { return ntp_max_rel_error_floor(a, ref, 0); }

double ntp_max_abs(const ntp_host_tensor *t) {
  double m = 0;
  for (int64_t i = 0, n = shape_numel(&t->shape); i < n; i++) m = fmax(m, fabs(t->f ? (double)t->f[i] : (double)t->i[i]));
  return m;
}

double ntp_max_rel_error_floor(const ntp_host_tensor *a, const ntp_host_tensor *ref, double floor) {
  int64_t n = shape_numel(&ref->shape);
  double maxref = 0, maxdiff = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = a->f ? a->f[i] : a->i[i], y = ref->f ? ref->f[i] : ref->i[i];
    if (isnan(x) != isnan(y)) return INFINITY;
    if (isnan(x)) continue;
    if (fabs(y) > maxref) maxref = fabs(y);
    if (fabs(x - y) > maxdiff) maxdiff = fabs(x - y);
  }
  if (maxref < floor) maxref = floor;
  return maxref > 0 ? maxdiff / maxref : maxdiff;
}
