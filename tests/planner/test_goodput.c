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
 *     long-run fraction; goodput below throughput; the same seed, the same run;
 *  6. ntp-3d's layers moved between stages (gp_replica_time) against every split of the layers;
 *     ntp-3d never below ntp, ntp never below ntp-uni;
 *  7. stragglers: a restart policy runs at 1/f, ntp-3d's re-split recovers most of it, by hand
 *     and over a run; the spare domains worked out by hand.
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
    CHECK(gp_static_loss(&c, f, 40, 7, out, NULL));
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


/* every split of P L layers over the stages (each healthy one up to L + GP_MORE_LAYERS), the
 * slowest stage's time of the best */
static double brute_replica(const gp_config *c, int32_t P, const double *tau, const bool *healthy, int32_t i,
                            int32_t left, double worst) {
  int32_t L = c->stage_layers;
  if (i == P) return left == 0 ? worst : INFINITY;
  double best = INFINITY;
  for (int32_t n = 0; n <= left && n <= L + GP_MORE_LAYERS; n++) {
    double t = n <= L ? tau[i] * n / L
               : healthy[i] && c->tau_more[n - L] > 0 ? c->tau_more[n - L] : INFINITY;
    if (t == INFINITY) break;
    double r = brute_replica(c, P, tau, healthy, i + 1, left - n, t > worst ? t : worst);
    if (r < best) best = r;
  }
  return best;
}

static void test_layer_moves(void) {
  int worse = 0;
  for (int k = 0; k < 400; k++) {
    gp_config c = {.stage_layers = 2 + (int32_t)(urand() * 5)};
    int32_t P = 2 + (int32_t)(urand() * 3), L = c.stage_layers;
    double h = 1, tau[4];
    bool healthy[4];
    /* a healthy stage holding k more: at least its linear share, more as the memory tightens */
    double extra = 1;
    for (int32_t m = 1; m <= GP_MORE_LAYERS; m++) {
      extra *= 1 + 0.1 * urand();
      c.tau_more[m] = urand() < 0.15 ? 0 : h * (L + m) / L * extra;
      if (!(c.tau_more[m] > 0)) break;
    }
    for (int32_t i = 0; i < P; i++) {
      healthy[i] = urand() < 0.5;
      tau[i] = healthy[i] ? h : h * (1 + urand());
    }
    double a = gp_replica_time(&c, P, tau, healthy);
    double b = brute_replica(&c, P, tau, healthy, 0, P * L, 0);
    double worst = 0;
    for (int32_t i = 0; i < P; i++) worst = tau[i] > worst ? tau[i] : worst;
    CHECK(fabs(a - b) <= 1e-12 * b && a <= worst);
    if (fabs(a - b) > 1e-12 * b && worse++ < 5) fprintf(stderr, "  case %d: %g, every split %g\n", k, a, b);
  }
  /* by hand: 4 stages of 4 layers, one 1.5x slow; a healthy stage holds a fifth at 1.3 */
  gp_config c = {.stage_layers = 4};
  c.tau_more[1] = 1.3;
  double tau[4] = {1, 1.5, 1, 1};
  bool healthy[4] = {true, false, true, true};
  /* the slow stage gives one layer away: 3 x 0.375 = 1.125, one healthy stage holds 5 (1.3) */
  CHECK(fabs(gp_replica_time(&c, 4, tau, healthy) - 1.3) < 1e-12);
  c.tau_more[1] = 0; /* no room: nothing moves */
  CHECK(gp_replica_time(&c, 4, tau, healthy) == 1.5);
}

static void test_live_policies(void) {
  gp_config c = big(32, 4);
  c.stage_layers = 25;
  for (int32_t m = 1; m <= GP_MORE_LAYERS; m++) c.tau_more[m] = c.tau_ntp[32] * (25 + m) / 25 * (1 + 0.02 * m);
  int32_t G = gp_groups(&c), *lost = calloc((size_t)G, sizeof *lost);
  int gain = 0;
  for (int s = 0; s < 100; s++) {
    memset(lost, 0, (size_t)G * sizeof *lost);
    int32_t nf = 1 + (int32_t)(urand() * 200);
    for (int32_t i = 0; i < nf; i++) lost[(int32_t)(urand() * G)] += 1;
    double uni = gp_evaluate(&c, GP_NTP_UNI, lost).throughput, ntp = gp_evaluate(&c, GP_NTP, lost).throughput,
           d3 = gp_evaluate(&c, GP_NTP_3D, lost).throughput;
    CHECK(ntp >= uni - 1e-12 && d3 >= ntp - 1e-12 && d3 <= 1 + 1e-12);
    gain += d3 > ntp + 1e-9;
  }
  printf("ntp-3d above ntp on %d of 100 random failure states (layers moved)\n", gain);
  CHECK(gain > 0);
  /* one group lost 4 GPUs (its stage 1.17x slower), one replica: the layers move */
  memset(lost, 0, (size_t)G * sizeof *lost);
  lost[5] = 4;
  CHECK(gp_evaluate(&c, GP_NTP_3D, lost).throughput > gp_evaluate(&c, GP_NTP, lost).throughput + 1e-6);
  free(lost);
}

static void test_stragglers(void) {
  gp_config c = big(32, 4);
  c.micro = 0;
  int32_t G = gp_groups(&c), *lost = calloc((size_t)G, sizeof *lost);
  double *slow = malloc((size_t)G * sizeof *slow);
  for (int32_t g = 0; g < G; g++) slow[g] = 1;
  slow[17] = 2; /* one GPU of group 17 at half speed */
  /* the synchronous step waits for it: every policy that does not re-split runs at 1/2 */
  for (int p = 0; p < GP_NPOLICIES; p++) {
    gp_state_eval e = gp_evaluate_slow(&c, (gp_policy)p, lost, slow);
    if (p == GP_NTP_3D) {
      /* its share cut to its speed: the group at 32 / 31.5 of its time, one replica of 256 slowed */
      double expect = (255 + 31.5 / 32) / 256;
      CHECK(fabs(e.throughput - expect) < 1e-12 && e.slow_domains == 0);
      printf("a 2x straggler: ntp-3d keeps %.4f of the throughput, the others %.4f (%.1f%% of the loss recovered)\n",
             e.throughput, 0.5, 100 * (e.throughput - 0.5) / 0.5);
    } else {
      CHECK(fabs(e.throughput - 0.5) < 1e-12 && e.slowed == 2 && e.slow_domains == 1);
      CHECK(gp_state_spares(&c, &e) == 1); /* its domain swapped for a spare */
    }
  }
  /* a straggler in a group dp-drop has dropped slows nothing */
  lost[17] = 1;
  CHECK(fabs(gp_evaluate_slow(&c, GP_DP_DROP, lost, slow).throughput - 255.0 / 256) < 1e-12);
  /* spares: dp-drop lost one replica of 4 domains */
  CHECK(gp_state_spares(&c, &(gp_state_eval){.throughput = 255.0 / 256, .slowed = 1}) == 4);
  CHECK(gp_spare_domains(&c, 1) == 0 && gp_spare_domains(&c, 0.999) == 4 && gp_spare_domains(&c, 254.5 / 256) == 8);
  free(lost), free(slow);
  /* a run: stragglers cost the others a good deal, ntp-3d little; the same seed, the same run */
  c = big(32, 4);
  gp_failures f = {.hw_frac = 0.78, .hw_min_h = 72, .hw_max_h = 120, .sw_h = 3, .slow_min = 1.2, .slow_max = 3,
                   .slow_min_h = 0.1, .slow_max_h = 10};
  f.rate_per_gpu_h = gp_rate_for_fraction(&f, 0.0015);
  f.slow_rate_per_gpu_h = 0.0002 / 24;
  gp_costs k = {.restart_s = 600, .ckpt_s = 600, .detect_s = 30, .resume_s = 5};
  gp_run_result r, again;
  CHECK(gp_simulate(&c, &f, &k, 28, 5, 11, &r) && gp_simulate(&c, &f, &k, 28, 5, 11, &again));
  CHECK(memcmp(&r, &again, sizeof r) == 0);
  printf("28 days with %lld slowdowns:", (long long)r.slowdowns);
  for (int p = 0; p < GP_NPOLICIES; p++) printf(" %s %.4f", gp_policy_name((gp_policy)p), r.throughput[p]);
  printf("\n");
  CHECK(r.slowdowns > 50);
  for (int p = 0; p < GP_NTP_3D; p++) CHECK(r.throughput[GP_NTP_3D] > r.throughput[p] + 0.1);
  CHECK(r.spares_max[GP_NTP_3D] <= r.spares_max[GP_NTP] && r.spares_p99[GP_NTP_3D] <= r.spares_max[GP_NTP_3D]);
}

int main(void) {
  test_step_time();
  test_by_hand();
  test_closed_form();
  test_random_states();
  test_run();
  test_never_above_healthy();
  test_layer_moves();
  test_live_policies();
  test_stragglers();
  return check_report("test_goodput");
}
