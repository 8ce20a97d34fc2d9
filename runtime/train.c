/* train.c — AdamW training (ntp_train.h): every step runs the module's forward and backward
 * ops with the current parameters (on the CPU reference, every rank of a sharded program in
 * the simulation, or every rank on the CUDA backend), clips the gradients by their global
 * norm, and updates fp32 master weights with AdamW (bias-corrected moments, decoupled weight
 * decay on matrices and embeddings); the module then runs with the masters rounded to its
 * dtype, as mixed-precision training does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cuda_backend.h"
#include "ntp_train.h"

void ntp_adamw_defaults(ntp_adamw *o) {
  *o = (ntp_adamw){.lr = 1e-3, .min_lr_frac = 0.1, .warmup = 0, .steps = 1, .beta1 = 0.9, .beta2 = 0.95,
                   .eps = 1e-8, .weight_decay = 0.1, .clip = 1.0};
}

/* linear warmup, then a cosine from lr to lr * min_lr_frac over the remaining steps */
double ntp_adamw_lr(const ntp_adamw *o, int64_t step) {
  if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
  double lo = o->lr * o->min_lr_frac;
  int64_t span = o->steps - o->warmup;
  if (span <= 1) return o->lr;
  double ratio = (double)(step - o->warmup) / (double)(span - 1);
  if (ratio > 1) ratio = 1;
  return lo + 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) * (o->lr - lo);
}

typedef struct tparam {
  int32_t value;       /* in the module */
  int32_t grad_output; /* the output holding its gradient; -1: none (it does not affect the loss) */
  ntp_host_tensor cur; /* the master rounded to the module's dtype: what the module runs with */
  float *master, *m, *v;
  int64_t n;
  bool decay;
} tparam;

struct ntp_trainer {
  const ntp_module *mod;
  ntp_sim *sim;   /* a sharded program: every rank simulated */
  ntp_cuda *cuda; /* or every rank on the CUDA backend; neither: the CPU reference */
  ntp_adamw o;
  uint64_t seed;
  tparam *p;
  size_t np;
  int32_t loss_output;
  int64_t step;
  const ntp_host_tensor **given; /* [n_values] */
  ntp_host_tensor *cur;          /* [np]: the cur tensors, contiguous (ntp_trainer_params) */
  ntp_cpu_result last;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ntp_round_mode mode_of(ntp_dtype dt) {
  return dt == NTP_BF16 ? NTP_ROUND_BF16 : dt == NTP_FP16 ? NTP_ROUND_FP16 : NTP_ROUND_NONE;
}

void ntp_trainer_free(ntp_trainer *t) {
  if (!t) return;
  for (size_t i = 0; i < t->np; i++) {
    free(t->p[i].master);
    free(t->p[i].m);
    free(t->p[i].v);
    free(t->p[i].cur.f);
  }
  free(t->p);
  free(t->cur);
  free(t->given);
  ntp_cpu_result_free(&t->last);
  ntp_sim_free(t->sim);
  ntp_cuda_free(t->cuda);
  free(t);
}

int ntp_trainer_new(const ntp_program *prog, const ntp_adamw *o, uint64_t seed, const ntp_safetensors *params,
                    ntp_trainer **out, char *err, size_t cap) {
  return ntp_trainer_new_cuda(prog, o, seed, params, NULL, out, err, cap);
}

int ntp_trainer_new_cuda(const ntp_program *prog, const ntp_adamw *o, uint64_t seed, const ntp_safetensors *params,
                         const ntp_cuda_options *co, ntp_trainer **out, char *err, size_t cap) {
  *out = NULL;
  const ntp_module *m = &prog->global;
  ntp_trainer *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->mod = m;
  if (co ? ntp_cuda_create(prog, co, &t->cuda, err, cap) != 0
         : prog->world > 0 && ntp_sim_new(prog, &t->sim, err, cap) != 0) {
    ntp_trainer_free(t);
    return -1;
  }
  t->o = *o;
  t->seed = seed;
  t->loss_output = -1;
  for (size_t k = 0; k < m->n_outputs; k++) {
    const ntp_value *v = &m->values[m->outputs[k].value];
    if (v->shape.ndim == 0 && strncmp(m->outputs[k].name, "grad.", 5) != 0 &&
        (t->loss_output < 0 || strcmp(m->outputs[k].name, "loss") == 0))
      t->loss_output = (int32_t)k;
  }
  if (t->loss_output < 0) {
    snprintf(err, cap, "the model has no scalar loss output to train");
    ntp_trainer_free(t);
    return -1;
  }
  size_t cap_p = 0;
  for (size_t i = 0; i < m->n_ops; i++) cap_p += m->ops[i].code == IR_PARAM;
  t->p = calloc(cap_p + 1, sizeof *t->p);
  t->cur = calloc(cap_p + 1, sizeof *t->cur);
  t->given = calloc(m->n_values + 1, sizeof *t->given);
  if (!t->p || !t->cur || !t->given) goto oom;
  for (size_t i = 0; i < m->n_ops; i++) {
    if (m->ops[i].code != IR_PARAM) continue;
    int32_t v = m->ops[i].result;
    const ntp_value *val = &m->values[v];
    tparam *p = &t->p[t->np++];
    p->value = v;
    p->n = shape_numel(&val->shape);
    p->decay = val->shape.ndim >= 2;
    p->grad_output = -1;
    char gname[512];
    snprintf(gname, sizeof gname, "grad.%s", val->name);
    for (size_t k = 0; k < m->n_outputs; k++)
      if (strcmp(m->outputs[k].name, gname) == 0) p->grad_output = (int32_t)k;
    size_t bytes = (size_t)(p->n ? p->n : 1) * sizeof(float);
    p->master = malloc(bytes);
    p->m = calloc(1, bytes);
    p->v = calloc(1, bytes);
    p->cur = (ntp_host_tensor){.name = val->name, .dtype = val->dtype, .shape = val->shape, .f = malloc(bytes)};
    if (!p->master || !p->m || !p->v || !p->cur.f) goto oom;
    if (params) {
      ntp_box full = box_full(&val->shape);
      if (ntp_safetensors_read_box(params, val->name, val->dtype, &val->shape, &full, p->master, err, cap) != 0) {
        ntp_trainer_free(t);
        return -1;
      }
    } else {
      ntp_host_tensor h = p->cur;
      h.f = p->master;
      ntp_init_tensor(m, v, seed, &h);
    }
    memcpy(p->cur.f, p->master, bytes);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(val->dtype));
  }
  for (size_t i = 0; i < t->np; i++) t->cur[i] = t->p[i].cur;
  *out = t;
  return 0;
oom:
  snprintf(err, cap, "out of memory for the trainer's state");
  ntp_trainer_free(t);
  return -1;
}

/* The step on the simulation or the CUDA backend: every given input and parameter set on the
 * ranks that hold its slices, every rank's forward and backward run; with keep, the inputs and
 * parameters it ran with copied beside its outputs (as the CPU reference's keep_all gives them). */
static int ranks_run(ntp_trainer *t, int keep, char *err, size_t cap) {
  const ntp_module *m = t->mod;
  for (size_t v = 0; v < m->n_values; v++)
    if (t->given[v] && (t->cuda ? ntp_cuda_set(t->cuda, (int32_t)v, t->given[v], err, cap)
                                : ntp_sim_set(t->sim, (int32_t)v, t->given[v], err, cap)) != 0)
      return -1;
  if ((t->cuda ? ntp_cuda_forward(t->cuda, t->seed, &t->last, err, cap)
               : ntp_sim_forward(t->sim, t->seed, &t->last, err, cap)) != 0)
    return -1;
  if (!keep) return 0;
  ntp_cpu_result *r = &t->last;
  r->inputs = calloc(m->n_ops + 1, sizeof *r->inputs);
  r->params = calloc(m->n_ops + 1, sizeof *r->params);
  if (!r->inputs || !r->params) goto oom;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    const ntp_host_tensor *g = t->given[op->result];
    if (!g || (op->code != IR_INPUT && op->code != IR_PARAM)) continue;
    ntp_host_tensor *dst = op->code == IR_INPUT ? &r->inputs[r->n_inputs] : &r->params[r->n_params];
    if (!ntp_host_tensor_copy(g, m->values[op->result].name, dst)) goto oom;
    if (op->code == IR_INPUT) r->n_inputs++;
    else r->n_params++;
  }
  return 0;
oom:
  snprintf(err, cap, "out of memory");
  return -1;
}

/* The run's given values: the caller's inputs, and every parameter as the program runs with it. */
static void fill_given(ntp_trainer *t, const ntp_host_tensor *const *given) {
  for (size_t v = 0; v < t->mod->n_values; v++) t->given[v] = given ? given[v] : NULL;
  for (size_t i = 0; i < t->np; i++) t->given[t->p[i].value] = &t->p[i].cur;
}

int ntp_trainer_step(ntp_trainer *t, const ntp_host_tensor *const *given, int keep, ntp_train_stats *st, char *err,
                     size_t cap) {
  const ntp_module *m = t->mod;
  double t0 = now_s();
  fill_given(t, given);
  ntp_cpu_result_free(&t->last);
  if (t->sim || t->cuda) {
    if (ranks_run(t, keep, err, cap) != 0) return -1;
  } else if (ntp_cpu_run_given(m, t->seed, keep, NULL, t->given, &t->last, err, cap) != 0) {
    return -1;
  }
  const ntp_cpu_result *r = &t->last;
  double loss = r->outputs[t->loss_output].f[0];
  if (!isfinite(loss)) {
    snprintf(err, cap, "the loss is %g at step %lld", loss, (long long)t->step + 1);
    return -1;
  }
  /* the global norm: every element of every gradient once */
  double sq = 0;
  for (size_t i = 0; i < t->np; i++) {
    if (t->p[i].grad_output < 0) continue;
    const float *g = r->outputs[t->p[i].grad_output].f;
    for (int64_t e = 0; e < t->p[i].n; e++) sq += (double)g[e] * g[e];
  }
  double norm = sqrt(sq), scale = t->o.clip > 0 && norm > t->o.clip ? t->o.clip / norm : 1.0;
  double lr = ntp_adamw_lr(&t->o, t->step);
  int64_t k = ++t->step;
  double b1 = t->o.beta1, b2 = t->o.beta2, c1 = 1.0 - pow(b1, (double)k), c2 = 1.0 - pow(b2, (double)k);
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    const float *g = p->grad_output >= 0 ? r->outputs[p->grad_output].f : NULL;
    double wd = p->decay ? t->o.weight_decay : 0.0;
    for (int64_t e = 0; e < p->n; e++) {
      double ge = g ? (double)g[e] * scale : 0.0;
      double mm = b1 * p->m[e] + (1.0 - b1) * ge, vv = b2 * p->v[e] + (1.0 - b2) * ge * ge;
      p->m[e] = (float)mm;
      p->v[e] = (float)vv;
      double w = p->master[e];
      w -= lr * ((mm / c1) / (sqrt(vv / c2) + t->o.eps) + wd * w);
      p->master[e] = (float)w;
      p->cur.f[e] = p->master[e];
    }
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
  *st = (ntp_train_stats){.step = k, .loss = loss, .grad_norm = norm, .lr = lr, .seconds = now_s() - t0};
  return 0;
}

const ntp_cpu_result *ntp_trainer_last(const ntp_trainer *t) { return &t->last; }

void ntp_trainer_set_options(ntp_trainer *t, const ntp_adamw *o) { t->o = *o; }

void ntp_trainer_init_std(ntp_trainer *t, double std, uint64_t seed) {
  const ntp_module *m = t->mod;
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    const ntp_op *op = &m->ops[m->values[p->value].def];
    uint64_t key = ntp_init_key(seed, ntp_name_hash(p->cur.name));
    double a = std * 1.7320508075688772; /* U(-a, a) has standard deviation a / sqrt(3) */
    for (int64_t e = 0; e < p->n; e++)
      p->master[e] = p->decay ? (float)(a * ntp_init_uniform_key(key, (uint64_t)e)) : op->attr.init.center;
    memcpy(p->cur.f, p->master, (size_t)p->n * sizeof *p->cur.f);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
}

int ntp_trainer_eval(ntp_trainer *t, const ntp_host_tensor *const *given, ntp_cpu_result *res, char *err, size_t cap) {
  const ntp_module *m = t->mod;
  fill_given(t, given);
  if (!t->sim && !t->cuda) return ntp_cpu_run_given(m, t->seed, 0, NULL, t->given, res, err, cap);
  ntp_cpu_result keep = t->last; /* ranks_run fills t->last: keep the last step's */
  t->last = (ntp_cpu_result){0};
  int rc = ranks_run(t, 0, err, cap);
  *res = t->last;
  t->last = keep;
  return rc;
}

int ntp_trainer_set_param(ntp_trainer *t, int32_t value, const ntp_host_tensor *g, char *err, size_t cap) {
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    if (p->value != value) continue;
    if (!g->f || !shape_eq(&g->shape, &p->cur.shape)) {
      snprintf(err, cap, "'%s': a float tensor of the parameter's shape is needed", p->cur.name);
      return -1;
    }
    memcpy(p->master, g->f, (size_t)p->n * sizeof *p->master);
    memcpy(p->cur.f, g->f, (size_t)p->n * sizeof *p->cur.f);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
    return 0;
  }
  snprintf(err, cap, "value %d is not a parameter", value);
  return -1;
}

size_t ntp_trainer_params(const ntp_trainer *t, const ntp_host_tensor **params) {
  *params = t->cur; /* the same buffers as p[i].cur: set once, updated in place */
  return t->np;
}

int64_t ntp_trainer_steps_taken(const ntp_trainer *t) { return t->step; }

int ntp_trainer_save_state(const ntp_trainer *t, const char *path, char *err, size_t cap) {
  ntp_host_tensor *ts = calloc(3 * t->np + 1, sizeof *ts);
  char **names = calloc(3 * t->np + 1, sizeof *names);
  int rc = -1;
  if (!ts || !names) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < t->np; i++) {
    const tparam *p = &t->p[i];
    float *bufs[3] = {p->master, p->m, p->v};
    const char *pre[3] = {"", "adamw.m.", "adamw.v."};
    for (int k = 0; k < 3; k++) {
      size_t n = strlen(pre[k]) + strlen(p->cur.name) + 1;
      if (!(names[3 * i + k] = malloc(n))) {
        snprintf(err, cap, "out of memory");
        goto done;
      }
      snprintf(names[3 * i + k], n, "%s%s", pre[k], p->cur.name);
      ts[3 * i + k] = (ntp_host_tensor){.name = names[3 * i + k], .dtype = NTP_FP32, .shape = p->cur.shape, .f = bufs[k]};
    }
  }
  rc = ntp_safetensors_save(path, ts, 3 * t->np, err, cap);
done:
  for (size_t i = 0; names && i < 3 * t->np; i++) free(names[i]);
  free(names);
  free(ts);
  return rc;
}

int ntp_trainer_load_state(ntp_trainer *t, const ntp_safetensors *f, int64_t steps_taken, char *err, size_t cap) {
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    float *bufs[3] = {p->master, p->m, p->v};
    const char *pre[3] = {"", "adamw.m.", "adamw.v."};
    ntp_box full = box_full(&p->cur.shape);
    for (int k = 0; k < 3; k++) {
      char name[512];
      snprintf(name, sizeof name, "%s%s", pre[k], p->cur.name);
      if (ntp_safetensors_read_box(f, name, NTP_FP32, &p->cur.shape, &full, bufs[k], err, cap) != 0) return -1;
    }
    memcpy(p->cur.f, p->master, (size_t)p->n * sizeof *p->cur.f);
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
  t->step = steps_taken;
  return 0;
}
