/* bench_bubble.c — the pipeline bubble, measured: for each schedule (GPipe, 1F1B, interleaved
 * 1F1B, ZB-H1), stage count p and micro-batch count m, a transformer is trained one step on the
 * CPU simulation with every step timed alone; the timeline of the ranks (compiler/shard/
 * shard_timeline.c) is drawn from those times, and each rank's idle / busy is its bubble. Printed
 * beside the textbook formula ((p-1)/m, (p-1)/(v m), (p-1)/(3m)) and beside the schedule's own
 * bubble with one unit per action. Equal stages (the same blocks and ranks on each) should come
 * within 10 % of the formula; an unequal case (one stage on fewer ranks, so slower) shows how far
 * a real plan is from it.
 *
 *   OMP_NUM_THREADS=1 bench_bubble [--quick] [--svg DIR]     (--svg: one timeline per case)
 *
 * One thread per kernel keeps each step's time steady (on 2 cores, threaded kernels' times vary
 * by tens of per cent between runs); the steps are large enough (D = 256, S = 64) that the
 * timer's and the caches' noise stays a few per cent. About 3 minutes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"
#include "shard.h"

typedef struct bcase {
  const char *schedule;
  int p, v, m, tp_slow; /* tp_slow > 0: stage 1 runs on 1 rank, the others on tp_slow */
} bcase;

static const char *model =
    "model b {\n"
    "  dim B = 32, S = 64, D = 256, V = 64, L = 8;\n"
    "  dtype fp32;\n"
    "  input tokens : i32[B, S];\n"
    "  input targets : i32[B, S];\n"
    "  x = embed: embedding(tokens, vocab = V, dim = D);\n"
    "  repeat L as blk {\n"
    "    h = n1: layernorm(x);\n"
    "    x = x + attn: attention(h, heads = 4, causal);\n"
    "    h = n2: layernorm(x);\n"
    "    x = x + mlp: mlp(h, hidden = 4 * D, act = gelu);\n"
    "  }\n"
    "  x = nf: layernorm(x);\n"
    "  logits = head: linear(x, out = V);\n"
    "  output loss = cross_entropy(logits, targets);\n"
    "}\n";

/* p rank sets of `per` ranks each (stage 1 alone when tp_slow), p v chunks of 8 / (p v) blocks. */
static void plan_text(const bcase *c, char *out, size_t cap) {
  int per = c->tp_slow ? c->tp_slow : 1, n = c->p * c->v, k = 0, world = 0, lo[8], sz[8];
  for (int i = 0; i < c->p; i++) sz[i] = c->tp_slow && i == 1 ? 1 : per, lo[i] = world, world += sz[i];
  k += snprintf(out + k, cap - (size_t)k, "plan p for b {\n  world %d;\n", world);
  for (int s = 0; s < n; s++) {
    int b0 = 8 * s / n, b1 = 8 * (s + 1) / n - 1, i = s % c->p;
    char first[32], last[32];
    snprintf(first, sizeof first, s == 0 ? "embed" : "blk.%d", b0);
    snprintf(last, sizeof last, s == n - 1 ? "head" : "blk.%d", b1);
    k += snprintf(out + k, cap - (size_t)k, "  stage %s .. %s ranks %d..%d;\n", first, last, lo[i], lo[i] + sz[i] - 1);
  }
  if (c->tp_slow) /* stage 1 (blocks 2 and 3 with 4 stages) at tp 1 on its one rank, the others at tp_slow */
    k += snprintf(out + k, cap - (size_t)k, "  * tp %d;\n  blk.{%d..%d}.* tp 1;\n", per, 8 / n, 16 / n - 1);
  snprintf(out + k, cap - (size_t)k, "}\n");
}

static double mean_bubble(const sh_program *sp, const double *cost, sh_timeline *keep) {
  sh_timeline t;
  if (!sh_timeline_run(sp, cost, &t)) return NAN;
  double sum = 0;
  for (int32_t r = 0; r < sp->world; r++) sum += sh_timeline_bubble(&t, r);
  if (keep) *keep = t;
  else sh_timeline_free(&t);
  return sum / sp->world;
}

static int run_case(const bcase *c, const char *svg_dir) {
  char plan[2048], src[8192], err[512];
  plan_text(c, plan, sizeof plan);
  snprintf(src, sizeof src, "%s%s", model, plan);
  ntpc_session *s = ntpc_session_new();
  ntpc_select_plan(s, "p");
  ntpc_set_world(s, 0);
  ntpc_want_grad(s, true);
  ntpc_set_pipeline(s, c->m, c->schedule);
  if (ntpc_compile_string(s, "bubble.ntp", src) != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return 1;
  }
  const sh_program *sp = ntpc_sharded(s);
  ntp_program *prog = session_program(s, err, sizeof err);
  ntp_sim *sim = NULL;
  if (!prog || ntp_sim_new(prog, &sim, err, sizeof err) != 0) {
    fprintf(stderr, "bench_bubble: %s\n", err);
    return 1;
  }
  double *t1 = calloc(sp->n_steps + 1, sizeof *t1), *t2 = calloc(sp->n_steps + 1, sizeof *t2);
  double *unit = calloc(sp->n_steps + 1, sizeof *unit);
  ntp_cpu_result res;
  int rc = 0;
  for (int rep = 0; rep < 5 && rc == 0; rep++) { /* per step, the least of 4 timed runs after a warm-up */
    ntp_sim_time_steps(sim, rep < 2 ? t1 : t2);
    rc = ntp_sim_forward(sim, 1, &res, err, sizeof err);
    if (rc == 0) ntp_cpu_result_free(&res);
    for (size_t k = 0; rep >= 2 && k < sp->n_steps; k++) t1[k] = fmin(t1[k], t2[k]);
  }
  sh_unit_costs(sp, unit);
  /* the same step of every micro-batch at its mean time: the stages' real costs, without the
   * jitter between micro-batches that a 2-core machine adds (a step is the k-th of its action
   * on its rank, the same op in every micro-batch) */
  int32_t M = sp->micro_batches, C = sh_max_chunks(sp), maxk = 0;
  size_t na = (size_t)sp->world * 3 * (size_t)C;
  int32_t *seen = calloc(na * (size_t)M + 1, sizeof *seen), *kth = calloc(sp->n_steps + 1, sizeof *kth);
  size_t *act = calloc(sp->n_steps + 1, sizeof *act);
  double *avg = malloc((sp->n_steps + 1) * sizeof *avg);
  for (size_t k = 0; k < sp->n_steps; k++) { /* step k is the kth[k]-th of its action on its rank */
    const sh_step *st = &sp->steps[k];
    if (st->kind == SH_COMM || st->mb < 0) continue;
    act[k] = ((size_t)st->rank * 3 + (size_t)st->phase) * (size_t)C + (size_t)sh_rank_chunk(sp, st->rank, st->at_layer);
    kth[k] = seen[act[k] * (size_t)M + (size_t)st->mb]++;
    maxk = kth[k] + 1 > maxk ? kth[k] + 1 : maxk;
  }
  double *sum = calloc(na * (size_t)maxk + 1, sizeof *sum);
  int32_t *cnt = calloc(na * (size_t)maxk + 1, sizeof *cnt);
  for (size_t k = 0; k < sp->n_steps; k++)
    if (sp->steps[k].kind == SH_COMPUTE && sp->steps[k].mb >= 0)
      sum[act[k] * (size_t)maxk + (size_t)kth[k]] += t1[k], cnt[act[k] * (size_t)maxk + (size_t)kth[k]]++;
  for (size_t k = 0; k < sp->n_steps; k++) {
    size_t i = act[k] * (size_t)maxk + (size_t)kth[k];
    avg[k] = sp->steps[k].kind == SH_COMPUTE && sp->steps[k].mb >= 0 ? sum[i] / cnt[i] : t1[k];
  }
  double ma = mean_bubble(sp, avg, NULL);
  free(sum), free(kth), free(cnt), free(seen), free(act), free(avg);
  sh_timeline keep;
  double f = sh_schedule_formula(sp, 0), u = mean_bubble(sp, unit, NULL), mb = mean_bubble(sp, t1, &keep);
  /* ZB-H1's bubble with the measured F, B and W: (p - 1)(F + B - W) / (m (F + B + W)) */
  double ph[3] = {0, 0, 0};
  for (size_t k = 0; k < sp->n_steps; k++)
    if (sp->steps[k].kind == SH_COMPUTE && sp->steps[k].mb >= 0) ph[sp->steps[k].phase] += t1[k];
  double fz = sp->sched.split_w ? (c->p - 1) * (ph[0] + ph[1] - ph[2]) / (c->m * (ph[0] + ph[1] + ph[2])) : f;
  double peak = 0;
  for (int32_t r = 0; r < sp->world; r++) peak = fmax(peak, (double)sp->mem[r].arena_bytes);
  printf("%-17s %2d %2d %3d %-8s %8.3f %8.3f %9.3f %9.3f %7.0f%%  %9.3f %7.0f%%  %8.1f\n", sp->sched.name, c->p, c->v,
         c->m, c->tp_slow ? "unequal" : "equal", f, u, mb, ma, 100 * (ma - f) / f, fz, 100 * (ma - fz) / fz,
         peak / 1048576.0);
  if (svg_dir) {
    char path[512], title[160];
    snprintf(path, sizeof path, "%s/%s_p%d_v%d_m%d%s.svg", svg_dir, c->schedule, c->p, c->v, c->m,
             c->tp_slow ? "_unequal" : "");
    snprintf(title, sizeof title, "%s, %d stages, %d micro-batches: bubble %.3f (formula %.3f)", sp->sched.name, c->p,
             c->m, mb, f);
    FILE *o = fopen(path, "w");
    if (o) sh_timeline_svg(sp, &keep, title, o), fclose(o);
  }
  sh_timeline_free(&keep);
  free(t1);
  free(t2);
  free(unit);
  ntp_sim_free(sim);
  ntp_program_free(prog);
  ntpc_session_free(s);
  return rc;
}

int main(int argc, char **argv) {
  bool quick = false;
  const char *svg = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--svg") && i + 1 < argc) svg = argv[++i];
    else {
      fprintf(stderr, "usage: bench_bubble [--quick] [--svg DIR]\n");
      return 2;
    }
  }
  static const bcase full[] = {
      {"gpipe", 2, 1, 8, 0},       {"gpipe", 4, 1, 8, 0},       {"1f1b", 2, 1, 8, 0},  {"1f1b", 4, 1, 8, 0},
      {"1f1b", 4, 1, 16, 0},       {"interleaved", 2, 2, 8, 0}, {"interleaved", 4, 2, 8, 0},
      {"zb-h1", 2, 1, 8, 0},       {"zb-h1", 4, 1, 8, 0},       {"zb-h1", 4, 1, 16, 0},
      {"1f1b", 4, 1, 8, 2},        {"zb-h1", 4, 1, 8, 2},
  };
  static const bcase small[] = {{"1f1b", 2, 1, 4, 0}, {"zb-h1", 2, 1, 4, 0}};
  const bcase *cs = quick ? small : full;
  size_t n = quick ? sizeof small / sizeof *small : sizeof full / sizeof *full;
  printf("the pipeline bubble: idle / busy per rank (mean over ranks), one training step on the CPU simulation,\n"
         "every step timed alone; unit: the schedule with one unit per action (F = B = W); mb-mean: each step at\n"
         "its mean time over the micro-batches (the comparisons use it); form.FBW: the formula\n"
         "with the measured times of F, B and W (ZB-H1: (p-1)(F+B-W)/(m(F+B+W)); the others do not depend on them)\n\n");
  printf("%-17s %2s %2s %3s %-8s %8s %8s %9s %9s %8s  %9s %8s  %8s\n", "schedule", "p", "v", "m", "stages", "formula",
         "unit", "measured", "mb-mean", "vs form.", "form.FBW", "vs it", "peak MiB");
  int rc = 0;
  for (size_t i = 0; i < n; i++) rc |= run_case(&cs[i], svg);
  return rc;
}
