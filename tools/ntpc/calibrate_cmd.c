/* calibrate_cmd.c — `ntpc calibrate`: measures the local GPU(s) and writes a device profile the
 * planner reads (`ntpc plan --profile FILE`). The measurements are the runtime's
 * (runtime/cuda/cuda_measure.h; the attention core through a compiled attention layer and the
 * backend's per-layer profiling); the fits and the text are the planner's (profile_write.c).
 * What is not measured comes from a base profile, and every line's comment says which. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "cuda_backend.h"
#include "cuda_measure.h"
#include "ntpc.h"
#include "outfile.h"
#include "planner.h"
#include "session_program.h"

static const char calibrate_usage[] =
    "usage: ntpc calibrate [-o FILE] [--quick] [--gpus N] [--base PROFILE] [--name NAME]\n"
    "\n"
    "Measures the local GPU and writes a device profile (docs/planner.md#calibration): cuBLASLt GEMM\n"
    "rates by shape (bf16, fp16, fp32) -> flops and gemm_efficiency; attention's tiled and GEMM kernels\n"
    "against each other by S -> attention_gemm_from (the crossover 'ntpc --gpu FILE' compiles by); the\n"
    "kernel it picks -> attention_efficiency; device copies and a streaming kernel -> memory_bandwidth and\n"
    "memory_efficiency; the launch gap -> kernel_launch; with 2 GPUs or more, NCCL all-reduce,\n"
    "reduce-scatter and all-gather from 64K to 256M -> their 'collective intra' lines. The rest comes\n"
    "from the base profile. Then: ntpc plan MODEL --world W --profile FILE.\n"
    "\n"
    "options:\n"
    "  -o FILE          the profile to write (default NAME.prof)\n"
    "  --quick          small shapes and few repetitions (seconds; for a check, not for planning)\n"
    "  --gpus N         GPUs for the collectives (default: every visible GPU; 1: none measured)\n"
    "  --base PROFILE   a built-in profile (h100, h200, a100, b200) or a profile file, for what is not\n"
    "                   measured (default: the built-in whose name the GPU's contains, else h100)\n"
    "  --name NAME      the profile's name (default BASE_calibrated)\n"
    "\n"
    "exit status: 0 written, 1 no GPU or a measurement failed, 2 usage\n";

static int usage_fail(const char *fmt, const char *arg) { return cli_usage_error("ntpc calibrate", fmt, arg); }

typedef struct calib {
  bool quick;
  int gpus;
  char device[96], date[32], measured[192]; /* measured: "measured on DEVICE at DATE" */
  plan_profile prof;                          /* the base, overwritten by what is measured */
  plan_profile_notes notes;
  char base[160];                             /* where the base came from */
  char err[1024];
} calib;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) { /* progress on stderr: the summary is stdout's */
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fflush(stderr);
}

/* "measured on DEVICE at DATE: what" into a note */
static void measured(char *note, size_t cap, const calib *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void measured(char *note, size_t cap, const calib *k, const char *fmt, ...) {
  int n = snprintf(note, cap, "%s: ", k->measured);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < cap) vsnprintf(note + n, cap - (size_t)n, fmt, ap);
  va_end(ap);
}

/* ---- GEMMs: the peak per dtype, and the efficiency curve by the smallest dimension ---------- */
static int calibrate_gemms(calib *k) {
  static const double full[] = {16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  static const double quick[] = {16, 64, 256};
  const double *pts = k->quick ? quick : full;
  int npts = k->quick ? 3 : 10;
  double wide = k->quick ? 256 : 4096; /* the long dims of a skinny GEMM */
  static const ntp_dtype dts[] = {NTP_BF16, NTP_FP16, NTP_FP32};
  double rate[3][10][2] = {{{0}}}, peak[3] = {0};
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < npts; i++)
      for (int shape = 0; shape < 2; shape++) { /* square x^3; skinny x by wide by wide */
        double x = pts[i], M = x, N = shape ? wide : x, K = shape ? wide : x;
        if (shape && x >= wide) continue;
        double flops = 2 * M * N * K, s;
        int iters = k->quick ? 2 : (int)fmin(200, fmax(5, 2e11 / flops));
        if (ntp_measure_gemm(0, dts[d], (int64_t)M, (int64_t)N, (int64_t)K, iters, &s, k->err, sizeof k->err) != 0)
          return -1;
        rate[d][i][shape] = flops / s;
        if (rate[d][i][shape] > peak[d]) peak[d] = rate[d][i][shape];
      }
  double x[40], y[40];
  int n = 0;
  for (int d = 0; d < 2; d++) /* the curve from the tensor-core dtypes, each against its own peak */
    for (int i = 0; i < npts; i++)
      for (int shape = 0; shape < 2; shape++)
        if (rate[d][i][shape] > 0) x[n] = pts[i], y[n++] = rate[d][i][shape] / peak[d];
  k->prof.gemm_eff = plan_fit_curve(x, y, n);
  measured(k->notes.gemm, sizeof k->notes.gemm, k,
           "cuBLASLt bf16 and fp16 GEMMs (square, and x by %.0f by %.0f), each dtype's rate / its best", wide, wide);
  for (int d = 0; d < 3; d++) {
    k->prof.flops[dts[d]] = peak[d];
    measured(k->notes.flops[dts[d]], sizeof k->notes.flops[0], k, "best cuBLASLt %s GEMM rate of %d shapes up to %.0f^3",
             dtype_name(dts[d]), 2 * npts - 1, pts[npts - 1]);
    say("calibrate: %s GEMM peak %.1f TFLOP/s\n", dtype_name(dts[d]), peak[d] / 1e12);
  }
  return 0;
}

/* ---- attention: the generated kernels, in a compiled attention layer on one GPU --------------- */

/* NAME=VALUE while one layer is compiled (the codegen reads it; VALUE NULL: unset), then the
 * value it had before */
typedef struct env_save {
  const char *name;
  char *old;
  bool had;
} env_save;
static env_save env_push(const char *name, const char *value) {
  const char *old = getenv(name);
  env_save e = {.name = name, .had = old != NULL, .old = old ? strdup(old) : NULL};
  if (value) setenv(name, value, 1);
  else unsetenv(name);
  return e;
}
static void env_pop(env_save *e) {
  if (e->had && e->old) setenv(e->name, e->old, 1);
  else unsetenv(e->name);
  free(e->old);
}

/* Does rank 0's code run an attention step as the GEMM baseline? */
static bool runs_attention_gemm(const ntp_program *p) {
  for (size_t i = 0; p->cuda && i < p->n_steps; i++)
    if (p->cuda[0].steps[i].kind == CG_ATTENTION_GEMM) return true;
  return false;
}

/* Device seconds of layer 0 (the attention layer, its projections included) of a causal bf16
 * model, best of the forwards after a warm-up, with attention's kernel chosen by the codegen's
 * setting `mode` (tiled, gemm; auto: from the sequence length `gemm_from` on, PLAN_ATTN_GEMM_NEVER:
 * never). A forced kernel that is not the one generated is an error: the shape would measure the
 * other one. */
static int attention_layer(calib *k, int64_t B, int64_t S, int64_t D, int64_t H, const char *mode, int64_t gemm_from,
                           double *seconds) {
  char src[512], from[32];
  snprintf(src, sizeof src,
           "model calibrate_attention {\n  dim B = %lld, S = %lld, D = %lld, H = %lld;\n  dtype bf16;\n"
           "  input x : bf16[B, S, D];\n  output y = attn: attention(x, heads = H, causal);\n}\n",
           (long long)B, (long long)S, (long long)D, (long long)H);
  if (!strcmp(mode, "auto") && gemm_from == PLAN_ATTN_GEMM_NEVER) mode = "tiled";
  snprintf(from, sizeof from, "%lld", (long long)gemm_from);
  env_save em = env_push("NTP_CUDA_ATTENTION", mode);
  env_save ef = env_push("NTP_CUDA_ATTENTION_GEMM_FROM", !strcmp(mode, "auto") && gemm_from > 0 ? from : NULL);
  ntpc_session *s = ntpc_session_new();
  ntp_program *p = NULL;
  ntp_cuda *c = NULL;
  int rc = -1;
  if (!s) goto done;
  ntpc_set_world(s, 1);
  ntpc_want_cuda(s, true);
  if (ntpc_compile_string(s, "calibrate_attention.ntp", src) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    snprintf(k->err, sizeof k->err, "the attention model did not compile (an internal error)");
    goto done;
  }
  if (!(p = session_program(s, k->err, sizeof k->err))) goto done;
  if (strcmp(mode, "auto") && runs_attention_gemm(p) != !strcmp(mode, "gemm")) {
    snprintf(k->err, sizeof k->err, "NTP_CUDA_ATTENTION=%s did not generate that kernel at B=%lld S=%lld D=%lld H=%lld", mode,
             (long long)B, (long long)S, (long long)D, (long long)H);
    goto done;
  }
  ntp_cuda_options co = {.loopback = 1, .rank_hi = 1};
  if (ntp_cuda_create(p, &co, &c, k->err, sizeof k->err) != 0 || ntp_cuda_profile_layers(c, true, k->err, sizeof k->err) != 0)
    goto done;
  size_t nl = p->global.n_layers + 1;
  double best = INFINITY, t[8] = {0};
  for (int i = 0; i < (k->quick ? 2 : 6); i++) { /* the first is a warm-up */
    if (nl > 8 || ntp_cuda_run(c, 0, NULL, k->err, sizeof k->err) != 0 ||
        ntp_cuda_layer_times(c, t, nl, k->err, sizeof k->err) != 0)
      goto done;
    if (i > 0 && t[0] < best) best = t[0];
  }
  *seconds = best;
  rc = 0;
done:
  ntp_cuda_free(c);
  ntp_program_free(p);
  ntpc_session_free(s);
  env_pop(&ef);
  env_pop(&em);
  return rc;
}

/* The attention core's seconds: the layer with the kernel the measured crossover picks, less its
 * four projection GEMMs (measured alone). */
static int attention_core(calib *k, int64_t B, int64_t S, int64_t D, int64_t H, double *core) {
  double best, g;
  if (attention_layer(k, B, S, D, H, "auto", k->prof.attn_gemm_from, &best) != 0 ||
      ntp_measure_gemm(0, NTP_BF16, B * S, D, D, k->quick ? 2 : 10, &g, k->err, sizeof k->err) != 0)
    return -1;
  double proj = 4 * g; /* Q, K, V and the output projection */
  *core = best - proj > best * 0.05 ? best - proj : best * 0.05;
  return 0;
}

/* attention_gemm_from: both forward kernels forced (tiled, gemm) on the same causal layers, at
 * each S doubling, their times summed over the head dims; the crossover is the smallest S from
 * which the GEMMs were faster at every S measured (never: not even at the largest). B = tokens / S,
 * so every S has the same positions; H heads keep the largest S's scores within the GEMMs' 1 GiB. */
static int calibrate_attention_kernels(calib *k) {
  static const int64_t full_s[] = {64, 128, 256, 512, 1024, 2048, 4096}, quick_s[] = {16, 32};
  static const int64_t full_hd[] = {64, 128}, quick_hd[] = {16};
  const int64_t *ss = k->quick ? quick_s : full_s, *hds = k->quick ? quick_hd : full_hd;
  int ns = k->quick ? 2 : 7, nh = k->quick ? 1 : 2;
  int64_t H = k->quick ? 2 : 4, tokens = k->quick ? 32 : 8192;
  double tiled[7] = {0}, gemm[7] = {0};
  for (int i = 0; i < ns; i++) {
    int64_t S = ss[i], B = tokens / S > 1 ? tokens / S : 1;
    for (int h = 0; h < nh; h++) {
      double t, g;
      if (attention_layer(k, B, S, H * hds[h], H, "tiled", 0, &t) != 0 ||
          attention_layer(k, B, S, H * hds[h], H, "gemm", 0, &g) != 0)
        return -1;
      tiled[i] += t, gemm[i] += g;
    }
    say("calibrate: attention S=%lld (B=%lld, %lld heads): tiled %.1f us, gemm %.1f us\n", (long long)S, (long long)B,
        (long long)H, tiled[i] * 1e6, gemm[i] * 1e6);
  }
  int64_t from = PLAN_ATTN_GEMM_NEVER;
  for (int i = ns - 1; i >= 0 && gemm[i] < tiled[i]; i--) from = ss[i];
  k->prof.attn_gemm_from = from;
  char hd_list[32] = "";
  for (int h = 0; h < nh; h++)
    snprintf(hd_list + strlen(hd_list), sizeof hd_list - strlen(hd_list), "%s%lld", h ? "/" : "", (long long)hds[h]);
  char won[64];
  if (from == PLAN_ATTN_GEMM_NEVER) snprintf(won, sizeof won, "the GEMMs were slower at S = %lld", (long long)ss[ns - 1]);
  else snprintf(won, sizeof won, "the GEMMs faster from S = %lld on", (long long)from);
  measured(k->notes.attn_gemm, sizeof k->notes.attn_gemm, k,
           "tiled vs gemm attention layers, causal bf16, hd %s, %lld heads, B*S = %lld, S = %lld..%lld doubling: %s", hd_list,
           (long long)H, (long long)tokens, (long long)ss[0], (long long)ss[ns - 1], won);
  if (from == PLAN_ATTN_GEMM_NEVER) say("calibrate: attention: the GEMMs lost at the largest S: never\n");
  else say("calibrate: attention: the GEMMs from S = %lld on\n", (long long)from);
  return 0;
}

static int calibrate_attention(calib *k) {
  static const int64_t full[][4] = {{8, 1024, 768, 12}, {4, 2048, 1024, 16}, {2, 4096, 2048, 16}};
  static const int64_t quick[][4] = {{1, 32, 32, 2}};
  const int64_t(*shapes)[4] = k->quick ? quick : full;
  int n = k->quick ? 1 : 3;
  double sum = 0;
  double peak = k->prof.flops[NTP_BF16];
  for (int i = 0; i < n; i++) {
    int64_t B = shapes[i][0], S = shapes[i][1], D = shapes[i][2];
    double core;
    if (attention_core(k, B, S, D, shapes[i][3], &core) != 0) return -1;
    double flops = 4.0 * (double)B * (double)S * (double)S * (double)D * 0.5; /* causal: half of QK^T and PV */
    sum += flops / (core * peak);
  }
  double eff = sum / n;
  k->prof.attn_eff = eff > 1 ? 1 : eff < 1e-4 ? 1e-4 : eff;
  measured(k->notes.attn, sizeof k->notes.attn, k,
           "the generated causal attention kernels (bf16, %s; the kernel attention_gemm_from picks), their layer's time less "
           "its 4 projection GEMMs, / bf16 peak",
           k->quick ? "B=1 S=32 D=32 H=2" : "B*S*D = 8*1024*768, 4*2048*1024, 2*4096*2048");
  say("calibrate: attention efficiency %.3f\n", k->prof.attn_eff);
  return 0;
}

/* ---- memory and launches --------------------------------------------------------------------- */
static int calibrate_memory(calib *k) {
  size_t bytes = k->quick ? (4u << 20) : ((size_t)1 << 30);
  int iters = k->quick ? 2 : 20;
  double tc, ts, tl;
  if (ntp_measure_copy(0, bytes, iters, &tc, k->err, sizeof k->err) != 0 ||
      ntp_measure_stream(0, bytes, iters, &ts, k->err, sizeof k->err) != 0 ||
      ntp_measure_launch(0, k->quick ? 100 : 5000, &tl, k->err, sizeof k->err) != 0)
    return -1;
  double copy = 2.0 * (double)bytes / tc, stream = 2.0 * (double)bytes / ts; /* read + write */
  double bw = copy > stream ? copy : stream;
  k->prof.mem_bw = bw;
  k->prof.mem_eff = stream / bw < 1e-4 ? 1e-4 : stream / bw;
  k->prof.launch = tl;
  measured(k->notes.mem_bw, sizeof k->notes.mem_bw, k, "device-to-device copy of %zu MiB (read + write bytes / time)%s",
           bytes >> 20, copy >= stream ? "" : " (the streaming kernel was faster: its rate)");
  measured(k->notes.mem_eff, sizeof k->notes.mem_eff, k, "an fp32 streaming kernel (y = 2x + 1) / the copy's bandwidth");
  measured(k->notes.launch, sizeof k->notes.launch, k, "empty kernels launched back to back, gap per launch (no graphs)");
  say("calibrate: copy %.0f GB/s, streaming kernel %.0f GB/s, launch gap %.2f us\n", copy / 1e9, stream / 1e9, tl * 1e6);
  return 0;
}

/* ---- collectives (intra-node) ---------------------------------------------------------------- */
static int calibrate_collectives(calib *k) {
  static const double full[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
  static const double quick[] = {64 << 10, 1 << 20};
  const double *sizes = k->quick ? quick : full;
  int ns = k->quick ? 2 : 7, n = k->gpus;
  static const plan_coll to_plan[] = {COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER};
  for (int kind = 0; kind < NTP_MEASURE_NCOLLS; kind++) {
    const char *name = ntp_measure_coll_name((ntp_measure_coll)kind);
    char *note = k->notes.coll[PLAN_INTRA][to_plan[kind]];
    size_t cap = sizeof k->notes.coll[0][0];
    /* the latency: a message of 8 bytes per rank, first in the list */
    size_t at[8] = {(size_t)16 * (size_t)n};
    for (int i = 0; i < ns; i++) at[i + 1] = (size_t)sizes[i];
    double secs[8], *t = secs + 1;
    char why[512];
    if (ntp_measure_collective(n, (ntp_measure_coll)kind, at, ns + 1, k->quick ? 2 : 20, secs, why, sizeof why) != 0) {
      if (strstr(why, "libnccl lacks")) { /* a collective this NCCL does not have: the base's line */
        snprintf(note, cap, "from %s; not measured: %.180s", k->base, why);
        say("calibrate: %s not measured: %s\n", name, why);
        continue;
      }
      snprintf(k->err, sizeof k->err, "%s: %s", name, why);
      return -1;
    }
    double lat = secs[0];
    double traffic = (kind == NTP_MEASURE_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n; /* bytes each rank sends, per byte */
    k->prof.lat[PLAN_INTRA][to_plan[kind]] = lat;
    k->prof.eff[PLAN_INTRA][to_plan[kind]] =
        plan_fit_collective(sizes, t, ns, traffic, k->prof.link_bw[PLAN_INTRA], lat);
    measured(note, cap, k, "NCCL %s over %d GPUs, bf16; efficiency against 'link intra'", name, n);
    say("calibrate: %s over %d GPUs: latency %.1f us, %.0f GB/s bus at %.0f MiB\n", name, n, lat * 1e6,
        traffic * sizes[ns - 1] / t[ns - 1] / 1e9, sizes[ns - 1] / 1048576.0);
  }
  return 0;
}

/* ---- the base profile and the notes of what is not measured ---------------------------------- */
static int load_base(calib *k, const char *base) {
  const char *pick = base ? base : plan_profile_closest(k->device);
  struct stat sb;
  if (base && (strchr(base, '/') || stat(base, &sb) == 0)) {
    if (!plan_profile_load(base, &k->prof, k->err, sizeof k->err)) return -1;
    snprintf(k->base, sizeof k->base, "the base profile %s", base);
  } else {
    if (!pick) pick = "h100";
    if (!plan_profile_builtin(pick, &k->prof)) {
      snprintf(k->err, sizeof k->err, "unknown base profile '%s' (built-in: h100, h200, a100, b200; or a file)", pick);
      return -1;
    }
    snprintf(k->base, sizeof k->base, "built-in %s%s (profiles/%s.prof: datasheet or assumption, see there)", pick,
             base || plan_profile_closest(k->device) ? "" : ", no built-in matches the GPU's name", pick);
  }
  plan_profile_notes *nt = &k->notes;
  char from[200];
  snprintf(from, sizeof from, "from %s", k->base);
#define FROM(field) snprintf(field, sizeof field, "%s", from)
  for (int d = 0; d < NTP_DTYPE_COUNT; d++) FROM(nt->flops[d]);
  FROM(nt->gemm); FROM(nt->attn); FROM(nt->attn_gemm); FROM(nt->mem_bw); FROM(nt->mem_cap); FROM(nt->mem_eff); FROM(nt->launch);
  for (int lv = 0; lv < PLAN_NLEVELS; lv++) {
    FROM(nt->link[lv]);
    for (int c = 0; c < PLAN_NCOLLS; c++) FROM(nt->coll[lv][c]);
  }
#undef FROM
  return 0;
}

static int write_profile(calib *k, const char *path) {
  ntp_outfile out;
  char err[512];
  if (ntp_outfile_open(&out, path, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc calibrate: error: %s\n", err);
    return 2;
  }
  bool ok = plan_profile_write(out.f, &k->prof, &k->notes);
  if (ntp_outfile_commit(&out, ok, err, sizeof err) != 0) {
    fprintf(stderr, "ntpc calibrate: error: %s\n", err);
    return 2;
  }
  plan_profile back; /* what the planner will read */
  if (!plan_profile_load(path, &back, err, sizeof err)) {
    fprintf(stderr, "ntpc calibrate: internal error: the written profile does not read back: %s\n", err);
    return 3;
  }
  return 0;
}

/* The command line into k and the -o, --base and --name it gives; then what can be checked before
 * any GPU is asked for. -1, or the exit status. */
static int parse_args(int argc, char **argv, calib *k, const char **out, const char **base, const char **name) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    double num;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(calibrate_usage, stdout);
      return 0;
    } else if (!strcmp(a, "--quick")) k->quick = true;
    else if ((v = cli_option_value(argc, argv, &i, "-o", &missing))) *out = v;
    else if ((v = cli_option_value(argc, argv, &i, "--base", &missing))) *base = v;
    else if ((v = cli_option_value(argc, argv, &i, "--name", &missing))) *name = v;
    else if ((v = cli_option_value(argc, argv, &i, "--gpus", &missing))) {
      if (!cli_number(v, 1, 1024, &num) || num != floor(num)) return usage_fail("--gpus needs a count of 1 or more, got '%s'", v);
      k->gpus = (int)num;
    } else {
      return missing ? usage_fail("option '%s' needs a value", a) : usage_fail("unexpected argument '%s'", a);
    }
  }
  if (*name && (strlen(*name) >= sizeof k->prof.name || !(*name)[0] || strpbrk(*name, " \t#")))
    return usage_fail("--name needs a word of at most 31 characters, got '%s'", *name);
  /* the arguments first: a bad --base or -o is a usage error, found before any GPU is asked for */
  if (*base && load_base(k, *base) != 0) return usage_fail("--base: %s", k->err);
  if (*out) {
    ntp_outfile probe;
    char why[512];
    if (ntp_outfile_open(&probe, *out, NULL, why, sizeof why) != 0) return usage_fail("-o: %s", why);
    ntp_outfile_abort(&probe);
  }
  return -1;
}

/* GPU 0's name and memory (*mem: 0 unknown), the GPUs for the collectives, the date, and the base
 * profile closest to the GPU unless --base gave one. -1, or the exit status (1: no GPU, or
 * too few; the message printed). */
static int find_gpus(calib *k, const char *base, double *mem) {
  int ndev = 0;
  if (ntp_measure_devices(&ndev, k->err, sizeof k->err) != 0 || ndev == 0) {
    fprintf(stderr, "ntpc calibrate: error: no GPU to calibrate: %s\n", ndev == 0 && !k->err[0] ? "0 devices" : k->err);
    return 1;
  }
  if (ntp_measure_device_info(0, k->device, sizeof k->device, mem, k->err, sizeof k->err) != 0) {
    fprintf(stderr, "ntpc calibrate: error: %s\n", k->err);
    return 1;
  }
  if (!k->device[0]) snprintf(k->device, sizeof k->device, "GPU 0 (cudart gives no name)");
  if (k->gpus < 0) k->gpus = ndev;
  if (k->gpus > ndev) {
    fprintf(stderr, "ntpc calibrate: error: --gpus %d, but %d GPUs are visible\n", k->gpus, ndev);
    return 1;
  }
  time_t now = time(NULL);
  strftime(k->date, sizeof k->date, "%Y-%m-%dT%H:%MZ", gmtime(&now));
  snprintf(k->measured, sizeof k->measured, "measured on %s at %s%s", k->device, k->date, k->quick ? " (--quick)" : "");
  if (!base && load_base(k, NULL) != 0) { /* the built-in closest to the GPU's name */
    fprintf(stderr, "ntpc calibrate: error: %s\n", k->err);
    return 1;
  }
  say("calibrate: %s (%d visible), base %s\n", k->device, ndev, k->base);
  return -1;
}

/* Every measurement into the profile and its notes; mem: the GPU's memory (0: unknown, the
 * base's). 0, or -1 with the message in k->err. */
static int measure_all(calib *k, double mem) {
  if (calibrate_gemms(k) != 0 || calibrate_attention_kernels(k) != 0 || calibrate_attention(k) != 0 ||
      calibrate_memory(k) != 0)
    return -1;
  if (mem > 0) {
    k->prof.mem_capacity = mem;
    measured(k->notes.mem_cap, sizeof k->notes.mem_cap, k, "cudaMemGetInfo's total");
  }
  if (k->gpus >= 2 && calibrate_collectives(k) != 0) return -1;
  if (k->gpus < 2)
    for (int c = 0; c < PLAN_NCOLLS; c++)
      snprintf(k->notes.coll[PLAN_INTRA][c], sizeof k->notes.coll[0][0], "from %s (one GPU: no collective measured)", k->base);
  return 0;
}

/* The profile's device, its name (--name, else the closest built-in's + _calibrated) and the
 * header that says how it was made. */
static void name_profile(calib *k, const char *name) {
  snprintf(k->prof.device, sizeof k->prof.device, "%s", k->device);
  char pname[32];
  snprintf(pname, sizeof pname, "%.16s_calibrated", plan_profile_closest(k->device) ? plan_profile_closest(k->device) : "gpu");
  snprintf(k->prof.name, sizeof k->prof.name, "%s", name ? name : pname);
  snprintf(k->notes.header, sizeof k->notes.header,
           "Written by ntpc calibrate, %s. Each line's comment says where its figure comes from.\n"
           "%sUse: ntpc plan MODEL --world W --profile THIS_FILE; ntpc run MODEL --backend cuda --gpu THIS_FILE",
           k->measured, k->quick ? "--quick: small shapes and few repetitions, a check of the tool, not for planning.\n" : "");
}

int ntpc_calibrate_command(int argc, char **argv) {
  calib *k = calloc(1, sizeof *k);
  const char *out = NULL, *base = NULL, *name = NULL;
  int rc;
  if (!k) return 2;
  k->gpus = -1;
  double mem = 0;
  if ((rc = parse_args(argc, argv, k, &out, &base, &name)) >= 0 || (rc = find_gpus(k, base, &mem)) >= 0) goto done;
  if (measure_all(k, mem) != 0) {
    fprintf(stderr, "ntpc calibrate: error: %s\n", k->err);
    rc = 1;
    goto done;
  }
  name_profile(k, name);
  char def_path[48]; /* NAME.prof: NAME is at most 31 characters */
  snprintf(def_path, sizeof def_path, "%s.prof", k->prof.name);
  const char *path = out ? out : def_path;
  if ((rc = write_profile(k, path)) == 0) printf("calibrate: wrote %s (profile '%s', %s)\n", path, k->prof.name, k->measured);
done:
  free(k);
  return rc;
}
