/* test_goodput.c — the failure simulation of `ntpc goodput` (compiler/planner/goodput.c):
 *
 *  1. the split of the global batch over replicas of different speeds (gp_step_time) equals a
 *     greedy assignment, micro-batch by micro-batch, to the replica that finishes it first;
 *  2. each policy on a failure state worked out by hand;
 *  3. dp-drop against the closed form: with f of the GPUs failed at random, a replica of n GPUs
 *     survives with probability (1-f)^n;
 *  4. on random failure states: ntp's live per-layer plan is never below the two-degree restart
 *     when its tables are no slower, and nothing exceeds the healthy cluster;
 *  5. the run over time: no failures, no loss; the measured failed fraction is the process's
 *     long-run fraction; goodput below throughput; the same seed, the same run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "goodput.h"

static uint64_t rs = 12345;
static double urand(void) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rs >> 11) * 0x1.0p-53;
}

/* the greedy split: each micro-batch to the replica that would finish it first */
static double greedy_step(int32_t n, const int32_t *count, const double *tau, int64_t total) {
  int32_t R = 0;
  for (int32_t j = 0; j < n; j++) R += count[j];
  if (!R) return 0;
  double *fin = calloc((size_t)R, sizeof *fin), *t = calloc((size_t)R, sizeof *t);
  int32_t r = 0;
  for (int32_t j = 0; j < n; j++)
    for (int32_t i = 0; i < count[j]; i++) t[r++] = tau[j];
  double S = 0;
  for (int64_t m = 0; m < total; m++) {
    int32_t b = 0;
    for (int32_t i = 1; i < R; i++)
      if (fin[i] + t[i] < fin[b] + t[b]) b = i;
    fin[b] += t[b];
    if (fin[b] > S) S = fin[b];
  }
  free(fin), free(t);
  return S;
}

static void test_step_time(void) {
  for (int c = 0; c < 300; c++) {
    int32_t n = 1 + (int32_t)(urand() * 4), count[4];
    double tau[4];
    for (int32_t j = 0; j < n; j++) count[j] = (int32_t)(urand() * 5), tau[j] = 0.5 + urand() * 2;
    int64_t total = 1 + (int64_t)(urand() * 60);
    double a = gp_step_time(n, count, tau, total), b = greedy_step(n, count, tau, total);
    CHECK(fabs(a - b) <= 1e-9 * b);
    if (fabs(a - b) > 1e-9 * b) fprintf(stderr, "  case %d: %g vs greedy %g\n", c, a, b);
  }
  int32_t none = 0;
  double one = 1;
  CHECK(gp_step_time(1, &none, &one, 10) == 0);
}

static gp_config small(void) {
  gp_config c = {.gpus = 16, .domain = 4, .tp = 4, .pp = 1, .micro = 8, .max_lost = 2};
  c.tau_ntp[4] = 1, c.tau_ntp[3] = 1.5, c.tau_ntp[2] = 3;
  c.tau_uni[4] = 1.2, c.tau_uni[3] = 2, c.tau_uni[2] = 0; /* uniform over 2 does not fit */
  return c;
}

static void test_by_hand(void) {
  gp_config c = small();
  CHECK(gp_config_check(&c) == NULL);
  int32_t lost[4] = {0, 1, 0, 0};
  /* 4 replicas of one group, 32 micro-batches. dp-drop: 3 replicas, 11 each: 8/11 */
  gp_state_eval e = gp_evaluate(&c, GP_DP_DROP, lost);
  CHECK(e.replicas == 3 && fabs(e.throughput - 8.0 / 11) < 1e-12);
  /* ntp: 3 at 1 s and 1 at 1.5 s: 9 s takes 27 + 6 */
  e = gp_evaluate(&c, GP_NTP, lost);
  CHECK(e.replicas == 4 && e.degraded == 1 && fabs(e.throughput - 8.0 / 9) < 1e-12);
  /* two-degree: the degraded group at uniform 3 (2 s): 10 s takes 30 + 5 */
  e = gp_evaluate(&c, GP_TWO_DEGREE, lost);
  CHECK(e.replicas == 4 && fabs(e.throughput - 0.8) < 1e-12);
  /* uniform: 4 at 1 s for 3 replicas (8/11) beats 4 replicas of 3 at 2 s (8/16) */
  e = gp_evaluate(&c, GP_UNIFORM, lost);
  CHECK(e.degree == 4 && fabs(e.throughput - 8.0 / 11) < 1e-12);
  /* one group loses 2 (ntp: 3 s; two-degree pads the other degraded group to 2, which has no
   * uniform plan: that group is dropped, the other runs at 3 GPUs) */
  int32_t lost2[4] = {0, 1, 2, 0};
  e = gp_evaluate(&c, GP_TWO_DEGREE, lost2);
  CHECK(e.replicas == 3 && e.degraded == 1);
  /* 2 at 1 s + 1 at 2 s: S = 13 takes 26 + 6 = 32 */
  CHECK(fabs(e.throughput - 8.0 / 13) < 1e-12);
  e = gp_evaluate(&c, GP_NTP, lost2);
  CHECK(e.replicas == 4 && e.degraded == 2);
  /* more lost than max_lost: dropped by everyone */
  int32_t lost3[4] = {3, 0, 0, 0};
  for (int p = 0; p < GP_NPOLICIES; p++) CHECK(gp_evaluate(&c, (gp_policy)p, lost3).replicas == 3);
  /* pipelines: 2 stages a replica; ntp packs both degraded groups into one replica */
  c.pp = 2;
  e = gp_evaluate(&c, GP_NTP, lost2);
  CHECK(e.replicas == 2 && e.degraded == 1);
  e = gp_evaluate(&c, GP_DP_DROP, lost2); /* both replicas lost a GPU */
  CHECK(e.replicas == 0 && e.throughput == 0);
  /* in use: dp-drop's dropped replica and every policy's dropped group are not */
  CHECK(!gp_in_use(&c, GP_DP_DROP, lost2, 4, 3) && gp_in_use(&c, GP_NTP, lost2, 4, 3));
  CHECK(!gp_in_use(&c, GP_NTP, lost3, 4, 0) && gp_in_use(&c, GP_NTP, lost3, 4, 1));
}

static gp_config big(int32_t tp, int32_t pp) {
  gp_config c = {.gpus = 32768, .domain = 32, .tp = tp, .pp = pp, .micro = 16, .max_lost = 4};
  for (int32_t t = tp - 4; t <= tp; t++) {
    c.tau_ntp[t] = (double)tp / t * (1 + 0.01 * (tp - t)); /* a little worse than linear */
    c.tau_uni[t] = c.tau_ntp[t] * (t == tp ? 1 : 1.05);
  }
  return c;
}

static void test_closed_form(void) {
  for (int32_t pp = 1; pp <= 4; pp *= 4) {
    gp_config c = big(32, pp);
    c.micro = 4096; /* whole micro-batches cost dp-drop up to one in `micro` more: negligible here */
    CHECK(gp_config_check(&c) == NULL);
    double out[GP_NPOLICIES];
    double f = 0.001;
    CHECK(gp_static_loss(&c, f, 40, 7, out));
    /* replicas left ~ (1-f)^n; 40 draws of 32768/(32 pp) replicas: well within 1% */
    double expect = pow(1 - f, 32 * pp);
    CHECK(fabs(out[GP_DP_DROP] - expect) < 0.01);
    printf("dp-drop at %.1f%% failed, replicas of %d GPUs: throughput %.4f (closed form %.4f)\n", 100 * f, 32 * pp,
           out[GP_DP_DROP], expect);
    CHECK(out[GP_NTP] >= out[GP_TWO_DEGREE] - 1e-12 && out[GP_NTP] > out[GP_DP_DROP]);
  }
}

static void test_random_states(void) {
  gp_config c = big(32, 4);
  int32_t G = gp_groups(&c), *lost = calloc((size_t)G, sizeof *lost);
  for (int s = 0; s < 200; s++) {
    memset(lost, 0, (size_t)G * sizeof *lost);
    int32_t nf = (int32_t)(urand() * 400);
    for (int32_t i = 0; i < nf; i++) lost[(int32_t)(urand() * G)] += 1;
    double th[GP_NPOLICIES];
    for (int p = 0; p < GP_NPOLICIES; p++) {
      th[p] = gp_evaluate(&c, (gp_policy)p, lost).throughput;
      CHECK(th[p] >= 0 && th[p] <= 1 + 1e-12);
    }
    CHECK(th[GP_NTP] >= th[GP_TWO_DEGREE] - 1e-12);
    CHECK(th[GP_NTP] >= th[GP_DP_DROP] - 1e-12);
  }
  free(lost);
}

static void test_run(void) {
  gp_config c = big(32, 4);
  gp_failures none = {.rate_per_gpu_h = 0, .hw_frac = 0.78, .hw_min_h = 72, .hw_max_h = 120, .sw_h = 3};
  gp_costs k = {.restart_s = 600, .ckpt_s = 600, .detect_s = 30, .resume_s = 5};
  gp_run_result r;
  CHECK(gp_simulate(&c, &none, &k, 7, 1, 1, &r));
  for (int p = 0; p < GP_NPOLICIES; p++) CHECK(r.throughput[p] == 1 && r.goodput[p] == 1 && r.stops[p] == 0);
  gp_failures f = none;
  f.rate_per_gpu_h = gp_rate_for_fraction(&f, 0.002);
  CHECK(fabs(gp_steady_fraction(&f) - 0.002) < 1e-12);
  CHECK(gp_simulate(&c, &f, &k, 60, 5, 3, &r));
  printf("60 days at a long-run 0.2%% failed: measured %.3f%% failed, %lld failures\n", 100 * r.mean_failed_frac,
         (long long)r.failures);
  CHECK(fabs(r.mean_failed_frac - 0.002) < 0.0005);
  for (int p = 0; p < GP_NPOLICIES; p++) {
    CHECK(r.goodput[p] < r.throughput[p] && r.throughput[p] < 1);
    printf("  %-10s throughput %.4f goodput %.4f stops %lld\n", gp_policy_name((gp_policy)p), r.throughput[p],
           r.goodput[p], (long long)r.stops[p]);
  }
  CHECK(r.goodput[GP_NTP] > r.goodput[GP_TWO_DEGREE] && r.goodput[GP_NTP] > r.goodput[GP_DP_DROP]);
  gp_run_result again;
  CHECK(gp_simulate(&c, &f, &k, 60, 5, 3, &again));
  CHECK(memcmp(&r, &again, sizeof r) == 0);
}

/* issue 24 item 14: no policy beats the healthy cluster, whatever the tables and the costs */
static void test_never_above_healthy(void) {
  gp_config c = big(32, 4);
  CHECK(gp_config_check(&c) == NULL);
  c.tau_ntp[31] = 0.9 * c.tau_ntp[32]; /* a degraded plan priced faster than the healthy one */
  CHECK(gp_config_check(&c) != NULL);
  c = big(32, 4);
  c.tau_uni[30] = 0.5 * c.tau_ntp[32];
  CHECK(gp_config_check(&c) != NULL);
  /* failures faster than restarts end: the pauses overlap, goodput stays in [0, throughput] */
  c = big(32, 4);
  gp_failures f = {.hw_frac = 0.78, .hw_min_h = 72, .hw_max_h = 120, .sw_h = 3};
  f.rate_per_gpu_h = gp_rate_for_fraction(&f, 0.3);
  gp_costs k = {.restart_s = 36000, .ckpt_s = 36000, .detect_s = 600, .resume_s = 600};
  gp_run_result r;
  CHECK(gp_simulate(&c, &f, &k, 20, 2, 5, &r));
  for (int p = 0; p < GP_NPOLICIES; p++) {
    CHECK(r.throughput[p] >= 0 && r.throughput[p] <= 1 + 1e-12);
    CHECK(r.goodput[p] >= -1e-12 && r.goodput[p] <= r.throughput[p] + 1e-12);
    CHECK(r.paused_h[p] <= r.hours + 1e-9);
  }
}

int main(void) {
  test_step_time();
  test_by_hand();
  test_closed_form();
  test_random_states();
  test_run();
  test_never_above_healthy();
  return check_report("test_goodput");
}
