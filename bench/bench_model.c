/* bench_model.c — times forwards of a compiled model (bench/bench_gpt2_cuda.sh drives it).
 *
 * Library mode (the default build): only the model library's C ABI (runtime/ntp_model.h).
 *
 *   ntpc examples/gpt2.ntp -o gpt2.so
 *   cc -std=c17 -O2 -Iruntime bench/bench_model.c -ldl -o bench_model
 *   ./bench_model ./gpt2.so [--backend cuda|cpu] [--iters N] [--warmup N] [--create-only]
 *                           [--flops F] [--device N] [--loopback] [--seed N]
 *
 *   It times ntp_model_create (with a cold NVRTC cache this is dominated by compiling every
 *   rank's kernels; with a warm one, by loading the CUBINs), gives every parameter synthetic
 *   values through ntp_model_set_param (so forwards do not re-run the initialisation
 *   kernels), sets the inputs once, then times ntp_model_forward on the host clock. That time
 *   is end to end: the ABI copies every output to the host and converts it to the caller's
 *   buffer on each call (GPT-2 at B=8, S=1024: 411M logits, 823 MB of bf16), so it is not the
 *   GPU time of the forward; the direct mode measures that.
 *
 * Direct mode (built with -DNTP_BENCH_DIRECT, linked with libntpc and libntprt): compiles
 * the .ntp itself and drives the runtime's CUDA backend as `ntpc run --backend cuda` does,
 * without the CPU reference, and reports the device time of each forward (CUDA events around
 * the step list, as ntpc prints it) next to the host time of the call.
 *
 *   ./bench_model_direct --ntp examples/gpt2.ntp [-D NAME=VALUE]... [--plan F] [--world W]
 *                        [--backend cuda|cpu] [--iters N] [--warmup N] [--flops F] [--loopback]
 *
 * Both modes print `key=value` lines (create_ms=, forward_ms_mean=, ...) for scripts and a
 * readable summary. --flops F: the FLOPs of one forward, to print TFLOP/s (the caller knows
 * the model; bench_gpt2_cuda.sh documents the GPT-2 formula). Exit 0, 1 on failure, 2 usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <dlpack/dlpack.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ntp_model.h"

#ifdef NTP_BENCH_DIRECT
#include "cuda_backend.h"
#include "cuda_gen.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"
#include "shard.h"
#endif

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- synthetic values: fixed-seed uniform numbers with the scales of ntp's initialisation ---- */

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float urand(void) { /* (-1, 1) */
  uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(((double)(z >> 40) + 0.5) * (1.0 / 8388608.0) - 1.0);
}

/* center + scale * u: norm gains around 1, weights 1/sqrt(fan_in), tables and biases small */
static void synth_scale(const char *name, int ndim, const int64_t *shape, float *center, float *scale) {
  const char *dot = strrchr(name, '.');
  const char *leaf = dot ? dot + 1 : name;
  *center = 0.0f;
  if (!strcmp(leaf, "wte")) *scale = 1.0f;
  else if (!strcmp(leaf, "wpe")) *scale = 0.5f;
  else if (!strcmp(leaf, "g")) *center = 1.0f, *scale = 0.1f;
  else if (ndim >= 2) *scale = 1.0f / sqrtf((float)shape[ndim - 1]);
  else *scale = 0.1f;
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f) { /* |f| < 65504, normal range only: enough for synthetic values */
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  if (e <= 0) return (uint16_t)sign; /* flush tiny values to zero */
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)h;
}

static void stats(const double *v, int n, double *mean, double *min, double *max) {
  *mean = 0;
  *min = n ? v[0] : 0;
  *max = n ? v[0] : 0;
  for (int i = 0; i < n; i++) {
    *mean += v[i] / n;
    if (v[i] < *min) *min = v[i];
    if (v[i] > *max) *max = v[i];
  }
}

static void print_rate(const char *key, double flops, double ms) {
  if (flops > 0 && ms > 0) printf("%s=%.2f\n", key, flops / (ms * 1e-3) / 1e12);
}

/* ---- library mode ----------------------------------------------------------------------------- */

typedef int (*get_info_fn)(const ntp_model_info **);
typedef int (*create_fn)(const ntp_model_options *, ntp_model **);
typedef int (*set_param_fn)(ntp_model *, const char *, const DLTensor *);
typedef int (*forward_fn)(ntp_model *, const DLTensor *const *, DLTensor *const *);
typedef const char *(*error_fn)(void);
typedef void (*destroy_fn)(ntp_model *);

static int64_t numel(const ntp_model_tensor_info *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

static size_t esize(DLDataType t) { return (size_t)(t.bits / 8); }

/* A host DLTensor of t's shape and dtype filled with center + scale * u (ints: [0, range)). */
static int make_tensor(const ntp_model_tensor_info *t, float center, float scale, int64_t range, DLTensor *out) {
  int64_t n = numel(t);
  void *data = malloc((size_t)(n ? n : 1) * esize(t->dtype));
  if (!data) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype.code == kDLInt) {
      ((int32_t *)data)[i] = (int32_t)((double)(urand() + 1.0f) * 0.5 * (double)range) % (int32_t)(range > 0 ? range : 1);
      continue;
    }
    float v = center + scale * urand();
    if (t->dtype.bits == 32) ((float *)data)[i] = v;
    else ((uint16_t *)data)[i] = t->dtype.code == kDLBfloat ? to_bf16(v) : to_f16(v);
  }
  *out = (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = t->ndim, .dtype = t->dtype, .shape = (int64_t *)t->shape};
  return 0;
}

static int count_nonfinite(const DLTensor *t, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype.code == kDLInt) continue;
    if (t->dtype.bits == 32) bad += !isfinite(((const float *)t->data)[i]);
    else {
      uint16_t h = ((const uint16_t *)t->data)[i];
      bad += t->dtype.code == kDLBfloat ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
    }
  }
  return bad > 0x7fffffff ? 0x7fffffff : (int)bad;
}

typedef struct opts {
  const char *model, *ntp, *backend, *plan;
  const char *defines[64];
  int ndefines;
  int iters, warmup, create_only, loopback, device;
  long world;
  double flops;
  unsigned long long seed;
} opts;

static int run_library(const opts *o) {
  void *lib = dlopen(o->model, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "bench_model: %s\n", dlerror());
    return 1;
  }
  get_info_fn get_info = (get_info_fn)dlsym(lib, "ntp_model_get_info");
  create_fn create = (create_fn)dlsym(lib, "ntp_model_create");
  set_param_fn set_param = (set_param_fn)dlsym(lib, "ntp_model_set_param");
  forward_fn forward = (forward_fn)dlsym(lib, "ntp_model_forward");
  error_fn last_error = (error_fn)dlsym(lib, "ntp_model_last_error");
  destroy_fn destroy = (destroy_fn)dlsym(lib, "ntp_model_destroy");
  if (!get_info || !create || !set_param || !forward || !last_error || !destroy) {
    fprintf(stderr, "bench_model: %s is not an ntp model library\n", o->model);
    return 1;
  }
  const ntp_model_info *info;
  if (get_info(&info) != 0 || info->abi_version != NTP_MODEL_ABI_VERSION) {
    fprintf(stderr, "bench_model: %s: ABI version %d, this driver knows %d\n", o->model, info ? info->abi_version : -1,
            NTP_MODEL_ABI_VERSION);
    return 1;
  }
  int64_t pelems = 0, vocab = 0;
  for (int i = 0; i < info->n_params; i++) {
    pelems += numel(&info->params[i]);
    const char *dot = strrchr(info->params[i].name, '.');
    if (dot && !strcmp(dot, ".wte") && (vocab == 0 || info->params[i].shape[0] < vocab)) vocab = info->params[i].shape[0];
  }
  printf("model %s: %d ranks, %d params (%.3fM elements), backend %s%s\n", info->name, info->world, info->n_params,
         (double)pelems / 1e6, o->backend, o->loopback && info->world > 1 ? " loopback" : "");

  ntp_model_options mo = {.backend = o->backend, .rank = -1, .device = o->device, .loopback = o->loopback, .seed = o->seed};
  ntp_model *m = NULL;
  double t0 = now_s();
  if (create(&mo, &m) != 0) {
    fprintf(stderr, "bench_model: create: %s\n", last_error());
    return 1;
  }
  double create_ms = (now_s() - t0) * 1e3;
  printf("create_ms=%.1f\n", create_ms);
  if (o->create_only) {
    destroy(m);
    return 0;
  }

  /* parameters: synthetic values, set once (forwards then skip the initialisation kernels) */
  t0 = now_s();
  for (int i = 0; i < info->n_params; i++) {
    const ntp_model_tensor_info *t = &info->params[i];
    float center, scale;
    synth_scale(t->name, t->ndim, t->shape, &center, &scale);
    DLTensor d;
    if (make_tensor(t, center, scale, 0, &d) != 0) {
      fprintf(stderr, "bench_model: out of memory\n");
      return 1;
    }
    int rc = set_param(m, t->name, &d);
    free(d.data);
    if (rc != 0) {
      fprintf(stderr, "bench_model: set_param %s: %s\n", t->name, last_error());
      return 1;
    }
  }
  printf("set_params_ms=%.1f\n", (now_s() - t0) * 1e3);

  DLTensor *ins = calloc((size_t)info->n_inputs + 1, sizeof *ins), *outs = calloc((size_t)info->n_outputs + 1, sizeof *outs);
  DLTensor **inp = calloc((size_t)info->n_inputs + 1, sizeof *inp), **outp = calloc((size_t)info->n_outputs + 1, sizeof *outp);
  if (!ins || !outs || !inp || !outp) return 1;
  for (int i = 0; i < info->n_inputs; i++) {
    if (make_tensor(&info->inputs[i], 0.0f, 1.0f, vocab ? vocab : 1000, &ins[i]) != 0) return 1;
    inp[i] = &ins[i];
  }
  int64_t out_bytes = 0;
  for (int i = 0; i < info->n_outputs; i++) {
    if (make_tensor(&info->outputs[i], 0.0f, 0.0f, 1, &outs[i]) != 0) return 1;
    outp[i] = &outs[i];
    out_bytes += numel(&info->outputs[i]) * (int64_t)esize(info->outputs[i].dtype);
  }
  /* warm-up: the first call also uploads the inputs; later calls keep them */
  for (int w = 0; w < (o->warmup > 0 ? o->warmup : 1); w++) {
    if (forward(m, w == 0 ? (const DLTensor *const *)inp : NULL, outp) != 0) {
      fprintf(stderr, "bench_model: forward: %s\n", last_error());
      return 1;
    }
  }
  double *ms = calloc((size_t)o->iters + 1, sizeof *ms);
  for (int i = 0; i < o->iters; i++) {
    t0 = now_s();
    if (forward(m, NULL, outp) != 0) {
      fprintf(stderr, "bench_model: forward: %s\n", last_error());
      return 1;
    }
    ms[i] = (now_s() - t0) * 1e3;
  }
  double mean, min, max;
  stats(ms, o->iters, &mean, &min, &max);
  int bad = 0;
  for (int i = 0; i < info->n_outputs; i++) bad += count_nonfinite(&outs[i], numel(&info->outputs[i]));
  printf("forward_e2e_ms_mean=%.3f\nforward_e2e_ms_min=%.3f\nforward_e2e_ms_max=%.3f\niters=%d\n", mean, min, max, o->iters);
  print_rate("tflops_e2e", o->flops, min);
  printf("output_bytes=%lld\nnonfinite_outputs=%d\n", (long long)out_bytes, bad);
  printf("summary: create %.1f ms; forward (host clock, outputs copied to the host each call) mean %.3f ms, min %.3f ms"
         " over %d; %.1f MB of outputs per call%s\n",
         create_ms, mean, min, o->iters, (double)out_bytes / 1e6, bad ? "; WARNING: non-finite outputs" : "");
  destroy(m);
  for (int i = 0; i < info->n_inputs; i++) free(ins[i].data);
  for (int i = 0; i < info->n_outputs; i++) free(outs[i].data);
  free(ins), free(outs), free(inp), free(outp), free(ms);
  dlclose(lib);
  return 0;
}

/* ---- direct mode ------------------------------------------------------------------------------ */

#ifdef NTP_BENCH_DIRECT
static int run_direct(const opts *o) {
  char err[1024] = "";
  int rc = 1;
  ntpc_session *s = ntpc_session_new();
  for (int i = 0; i < o->ndefines; i++)
    if (ntpc_define_str(s, o->defines[i]) != NTPC_OK) {
      fprintf(stderr, "bench_model: -D %s: %s\n", o->defines[i], ntpc_last_error(s));
      ntpc_session_free(s);
      return 2;
    }
  if (o->plan) ntpc_add_plan_file(s, o->plan);
  ntpc_set_world(s, o->world > 0 ? (int32_t)o->world : 0);
  bool cuda = strcmp(o->backend, "cuda") == 0;
  ntpc_want_cuda(s, cuda); /* the image then carries every rank's CUDA */
  double t0 = now_s();
  if (ntpc_compile_file(s, o->ntp) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    const char *why = ntpc_last_error(s);
    fprintf(stderr, "bench_model: %s does not compile%s%s\n", o->ntp, why && *why ? ": " : "", why && *why ? why : "");
    ntpc_session_free(s);
    return 1;
  }
  double compile_ms = (now_s() - t0) * 1e3;
  const sh_program *sp = ntpc_sharded(s);
  ntp_program *p = session_program(s, err, sizeof err);
  if (!p) {
    fprintf(stderr, "bench_model: %s\n", err);
    ntpc_session_free(s);
    return 1;
  }
  const ntp_module *m = &p->global;
  cg_module *cms = calloc((size_t)p->world, sizeof *cms); /* codegen again, to time it alone */
  ntp_cuda *c = NULL;
  ntp_sim *sim = NULL;
  ntp_cpu_result res = {0};
  double *dev = calloc((size_t)o->iters + 1, sizeof *dev), *host = calloc((size_t)o->iters + 1, sizeof *host);
  t0 = now_s();
  if (cuda)
    for (int32_t r = 0; r < p->world; r++)
      if (cg_generate(sp, r, &cms[r], err, sizeof err) != 0) goto done;
  double codegen_ms = (now_s() - t0) * 1e3;
  int64_t pelems = 0;
  for (size_t i = 0; i < m->n_ops; i++)
    if (m->ops[i].code == IR_PARAM) pelems += shape_numel(&m->values[m->ops[i].result].shape);
  printf("model %s: %d ranks, %.3fM parameter elements, backend %s%s (direct: the runtime without the model ABI)\n",
         m->name, p->world, (double)pelems / 1e6, o->backend, cuda && (o->loopback || p->world == 1) && p->world > 1 ? " loopback" : "");
  printf("compile_ms=%.1f\ncodegen_ms=%.1f\n", compile_ms, codegen_ms);

  t0 = now_s();
  if (cuda) {
    ntp_cuda_options co = {.loopback = o->loopback || p->world == 1, .device = o->device, .rank_hi = p->world};
    if (ntp_cuda_create(p, &co, &c, err, sizeof err) != 0) goto done;
  } else if (ntp_sim_new(p, &sim, err, sizeof err) != 0) {
    goto done;
  }
  double create_ms = (now_s() - t0) * 1e3;
  printf("create_ms=%.1f\n", create_ms);

  /* synthetic parameters and inputs, set once */
  t0 = now_s();
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code != IR_PARAM && op->code != IR_INPUT) continue;
    const ntp_value *v = &m->values[op->result];
    int64_t n = shape_numel(&v->shape);
    ntp_host_tensor h = {.name = v->name, .dtype = v->dtype, .shape = v->shape};
    if (v->dtype == NTP_I32) {
      int64_t range = op->attr.init.int_range > 0 ? op->attr.init.int_range : 1;
      h.i = malloc((size_t)(n ? n : 1) * sizeof *h.i);
      for (int64_t k = 0; h.i && k < n; k++) h.i[k] = (int32_t)((double)(urand() + 1.0f) * 0.5 * (double)range) % (int32_t)range;
    } else {
      float center = 0.0f, scale = 1.0f;
      if (op->code == IR_PARAM) synth_scale(v->name, v->shape.ndim, v->shape.dim, &center, &scale);
      h.f = malloc((size_t)(n ? n : 1) * sizeof *h.f);
      for (int64_t k = 0; h.f && k < n; k++) {
        float x = center + scale * urand();
        h.f[k] = v->dtype == NTP_BF16 ? ntp_bf16_bits_to_float(ntp_float_to_bf16_bits(x))
                 : v->dtype == NTP_FP16 ? ntp_f16_bits_to_float(ntp_float_to_f16_bits(x))
                                        : x;
      }
    }
    if (!h.f && !h.i) {
      snprintf(err, sizeof err, "out of memory");
      goto done;
    }
    int src = cuda ? ntp_cuda_set(c, op->result, &h, err, sizeof err) : ntp_sim_set(sim, op->result, &h, err, sizeof err);
    free(h.f);
    free(h.i);
    if (src != 0) goto done;
  }
  printf("set_params_ms=%.1f\n", (now_s() - t0) * 1e3);

  for (int w = 0; w < (o->warmup > 0 ? o->warmup : 1); w++) {
    ntp_cpu_result_free(&res);
    if ((cuda ? ntp_cuda_forward(c, o->seed, &res, err, sizeof err) : ntp_sim_forward(sim, o->seed, &res, err, sizeof err)) != 0)
      goto done;
  }
  for (int i = 0; i < o->iters; i++) {
    ntp_cpu_result_free(&res);
    t0 = now_s();
    if ((cuda ? ntp_cuda_forward(c, o->seed, &res, err, sizeof err) : ntp_sim_forward(sim, o->seed, &res, err, sizeof err)) != 0)
      goto done;
    host[i] = (now_s() - t0) * 1e3;
    dev[i] = res.seconds * 1e3;
  }
  double dmean, dmin, dmax, hmean, hmin, hmax;
  stats(dev, o->iters, &dmean, &dmin, &dmax);
  stats(host, o->iters, &hmean, &hmin, &hmax);
  int64_t bad = 0;
  for (size_t k = 0; k < res.n_outputs; k++) {
    int64_t n = shape_numel(&res.outputs[k].shape);
    for (int64_t e = 0; res.outputs[k].f && e < n; e++) bad += !isfinite(res.outputs[k].f[e]);
  }
  printf("forward_ms_mean=%.3f\nforward_ms_min=%.3f\nforward_ms_max=%.3f\n", dmean, dmin, dmax);
  printf("forward_call_ms_mean=%.3f\nforward_call_ms_min=%.3f\niters=%d\n", hmean, hmin, o->iters);
  print_rate("tflops", o->flops, dmean);
  print_rate("tflops_best", o->flops, dmin);
  printf("nonfinite_outputs=%lld\n", (long long)bad);
  char layers[16384] = "";
  if (cuda && ntp_cuda_layer_report(c, p, layers, sizeof layers, err, sizeof err) != 0) goto done;
  fputs(layers, stdout);
  printf("summary: create %.1f ms; forward %s time mean %.3f ms, min %.3f ms over %d; whole call (outputs assembled on "
         "the host) mean %.3f ms%s\n",
         create_ms, cuda ? "device (CUDA events)" : "cpu", dmean, dmin, o->iters, hmean,
         bad ? "; WARNING: non-finite outputs" : "");
  rc = 0;
done:
  if (rc) fprintf(stderr, "bench_model: %s\n", err[0] ? err : "failed");
  ntp_cpu_result_free(&res);
  ntp_cuda_free(c);
  ntp_sim_free(sim);
  for (int32_t r = 0; r < p->world; r++) cg_module_free(&cms[r]);
  free(cms);
  ntp_program_free(p);
  free(dev);
  free(host);
  ntpc_session_free(s);
  return rc;
}
#endif

static int usage(void) {
  fprintf(stderr,
          "usage: bench_model MODEL.so [--backend cuda|cpu] [--iters N] [--warmup N] [--create-only]\n"
          "                   [--flops F] [--device N] [--loopback] [--seed N]\n"
#ifdef NTP_BENCH_DIRECT
          "       bench_model --ntp FILE.ntp [-D NAME=VALUE]... [--plan F] [--world W] [same options]\n"
#endif
  );
  return 2;
}

int main(int argc, char **argv) {
  opts o = {.backend = "cuda", .iters = 10, .warmup = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--create-only")) o.create_only = 1;
    else if (!strcmp(a, "--loopback")) o.loopback = 1;
    else if (!strcmp(a, "--backend") && v) o.backend = v, i++;
    else if (!strcmp(a, "--iters") && v) o.iters = atoi(v), i++;
    else if (!strcmp(a, "--warmup") && v) o.warmup = atoi(v), i++;
    else if (!strcmp(a, "--flops") && v) o.flops = strtod(v, NULL), i++;
    else if (!strcmp(a, "--device") && v) o.device = atoi(v), i++;
    else if (!strcmp(a, "--seed") && v) o.seed = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--ntp") && v) o.ntp = v, i++;
    else if (!strcmp(a, "--plan") && v) o.plan = v, i++;
    else if (!strcmp(a, "--world") && v) o.world = atol(v), i++;
    else if (!strncmp(a, "-D", 2) && (a[2] || v) && o.ndefines < 64) o.defines[o.ndefines++] = a[2] ? a + 2 : argv[++i];
    else if (a[0] != '-' && !o.model) o.model = a;
    else return usage();
  }
  if (o.iters < 1 || (strcmp(o.backend, "cuda") && strcmp(o.backend, "cpu"))) return usage();
  if (o.ntp) {
#ifdef NTP_BENCH_DIRECT
    return run_direct(&o);
#else
    fprintf(stderr, "bench_model: --ntp needs the direct build (-DNTP_BENCH_DIRECT, linked with libntpc and libntprt)\n");
    return 2;
#endif
  }
  if (!o.model) return usage();
  return run_library(&o);
}
