/* test_zero.c — the distributed optimizer in training plans (compiler/planner/zero.c,
 * docs/planner.md, "Training"):
 *
 *  1. the memory of every layer's state against the closed forms: without ZeRO a rank keeps
 *     P (1 + (eb + 12) / eb) for P parameter bytes of dtype size eb (the planner's expression
 *     before ZeRO, bit for bit); with zero 1 P + P + 12 (P / eb) K / n, with zero 2
 *     P + P K / n + 12 (P / eb) K / n, for n replicas and K = min(redundancy, n);
 *  2. at a fixed group size, ZeRO's memory falls strictly as the replicas grow, and so does its
 *     saving over zero 0 (whose memory falls only by the input rows each group reads),
 *     redundancy 2 keeps more than redundancy 1, zero 2 at most zero 1, zero 1 at most zero 0;
 *  3. the search over ZeRO-priced tables: the DP equals the exhaustive search, bit for bit;
 *  4. plan_solve: zero 0 forced gives the same plan and step as zero 0 searched among the
 *     candidates of zero auto (the tables re-priced), and auto never chooses a plan slower
 *     than 4% over the fastest candidate.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntpc.h"
#include "planner.h"

#include "check.h"

static diag_sink *sink; /* the model's session's: the planner reports there */


/* a small trainable model in fp32 (byte_gpt) and one in bf16 with GQA and SwiGLU (llama3_70b) */
static const struct {
  const char *file, *dims[8];
  double eb;
} models[] = {
    {"examples/byte_gpt.ntp", {"B=16", "S=32", "D=64", "H=4", "L=1", NULL}, 4},
    {"examples/llama3_70b.ntp", {"B=16", "S=32", "D=128", "H=8", "V=512", "L=1", NULL}, 2},
};

static ntpc_session *compile_model(int m) {
  ntpc_session *s = ntpc_session_new();
  for (int d = 0; models[m].dims[d]; d++) ntpc_define_str(s, models[m].dims[d]);
  if (ntpc_compile_file(s, models[m].file) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

/* the state of t-rank groups over W ranks, recomputed (no saved activations), in T; -1: none */
static int32_t state_tp(const plan_tables *T, int32_t W, int32_t t) {
  plan_place want = plan_place_balanced(W, W / t, false);
  want.rc = true;
  for (int32_t s = 0; s < plan_tables_nstates(T); s++)
    if (memcmp(plan_tables_state(T, s), &want, sizeof want) == 0) return s;
  return -1;
}

static plan_tables *tables(const plan_model *pm, const plan_profile *prof, int32_t W, bool train, int32_t zero, int32_t red) {
  plan_request rq = {.world = W, .prof = prof, .train = train, .zero = zero, .redundancy = red};
  return plan_tables_new(pm, &rq, sink);
}

/* 1 and 2: every layer at groups of 2 over 2, 4, 8, 16 ranks (1, 2, 4, 8 replicas) */
static void test_memory(int m, const plan_model *pm, const plan_profile *prof) {
  double eb = models[m].eb, prev1 = INFINITY, saved = -1;
  for (int32_t W = 2; W <= 16; W *= 2) {
    int32_t n = W / 2;
    plan_tables *F = tables(pm, prof, W, false, 0, 0), *T[6] = {
        tables(pm, prof, W, true, 0, 0), tables(pm, prof, W, true, 1, 1), tables(pm, prof, W, true, 1, 2),
        tables(pm, prof, W, true, 2, 1), tables(pm, prof, W, true, 2, 2), tables(pm, prof, W, true, 1, 3)};
    int32_t sf = -1, st = state_tp(T[0], W, 2);
    plan_place fwd = plan_place_balanced(W, n, false);
    for (int32_t s = 0; s < plan_tables_nstates(F); s++)
      if (memcmp(plan_tables_state(F, s), &fwd, sizeof fwd) == 0) sf = s;
    CHECKF(sf >= 0 && st >= 0, "%s, W=%d: no state of groups of 2", models[m].file, W);
    double sum[6] = {0};
    for (int32_t i = 0; sf >= 0 && st >= 0 && i < plan_model_layers(pm); i++) {
      double P = plan_tables_param_bytes(F, i, sf), got[6];
      for (int k = 0; k < 6; k++) sum[k] += got[k] = plan_tables_param_bytes(T[k], i, st);
      double K2 = n < 2 ? n : 2, K3 = n < 3 ? n : 3;
      CHECKF(got[0] == P * (1.0 + (eb + 12.0) / eb), "%s W=%d layer %d: zero 0 keeps %.17g, want %.17g", models[m].file,
            W, i, got[0], P * (1.0 + (eb + 12.0) / eb));
      double want[6] = {0, P + P + 12 * P / eb / n, P + P + 12 * P / eb * K2 / n, P + P / n + 12 * P / eb / n,
                        P + P * K2 / n + 12 * P / eb * K2 / n, P + P + 12 * P / eb * K3 / n};
      for (int k = 1; k < 6; k++)
        CHECKF(fabs(got[k] - want[k]) <= 1e-9 * want[k], "%s W=%d layer %d candidate %d: %.17g bytes, want %.17g",
              models[m].file, W, i, k, got[k], want[k]);
    }
    /* the orders: zero 2 <= zero 1 <= zero 0; redundancy 2 above 1 once there are two replicas */
    CHECKF(sum[3] <= sum[1] && sum[1] <= sum[0], "%s W=%d: zero 2 %g, zero 1 %g, zero 0 %g", models[m].file, W, sum[3],
          sum[1], sum[0]);
    CHECKF(n < 2 ? sum[2] == sum[1] : sum[2] > sum[1], "%s W=%d: redundancy 2 %g against 1 %g", models[m].file, W, sum[2],
          sum[1]);
    CHECKF(n < 2 || sum[4] > sum[3], "%s W=%d: zero 2 redundancy 2 %g against 1 %g", models[m].file, W, sum[4], sum[3]);
    CHECKF(sum[1] < prev1, "%s: zero 1 at %d replicas keeps %g, not less than %g at half as many", models[m].file, n,
          sum[1], prev1);
    CHECKF(sum[0] - sum[1] > saved, "%s: zero 1 at %d replicas saves %g, at half as many %g", models[m].file, n,
          sum[0] - sum[1], saved);
    prev1 = sum[1];
    saved = sum[0] - sum[1];
    plan_tables_free(F);
    for (int k = 0; k < 6; k++) plan_tables_free(T[k]);
  }
}

/* 3: the DP against enumeration on ZeRO-priced tables, at caps from tight to loose */
static void test_search(int m, const plan_model *pm, const plan_profile *prof) {
  int agree = 0;
  for (int32_t zero = 1; zero <= 2; zero++)
    for (int32_t red = 1; red <= 2; red++) {
      plan_tables *T = tables(pm, prof, 4, true, zero, red);
      double lo = plan_tables_fixed_bytes(T), hi = lo;
      for (int32_t i = 0; i < plan_model_layers(pm); i++) {
        double mn = INFINITY, mx = 0;
        for (int32_t s = 0; s < plan_tables_nstates(T); s++) {
          double b = plan_tables_param_bytes(T, i, s);
          if (b > 0 && b < mn) mn = b;
          if (b > mx) mx = b;
        }
        lo += mn < INFINITY ? mn : 0;
        hi += mx;
      }
      for (int c = 0; c <= 4; c++) {
        plan_problem pb = plan_tables_problem(T, lo + (hi - lo) * c / 4.0, 64, true);
        int32_t a[64], b[64];
        double ta = 0, tb = 0;
        int64_t ua = 0, ub = 0;
        bool fa = plan_dp_solve(&pb, a, &ta, &ua), fb = plan_exhaustive_solve(&pb, b, &tb, &ub);
        CHECKF(fa == fb && (!fa || ta == tb), "%s zero %d redundancy %d cap %d/4: DP %d %.9g, exhaustive %d %.9g",
              models[m].file, zero, red, c, fa, ta, fb, tb);
        agree += fa == fb && (!fa || ta == tb);
      }
      plan_tables_free(T);
    }
  printf("zero: %s: the DP equals the exhaustive search on %d ZeRO-priced problems\n", models[m].file, agree);
}

/* 4: zero 0 forced against zero auto's zero-0 candidate; auto's choice within its margin */
static void test_choice(int m, const plan_model *pm, const ir_module *mod, const plan_profile *prof) {
  for (int32_t W = 2; W <= 8; W *= 2) {
    plan_request r0 = {.world = W, .prof = prof, .train = true};
    plan_request ra = r0;
    ra.zero = PLAN_ZERO_AUTO;
    plan_solution s0, sa;
    bool ok0 = plan_solve(pm, mod, &r0, &s0, sink), oka = plan_solve(pm, mod, &ra, &sa, sink);
    CHECKF(ok0 && oka && s0.feasible && sa.feasible, "%s W=%d: no plan", models[m].file, W);
    if (ok0 && oka && s0.feasible && sa.feasible) {
      CHECKF(s0.nalts == 1 && s0.zero == 0 && sa.nalts == 5, "%s W=%d: %d and %d candidates", models[m].file, W, s0.nalts,
            sa.nalts);
      CHECKF(sa.alts[0].zero == 0 && sa.alts[0].step_s == s0.step_s, "%s W=%d: zero 0 alone %.17g, among the "
            "candidates %.17g", models[m].file, W, s0.step_s, sa.alts[0].step_s);
      double fastest = INFINITY;
      for (int32_t a = 0; a < sa.nalts; a++)
        if (sa.alts[a].feasible && sa.alts[a].step_s < fastest) fastest = sa.alts[a].step_s;
      CHECKF(sa.step_s <= fastest * 1.04, "%s W=%d: chose %.9g s, the fastest is %.9g s", models[m].file, W, sa.step_s,
            fastest);
    }
    plan_solution_free(&s0);
    plan_solution_free(&sa);
  }
}

int main(void) {
  plan_profile prof;
  if (!plan_profile_builtin("h100", &prof)) return 1;
  for (int m = 0; m < (int)(sizeof models / sizeof models[0]); m++) {
    ntpc_session *s = compile_model(m);
    CHECKF(s != NULL, "%s does not compile", models[m].file);
    if (!s) continue;
    sink = ntpc_diag_sink(s);
    plan_model *pm = plan_model_new(ntpc_module(s), sink);
    CHECKF(pm != NULL, "%s: no planner model", models[m].file);
    if (pm) {
      test_memory(m, pm, &prof);
      test_search(m, pm, &prof);
      test_choice(m, pm, ntpc_module(s), &prof);
    }
    plan_model_free(pm);
    ntpc_session_free(s);
  }
  if (failures) {
    fprintf(stderr, "zero: %d check(s) failed\n", failures);
    return 1;
  }
  printf("zero: all checks passed\n");
  return 0;
}
