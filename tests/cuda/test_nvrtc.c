/* test_nvrtc.c — every example's generated CUDA, every rank, several plans, compiles with
 * NVRTC to sm_90 and sm_80 machine code with no warnings (no GPU needed). Identical
 * sources (ranks of equal shape) are compiled once. Exits 77 when NVRTC is absent.
 *
 *   test_nvrtc [--arch N] [--dump DIR]   N: only sm_N (80 or 90; default both); DIR: write each
 *                                         distinct source as DIR/<case>.r<rank>.cu
 * ctest runs one test per architecture, so that the two run side by side (this is the suite's
 * longest test: NVRTC's optimiser on every distinct rank's source). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_gen.h"
#include "ntpc.h"
#include "nvrtc_dl.h"
#include "shard.h"

typedef struct tcase {
  const char *name, *file, *plan; /* plan: a plan file, or NULL with world */
  int world;
  const char *defines[12];
} tcase;

#define GPT2 {"B=8", "S=16", "D=64", "H=8", "V=250", "L=2"}
static const tcase cases[] = {
    {"gpt2.w1", "examples/gpt2.ntp", NULL, 1, GPT2},
    {"gpt2.mixed8", "examples/gpt2.ntp", "examples/plans/gpt2_mixed8.ntp", 0, GPT2},
    {"gpt2.degraded7", "examples/gpt2.ntp", "examples/plans/gpt2_degraded7.ntp", 7, GPT2},
    {"gpt3.w8", "examples/gpt3_175b.ntp", NULL, 8, {"B=8", "S=16", "D=96", "H=8", "V=320", "L=2"}},
    {"llama3.w8", "examples/llama3_8b.ntp", NULL, 8, {"B=8", "S=16", "D=64", "H=8", "V=256", "L=2"}},
    {"llama_block.w6_sp", "examples/llama_block.ntp", "tests/plans/llama_block_w6_sp.ntp", 0,
     {"B=6", "S=16", "D=64", "H=8"}},
    {"llama_block.w5", "examples/llama_block.ntp", "tests/plans/llama_block_w5_groups.ntp", 0,
     {"B=6", "S=16", "D=64", "H=8"}},
    {"sharded_matmul.w8", "examples/sharded_matmul.ntp", NULL, 8, {"M=16", "K=32", "N=24"}},
    {"elementwise.w1", "examples/elementwise.ntp", NULL, 1, {0}},
    {"elementwise.w3", "examples/elementwise.ntp", NULL, 3, {0}},
};

static uint64_t hash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* A log with anything but whitespace is a warning (or worse). */
static bool quiet(const char *log) {
  for (; log && *log; log++)
    if (*log != ' ' && *log != '\n' && *log != '\r' && *log != '\t') return false;
  return true;
}

int main(int argc, char **argv) {
  const char *dump = NULL;
  int arch_lo = 80, arch_hi = 90;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--dump")) dump = argv[i + 1];
    else if (!strcmp(argv[i], "--arch") && (!strcmp(argv[i + 1], "80") || !strcmp(argv[i + 1], "90")))
      arch_lo = arch_hi = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "usage: test_nvrtc [--arch 80|90] [--dump DIR]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    fprintf(stderr, "usage: test_nvrtc [--arch 80|90] [--dump DIR]\n");
    return 2;
  }
  char err[512];
  if (ntp_nvrtc_load(err, sizeof err) != 0) {
    printf("skipped: %s\n", err);
    return 77;
  }
  int major = 0, minor = 0;
  ntp_nvrtc_version(&major, &minor);
  static uint64_t seen[4096];
  size_t nseen = 0;
  int failures = 0, compiled = 0, ranks = 0, kernels = 0;
  size_t bytes = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const tcase *tc = &cases[c];
    ntpc_session *s = ntpc_session_new();
    for (int d = 0; d < 12 && tc->defines[d]; d++) ntpc_define_str(s, tc->defines[d]);
    if (tc->plan) ntpc_add_plan_file(s, tc->plan);
    ntpc_set_world(s, tc->world);
    if (ntpc_compile_file(s, tc->file) != NTPC_OK) {
      ntpc_print_diags(s, stderr, 0);
      fprintf(stderr, "FAIL %s: does not compile\n", tc->name);
      failures++;
      ntpc_session_free(s);
      continue;
    }
    const sh_program *p = ntpc_sharded(s);
    for (int32_t r = 0; r < p->world; r++) {
      cg_module m;
      ranks++;
      if (cg_generate(p, r, &m, err, sizeof err) != 0) {
        fprintf(stderr, "FAIL %s rank %d: %s\n", tc->name, r, err);
        failures++;
        continue;
      }
      kernels += (int)m.nkernels;
      uint64_t h = hash(m.source, m.len);
      bool dup = false;
      for (size_t i = 0; i < nseen; i++) dup |= seen[i] == h;
      if (dup || nseen == 4096) {
        cg_module_free(&m);
        continue;
      }
      seen[nseen++] = h;
      if (dump) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s.r%d.cu", dump, tc->name, r);
        FILE *f = fopen(path, "w");
        if (f) {
          fwrite(m.source, 1, m.len, f);
          fclose(f);
        }
      }
      for (int arch = arch_lo; arch <= arch_hi; arch += 10) {
        void *cubin;
        size_t size;
        char *log;
        char name[128];
        snprintf(name, sizeof name, "%s.r%d.cu", tc->name, r);
        int rc = ntp_nvrtc_compile(m.source, name, arch, &cubin, &size, &log, err, sizeof err);
        compiled++;
        if (rc != 0 || !quiet(log) || size == 0) {
          fprintf(stderr, "FAIL %s rank %d sm_%d: %s\n%s\n", tc->name, r, arch, rc ? err : "warnings", log ? log : "");
          failures++;
        } else {
          bytes += size;
        }
        free(cubin);
        free(log);
      }
      cg_module_free(&m);
    }
    ntpc_session_free(s);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("NVRTC %d.%d: %zu cases, %d ranks (%d kernels), %zu distinct sources, %d compilations (%s), "
         "%.1f MiB of CUBIN, %.1f s\n",
         major, minor, sizeof cases / sizeof cases[0], ranks, kernels, nseen, compiled,
         arch_lo == arch_hi ? (arch_lo == 80 ? "sm_80" : "sm_90") : "sm_80 + sm_90", (double)bytes / (1 << 20), secs);
  printf("%d passed, %d failed\n", compiled - failures, failures);
  return failures ? 1 : 0;
}
