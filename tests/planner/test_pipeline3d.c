/* test_pipeline3d.c — the 3D search (compiler/planner/pipeline.c, docs/planner.md, "Pipelines")
 * against enumeration. For random structures of a small trainable model (byte_gpt, fp32: 4 or 6
 * chain layers) — g GPUs a stage (1 to 4), p stages (1 to 3), d replicas (1, 2), m micro-batches
 * (1, 2, 4), forward or training (1F1B or ZB-H1), memory caps from generous to tight, two profiles — the step the
 * search finds is compared with the best over every placement of every layer and every cut into
 * stages:
 *   - never faster than that optimum (a faster one would be a pricing or packing bug);
 *   - within PP_FREE_GAP of it when memory does not bind and PP_GAP when it does (the search is
 *     a relaxation with a local improvement, not an enumeration), and equal to it on at least
 *     PP_EXACT of the feasible cases (the run prints how often);
 *   - feasible whenever the enumeration finds a plan that fits.
 *
 *   test_pipeline3d [--cases N] [--seed S] [--verbose]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntpc.h"
#include "planner.h"

#include "check.h"

#define PP_GAP 0.10      /* the search's largest miss where memory binds */
#define PP_FREE_GAP 0.03 /* ... where it does not */
#define PP_EXACT 0.9     /* the share of feasible cases where it finds the optimum */

static uint64_t rng;
static int pick(int n) {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (int)((rng >> 33) % (uint64_t)n);
}

int main(int argc, char **argv) {
  int cases = 60;
  uint64_t seed = 1;
  bool verbose = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc) cases = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--verbose") == 0) verbose = true;
  }
  static const double caps_mib[] = {1e6, 2, 1, 0.6, 0.45, 0.35};
  int feasible = 0, bound = 0, exact = 0, binding = 0;
  double worst = 0;
  for (int c = 0; c < cases; c++) {
    uint64_t cs = seed + (uint64_t)c; /* case c of seed s is case 0 of seed s + c */
    rng = cs * 0x9E3779B97F4A7C15ULL;
    int g = 1 + pick(4), p = 1 + pick(3), d = 1 + pick(2), m = 1 << pick(3), b = 1 + pick(2);
    bool train = pick(2), small = g >= 3 || (train && g >= 2);
    double cap = caps_mib[pick(6)] * 1048576.0;
    const char *gpu = pick(2) ? "h100" : "a100";
    plan_profile prof;
    plan_profile_builtin(gpu, &prof);
    char bdim[32];
    snprintf(bdim, sizeof bdim, "B=%d", d * m * b);
    const char *dims[4] = {"S=16", "D=32", "H=4", small ? "L=1" : "L=2"};
    ntpc_rows_models *ms = ntpc_rows_models_new("examples/byte_gpt.ntp", NULL, dims, 4, "B");
    const plan_model *pm = ms ? ntpc_rows_model(ms, d * m * b) : NULL;
    if (!pm) {
      CHECKF(false, "case %d: byte_gpt does not compile", c);
      ntpc_rows_models_free(ms);
      continue;
    }
    plan_request rq = {.world = g * p * d, .prof = &prof, .mem_cap = cap, .train = train, .zero = 0,
                       .schedule = pick(2) ? 4 : 2, .model_at_rows = ntpc_rows_model, .rows_ctx = ms};
    diag_sink quiet = {0};
    double fast = plan_pipeline_shape(pm, &rq, g, p, d, m, false, &quiet);
    double best = plan_pipeline_shape(pm, &rq, g, p, d, m, true, &quiet);
    diag_free(&quiet);
    rq.mem_cap = 1e15;
    double free_best = plan_pipeline_shape(pm, &rq, g, p, d, m, true, &quiet);
    bool binds = isfinite(best) && best > free_best * (1 + 1e-12);
    if (verbose)
      printf("case %3d: g %d p %d d %d m %d b %d %s %s cap %.1f MiB: search %.6g, enumeration %.6g%s\n", c, g, p, d, m,
             b, !train ? "forward" : rq.schedule == 4 ? "train zb-h1" : "train", gpu, cap / 1048576.0, fast, best,
             binds ? " (memory binds)" : "");
    if (isfinite(best)) {
      feasible++;
      binding += binds;
      CHECKF(isfinite(fast), "case %d: the search finds nothing where a plan fits (--seed %llu --cases 1)", c,
             (unsigned long long)cs);
      if (isfinite(fast)) {
        double gap = fast / best - 1;
        CHECKF(gap >= -1e-9, "case %d (--seed %llu --cases 1): the search (%.9g) beats the enumeration (%.9g)", c,
               (unsigned long long)cs, fast, best);
        if (gap > worst) worst = gap;
        exact += gap <= 1e-9;
        if (!binds) CHECKF(gap <= PP_FREE_GAP, "case %d (--seed %llu --cases 1): memory does not bind, yet the search misses by %.3g%%",
                          c, (unsigned long long)cs, 100 * gap);
        else CHECKF(gap <= PP_GAP, "case %d (--seed %llu --cases 1): the search misses by %.3g%%", c,
                     (unsigned long long)cs, 100 * gap);
        bound += binds;
      }
    } else {
      CHECKF(!isfinite(fast), "case %d (--seed %llu --cases 1): the search fits where the enumeration finds nothing", c,
             (unsigned long long)cs);
    }
    ntpc_rows_models_free(ms);
  }
  CHECKF(exact >= PP_EXACT * feasible, "the search finds the optimum in only %d of %d feasible cases", exact, feasible);
  printf("%d cases: %d feasible (%d with memory binding); the search equals the enumeration on %d, worst miss %.2f%%\n",
         cases, feasible, binding, exact, 100 * worst);
  return check_report("test_pipeline3d");
}
