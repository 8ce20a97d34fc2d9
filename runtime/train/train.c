/* train.c — AdamW training (ntp_train.h): every step runs the module's forward and backward
 * ops with the current parameters (on the CPU reference, every rank of a sharded program in
 * the simulation, or every rank on the CUDA backend), clips the gradients by their global
 * norm, and updates fp32 master weights with AdamW (bias-corrected moments, decoupled weight
 * decay on matrices and embeddings); the module then runs with the masters rounded to its
 * dtype, as mixed-precision training does. */
#include <time.h>

#include "train_internal.h"

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

/* The numbers of AdamW step k (c1, c2 the bias corrections 1 - beta^k) for a parameter with
 * weight decay wd, its gradient scaled by `scale` (clipping). The element's update is
 * ntp_adamw_element (exec.h): the same arithmetic here and in every executor. */
static ntp_exec_adamw adamw_at(const ntp_adamw *o, double lr, int64_t k, double wd, double scale) {
  return (ntp_exec_adamw){lr, o->beta1, o->beta2, 1.0 - pow(o->beta1, (double)k), 1.0 - pow(o->beta2, (double)k),
                          o->eps, wd, scale};
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ntp_trainer_free(ntp_trainer *t) {
  if (!t) return;
  for (size_t i = 0; i < t->np; i++) {
    free(t->p[i].unheld);
    free(t->p[i].master);
    free(t->p[i].m);
    free(t->p[i].v);
    free(t->p[i].cur.f);
  }
  for (size_t i = 0; i < t->nsl; i++) free(t->sl[i].own); /* the state buffers go with the executor */
  free(t->sl);
  free(t->p);
  free(t->cur);
  free(t->given);
  ntp_cpu_result_free(&t->last);
  ntp_exec_free(t->exec);
  free(t);
}


/* The slices of a sharded run: every persistent slice of a parameter, the gradient piece of
 * the same box on the same rank, the elements it counts in the norm, its state allocated. */
static int build_slices(ntp_trainer *t, const ntp_program *prog, char *err, size_t cap) {
  const ntp_module *m = t->mod;
  int32_t *pidx = malloc((m->n_values + 1) * sizeof *pidx);
  unsigned char **claimed = calloc(t->np + 1, sizeof *claimed);
  t->sl = calloc(prog->n_tensors + 1, sizeof *t->sl);
  int rc = -1;
  if (!pidx || !claimed || !t->sl) goto oom;
  for (size_t v = 0; v < m->n_values; v++) pidx[v] = -1;
  for (size_t i = 0; i < t->np; i++) pidx[t->p[i].value] = (int32_t)i;
  for (size_t ti = 0; ti < prog->n_tensors; ti++) {
    const ntp_tensor *ts = &prog->tensors[ti];
    if (!ts->persistent || ts->init_value < 0 || pidx[ts->init_value] < 0) continue;
    int32_t pi = pidx[ts->init_value];
    const tparam *p = &t->p[pi];
    tslice *s = &t->sl[t->nsl++];
    *s = (tslice){.param = pi, .tensor = (int32_t)ti, .grad = -1, .rank = ts->rank, .box = ts->init_box,
                  .n = box_volume(&ts->init_box), .here = EXEC(t, runs_rank, ts->rank)};
    if (p->grad_output >= 0) {
      int32_t gv = m->outputs[p->grad_output].value;
      for (size_t k = 0; k < prog->npieces[gv] && s->grad < 0; k++) {
        const ntp_tensor *gt = &prog->tensors[prog->pieces[gv][k]];
        if (gt->rank == ts->rank && box_eq(&gt->box, &ts->init_box)) s->grad = prog->pieces[gv][k];
      }
      if (s->grad < 0) {
        snprintf(err, cap, "internal: the slice of '%s' on rank %d has no gradient beside it", p->cur.name, ts->rank);
        goto done;
      }
    }
    if (!claimed[pi] && !(claimed[pi] = calloc((size_t)(p->n ? p->n : 1), 1))) goto oom;
    if (!(s->own = malloc((size_t)(s->n ? s->n : 1)))) goto oom;
    box_walk w = box_walk_start(&s->box, &p->cur.shape);
    for (int64_t e = 0; e < s->n; e++) {
      int64_t gi = box_walk_next(&w);
      s->own[e] = !claimed[pi][gi];
      claimed[pi][gi] = 1;
    }
    size_t bytes = (size_t)(s->n ? s->n : 1) * sizeof(float);
    if (!s->here) continue; /* another process's */
    if (EXEC(t, alloc, s->rank, bytes, (void **)&s->master, err, cap) != 0 ||
        EXEC(t, alloc, s->rank, bytes, (void **)&s->m, err, cap) != 0 ||
        EXEC(t, alloc, s->rank, bytes, (void **)&s->v, err, cap) != 0 ||
        EXEC(t, alloc, s->rank, (size_t)(s->n ? s->n : 1), (void **)&s->own_dev, err, cap) != 0 ||
        EXEC(t, put, s->rank, s->own_dev, s->own, (size_t)s->n, err, cap) != 0)
      goto done;
  }
  for (size_t i = 0; i < t->np; i++) { /* what no slice holds stays with the global copies */
    tparam *p = &t->p[i];
    for (int64_t e = 0; e < p->n; e++) p->nunheld += !claimed[i] || !claimed[i][e];
    if (p->nunheld && !(p->unheld = malloc((size_t)p->nunheld * sizeof *p->unheld))) goto oom;
    p->nunheld = 0;
    for (int64_t e = 0; e < p->n; e++)
      if (!claimed[i] || !claimed[i][e]) p->unheld[p->nunheld++] = e;
  }
  rc = 0;
  goto done;
oom:
  snprintf(err, cap, "out of memory for the optimizer's slices");
done:
  for (size_t i = 0; claimed && i < t->np; i++) free(claimed[i]);
  free(claimed);
  free(pidx);
  return rc;
}

/* A host buffer of the largest slice's size (staging between the slices and the global copies). */
float *ntp_train_slice_buffer(const ntp_trainer *t, char *err, size_t cap) {
  int64_t n = 1;
  for (size_t i = 0; i < t->nsl; i++)
    if (t->sl[i].n > n) n = t->sl[i].n;
  float *b = malloc((size_t)n * sizeof *b);
  if (!b) snprintf(err, cap, "out of memory");
  return b;
}

/* The global masters and moments into every slice, and the slices' parameters rounded from them. */
int ntp_train_scatter(ntp_trainer *t, char *err, size_t cap) {
  float *tmp = ntp_train_slice_buffer(t, err, cap);
  if (!tmp) return -1;
  for (size_t i = 0; i < t->nsl; i++) {
    tslice *s = &t->sl[i];
    tparam *p = &t->p[s->param];
    float *src[3] = {p->master, p->m, p->v}, *dst[3] = {s->master, s->m, s->v};
    if (!s->here) continue;
    for (int k = 2; k >= 0; k--) { /* the master last: tmp then holds it, and the slice is it rounded */
      box_copy(src[k], &p->cur.shape, &s->box, tmp, true, NULL);
      if (EXEC(t, put, s->rank, dst[k], tmp, (size_t)s->n * sizeof(float), err, cap) != 0) goto fail;
    }
    if (EXEC(t, tensor_put, s->tensor, tmp, err, cap) != 0) goto fail;
  }
  free(tmp);
  t->stale = false;
  return 0;
fail:
  free(tmp);
  return -1;
}

/* The global copies from the slices of every process (one rank per process): each process puts the
 * elements it owns (the norm's mask) of its slices into a zeroed copy of all the state, the copies
 * are merged (every element has one owner: its bits come through exactly), the elements no rank
 * holds stay as the host updated them; then this process's replicas are checked against it. */
static int gather_merged(ntp_trainer *t, char *err, size_t cap) {
  size_t total = 0, *off = calloc(t->np + 1, sizeof *off);
  for (size_t i = 0; off && i < t->np; i++) off[i] = total, total += 3 * (size_t)t->p[i].n;
  float *all = calloc(total + 1, sizeof *all), *tmp = ntp_train_slice_buffer(t, err, cap);
  int rc = -1;
  if (!off || !all || !tmp) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < t->nsl; i++) {
    const tslice *s = &t->sl[i];
    const tparam *p = &t->p[s->param];
    float *src[3] = {s->master, s->m, s->v};
    if (!s->here) continue;
    for (int k = 0; k < 3; k++) {
      if (EXEC(t, get, s->rank, tmp, src[k], (size_t)s->n * sizeof(float), err, cap) != 0) goto done;
      box_copy(all + off[s->param] + (size_t)k * (size_t)p->n, &p->cur.shape, &s->box, tmp, false, s->own);
    }
  }
  if (EXEC(t, merge, all, total * sizeof *all, err, cap) != 0) goto done;
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    float *dst[3] = {p->master, p->m, p->v};
    for (int k = 0; k < 3; k++) {
      float *mine = all + off[i] + (size_t)k * (size_t)p->n;
      for (int64_t j = 0; j < p->nunheld; j++) mine[p->unheld[j]] = dst[k][p->unheld[j]];
      memcpy(dst[k], mine, (size_t)p->n * sizeof(float));
    }
  }
  for (size_t i = 0; i < t->nsl; i++) { /* this process's replicas hold what the owners do */
    const tslice *s = &t->sl[i];
    const tparam *p = &t->p[s->param];
    if (!s->here || EXEC(t, get, s->rank, tmp, s->master, (size_t)s->n * sizeof(float), err, cap) != 0) {
      if (s->here) goto done;
      continue;
    }
    box_walk w = box_walk_start(&s->box, &p->cur.shape);
    for (int64_t e = 0; e < s->n; e++)
      if (memcmp(&p->master[box_walk_next(&w)], &tmp[e], sizeof(float)) != 0) {
        snprintf(err, cap, "internal: the replicas of '%s' diverged (rank %d, element %lld of its slice)", p->cur.name,
                 s->rank, (long long)e);
        goto done;
      }
  }
  for (size_t i = 0; i < t->np; i++) {
    memcpy(t->p[i].cur.f, t->p[i].master, (size_t)t->p[i].n * sizeof(float));
    ntp_round_buf(t->p[i].cur.f, (size_t)t->p[i].n, mode_of(t->p[i].cur.dtype));
  }
  t->stale = false;
  rc = 0;
done:
  free(off);
  free(all);
  free(tmp);
  return rc;
}

/* The slices' state into the global copies (each element from the slice the norm counts it in). */
int ntp_train_gather(ntp_trainer *t, char *err, size_t cap) {
  if (!t->stale) return 0;
  if (per_process(t)) return gather_merged(t, err, cap);
  float *tmp = ntp_train_slice_buffer(t, err, cap);
  if (!tmp) return -1;
  for (size_t i = 0; i < t->nsl; i++) {
    tslice *s = &t->sl[i];
    tparam *p = &t->p[s->param];
    float *dst[3] = {p->master, p->m, p->v}, *src[3] = {s->master, s->m, s->v};
    for (int k = 0; k < 3; k++) {
      if (EXEC(t, get, s->rank, tmp, src[k], (size_t)s->n * sizeof(float), err, cap) != 0) {
        free(tmp);
        return -1;
      }
      box_copy(dst[k], &p->cur.shape, &s->box, tmp, false, s->own);
    }
  }
  /* every other holder of an element holds the same master: replicas sum the same gradients in
   * the same order, so they stay equal bit for bit (checked: a divergence is a defect) */
  for (size_t i = 0; i < t->nsl; i++) {
    tslice *s = &t->sl[i];
    tparam *p = &t->p[s->param];
    float *mine = tmp;
    if (EXEC(t, get, s->rank, tmp, s->master, (size_t)s->n * sizeof(float), err, cap) != 0) {
      free(tmp);
      return -1;
    }
    float *there = malloc((size_t)(s->n ? s->n : 1) * sizeof *there);
    if (!there) {
      free(tmp);
      snprintf(err, cap, "out of memory");
      return -1;
    }
    box_copy(p->master, &p->cur.shape, &s->box, there, true, NULL);
    int64_t bad = -1;
    for (int64_t e = 0; e < s->n && bad < 0; e++)
      if (memcmp(&there[e], &mine[e], sizeof(float)) != 0) bad = e;
    free(there);
    if (bad >= 0) {
      snprintf(err, cap, "internal: the replicas of '%s' diverged (rank %d, element %lld of its slice)", p->cur.name,
               s->rank, (long long)bad);
      free(tmp);
      return -1;
    }
  }
  free(tmp);
  for (size_t i = 0; i < t->np; i++) {
    memcpy(t->p[i].cur.f, t->p[i].master, (size_t)t->p[i].n * sizeof(float));
    ntp_round_buf(t->p[i].cur.f, (size_t)t->p[i].n, mode_of(t->p[i].cur.dtype));
  }
  t->stale = false;
  return 0;
}

int ntp_trainer_new(const ntp_program *prog, const ntp_adamw *o, uint64_t seed, const ntp_safetensors *params,
                    const ntp_exec_options *x, ntp_trainer **out, char *err, size_t cap) {
  *out = NULL;
  const ntp_module *m = &prog->global;
  ntp_trainer *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->mod = m;
  if (ntp_exec_new(prog, x, &t->exec, err, cap) != 0) { /* none: the CPU reference runs the module */
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
  t->world = prog->world;
  if (t->exec) { /* the piece of the loss that is read: the first */
    int32_t lv = m->outputs[t->loss_output].value;
    t->loss_rank = prog->world > 0 && prog->npieces[lv] ? prog->tensors[prog->pieces[lv][0]].rank : 0;
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
  if (t->exec && (build_slices(t, prog, err, cap) != 0 || ntp_train_scatter(t, err, cap) != 0)) {
    ntp_trainer_free(t);
    return -1;
  }
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
    if (t->given[v] && EXEC(t, set, (int32_t)v, t->given[v], err, cap) != 0) return -1;
  if (EXEC(t, forward, t->seed, &t->last, err, cap) != 0) return -1;
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

/* The run's given values: the caller's inputs, and every parameter as the program runs with it
 * (with_params; a sharded run's parameters are in place on its ranks already). */
static void fill_given(ntp_trainer *t, const ntp_host_tensor *const *given, bool with_params) {
  for (size_t v = 0; v < t->mod->n_values; v++) t->given[v] = given ? given[v] : NULL;
  for (size_t i = 0; with_params && i < t->np; i++) t->given[t->p[i].value] = &t->p[i].cur;
}

/* The step on the slices: forward and backward (the loss into *loss), the global norm over
 * every element once, AdamW on each slice where it lives. Without keep only the loss comes back
 * to the host. With one rank per process each slice's sum of squares (and the loss, from the
 * process that has it) is merged across the processes, so every process computes the same norm;
 * else the sums accumulate in slice order. */
static int sharded_step(ntp_trainer *t, int keep, double *loss, double *norm, double lr, int64_t k, char *err,
                        size_t cap) {
  if (keep) {
    if (ranks_run(t, keep, err, cap) != 0) return -1;
    *loss = t->last.outputs[t->loss_output].f[0];
  } else {
    for (size_t v = 0; v < t->mod->n_values; v++)
      if (t->given[v] && EXEC(t, set, (int32_t)v, t->given[v], err, cap) != 0) return -1;
    ntp_host_tensor h;
    if (EXEC(t, run, t->seed, err, cap) != 0 || EXEC(t, output, (size_t)t->loss_output, &h, err, cap) != 0) return -1;
    *loss = h.f[0];
    free(h.f);
  }
  double sq = 0;
  if (per_process(t)) {
    double *part = calloc(t->nsl + 1, sizeof *part);
    if (!part) {
      snprintf(err, cap, "out of memory");
      return -1;
    }
    part[t->nsl] = EXEC(t, runs_rank, t->loss_rank) ? *loss : 0.0;
    for (size_t i = 0; i < t->nsl; i++)
      if (t->sl[i].grad >= 0 && t->sl[i].here && EXEC(t, sumsq, t->sl[i].grad, t->sl[i].own_dev, &part[i], err, cap) != 0) {
        free(part);
        return -1;
      }
    if (EXEC(t, merge, part, (t->nsl + 1) * sizeof *part, err, cap) != 0) {
      free(part);
      return -1;
    }
    *loss = part[t->nsl];
    for (size_t i = 0; i < t->nsl; i++)
      if (t->sl[i].grad >= 0) sq += part[i];
    free(part);
  } else {
    for (size_t i = 0; i < t->nsl; i++)
      if (t->sl[i].grad >= 0 && EXEC(t, sumsq, t->sl[i].grad, t->sl[i].own_dev, &sq, err, cap) != 0) return -1;
  }
  if (!isfinite(*loss)) return 0;
  *norm = sqrt(sq);
  double scale = t->o.clip > 0 && *norm > t->o.clip ? t->o.clip / *norm : 1.0;
  for (size_t i = 0; i < t->nsl; i++) {
    tslice *s = &t->sl[i];
    ntp_exec_adamw a = adamw_at(&t->o, lr, k, t->p[s->param].decay ? t->o.weight_decay : 0.0, scale);
    if (s->here && EXEC(t, adamw, s->tensor, s->grad, s->master, s->m, s->v, &a, err, cap) != 0) return -1;
  }
  for (size_t i = 0; i < t->np; i++) { /* the elements no rank holds: a zero gradient, the decay */
    tparam *p = &t->p[i];
    ntp_exec_adamw a = adamw_at(&t->o, lr, k, p->decay ? t->o.weight_decay : 0.0, scale);
    for (int64_t j = 0; j < p->nunheld; j++) {
      int64_t e = p->unheld[j];
      ntp_adamw_element(&a, 0.0, &p->m[e], &p->v[e], &p->master[e]);
      p->cur.f[e] = p->master[e];
    }
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype)); /* idempotent where already rounded */
  }
  t->stale = true;
  return 0;
}

int ntp_trainer_step(ntp_trainer *t, const ntp_host_tensor *const *given, int keep, ntp_train_stats *st, char *err,
                     size_t cap) {
  const ntp_module *m = t->mod;
  double t0 = now_s();
  ntp_cpu_result_free(&t->last);
  if (t->exec) {
    if (keep && ntp_train_gather(t, err, cap) != 0) return -1; /* the dump's parameters: as the step runs with them */
    fill_given(t, given, keep);
    double loss = NAN, norm = 0, lr = ntp_adamw_lr(&t->o, t->step);
    if (sharded_step(t, keep, &loss, &norm, lr, t->step + 1, err, cap) != 0) return -1;
    if (!isfinite(loss)) {
      snprintf(err, cap, "the loss is %g at step %lld", loss, (long long)t->step + 1);
      return -1;
    }
    int64_t k = ++t->step;
    *st = (ntp_train_stats){.step = k, .loss = loss, .grad_norm = norm, .lr = lr, .seconds = now_s() - t0};
    return 0;
  }
  fill_given(t, given, true);
  if (ntp_cpu_run_given(m, t->seed, keep, NULL, t->given, &t->last, err, cap) != 0) return -1;
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
  for (size_t i = 0; i < t->np; i++) {
    tparam *p = &t->p[i];
    const float *g = p->grad_output >= 0 ? r->outputs[p->grad_output].f : NULL;
    ntp_exec_adamw a = adamw_at(&t->o, lr, k, p->decay ? t->o.weight_decay : 0.0, scale);
    for (int64_t e = 0; e < p->n; e++) {
      ntp_adamw_element(&a, g ? (double)g[e] * scale : 0.0, &p->m[e], &p->v[e], &p->master[e]);
      p->cur.f[e] = p->master[e];
    }
    ntp_round_buf(p->cur.f, (size_t)p->n, mode_of(p->cur.dtype));
  }
  *st = (ntp_train_stats){.step = k, .loss = loss, .grad_norm = norm, .lr = lr, .seconds = now_s() - t0};
  return 0;
}

const ntp_cpu_result *ntp_trainer_last(const ntp_trainer *t) { return &t->last; }

void ntp_trainer_set_options(ntp_trainer *t, const ntp_adamw *o) { t->o = *o; }

/* A sharded run's slices take the global copies after these changed them. */
static int rescatter(ntp_trainer *t, char *err, size_t cap) { return t->exec ? ntp_train_scatter(t, err, cap) : 0; }

int ntp_trainer_eval(ntp_trainer *t, const ntp_host_tensor *const *given, ntp_cpu_result *res, char *err, size_t cap) {
  const ntp_module *m = t->mod;
  fill_given(t, given, !t->exec);
  if (!t->exec) return ntp_cpu_run_given(m, t->seed, 0, NULL, t->given, res, err, cap);
  ntp_cpu_result keep = t->last; /* ranks_run fills t->last: keep the last step's */
  t->last = (ntp_cpu_result){0};
  int rc = ranks_run(t, 0, err, cap);
  *res = t->last;
  t->last = keep;
  return rc;
}

int ntp_trainer_set_param(ntp_trainer *t, int32_t value, const ntp_host_tensor *g, char *err, size_t cap) {
  if (ntp_train_gather(t, err, cap) != 0) return -1;
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
    return rescatter(t, err, cap);
  }
  snprintf(err, cap, "value %d is not a parameter", value);
  return -1;
}

size_t ntp_trainer_params(ntp_trainer *t, const ntp_host_tensor **params) {
  char err[256];
  *params = t->cur; /* the same buffers as p[i].cur: set once, updated in place */
  return ntp_train_gather(t, err, sizeof err) == 0 ? t->np : 0;
}

int ntp_trainer_gather(ntp_trainer *t, char *err, size_t cap) { return ntp_train_gather(t, err, cap); }

int ntp_trainer_state(ntp_trainer *t, size_t i, const float **master, const float **m, const float **v, char *err,
                      size_t cap) {
  if (i >= t->np) {
    snprintf(err, cap, "no parameter %zu (the module has %zu)", i, t->np);
    return -1;
  }
  if (ntp_train_gather(t, err, cap) != 0) return -1;
  *master = t->p[i].master, *m = t->p[i].m, *v = t->p[i].v;
  return 0;
}

int64_t ntp_trainer_steps_taken(const ntp_trainer *t) { return t->step; }

bool ntp_trainer_writes(const ntp_trainer *t) { return !per_process(t) || EXEC(t, runs_rank, 0); }
