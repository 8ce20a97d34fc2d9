/* bench_planner.c — the planner's time on the 96-block GPT-3 model (194 layers with a degree):
 * cost tables and the exact search (the dynamic program over layers, placements and memory),
 * for worlds of 8 and 16 GPUs (every balanced placement, 1..W groups, with and without
 * sequence parallelism), and for a 100-layer stack (-D L=49). Median of N runs.
 *
 *   bench_planner [FILE] [N] [--gpu NAME]     (default examples/gpt3_175b.ntp, 5 runs, h200)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "ntpc.h"
#include "planner.h"

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

int main(int argc, char **argv) {
  const char *file = "examples/gpt3_175b.ntp", *gpu = "h200";
  int runs = 5;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gpu") == 0 && i + 1 < argc) gpu = argv[++i];
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
  rc |= bench(file, NULL, 8, runs, &prof);
  rc |= bench(file, NULL, 16, runs, &prof);
  rc |= bench(file, "L=49", 8, runs, &prof);
  rc |= bench(file, "L=49", 16, runs, &prof);
  return rc;
}
