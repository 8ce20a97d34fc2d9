/* bench_planner.c — the planner's time on the 96-block GPT-3 model (194 layers with a degree):
 * cost tables and the exact search (the dynamic program over layers, placements and memory),
 * for worlds of 8 and 16 GPUs (every balanced placement, 1..W groups, with and without
 * sequence parallelism), and for a 100-layer stack (-D L=49). Median of N runs.
 *
 * Then the 3D search (plan_solve_3d: pipelines of stages, replicas, micro-batches) on GPT-3 175B
 * training at Megatron's batch (1536 rows of 2048 tokens) on A100s, from 64 to 16,384 GPUs, and
 * the forward plan of examples/gpt3_175b.ntp at 1024 (targets: under 10 s at 1024 GPUs, under 60 s
 * at 16,384). Each is one run: the time includes compiling the model at every micro-batch size.
 *
 *   bench_planner [FILE] [N] [--gpu NAME] [--3d-only]  (default examples/gpt3_175b.ntp, 5 runs, h200)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir.h"
#include "ntpc.h"
#include "planner.h"

static double pl_bench_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int bench(const char *file, const char *define, int world, int runs, const plan_profile *prof) {
  ntpc_session *s = ntpc_session_new();
  if (define) ntpc_define_str(s, define);
  if (ntpc_compile_file(s, file) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    fprintf(stderr, "bench_planner: %s does not compile\n", file);
    ntpc_session_free(s);
    return 1;
  }
  plan_model *pm = plan_model_new(ntpc_module(s), ntpc_diag_sink(s));
  if (!pm) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return 1;
  }
  double *tab = malloc((size_t)runs * sizeof *tab), *dp = malloc((size_t)runs * sizeof *dp);
  plan_solution sol = {0};
  for (int i = 0; i < runs; i++) {
    plan_request rq = {.world = world, .prof = prof};
    if (i) plan_solution_free(&sol);
    if (!plan_solve(pm, ntpc_module(s), &rq, &sol, ntpc_diag_sink(s))) {
      ntpc_print_diags(s, stderr, 0);
      return 1;
    }
    tab[i] = sol.tables_ms;
    dp[i] = sol.search_ms;
  }
  qsort(tab, (size_t)runs, sizeof *tab, cmp);
  qsort(dp, (size_t)runs, sizeof *dp, cmp);
  printf("%-26s W=%-3d %4d layers x %3d placements  cost tables %7.2f ms   search %7.2f ms (min %.2f, max %.2f)",
         define ? define : "(as written)", world, plan_model_layers(pm), sol.states, tab[runs / 2], dp[runs / 2], dp[0],
         dp[runs - 1]);
  if (sol.feasible)
    printf("   step %.1f ms%s\n", sol.step_s * 1e3, sol.quantum > 0 ? (sol.exact ? ", memory binds (certified optimal)"
                                                                              : ", memory binds")
                                                                 : "");
  else printf("   %s\n", sol.why);
  plan_solution_free(&sol);
  free(tab);
  free(dp);
  plan_model_free(pm);
  ntpc_session_free(s);
  return 0;
}

static int bench_3d(const char *file, const char *batch, int world, bool train, const plan_profile *prof) {
  const char *defs[1] = {batch}; /* the model at other batch rows, for the 3D search: B set again */
  ntpc_rows_models *c = ntpc_rows_models_new(file, NULL, defs, 1, "B");
  ntpc_session *s = ntpc_session_new();
  ntpc_define_str(s, batch);
  if (ntpc_compile_file(s, file) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return 1;
  }
  plan_model *pm = plan_model_new(ntpc_module(s), ntpc_diag_sink(s));
  plan_request rq = {.world = world, .prof = prof, .train = train, .zero = train ? PLAN_ZERO_AUTO : 0,
                     .model_at_rows = ntpc_rows_model, .rows_ctx = c};
  plan_solution sol = {0};
  double t0 = pl_bench_now_ms();
  bool ok = pm && plan_solve_3d(pm, ntpc_module(s), &rq, &sol, ntpc_diag_sink(s));
  double ms = pl_bench_now_ms() - t0;
  printf("%-36s %s W=%-5d  %7.2f s  ", file, batch, world, ms / 1e3);
  if (!ok) printf("failed\n");
  else if (!sol.feasible) printf("%s\n", sol.why);
  else if (sol.pp_stages)
    printf("%3d replicas x %3d stages x %d GPUs, %4d micro-batches of %lld, %s; zero %d; step %8.3f s, MFU %4.1f%% "
           "(%d structures)\n", sol.pp_replicas, sol.pp_stages, sol.pp_stage_world, sol.micro_batches,
           (long long)sol.micro_rows, sol.schedule == 4 ? "ZB-H1" : "1F1B", sol.zero, sol.step_s,
           100 * plan_mfu(pm, &sol, prof), sol.structures);
  else printf("flat plan; step %.3f s, MFU %4.1f%%\n", sol.step_s, 100 * plan_mfu(pm, &sol, prof));
  plan_solution_free(&sol);
  plan_model_free(pm);
  ntpc_session_free(s);
  ntpc_rows_models_free(c);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  const char *file = "examples/gpt3_175b.ntp", *gpu = "h200";
  int runs = 5;
  bool only3d = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--3d-only") == 0) only3d = true;
    else if (strcmp(argv[i], "--gpu") == 0 && i + 1 < argc) gpu = argv[++i];
    else if (argv[i][0] >= '0' && argv[i][0] <= '9') runs = atoi(argv[i]);
    else file = argv[i];
  }
  if (runs < 1) runs = 1;
  plan_profile prof;
  if (!plan_profile_builtin(gpu, &prof)) {
    fprintf(stderr, "bench_planner: unknown GPU '%s'\n", gpu);
    return 2;
  }
  printf("planner on %s, %s profile, median of %d runs (target: search < 50 ms for 100 layers)\n", file, prof.name, runs);
  int rc = 0;
  if (!only3d) {
    rc |= bench(file, NULL, 8, runs, &prof);
    rc |= bench(file, NULL, 16, runs, &prof);
    rc |= bench(file, "L=49", 8, runs, &prof);
    rc |= bench(file, "L=49", 16, runs, &prof);
  }
  plan_profile a100;
  plan_profile_builtin("a100", &a100);
  printf("\n3D search (plan_solve_3d), one run each; targets: under 10 s at 1024 GPUs, under 60 s at 16384\n");
  rc |= bench_3d("examples/gpt3_175b.ntp", "B=8", 1024, false, &prof);
  int worlds[] = {64, 256, 1024, 4096, 16384};
  for (int k = 0; k < 5; k++) rc |= bench_3d("examples/gpt3_175b_train.ntp", "B=1536", worlds[k], true, &a100);
  return rc;
}
