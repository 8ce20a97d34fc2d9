/* exec_sim.c — the CPU simulation (cpu_sim.c) as an executor (exec.h): every rank in this
 * process, its state buffers in host memory, put and get plain copies; the worked example of
 * docs/adding-a-backend.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "exec.h"

typedef struct sim_exec {
  const ntp_program *p;
  ntp_sim *sim;
  ntp_cpu_result last; /* run's outputs, for output */
  void **bufs;         /* alloc's, freed with the executor */
  size_t nbufs, cap_bufs;
} sim_exec;

/* every rank here: one rank of several alone cannot run without the others */
static int sim_create(const ntp_program *p, const ntp_exec_options *o, void **be, char *err, size_t cap) {
  if (o->rank_hi > 0 && (o->rank_lo != 0 || o->rank_hi < p->world)) {
    snprintf(err, cap, "rank %d: the cpu backend runs every rank of the model in this process", o->rank_lo);
    return -1;
  }
  sim_exec *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  s->p = p;
  if (ntp_sim_new(p, &s->sim, err, cap) != 0) {
    free(s);
    return -1;
  }
  *be = s;
  return 0;
}

static void sim_free(void *be) {
  sim_exec *s = be;
  if (!s) return;
  for (size_t i = 0; i < s->nbufs; i++) free(s->bufs[i]);
  free(s->bufs);
  ntp_cpu_result_free(&s->last);
  ntp_sim_free(s->sim);
  free(s);
}

static bool sim_runs_rank(const void *be, int rank) { return (void)be, (void)rank, true; }
static bool sim_all_here(const void *be) { return (void)be, true; }

static int sim_set(void *be, int32_t value, const ntp_host_tensor *global, char *err, size_t cap) {
  return ntp_sim_set(((sim_exec *)be)->sim, value, global, err, cap);
}

static int sim_load(void *be, const ntp_safetensors *f, char *err, size_t cap) {
  return ntp_sim_load(((sim_exec *)be)->sim, f, err, cap);
}

static int sim_value_get(void *be, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t cap) {
  return ntp_sim_get(((sim_exec *)be)->sim, v, seed, out, err, cap);
}

/* no device memory: every tensor crosses as a host one */
static int sim_device_of(void *be, const void *data, int *dev, char *err, size_t cap) {
  (void)be, (void)data, (void)dev;
  snprintf(err, cap, "the cpu backend takes host tensors (kDLCPU)");
  return -1;
}

static int sim_copy_to_host(void *be, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  (void)dst, (void)bytes;
  return sim_device_of(be, src, NULL, err, cap);
}

static int sim_set_device(void *be, int32_t value, const void *data, int dev, char *err, size_t cap) {
  (void)value, (void)dev;
  return sim_device_of(be, data, NULL, err, cap);
}

static int sim_output_device(void *be, size_t output, void *data, int dev, char *err, size_t cap) {
  (void)output, (void)dev;
  return sim_device_of(be, data, NULL, err, cap);
}

static int sim_forward(void *be, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  return ntp_sim_forward(((sim_exec *)be)->sim, seed, res, err, cap);
}

static int sim_run(void *be, uint64_t seed, char *err, size_t cap) {
  sim_exec *s = be;
  ntp_cpu_result_free(&s->last);
  return ntp_sim_forward(s->sim, seed, &s->last, err, cap);
}

static int sim_output(void *be, size_t output, ntp_host_tensor *h, char *err, size_t cap) {
  sim_exec *s = be;
  if (output >= s->last.n_outputs || !ntp_host_tensor_copy(&s->last.outputs[output], s->last.outputs[output].name, h)) {
    snprintf(err, cap, output >= s->last.n_outputs ? "output %zu was not run" : "out of memory", output);
    return -1;
  }
  return 0;
}

static int sim_alloc(void *be, int rank, size_t bytes, void **buf, char *err, size_t cap) {
  sim_exec *s = be;
  (void)rank;
  if (s->nbufs == s->cap_bufs) {
    size_t n = s->cap_bufs ? 2 * s->cap_bufs : 64;
    void **b = realloc(s->bufs, n * sizeof *b);
    if (!b) goto oom;
    s->bufs = b, s->cap_bufs = n;
  }
  if (!(*buf = calloc(1, bytes ? bytes : 1))) goto oom;
  s->bufs[s->nbufs++] = *buf;
  return 0;
oom:
  snprintf(err, cap, "out of memory for the optimizer's state");
  return -1;
}

static int sim_put(void *be, int rank, void *buf, const void *host, size_t bytes, char *err, size_t cap) {
  (void)be, (void)rank, (void)err, (void)cap;
  memcpy(buf, host, bytes);
  return 0;
}

static int sim_get(void *be, int rank, void *host, const void *buf, size_t bytes, char *err, size_t cap) {
  (void)be, (void)rank, (void)err, (void)cap;
  memcpy(host, buf, bytes);
  return 0;
}

static ntp_round_mode mode_of(ntp_dtype dt) {
  return dt == NTP_BF16 ? NTP_ROUND_BF16 : dt == NTP_FP16 ? NTP_ROUND_FP16 : NTP_ROUND_NONE;
}

static int sim_tensor_put(void *be, int32_t tensor, const float *values, char *err, size_t cap) {
  sim_exec *s = be;
  (void)err, (void)cap;
  const ntp_tensor *t = &s->p->tensors[tensor];
  size_t n = (size_t)box_volume(&t->box);
  float *pd = ntp_sim_tensor(s->sim, tensor);
  memcpy(pd, values, n * sizeof *pd);
  ntp_round_buf(pd, n, mode_of(t->dtype));
  return 0;
}

static int sim_sumsq(void *be, int32_t tensor, const void *mask, double *acc, char *err, size_t cap) {
  sim_exec *s = be;
  (void)err, (void)cap;
  const float *g = ntp_sim_tensor(s->sim, tensor);
  const unsigned char *own = mask;
  for (int64_t e = 0, n = box_volume(&s->p->tensors[tensor].box); e < n; e++)
    if (own[e]) *acc += (double)g[e] * g[e];
  return 0;
}

static int sim_adamw(void *be, int32_t param, int32_t grad, void *master, void *m, void *v, const ntp_exec_adamw *a,
                     char *err, size_t cap) {
  sim_exec *s = be;
  (void)err, (void)cap;
  const ntp_tensor *t = &s->p->tensors[param];
  const float *g = grad >= 0 ? ntp_sim_tensor(s->sim, grad) : NULL;
  float *pd = ntp_sim_tensor(s->sim, param), *w = master, *mm = m, *vv = v;
  int64_t n = box_volume(&t->box);
  for (int64_t e = 0; e < n; e++) {
    ntp_adamw_element(a, g ? (double)g[e] * a->scale : 0.0, &mm[e], &vv[e], &w[e]);
    pd[e] = w[e];
  }
  ntp_round_buf(pd, (size_t)n, mode_of(t->dtype));
  return 0;
}

static int sim_merge(void *be, void *host, size_t bytes, char *err, size_t cap) {
  (void)be, (void)host, (void)bytes, (void)err, (void)cap;
  return 0; /* every rank is here */
}

static int sim_exchange(void *be, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                        char *err, size_t cap) {
  (void)be, (void)send, (void)n_send, (void)recv, (void)n_recv;
  snprintf(err, cap, "internal: the simulation runs every rank in one process: nothing to exchange");
  return -1;
}

/* every rank is in this process: a failed one loses nothing the others wait on, and the
 * survivors' program is simulated as this one was */
static int sim_lose(void *be, const bool *lost, ntp_exec_survivors *s, char *err, size_t cap) {
  (void)be, (void)lost, (void)err, (void)cap;
  s->next = (ntp_exec_options){.backend = "cpu"};
  return 0;
}

static bool sim_peer_lost(void *be) { return (void)be, false; }
static const char *sim_label(void *be) { return (void)be, "cpu (simulated)"; }

/* a check, not a benchmark: one forward */
static int sim_measure(void *be, uint64_t seed, long iters, ntp_cpu_result *res, ntp_exec_measured *m, char *err,
                       size_t cap) {
  (void)iters;
  if (sim_forward(be, seed, res, err, cap) != 0) return -1;
  *m = (ntp_exec_measured){.runs = 1, .mean_s = res->seconds};
  return 0;
}
static void sim_describe(void *be, char *buf, size_t cap) { (void)be, (void)buf, (void)cap; }

static const ntp_exec_ops sim_ops = {
    .name = "cpu", .runs_rank = sim_runs_rank, .all_here = sim_all_here, .set = sim_set, .load = sim_load,
    .value_get = sim_value_get, .forward = sim_forward, .device_of = sim_device_of, .copy_to_host = sim_copy_to_host,
    .set_device = sim_set_device, .output_device = sim_output_device,
    .run = sim_run, .output = sim_output, .alloc = sim_alloc, .put = sim_put, .get = sim_get,
    .tensor_put = sim_tensor_put, .sumsq = sim_sumsq, .adamw = sim_adamw, .merge = sim_merge,
    .exchange = sim_exchange, .lose = sim_lose, .peer_lost = sim_peer_lost, .describe = sim_describe, .label = sim_label,
    .measure = sim_measure, .free = sim_free};

static int sim_available(char *err, size_t cap) { return (void)err, (void)cap, 0; }

const ntp_exec_backend ntp_exec_sim_backend = {
    .name = "cpu", .ops = &sim_ops, .create = sim_create, .available = sim_available, .devices = false,
    .runs_unsharded = false, /* the CPU reference runs an unsharded program */
    .kernels = false, .fp32_tol = 1e-5, .versus = "unsharded",
    .what = "every rank simulated here (the CPU reference when unsharded)"};
