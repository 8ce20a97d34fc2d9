/* test_published.c — the 3D planner against Megatron-LM's published configurations
 * (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
 * Megatron-LM", SC21, Table 1: GPT models with a vocabulary of 51,200 and 2048-token sequences
 * on DGX A100 80GB nodes of 8 GPUs). For each row, examples/gpt3_175b_train.ntp at the row's width,
 * heads, layers and batch is planned for the row's GPU count on the a100 profile (plan_solve_3d,
 * as `ntpc plan --train` does), and the predicted step is turned into TFLOP/s per GPU with the
 * paper's own count of a step's FLOPs,
 *     F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))
 * (it counts the recomputed forward, as their runs recomputed every layer), so the figures are
 * comparable (the same count over a plan's step: TFLOP/s ratios are step-time ratios). Three rows each:
 *   1. Megatron-LM's own configuration priced by the cost model (tp 8 in each of its stages, every
 *      layer recomputed, no sequence parallelism, micro-batches of one row, no ZeRO): checked
 *      within TOLERANCE of the published TFLOP/s — the cost model against measurements;
 *   2. the planner's choice with the features Megatron-LM had then (every layer recomputed, no
 *      sequence parallelism, no ZeRO), and 3. with every feature: checked no slower than the
 *      configuration before it (it could have chosen it) and tensor parallel inside a node (a stage
 *      of at most 8 GPUs).
 * docs/planner.md prints the table.
 *
 *   test_published [--verbose]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntpc.h"
#include "planner.h"

#include "check.h"

#define TOLERANCE 0.15

static const struct row {
  const char *name;
  int heads, hidden, layers, tp, pp, gpus, batch;
  double tflops; /* published, per GPU */
  int pct;       /* of the A100's 312 TFLOP/s */
} rows[] = {
    {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52},
    {"1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52},
};

/* the row's dims (B aside) as -D overrides */
typedef struct dims {
  char d[5][48];
  const char *p[5];
} dims;
static void row_dims(const struct row *r, dims *x) {
  snprintf(x->d[0], sizeof x->d[0], "D=%d", r->hidden);
  snprintf(x->d[1], sizeof x->d[1], "H=%d", r->heads);
  snprintf(x->d[2], sizeof x->d[2], "L=%d", r->layers);
  snprintf(x->d[3], sizeof x->d[3], "V=51200");
  snprintf(x->d[4], sizeof x->d[4], "S=2048");
  for (int i = 0; i < 5; i++) x->p[i] = x->d[i];
}

static ntpc_session *compile(const struct row *r, int64_t batch) {
  ntpc_session *s = ntpc_session_new();
  dims x;
  row_dims(r, &x);
  char b[48];
  snprintf(b, sizeof b, "B=%lld", (long long)batch);
  for (int i = 0; i < 5; i++) ntpc_define_str(s, x.p[i]);
  ntpc_define_str(s, b);
  if (ntpc_compile_file(s, "examples/gpt3_175b_train.ntp") != NTPC_OK) {
    ntpc_print_diags(s, stderr, 0);
    ntpc_session_free(s);
    return NULL;
  }
  return s;
}

/* Plans the row with rq (zero, recompute, sequence parallelism as set), the step (INFINITY: none)
 * and the structure as a table cell */
static double plan_row(const struct row *r, plan_model *pm, ntpc_session *s, plan_request rq, char *cell, size_t cap,
                       int32_t *stage_gpus, bool verbose, const plan_profile *prof) {
  plan_solution sol = {0};
  bool ok = plan_solve_3d(pm, ntpc_module(s), &rq, &sol, ntpc_diag_sink(s));
  double step = ok && sol.feasible ? sol.step_s : INFINITY;
  CHECKF(isfinite(step), "%s on %d GPUs: no plan (%s)", r->name, r->gpus, ok ? sol.why : "failed");
  *stage_gpus = sol.pp_stages ? sol.pp_stage_world : sol.world;
  int32_t rc = 0, sp = 0;
  for (int32_t i = 0; i < sol.nlayers; i++) rc += sol.layers[i].place.rc, sp += sol.layers[i].place.sp;
  snprintf(cell, cap, "%d x %d x %d, %d x %lld rows, %s, zero %d, %d of %d layers recomputed, %d sequence parallel",
           *stage_gpus, sol.pp_stages ? sol.pp_stages : 1, sol.pp_stages ? sol.pp_replicas : 1,
           sol.micro_batches ? sol.micro_batches : 1, (long long)(sol.micro_rows ? sol.micro_rows : r->batch),
           sol.schedule == 4 ? "ZB-H1" : "1F1B", sol.zero, rc, sol.nlayers, sp);
  if (verbose && isfinite(step)) plan_write_report(stdout, pm, &sol, prof);
  plan_solution_free(&sol);
  return step;
}

int main(int argc, char **argv) {
  bool verbose = argc > 1 && strcmp(argv[1], "--verbose") == 0;
  plan_profile a100;
  plan_profile_builtin("a100", &a100);
  printf("| model, GPUs, batch | published (Megatron-LM) | how | stage GPUs x stages x replicas, micro-batches | "
         "predicted step | TFLOP/s per GPU (%% of peak) | vs published |\n|---|---|---|---|---|---|---|\n");
  for (size_t k = 0; k < sizeof rows / sizeof *rows; k++) {
    const struct row *r = &rows[k];
    dims x; /* the model at other batch rows, for the 3D search */
    row_dims(r, &x);
    ntpc_rows_models *c = ntpc_rows_models_new("examples/gpt3_175b_train.ntp", NULL, x.p, 5, "B");
    ntpc_session *s = compile(r, r->batch);
    plan_model *pm = s ? plan_model_new(ntpc_module(s), ntpc_diag_sink(s)) : NULL;
    if (s && !pm) ntpc_print_diags(s, stderr, 0);
    CHECKF(pm != NULL, "%s: the model does not compile", r->name);
    if (!pm) continue;
    double B = r->batch, sq = 2048, l = r->layers, h = r->hidden, V = 51200;
    double F = 96 * B * sq * l * h * h * (1 + sq / (6 * h) + V / (16 * l * h)); /* the paper's FLOPs of a step */
    plan_request rq = {.world = r->gpus, .prof = &a100, .train = true, .zero = PLAN_ZERO_AUTO, .model_at_rows = ntpc_rows_model,
                       .rows_ctx = c};
    /* 1. Megatron's configuration priced: tp 8 in every stage, every layer recomputed, no sequence
          parallelism (2021), micro-batches of one row, no ZeRO */
    plan_request mq = rq;
    mq.stage_tp = r->tp, mq.recompute = 1, mq.seq_parallel = -1, mq.zero = 0, mq.schedule = 2;
    int32_t d = r->gpus / (r->tp * r->pp), g2021 = 0, gnow = 0;
    double mstep = plan_pipeline_shape(pm, &mq, r->tp, r->pp, d, r->batch / d, false, ntpc_diag_sink(s));
    /* 2. the planner with what Megatron-LM had in 2021: every layer recomputed, no sequence
          parallelism, no ZeRO, 1F1B (zero bubble came in 2023) */
    plan_request oq = rq;
    oq.recompute = 1, oq.seq_parallel = -1, oq.zero = 0, oq.schedule = 2;
    char c2021[200], cnow[200], mcell[200];
    double s2021 = plan_row(r, pm, s, oq, c2021, sizeof c2021, &g2021, verbose, &a100);
    /* 3. the planner with everything: recomputation, sequence parallelism and ZeRO chosen */
    double snow = plan_row(r, pm, s, rq, cnow, sizeof cnow, &gnow, verbose, &a100);
    snprintf(mcell, sizeof mcell, "%d x %d x %d, %d x 1 row, every layer recomputed", r->tp, r->pp, d, r->batch / d);
    const char *how[3] = {"Megatron-LM's configuration, priced", "planned, 2021's features (recompute all, no SP, no ZeRO, 1F1B)",
                          "planned, every feature"};
    const char *cell[3] = {mcell, c2021, cnow};
    double step[3] = {mstep, s2021, snow};
    for (int i = 0; i < 3; i++) {
      double tf = F / step[i] / r->gpus / 1e12;
      printf("| %s | %s | %s | %s | %.2f s | %.1f (%.0f %%) | %+.1f %% |\n", i ? "" : r->name,
             i ? "" : "", how[i], cell[i], step[i], tf, 100 * tf * 1e12 / a100.flops[NTP_BF16], 100 * (tf / r->tflops - 1));
    }
    printf("| %d GPUs, batch %d | TP %d x PP %d: %.0f TFLOP/s per GPU (%d %%) | | | | | |\n", r->gpus, r->batch, r->tp,
           r->pp, r->tflops, r->pct);
    double t1 = F / mstep / r->gpus / 1e12;
    CHECKF(fabs(t1 / r->tflops - 1) <= TOLERANCE, "%s: Megatron's configuration priced at %.1f TFLOP/s per GPU, "
           "published %.0f", r->name, t1, r->tflops);
    CHECKF(g2021 <= 8 && gnow <= 8, "%s: tensor parallelism over %d / %d GPUs leaves the node", r->name, g2021, gnow);
    CHECKF(s2021 <= mstep * (1 + 1e-9) && snow <= s2021 * (1 + 1e-9),
           "%s: a plan slower than one it could choose (Megatron's %.3f s, 2021's %.3f s, all %.3f s)", r->name, mstep,
           s2021, snow);
    plan_model_free(pm);
    ntpc_session_free(s);
    ntpc_rows_models_free(c);
  }
  return check_report("test_published");
}
