/* exec_cuda.c — the CUDA backend (cuda_backend.h) as an executor (exec.h). Each operation is one
 * of the backend's entry points; this file only adapts their shapes. Built with or without the
 * CUDA headers (without them every entry point says so: no_cuda.c). */
#include "cuda_backend.h"
#include "exec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend and what it was made with: failover keeps the mode (loopback or NCCL). */
typedef struct cuda_exec {
  ntp_cuda *c;
  const ntp_program *p;
  ntp_exec_options o;
} cuda_exec;

#define C(be) (((cuda_exec *)(be))->c)

static int exec_create(const ntp_program *p, const ntp_exec_options *o, void **be, char *err, size_t cap) {
  cuda_exec *x = calloc(1, sizeof *x);
  if (!x) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  ntp_cuda_options co = {.loopback = o->loopback, .device = o->device, .rank_lo = o->rank_lo, .rank_hi = o->rank_hi,
                         .nccl_comm = o->comm, .devices = o->devices, .nccl_world = o->comms};
  if (ntp_cuda_create(p, &co, &x->c, err, cap) != 0) {
    free(x);
    return -1;
  }
  x->p = p;
  x->o = *o;
  x->o.devices = NULL, x->o.comms = NULL, x->o.comm = NULL; /* taken over: not the survivors' to reuse */
  *be = x;
  return 0;
}

static void exec_free(void *be) {
  if (!be) return;
  ntp_cuda_free(C(be));
  free(be);
}

static bool exec_runs_rank(const void *be, int rank) { return ntp_cuda_runs_rank(((const cuda_exec *)be)->c, rank); }
static bool exec_all_here(const void *be) { return ntp_cuda_all_here(((const cuda_exec *)be)->c); }

static int exec_set(void *be, int32_t value, const ntp_host_tensor *global, char *err, size_t cap) {
  return ntp_cuda_set(C(be), value, global, err, cap);
}

static int exec_load(void *be, const ntp_safetensors *f, char *err, size_t cap) { return ntp_cuda_load(C(be), f, err, cap); }

static int exec_value_get(void *be, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t cap) {
  (void)be, (void)v, (void)seed, (void)out;
  snprintf(err, cap, "the cuda backend keeps parameters on the GPUs (cpu backend or a training library)");
  return -1;
}

/* *dev = -1 where data is not device memory (the caller says whose GPU it expected) */
static int exec_device_of(void *be, const void *data, int *dev, char *err, size_t cap) {
  (void)err, (void)cap;
  if (ntp_cuda_device_of(C(be), data, dev) != 0) *dev = -1;
  return 0;
}

static int exec_copy_to_host(void *be, void *dst, const void *src, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_copy_to_host(C(be), dst, src, bytes, err, cap);
}

static int exec_set_device(void *be, int32_t value, const void *data, int dev, char *err, size_t cap) {
  return ntp_cuda_set_device(C(be), value, data, dev, err, cap);
}

static int exec_output_device(void *be, size_t output, void *data, int dev, char *err, size_t cap) {
  return ntp_cuda_output_device(C(be), output, data, dev, err, cap);
}

static int exec_forward(void *be, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap) {
  return ntp_cuda_forward(C(be), seed, res, err, cap);
}

static int exec_run(void *be, uint64_t seed, char *err, size_t cap) { return ntp_cuda_run(C(be), seed, NULL, err, cap); }

static int exec_output(void *be, size_t output, ntp_host_tensor *h, char *err, size_t cap) {
  return ntp_cuda_output_host(C(be), output, h, err, cap);
}

static int exec_alloc(void *be, int rank, size_t bytes, void **buf, char *err, size_t cap) {
  return ntp_cuda_alloc(C(be), rank, bytes, buf, err, cap);
}

static int exec_put(void *be, int rank, void *buf, const void *host, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_put(C(be), rank, buf, host, bytes, err, cap);
}

static int exec_get(void *be, int rank, void *host, const void *buf, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_get(C(be), rank, host, buf, bytes, err, cap);
}

static int exec_tensor_put(void *be, int32_t tensor, const float *values, char *err, size_t cap) {
  return ntp_cuda_tensor_put(C(be), tensor, values, err, cap);
}

static int exec_sumsq(void *be, int32_t tensor, const void *mask, double *acc, char *err, size_t cap) {
  double part = 0;
  if (ntp_cuda_sumsq(C(be), tensor, mask, &part, err, cap) != 0) return -1;
  *acc += part;
  return 0;
}

/* the kernel's arithmetic is fp32 (ntp_cuda_adamw_args) */
static int exec_adamw(void *be, int32_t param, int32_t grad, void *master, void *m, void *v, const ntp_exec_adamw *a,
                    char *err, size_t cap) {
  ntp_cuda_adamw_args h = {(float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->c1, (float)a->c2, (float)a->eps,
                           (float)a->wd, (float)a->scale};
  return ntp_cuda_adamw(C(be), param, grad, master, m, v, &h, err, cap);
}

static int exec_merge(void *be, void *host, size_t bytes, char *err, size_t cap) {
  return ntp_cuda_merge(C(be), host, bytes, err, cap);
}

static int exec_exchange(void *be, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                       char *err, size_t cap) {
  return ntp_cuda_exchange(C(be), send, n_send, recv, n_recv, err, cap);
}

/* NCCL (a GPU per rank): the communicators with a failed GPU in them are aborted at once (nothing
 * waits on a dead peer) and the survivors get a world of their own; loopback (every rank on one
 * GPU) has nothing to abort: the survivors' program runs on the same GPU. */
static void survivors_release(ntp_exec_survivors *s) {
  ntp_cuda_survivors_free(s->held);
  free(s->held);
}

/* the next executor's options from the backend's survivors: their GPUs and world communicators,
 * the ranks this process runs; the GPUs listed after `what` in the report */
static void next_of(ntp_exec_survivors *s, ntp_cuda_survivors *sv, const char *what) {
  s->held = sv, s->release = survivors_release;
  s->local = sv->local;
  s->next = (ntp_exec_options){.backend = "cuda", .device = sv->devices[0], .devices = sv->devices, .comms = sv->world,
                               .rank_lo = sv->local >= 0 ? sv->local : 0,
                               .rank_hi = sv->local >= 0 ? sv->local + 1 : sv->n};
  int k = (int)strlen(s->report);
  if (sv->local < 0 && what && k >= 0 && (size_t)k < sizeof s->report)
    k += snprintf(s->report + k, sizeof s->report - (size_t)k, "%s", what);
  for (int r = 0; sv->local < 0 && what && r < sv->n && k > 0 && (size_t)k < sizeof s->report; r++)
    k += snprintf(s->report + k, sizeof s->report - (size_t)k, " %d", sv->devices[r]);
}

static int exec_lose(void *be, const bool *lost, ntp_exec_survivors *s, char *err, size_t cap) {
  const cuda_exec *x = be;
  s->next = (ntp_exec_options){.backend = "cuda", .loopback = x->o.loopback, .device = x->o.device};
  if (x->o.loopback) return 0;
  ntp_cuda_survivors *sv = calloc(1, sizeof *sv);
  if (!sv) {
    snprintf(err, cap, "out of memory");
    return -1;
  }
  if (ntp_cuda_lose(x->c, lost, sv, err, cap) != 0) {
    free(sv);
    return -1;
  }
  snprintf(s->report, sizeof s->report, "communicators: %d aborted (ncclCommAbort: %s), the world %s %d ranks (%s)",
           sv->aborted, sv->local >= 0 ? "every one of this process's" : "each with a failed GPU in it",
           sv->shrunk ? "shrunk to" : "created again over the", sv->n, sv->how);
  next_of(s, sv, "; the survivors keep their GPUs:"); /* sv->n is s->n: the same survivors, counted by NCCL's side too */
  return 0;
}

static int exec_order(void *be, ntp_exec_survivors *s, int32_t world, const int32_t *from, char *err, size_t cap) {
  const cuda_exec *x = be;
  ntp_cuda_survivors *sv = s->held;
  if (x->o.loopback || !sv) return 0; /* every rank on one GPU: nothing bound to a survivor's place */
  int rc = ntp_cuda_survivors_order(x->c, sv, world, from, err, cap);
  if (rc != 0) return rc;
  size_t k = strlen(s->report);
  snprintf(s->report + k, sizeof s->report - k, "; then split into the survivors' plan's order (ncclCommSplit)");
  next_of(s, sv, ", its ranks on GPUs");
  return 0;
}

static int exec_grow(void *be, int32_t world, const int32_t *from, const int *devices, ntp_exec_survivors *s, char *err,
                     size_t cap) {
  const cuda_exec *x = be;
  ntp_cuda_survivors *sv = calloc(1, sizeof *sv);
  if (!sv) return snprintf(err, cap, "out of memory"), -1;
  int rc = x->o.loopback ? (sv->how = "loopback: no NCCL world", 1) : ntp_cuda_grow(x->c, world, from, devices, sv, err, cap);
  if (rc != 0) {
    if (rc > 0 && !x->o.loopback)
      snprintf(s->report, sizeof s->report, "a new world of %d ranks (ncclCommInitAll): %s", world, sv->how);
    free(sv);
    return rc;
  }
  snprintf(s->report, sizeof s->report, "the world communicator grown to %d ranks (%s)", sv->n, sv->how);
  next_of(s, sv, NULL);
  return 0;
}

static bool exec_peer_lost(void *be) { return ntp_cuda_peer_lost(C(be)); }

static void exec_describe(void *be, char *buf, size_t cap) {
  ntp_cuda_gemms g;
  ntp_cuda_overlap o;
  char a[1024], b[1024];
  ntp_cuda_gemm_summary(C(be), &g);
  ntp_cuda_gemm_line(&g, a, sizeof a);
  ntp_cuda_overlap_summary(C(be), &o);
  ntp_cuda_overlap_line(&o, b, sizeof b);
  snprintf(buf, cap, "%s\n%s", a, b);
}

static const char *exec_label(void *be) {
  const cuda_exec *x = be;
  return x->o.loopback && x->p->world > 1 ? "cuda loopback" : x->p->world > 1 ? "cuda nccl" : "cuda";
}

/* appends to notes */
static void note(char *notes, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *notes, size_t cap, const char *fmt, ...) {
  size_t n = strlen(notes);
  if (n + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(notes + n, cap - n, fmt, ap);
  va_end(ap);
}

int ntp_cuda_layer_report(const ntp_cuda *c, const ntp_program *p, char *buf, size_t cap, char *err, size_t ecap) {
  const char *prof = getenv("NTP_CUDA_PROFILE");
  if (!prof || strcmp(prof, "layers") != 0) return 0;
  size_t n = p->global.n_layers + 1;
  double *t = calloc(n, sizeof *t);
  if (!t || ntp_cuda_layer_times(c, t, n, err, ecap) != 0) {
    if (!t) snprintf(err, ecap, "out of memory");
    free(t);
    return -1;
  }
  for (size_t l = 0; l + 1 < n; l++) note(buf, cap, "layer %s %.9g\n", p->global.layers[l], t[l]);
  note(buf, cap, "layer (model) %.9g\n", t[n - 1]);
  free(t);
  return 0;
}

/* forwards in one launch mode; *host: their host launch seconds summed */
static int forwards(cuda_exec *x, uint64_t seed, long n, ntp_cpu_result *res, double *device, double *host, char *err,
                    size_t cap) {
  ntp_cuda_host ht;
  for (long i = 0; i < n; i++) {
    ntp_cpu_result_free(res);
    if (ntp_cuda_forward(x->c, seed, res, err, cap) != 0) return -1;
    ntp_cuda_host_time(x->c, &ht);
    *device += res->seconds, *host += ht.last_s;
  }
  return 0;
}

/* A warm-up (NVRTC's kernels loaded, the graphs captured), the same forwards in the other launch
 * mode (graphs or step by step) for the host's side of graphs, then the timed forwards last: the
 * per-layer times are those of the last of them. */
static int exec_measure(void *be, uint64_t seed, long iters, ntp_cpu_result *res, ntp_exec_measured *m, char *err,
                        size_t cap) {
  cuda_exec *x = be;
  char *notes = m->notes;
  size_t ncap = sizeof m->notes;
  notes[0] = 0;
  if (ntp_cuda_forward(x->c, seed, res, err, cap) != 0) return -1;
  ntp_cuda_host ht;
  ntp_cuda_host_time(x->c, &ht);
  bool graphs = ht.graphs, both = ntp_cuda_use_graphs(x->c, true) == 0; /* not: NCCL joins several GPUs here */
  ntp_cuda_use_graphs(x->c, graphs);
  double device = 0, host[2] = {0, 0}, ignored = 0; /* host: [0] in the mode runs use, [1] the other */
  if (iters > 0 && !both)
    note(notes, ncap, "graphs: not used: NCCL joins the %d GPUs of this process, and graphs launched from one thread "
         "may deadlock (NCCL's guide); one rank per process keeps them\n", x->p->world);
  if (iters > 0 && both) {
    ntp_cpu_result other = {0};
    ntp_cuda_use_graphs(x->c, !graphs);
    int rc = forwards(x, seed, 1, &other, &ignored, &ignored, err, cap); /* its warm-up: the capture */
    if (rc == 0) rc = forwards(x, seed, iters, &other, &ignored, &host[1], err, cap);
    ntp_cpu_result_free(&other);
    ntp_cuda_use_graphs(x->c, graphs);
    if (rc != 0) return -1;
  }
  if (forwards(x, seed, iters, res, &device, &host[0], err, cap) != 0) return -1;
  m->runs = iters > 0 ? iters : 1;
  m->mean_s = iters > 0 ? device / (double)iters : res->seconds;
  if (iters > 0 && both) { /* the host time per forward and per layer, with and without graphs (docs/runtime.md) */
    ntp_cuda_host_time(x->c, &ht);
    double with = (graphs ? host[0] : host[1]) / (double)iters * 1e6;
    double without = (graphs ? host[1] : host[0]) / (double)iters * 1e6;
    note(notes, ncap, "host launch: %.1f us per forward, %.2f us per layer with graphs; %.1f us, %.2f us per layer "
         "without (%d layers, mean of %ld)\n", with, with / ht.layers, without, without / ht.layers, ht.layers, iters);
  }
  return ntp_cuda_layer_report(x->c, x->p, notes, ncap, err, cap);
}

static const ntp_exec_ops cuda_ops = {
    .name = "cuda", .runs_rank = exec_runs_rank, .all_here = exec_all_here, .set = exec_set, .load = exec_load,
    .value_get = exec_value_get, .forward = exec_forward, .device_of = exec_device_of,
    .copy_to_host = exec_copy_to_host, .set_device = exec_set_device, .output_device = exec_output_device,
    .run = exec_run, .output = exec_output, .alloc = exec_alloc, .put = exec_put, .get = exec_get,
    .tensor_put = exec_tensor_put, .sumsq = exec_sumsq, .adamw = exec_adamw, .merge = exec_merge,
    .exchange = exec_exchange, .lose = exec_lose, .order = exec_order, .grow = exec_grow, .peer_lost = exec_peer_lost, .describe = exec_describe,
    .label = exec_label, .measure = exec_measure, .free = exec_free};

const ntp_exec_backend ntp_exec_cuda_backend = {
    .name = "cuda", .ops = &cuda_ops, .create = exec_create, .available = ntp_cuda_available, .devices = true,
    .runs_unsharded = true, .kernels = true, .fp32_tol = 1e-4, .versus = "cpu reference",
    .what = "every rank on the GPUs (NVRTC kernels, cuBLASLt, NCCL)"};
