/* bench_kernels.c — the runtime's kernels against what the hardware does bare, in one run:
 *
 *   1. GEMMs: GPT-2's linear layers (B*S rows; QKV, output, MLP up and down, the head) compiled
 *      as one-layer models and run by the CUDA backend (cuBLASLt through the step list), against
 *      bare cuBLASLt on the same M, N, K (runtime/cuda/cuda_measure.c: one matmul, its own heuristic);
 *   2. fused kernels: a LayerNorm and an elementwise chain (y = x * 0.5 + z) against the measured
 *      device-to-device copy bandwidth (bytes each kernel must read and write / its time);
 *   3. host time per layer: GPT-2 at toy dims (the GPU work is a few microseconds), the wall clock
 *      of ntp_cuda_run per layer with the step list as a CUDA graph and with NTP_CUDA_GRAPHS=0.
 *
 * Parameters and inputs are set once (random, so no initialisation kernel runs in the timed
 * forwards); times are means of --iters forwards after a warm-up, device time from the backend's
 * events. Output: one table, and key=value lines for scripts (bench/gpu_all.sh).
 *
 *   bench_kernels [--iters N] [--quick]      (--quick: toy shapes, for the emulated GPU)
 * Exit status: 0 measured, or no GPU ("bench_kernels: no GPU: ..." on stdout); 1 a step failed. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "cuda_measure.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"

/* the key=value lines, printed after the table */
static char keys[4096];
static void key(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void key(const char *fmt, ...) {
  size_t len = strlen(keys);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(keys + len, sizeof keys - len, fmt, ap);
  va_end(ap);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct timing {
  double device_s, wall_s; /* means per forward */
  size_t layers;
} timing;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng_state >> 40) / 8388608.0 - 1.0);
}

/* Compiles a model (source text, or a file with -D defines), sets every input and parameter to
 * random values, and times `iters` forwards on GPU 0. */
static int time_model(const char *src, const char *file, const char *const *defines, int ndef, int iters, timing *t,
                      char *err, size_t cap) {
  ntpc_session *s = ntpc_session_new();
  ntp_program *p = NULL;
  ntp_cuda *c = NULL;
  int rc = -1;
  for (int i = 0; i < ndef; i++) ntpc_define_str(s, defines[i]);
  ntpc_set_world(s, 1);
  ntpc_want_cuda(s, true);
  if ((src ? ntpc_compile_string(s, "bench.ntp", src) : ntpc_compile_file(s, file)) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    snprintf(err, cap, "the model does not compile");
    goto done;
  }
  if (!(p = session_program(s, err, cap))) goto done;
  ntp_cuda_options co = {.loopback = 1, .rank_hi = 1};
  if (ntp_cuda_create(p, &co, &c, err, cap) != 0) goto done;
  const ntp_module *m = &p->global;
  for (size_t i = 0; i < m->n_ops; i++) {
    const ntp_op *op = &m->ops[i];
    if (op->code != IR_PARAM && op->code != IR_INPUT) continue;
    const ntp_value *v = &m->values[op->result];
    int64_t n = shape_numel(&v->shape);
    ntp_host_tensor h = {.name = v->name, .dtype = v->dtype, .shape = v->shape};
    if (v->dtype == NTP_I32) {
      int64_t range = op->attr.init.int_range > 0 ? op->attr.init.int_range : 1;
      h.i = malloc((size_t)(n ? n : 1) * sizeof *h.i);
      for (int64_t k = 0; h.i && k < n; k++) h.i[k] = (int32_t)(fabsf(urand()) * (float)range) % (int32_t)range;
    } else {
      h.f = malloc((size_t)(n ? n : 1) * sizeof *h.f);
      for (int64_t k = 0; h.f && k < n; k++) h.f[k] = 0.1f * urand();
    }
    int bad = (!h.f && !h.i) || ntp_cuda_set(c, op->result, &h, err, cap) != 0;
    free(h.f), free(h.i);
    if (bad) goto done;
  }
  double dev = 0, s0 = 0;
  if (ntp_cuda_run(c, 0, NULL, err, cap) != 0) goto done; /* warm-up (and the graph's capture) */
  s0 = now_s();
  for (int i = 0; i < iters; i++) {
    double d;
    if (ntp_cuda_run(c, 0, &d, err, cap) != 0) goto done;
    dev += d;
  }
  t->wall_s = (now_s() - s0) / iters;
  t->device_s = dev / iters;
  t->layers = m->n_layers;
  rc = 0;
done:
  ntp_cuda_free(c);
  ntp_program_free(p);
  ntpc_session_free(s);
  return rc;
}

int main(int argc, char **argv) {
  int iters = 20;
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = true;
    else {
      fprintf(stderr, "usage: bench_kernels [--iters N] [--quick]\n");
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  char err[1024];
  int ndev = 0;
  if (ntp_measure_devices(&ndev, err, sizeof err) != 0 || ndev == 0) {
    printf("bench_kernels: no GPU: nothing measured (%s)\n", ndev == 0 && err[0] == 0 ? "0 devices" : err);
    return 0;
  }
  /* 1. GEMMs: GPT-2 124M at B*S = 8192 rows */
  long rows = quick ? 64 : 8192, D = quick ? 32 : 768, V = quick ? 200 : 50257;
  struct { const char *what; long K, N; } g[] = {
      {"qkv", D, 3 * D}, {"attn out", D, D}, {"mlp up", D, 4 * D}, {"mlp down", 4 * D, D}, {"head", D, V}};
  printf("bench_kernels: GPU 0 of %d, %d forwards each%s\n\n", ndev, iters, quick ? " (--quick: toy shapes)" : "");
  printf("%-24s | %-22s | %-12s | %-12s | %s\n", "what", "shape", "ntp", "bare", "bare/ntp (speed ratio)");
  printf("%.24s-|-%.22s-|-%.12s-|-%.12s-|-%.22s\n", "------------------------", "----------------------", "------------",
         "------------", "----------------------");
  double worst_gemm = INFINITY;
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
    char src[512], shape[64];
    snprintf(src, sizeof src,
             "model gemm {\n  dim M = %ld, K = %ld, N = %ld;\n  dtype bf16;\n  input x : bf16[M, K];\n"
             "  output y = lin: linear(x, out = N);\n}\n",
             rows, g[i].K, g[i].N);
    timing t;
    double bare;
    if (time_model(src, NULL, NULL, 0, iters, &t, err, sizeof err) != 0 ||
        ntp_measure_gemm(0, NTP_BF16, rows, g[i].N, g[i].K, iters, &bare, err, sizeof err) != 0) {
      fprintf(stderr, "bench_kernels: GEMM %s: %s\n", g[i].what, err);
      return 1;
    }
    snprintf(shape, sizeof shape, "%ldx%ldx%ld bf16", rows, g[i].N, g[i].K);
    double r = bare / t.device_s;
    if (r < worst_gemm) worst_gemm = r;
    printf("GEMM %-19s | %-22s | %9.4f ms | %9.4f ms | %.3f\n", g[i].what, shape, t.device_s * 1e3, bare * 1e3, r);
    key("gemm_ratio_%zu=%.4f\n", i, r);
  }
  /* 2. fused kernels against the copy bandwidth */
  long B = quick ? 2 : 8, S = quick ? 16 : 1024;
  double elems = (double)B * (double)S * (double)D, copy_s;
  size_t copy_bytes = (size_t)(elems * 2);
  if (ntp_measure_copy(0, copy_bytes, iters, &copy_s, err, sizeof err) != 0) {
    fprintf(stderr, "bench_kernels: copy: %s\n", err);
    return 1;
  }
  double copy_bw = 2.0 * (double)copy_bytes / copy_s;
  struct { const char *what, *body; double bytes; } k[] = {
      {"layernorm", "input x : bf16[B, S, D];\n  output y = ln: layernorm(x);", 2 * elems * 2},
      {"elementwise x*0.5+z", "input x : bf16[B, S, D];\n  input z : bf16[B, S, D];\n  output y = x * 0.5 + z;", 3 * elems * 2}};
  for (size_t i = 0; i < 2; i++) {
    char src[512], shape[64];
    snprintf(src, sizeof src, "model kern {\n  dim B = %ld, S = %ld, D = %ld;\n  dtype bf16;\n  %s\n}\n", B, S, D, k[i].body);
    timing t;
    if (time_model(src, NULL, NULL, 0, iters, &t, err, sizeof err) != 0) {
      fprintf(stderr, "bench_kernels: %s: %s\n", k[i].what, err);
      return 1;
    }
    double bw = k[i].bytes / t.device_s;
    snprintf(shape, sizeof shape, "%ldx%ldx%ld bf16", B, S, D);
    printf("%-24s | %-22s | %7.0f GB/s | %7.0f GB/s | %.3f (ntp/copy bandwidth)\n", k[i].what, shape, bw / 1e9,
           copy_bw / 1e9, bw / copy_bw);
    key("kernel_ratio_%zu=%.4f\n", i, bw / copy_bw);
  }
  /* 3. host time per layer, with and without the CUDA graph */
  const char *toy[] = {"B=1", "S=16", "D=64", "H=2", "L=12", "V=256"};
  timing tg, tn;
  setenv("NTP_CUDA_GRAPHS", "1", 1);
  int a = time_model(NULL, "examples/gpt2.ntp", toy, 6, iters, &tg, err, sizeof err);
  setenv("NTP_CUDA_GRAPHS", "0", 1);
  if (a != 0 || time_model(NULL, "examples/gpt2.ntp", toy, 6, iters, &tn, err, sizeof err) != 0) {
    fprintf(stderr, "bench_kernels: host time (examples/gpt2.ntp, run from the repository root): %s\n", err);
    return 1;
  }
  unsetenv("NTP_CUDA_GRAPHS");
  double ug = tg.wall_s / (double)tg.layers * 1e6, un = tn.wall_s / (double)tn.layers * 1e6;
  printf("%-24s | %-22s | %9.2f us | %9.2f us | graphs / step by step, per layer (%zu layers)\n", "host time per layer",
         "GPT-2 toy, L=12", ug, un, tg.layers);
  key("host_us_per_layer_graphs=%.3f\nhost_us_per_layer_nographs=%.3f\n", ug, un);
  key("gemm_ratio_worst=%.4f\n", worst_gemm);
  printf("\n%s", keys);
  return 0;
}
