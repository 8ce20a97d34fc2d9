/* profiles.c — device profiles: the text format's parser and the built-in profiles.
 *
 * The built-in profiles are the texts of the files in profiles/, compiled in (a test checks that the
 * two agree byte for byte), so a built-in and its file always give the same numbers. Each
 * figure carries its source in a comment: NVIDIA datasheets, or "assumption". */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

static const char prof_h100[] =
    "# ntp device profile: NVIDIA H100 SXM 80GB (one GPU of an 8-GPU HGX/DGX H100 node).\n"
    "# Format: docs/planner.md#profile-format. Units: FLOP/s, bytes, bytes/s, seconds; sizes in\n"
    "# curves take K, M, G (powers of 1024). Every figure says where it comes from: datasheet\n"
    "# figures are NVIDIA's; \"assumption\" figures are typical values, to be replaced by measurement.\n"
    "name h100\n"
    "device NVIDIA H100 SXM 80GB\n"
    "\n"
    "flops bf16 989e12        # NVIDIA H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense\n"
    "flops fp16 989e12        # NVIDIA H100 datasheet: FP16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense\n"
    "flops fp32 67e12         # NVIDIA H100 datasheet: FP32 67 TFLOPS (CUDA cores; fp32 models do not use TF32)\n"
    "\n"
    "# assumption: fraction of peak a cuBLAS GEMM reaches, by its smallest dimension (M, N or K)\n"
    "gemm_efficiency 16:0.04 32:0.10 64:0.22 128:0.40 256:0.58 512:0.70 1024:0.76 4096:0.80\n"
    "# assumption: FlashAttention-3 (Shah et al., 2024) reports up to 75% of peak on H100 in BF16;\n"
    "# 0.55 for the mixed head sizes and sequence lengths of real layers\n"
    "attention_efficiency 0.55\n"
    "\n"
    "memory_bandwidth 3.35e12 # NVIDIA H100 datasheet: GPU memory bandwidth 3.35 TB/s (HBM3)\n"
    "memory_capacity 80e9     # NVIDIA H100 datasheet: GPU memory 80 GB\n"
    "memory_efficiency 0.85   # assumption: fraction of peak bandwidth a streaming kernel reaches\n"
    "kernel_launch 4e-6       # assumption: launch and scheduling gap per kernel, no CUDA graphs\n"
    "\n"
    "link intra 450e9         # NVIDIA H100 datasheet: NVLink 900 GB/s (both directions) = 450 GB/s each way\n"
    "link inter 50e9          # DGX H100 datasheet: one 400 Gb/s ConnectX-7 (InfiniBand NDR) per GPU = 50 GB/s\n"
    "\n"
    "# collective LEVEL KIND LATENCY SIZE:EFFICIENCY...  (efficiency: fraction of the link bandwidth\n"
    "# reached at that message size). assumption: the shape of typical nccl-tests curves (NCCL ring\n"
    "# and NVLS algorithms; about 360 GB/s all-reduce bus bandwidth on 8 NVLink-4 GPUs).\n"
    "collective intra all-reduce      12e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra reduce-scatter  10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra all-gather      10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra all-to-all      15e-6 64K:0.04 1M:0.30 16M:0.60 256M:0.70\n"
    "collective intra send-recv       8e-6  64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective inter all-reduce      25e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter reduce-scatter  20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-gather      20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-to-all      30e-6 64K:0.04 1M:0.30 16M:0.70 256M:0.80\n"
    "collective inter send-recv       15e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n";

static const char prof_h200[] =
    "# ntp device profile: NVIDIA H200 SXM 141GB (one GPU of an 8-GPU HGX/DGX H200 node).\n"
    "# Format: docs/planner.md#profile-format. Units: FLOP/s, bytes, bytes/s, seconds; sizes in\n"
    "# curves take K, M, G (powers of 1024). Every figure says where it comes from: datasheet\n"
    "# figures are NVIDIA's; \"assumption\" figures are typical values, to be replaced by measurement.\n"
    "name h200\n"
    "device NVIDIA H200 SXM 141GB\n"
    "\n"
    "flops bf16 989e12        # NVIDIA H200 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense\n"
    "flops fp16 989e12        # NVIDIA H200 datasheet: FP16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense\n"
    "flops fp32 67e12         # NVIDIA H200 datasheet: FP32 67 TFLOPS (CUDA cores; fp32 models do not use TF32)\n"
    "\n"
    "# assumption: fraction of peak a cuBLAS GEMM reaches, by its smallest dimension (M, N or K)\n"
    "gemm_efficiency 16:0.04 32:0.10 64:0.22 128:0.40 256:0.58 512:0.70 1024:0.76 4096:0.80\n"
    "# assumption: FlashAttention-3 (Shah et al., 2024) reports up to 75% of peak on H100 in BF16 (same SM as H200);\n"
    "# 0.55 for the mixed head sizes and sequence lengths of real layers\n"
    "attention_efficiency 0.55\n"
    "\n"
    "memory_bandwidth 4.8e12  # NVIDIA H200 datasheet: GPU memory bandwidth 4.8 TB/s (HBM3e)\n"
    "memory_capacity 141e9    # NVIDIA H200 datasheet: GPU memory 141 GB\n"
    "memory_efficiency 0.85   # assumption: fraction of peak bandwidth a streaming kernel reaches\n"
    "kernel_launch 4e-6       # assumption: launch and scheduling gap per kernel, no CUDA graphs\n"
    "\n"
    "link intra 450e9         # NVIDIA H200 datasheet: NVLink 900 GB/s (both directions) = 450 GB/s each way\n"
    "link inter 50e9          # DGX H200 datasheet: one 400 Gb/s ConnectX-7 (InfiniBand NDR) per GPU = 50 GB/s\n"
    "\n"
    "# collective LEVEL KIND LATENCY SIZE:EFFICIENCY...  (efficiency: fraction of the link bandwidth\n"
    "# reached at that message size). assumption: the shape of typical nccl-tests curves (NCCL ring\n"
    "# and NVLS algorithms; about 360 GB/s all-reduce bus bandwidth on 8 NVLink-4 GPUs, as on H100).\n"
    "collective intra all-reduce      12e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra reduce-scatter  10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra all-gather      10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective intra all-to-all      15e-6 64K:0.04 1M:0.30 16M:0.60 256M:0.70\n"
    "collective intra send-recv       8e-6  64K:0.05 1M:0.35 16M:0.70 256M:0.80\n"
    "collective inter all-reduce      25e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter reduce-scatter  20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-gather      20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-to-all      30e-6 64K:0.04 1M:0.30 16M:0.70 256M:0.80\n"
    "collective inter send-recv       15e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n";

static const char prof_a100[] =
    "# ntp device profile: NVIDIA A100 SXM 80GB (one GPU of an 8-GPU HGX/DGX A100 node).\n"
    "# Format: docs/planner.md#profile-format. Units: FLOP/s, bytes, bytes/s, seconds; sizes in\n"
    "# curves take K, M, G (powers of 1024). Every figure says where it comes from: datasheet\n"
    "# figures are NVIDIA's; \"assumption\" figures are typical values, to be replaced by measurement.\n"
    "name a100\n"
    "device NVIDIA A100 SXM 80GB\n"
    "\n"
    "flops bf16 312e12        # NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)\n"
    "flops fp16 312e12        # NVIDIA A100 datasheet: FP16 Tensor Core 312 TFLOPS (624 with sparsity)\n"
    "flops fp32 19.5e12       # NVIDIA A100 datasheet: FP32 19.5 TFLOPS (CUDA cores; fp32 models do not use TF32)\n"
    "\n"
    "# assumption: fraction of peak a cuBLAS GEMM reaches, by its smallest dimension (M, N or K)\n"
    "gemm_efficiency 16:0.04 32:0.10 64:0.22 128:0.40 256:0.58 512:0.70 1024:0.76 4096:0.80\n"
    "# assumption: FlashAttention-2 (Dao, 2023) reports 50-73% of peak on A100\n"
    "attention_efficiency 0.55\n"
    "\n"
    "memory_bandwidth 2.039e12 # NVIDIA A100 datasheet: GPU memory bandwidth 2,039 GB/s (HBM2e, 80GB SXM)\n"
    "memory_capacity 80e9      # NVIDIA A100 datasheet: GPU memory 80 GB\n"
    "memory_efficiency 0.85    # assumption: fraction of peak bandwidth a streaming kernel reaches\n"
    "kernel_launch 4e-6        # assumption: launch and scheduling gap per kernel, no CUDA graphs\n"
    "\n"
    "link intra 300e9          # NVIDIA A100 datasheet: NVLink 600 GB/s (both directions) = 300 GB/s each way\n"
    "link inter 25e9           # DGX A100 datasheet: one 200 Gb/s ConnectX-6 (InfiniBand HDR) per GPU = 25 GB/s\n"
    "\n"
    "# collective LEVEL KIND LATENCY SIZE:EFFICIENCY...  (efficiency: fraction of the link bandwidth\n"
    "# reached at that message size). assumption: the shape of typical nccl-tests curves (about\n"
    "# 230 GB/s all-reduce bus bandwidth on 8 NVLink-3 GPUs).\n"
    "collective intra all-reduce      12e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.78\n"
    "collective intra reduce-scatter  10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.78\n"
    "collective intra all-gather      10e-6 64K:0.05 1M:0.35 16M:0.70 256M:0.78\n"
    "collective intra all-to-all      15e-6 64K:0.04 1M:0.30 16M:0.60 256M:0.70\n"
    "collective intra send-recv       8e-6  64K:0.05 1M:0.35 16M:0.70 256M:0.78\n"
    "collective inter all-reduce      25e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter reduce-scatter  20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-gather      20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-to-all      30e-6 64K:0.04 1M:0.30 16M:0.70 256M:0.80\n"
    "collective inter send-recv       15e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n";

static const char prof_b200[] =
    "# ntp device profile: NVIDIA B200 (one GPU of an 8-GPU HGX/DGX B200 node, 1000 W).\n"
    "# Format: docs/planner.md#profile-format. Units: FLOP/s, bytes, bytes/s, seconds; sizes in\n"
    "# curves take K, M, G (powers of 1024). Every figure says where it comes from: datasheet\n"
    "# figures are NVIDIA's; \"assumption\" figures are typical values, to be replaced by measurement.\n"
    "name b200\n"
    "device NVIDIA B200 180GB\n"
    "\n"
    "flops bf16 2250e12       # NVIDIA DGX B200 datasheet: FP16/BF16 Tensor Core 36 PFLOPS with sparsity for 8 GPUs = 2.25 PFLOPS dense per GPU\n"
    "flops fp16 2250e12       # NVIDIA DGX B200 datasheet: as BF16\n"
    "flops fp32 80e12         # NVIDIA Blackwell architecture technical brief (HGX B200): FP32 80 TFLOPS\n"
    "\n"
    "# assumption: fraction of peak a cuBLAS GEMM reaches, by its smallest dimension (M, N or K)\n"
    "gemm_efficiency 16:0.04 32:0.10 64:0.22 128:0.40 256:0.58 512:0.70 1024:0.76 4096:0.80\n"
    "# assumption: below Hopper's 0.55 while attention kernels for Blackwell mature\n"
    "attention_efficiency 0.50\n"
    "\n"
    "memory_bandwidth 8e12    # NVIDIA DGX B200 datasheet: 64 TB/s HBM3e for 8 GPUs = 8 TB/s per GPU\n"
    "memory_capacity 180e9    # NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs = 180 GB per GPU (the B200 package has 192 GB; HGX/DGX B200 expose 180 GB)\n"
    "memory_efficiency 0.85   # assumption: fraction of peak bandwidth a streaming kernel reaches\n"
    "kernel_launch 4e-6       # assumption: launch and scheduling gap per kernel, no CUDA graphs\n"
    "\n"
    "link intra 900e9         # NVIDIA DGX B200 datasheet: NVLink 5, 1.8 TB/s per GPU (both directions) = 900 GB/s each way\n"
    "link inter 50e9          # NVIDIA DGX B200 datasheet: 8 single-port 400 Gb/s ConnectX-7 (InfiniBand NDR), one per GPU = 50 GB/s\n"
    "\n"
    "# collective LEVEL KIND LATENCY SIZE:EFFICIENCY...  (efficiency: fraction of the link bandwidth\n"
    "# reached at that message size). assumption: the shape of the Hopper curves, on NVLink 5.\n"
    "collective intra all-reduce      12e-6 64K:0.04 1M:0.30 16M:0.65 256M:0.80\n"
    "collective intra reduce-scatter  10e-6 64K:0.04 1M:0.30 16M:0.65 256M:0.80\n"
    "collective intra all-gather      10e-6 64K:0.04 1M:0.30 16M:0.65 256M:0.80\n"
    "collective intra all-to-all      15e-6 64K:0.03 1M:0.25 16M:0.55 256M:0.70\n"
    "collective intra send-recv       8e-6  64K:0.04 1M:0.30 16M:0.65 256M:0.80\n"
    "collective inter all-reduce      25e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter reduce-scatter  20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-gather      20e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n"
    "collective inter all-to-all      30e-6 64K:0.04 1M:0.30 16M:0.70 256M:0.80\n"
    "collective inter send-recv       15e-6 64K:0.05 1M:0.40 16M:0.80 256M:0.90\n";

static const struct {
  const char *name, *alias, *text;
} builtins[] = {
    {"h100", "h100-sxm", prof_h100},
    {"h200", "h200-sxm", prof_h200},
    {"a100", "a100-80gb", prof_a100},
    {"b200", "b200-hgx", prof_b200},
};
#define NBUILTIN (sizeof builtins / sizeof builtins[0])

const char *const *plan_profile_names(void) {
  static const char *names[NBUILTIN + 1];
  for (size_t i = 0; i < NBUILTIN; i++) names[i] = builtins[i].name;
  names[NBUILTIN] = NULL;
  return names;
}

static int name_eq(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

const char *plan_profile_text(const char *name) {
  for (size_t i = 0; i < NBUILTIN; i++)
    if (name_eq(name, builtins[i].name) || name_eq(name, builtins[i].alias)) return builtins[i].text;
  return NULL;
}

bool plan_profile_builtin(const char *name, plan_profile *out) {
  const char *text = plan_profile_text(name);
  char err[256];
  return text && plan_profile_parse(text, name, out, err, sizeof err);
}

/* ---- the text format ---------------------------------------------------------------- */

const char *plan_coll_name(plan_coll c) { return c < PLAN_NCOLLS ? sh_comm_profile_key(c) : "?"; }

typedef struct parser {
  const char *file;
  int line;
  char *err;
  size_t cap;
  bool failed;
} parser;

static bool fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(parser *p, const char *fmt, ...) {
  if (p->failed) return false;
  p->failed = true;
  int n = snprintf(p->err, p->cap, "%s:%d: ", p->file, p->line);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < p->cap) vsnprintf(p->err + n, p->cap - (size_t)n, fmt, ap);
  va_end(ap);
  return false;
}

/* a positive (or, with zero_ok, non-negative) finite number; sizes may end in K, M, G, T (x1024) */
static bool number(parser *p, const char *tok, bool size, bool zero_ok, double *out) {
  char *end;
  errno = 0;
  double v = strtod(tok, &end);
  if (end == tok) return fail(p, "expected a number, got '%s'", tok);
  if (size && *end) {
    const char *units = "KMGT";
    const char *u = strchr(units, toupper((unsigned char)*end));
    if (u && end[1] == 0) {
      v *= pow(1024.0, (double)(u - units + 1));
      end++;
    }
  }
  if (*end || errno == ERANGE || !isfinite(v)) return fail(p, "'%s' is not a number", tok);
  if (v < 0 || (!zero_ok && v == 0)) return fail(p, "'%s' must be %s", tok, zero_ok ? "zero or more" : "positive");
  *out = v;
  return true;
}

static bool fraction(parser *p, const char *tok, double *out) {
  if (!number(p, tok, false, false, out)) return false;
  if (*out > 1) return fail(p, "efficiency '%s' must be at most 1", tok);
  if (*out < 1e-4) return fail(p, "efficiency '%s' must be at least 0.0001", tok);
  return true;
}

/* SIZE:FRACTION pairs, sizes increasing */
static bool curve(parser *p, char **tok, int n, plan_curve *c) {
  if (n < 1) return fail(p, "expected SIZE:EFFICIENCY pairs");
  if (n > PLAN_CURVE_MAX) return fail(p, "at most %d SIZE:EFFICIENCY pairs", PLAN_CURVE_MAX);
  plan_curve v = {0};
  for (int i = 0; i < n; i++) {
    char *colon = strchr(tok[i], ':');
    if (!colon) return fail(p, "expected SIZE:EFFICIENCY, got '%s'", tok[i]);
    *colon = 0;
    if (!number(p, tok[i], true, false, &v.x[i]) || !fraction(p, colon + 1, &v.y[i])) return false;
    if (i && v.x[i] <= v.x[i - 1]) return fail(p, "sizes must increase ('%s' after a larger one)", tok[i]);
    v.n++;
  }
  *c = v;
  return true;
}

/* attention_gemm_from's value: a sequence length (a positive integer), or never */
static bool gemm_from(parser *p, const char *tok, int64_t *out) {
  if (strcmp(tok, "never") == 0) {
    *out = PLAN_ATTN_GEMM_NEVER;
    return true;
  }
  char *end;
  errno = 0;
  long long v = strtoll(tok, &end, 10);
  if (end == tok || *end || errno == ERANGE || v < 1)
    return fail(p, "attention_gemm_from '%s': expected a sequence length (a positive integer) or 'never'", tok);
  *out = v;
  return true;
}

static int level_of(const char *s) {
  if (strcmp(s, "intra") == 0) return PLAN_INTRA;
  if (strcmp(s, "inter") == 0) return PLAN_INTER;
  return -1;
}

/* What a profile must set, as seen so far. */
typedef struct profile_seen {
  bool name, flops, bw, cap, link[PLAN_NLEVELS];
} profile_seen;

/* The line's fields, its comment ('#' on) dropped: how many, or -1 (reported) past 40. */
static int split_fields(parser *p, char *line, char **tok) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  int nt = 0;
  for (char *t = strtok(line, " \t\r"); t; t = strtok(NULL, " \t\r")) {
    if (nt == 40) {
      fail(p, "too many fields");
      return -1;
    }
    tok[nt++] = t;
  }
  return nt;
}

/* collective intra|inter KIND|* LATENCY SIZE:EFFICIENCY... ('*': every kind) */
static void collective_line(parser *p, char **tok, int nt, plan_profile *pr) {
  if (nt < 5) {
    fail(p, "expected: collective intra|inter KIND LATENCY SIZE:EFFICIENCY...");
    return;
  }
  int lv = level_of(tok[1]);
  if (lv < 0) {
    fail(p, "collective level must be 'intra' or 'inter', not '%s'", tok[1]);
    return;
  }
  int kind = -1;
  for (int c = 0; c < PLAN_NCOLLS; c++)
    if (strcmp(tok[2], plan_coll_name(c)) == 0) kind = c;
  if (kind < 0 && strcmp(tok[2], "*") != 0) {
    fail(p, "unknown collective '%s' (all-reduce, reduce-scatter, all-gather, all-to-all, send-recv or *)", tok[2]);
    return;
  }
  double lat;
  plan_curve c;
  if (!number(p, tok[3], false, true, &lat) || !curve(p, tok + 4, nt - 4, &c)) return;
  for (int k = 0; k < PLAN_NCOLLS; k++)
    if (kind < 0 || k == kind) {
      pr->lat[lv][k] = lat;
      pr->eff[lv][k] = c;
    }
}

/* the key as shown in the message: printable, at most 47 characters */
static void unknown_key(parser *p, const char *key) {
  char shown[48];
  size_t k = 0;
  for (; key[k] && k + 1 < sizeof shown; k++) shown[k] = isprint((unsigned char)key[k]) ? key[k] : '?';
  shown[k] = 0;
  fail(p, "unknown key '%s'", shown);
}

/* One line of nt > 0 fields: its key's value into pr (errors into p). */
static void profile_line(parser *p, char **tok, int nt, plan_profile *pr, profile_seen *seen) {
  const char *key = tok[0];
  if (strcmp(key, "name") == 0) {
    if (nt != 2) fail(p, "expected: name NAME");
    else if (strlen(tok[1]) >= sizeof pr->name) fail(p, "name '%s' is too long", tok[1]);
    else {
      snprintf(pr->name, sizeof pr->name, "%s", tok[1]);
      seen->name = true;
    }
  } else if (strcmp(key, "device") == 0) {
    if (nt < 2) fail(p, "expected: device DESCRIPTION");
    pr->device[0] = 0;
    for (int i = 1; i < nt; i++) {
      size_t len = strlen(pr->device);
      snprintf(pr->device + len, sizeof pr->device - len, "%s%s", i > 1 ? " " : "", tok[i]);
    }
  } else if (strcmp(key, "flops") == 0) {
    int dt = nt == 3 ? dtype_lookup(tok[1]) : -1;
    if (nt != 3) fail(p, "expected: flops DTYPE FLOP/S");
    else if (dt < 0 || !dtype_is_float((ntp_dtype)dt)) fail(p, "'%s' is not a float dtype (bf16, fp16, fp32)", tok[1]);
    else if (number(p, tok[2], false, false, &pr->flops[dt])) seen->flops = true;
  } else if (strcmp(key, "gemm_efficiency") == 0) {
    curve(p, tok + 1, nt - 1, &pr->gemm_eff);
  } else if (strcmp(key, "attention_efficiency") == 0) {
    if (nt != 2) fail(p, "expected: attention_efficiency FRACTION");
    else fraction(p, tok[1], &pr->attn_eff);
  } else if (strcmp(key, "attention_gemm_from") == 0) {
    if (nt != 2) fail(p, "expected: attention_gemm_from SEQUENCE_LENGTH|never");
    else gemm_from(p, tok[1], &pr->attn_gemm_from);
  } else if (strcmp(key, "memory_bandwidth") == 0) {
    if (nt != 2) fail(p, "expected: memory_bandwidth BYTES/S");
    else seen->bw = number(p, tok[1], false, false, &pr->mem_bw);
  } else if (strcmp(key, "memory_capacity") == 0) {
    if (nt != 2) fail(p, "expected: memory_capacity BYTES");
    else seen->cap = number(p, tok[1], true, false, &pr->mem_capacity);
  } else if (strcmp(key, "memory_efficiency") == 0) {
    if (nt != 2) fail(p, "expected: memory_efficiency FRACTION");
    else fraction(p, tok[1], &pr->mem_eff);
  } else if (strcmp(key, "kernel_launch") == 0) {
    if (nt != 2) fail(p, "expected: kernel_launch SECONDS");
    else number(p, tok[1], false, true, &pr->launch);
  } else if (strcmp(key, "link") == 0) {
    int lv = nt == 3 ? level_of(tok[1]) : -1;
    if (nt != 3) fail(p, "expected: link intra|inter BYTES/S");
    else if (lv < 0) fail(p, "link level must be 'intra' or 'inter', not '%s'", tok[1]);
    else seen->link[lv] = number(p, tok[2], false, false, &pr->link_bw[lv]);
  } else if (strcmp(key, "collective") == 0) {
    collective_line(p, tok, nt, pr);
  } else {
    unknown_key(p, key);
  }
}

bool plan_profile_parse(const char *text, const char *file, plan_profile *out, char *err, size_t cap) {
  parser p = {.file = file ? file : "<profile>", .err = err, .cap = cap};
  if (cap) err[0] = 0;
  plan_profile pr = {0};
  pr.attn_eff = 1;
  pr.mem_eff = 1;
  profile_seen seen = {0};
  const char *s = text;
  char line[1024];
  while (*s && !p.failed) {
    p.line++;
    size_t n = strcspn(s, "\n");
    if (n >= sizeof line) {
      fail(&p, "line too long");
      break;
    }
    memcpy(line, s, n);
    line[n] = 0;
    s += n + (s[n] == '\n');
    char *tok[40];
    int nt = split_fields(&p, line, tok);
    if (nt > 0) profile_line(&p, tok, nt, &pr, &seen);
  }
  if (p.failed) return false;
  p.line = 0;
  const char *missing = !seen.name ? "name" : !seen.flops ? "flops" : !seen.bw ? "memory_bandwidth" : !seen.cap ? "memory_capacity"
                        : !seen.link[PLAN_INTRA] ? "link intra" : !seen.link[PLAN_INTER] ? "link inter" : NULL;
  if (missing) {
    snprintf(err, cap, "%s: missing '%s'", p.file, missing);
    return false;
  }
  if (!pr.device[0]) snprintf(pr.device, sizeof pr.device, "%s", pr.name);
  *out = pr;
  return true;
}

bool plan_profile_load(const char *path, plan_profile *out, char *err, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "cannot open '%s': %s", path, strerror(errno));
    return false;
  }
  size_t len = 0, size = 4096;
  char *buf = malloc(size);
  size_t n;
  while (buf && (n = fread(buf + len, 1, size - len - 1, f)) > 0) {
    len += n;
    if (len + 1 == size) {
      char *nb = size < (1u << 24) ? realloc(buf, size * 2) : NULL;
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      size *= 2;
    }
  }
  bool bad = ferror(f) || !buf;
  fclose(f);
  if (bad) {
    snprintf(err, cap, "cannot read '%s'%s", path, buf ? "" : " (too large, or out of memory)");
    free(buf);
    return false;
  }
  buf[len] = 0;
  if (memchr(buf, 0, len)) {
    free(buf);
    snprintf(err, cap, "%s: not a text file", path);
    return false;
  }
  bool ok = plan_profile_parse(buf, path, out, err, cap);
  free(buf);
  return ok;
}

bool plan_profile_find(const char *name_or_file, plan_profile *out, char *err, size_t cap) {
  if (plan_profile_builtin(name_or_file, out)) return true;
  /* a path: it has a '/' or a '.' (no built-in name does), or a file of that name exists */
  FILE *f = fopen(name_or_file, "rb");
  bool path = f || strchr(name_or_file, '/') || strchr(name_or_file, '.');
  if (f) fclose(f);
  if (path) return plan_profile_load(name_or_file, out, err, cap);
  char names[128] = "";
  for (const char *const *n = plan_profile_names(); *n; n++)
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", *n);
  snprintf(err, cap, "unknown GPU '%s' (built-in profiles: %s; or a profile file)", name_or_file, names);
  return false;
}
