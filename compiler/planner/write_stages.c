/* write_stages.c — a pipelined plan written out: its 'micro_batches' and stage lines in the plan
 * file, its stages, step and memory in the report (docs/planner.md, "Pipelines"), and the MFU
 * every report prints beside its step time. */
#include <stdio.h>
#include <string.h>

#include "planner_internal.h"

/* the module layers of stage i: from the first after the previous stage's last chain layer (the
 * norms before a stage's first layer are its own) to the last before the next stage's */
static void stage_layers(const plan_model *pm, const ir_module *m, const plan_solution *s, int32_t i, size_t *lo,
                         size_t *hi) {
  *lo = i == 0 ? 0 : (size_t)plan_model_ir_layer(pm, s->stage_first[i] - 1) + 1;
  *hi = i + 1 == s->pp_stages ? m->n_layers - 1 : (size_t)plan_model_ir_layer(pm, s->stage_first[i + 1] - 1);
}

void pl_write_stage_lines(FILE *out, const plan_model *pm, const ir_module *m, const plan_solution *s) {
  int32_t p = s->pp_stages, g = s->pp_stage_world;
  fprintf(out, "  micro_batches %d;\n", s->micro_batches);
  if (s->schedule == 4) fputs("  schedule zb-h1;\n", out);
  for (int32_t r = 0; r < s->pp_replicas; r++) {
    const char *ind = s->pp_replicas > 1 ? "    " : "  ";
    if (s->pp_replicas > 1) fprintf(out, "  pipeline {\n");
    for (int32_t i = 0; i < p; i++) {
      size_t lo, hi;
      stage_layers(pm, m, s, i, &lo, &hi);
      int32_t r0 = (r * p + i) * g;
      fprintf(out, "%sstage %s", ind, m->layers[lo].name);
      if (hi > lo) fprintf(out, " .. %s", m->layers[hi].name);
      if (g > 1) fprintf(out, " ranks %d..%d;\n", r0, r0 + g - 1);
      else fprintf(out, " ranks %d;\n", r0);
    }
    if (s->pp_replicas > 1) fprintf(out, "  }\n");
  }
}

void pl_write_mfu(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof) {
  double mfu = plan_mfu(pm, s, prof);
  if (mfu > 0)
    fprintf(out, ", MFU %.1f%% (%.1f TFLOP/s per GPU)", 100 * mfu, plan_model_flops(pm, s->train) / s->step_s / s->world / 1e12);
  fputc('\n', out);
}

void pl_write_stage_report(FILE *out, const plan_model *pm, const plan_solution *s, const plan_profile *prof) {
  int32_t p = s->pp_stages, g = s->pp_stage_world, busiest = 0;
  char t1[32], t2[32], t3[32], t4[32], b1[32], b2[32], b3[32], b4[32];
  fprintf(out, "\n(the layers' figures are per micro-batch of %lld rows, on a stage's %d GPU%s)\n",
          (long long)s->micro_rows, g, g == 1 ? "" : "s");
  const char *sched = s->schedule == 4 ? "ZB-H1" : "1F1B";
  fprintf(out, "pipeline: %d replica%s x %d stage%s x %d GPU%s = %d GPUs; %d micro-batch%s of %lld rows per replica, "
          "%s\n", s->pp_replicas, s->pp_replicas == 1 ? "" : "s", p, p == 1 ? "" : "s", g, g == 1 ? "" : "s",
          s->world, s->micro_batches, s->micro_batches == 1 ? "" : "es", (long long)s->micro_rows, sched);
  fprintf(out, "%5s  %-36s %-11s %16s %11s %12s %9s\n", "stage", "layers", "GPUs", "per micro-batch", "grad sync",
          "memory/GPU", "in flight");
  for (int32_t i = 0; i < p; i++) {
    char layers[160];
    int32_t a = s->stage_first[i], e = s->stage_first[i + 1];
    snprintf(layers, sizeof layers, "%s .. %s (%d)", plan_model_layer(pm, a)->name, plan_model_layer(pm, e - 1)->name,
             e - a);
    if (e - a == 1) snprintf(layers, sizeof layers, "%s (1)", plan_model_layer(pm, a)->name);
    char gpus[32];
    snprintf(gpus, sizeof gpus, g > 1 ? "%d-%d" : "%d", i * g, i * g + g - 1);
    fprintf(out, "%5d  %-36s %-11s %16s %11s %12s %9d\n", i, layers, gpus, pl_fmt_time(s->stage_time[i], t1, sizeof t1),
            pl_fmt_time(s->stage_sync[i], t2, sizeof t2), pl_fmt_bytes(s->stage_mem[i], b1, sizeof b1),
            s->stage_inflight[i]);
    if (s->stage_mem[i] > s->stage_mem[busiest]) busiest = i;
  }
  double slow = 0;
  for (int32_t i = 0; i < p; i++)
    if (s->stage_time[i] > slow) slow = s->stage_time[i];
  fprintf(out, "\npredicted step time (%s, %s over %d micro-batches): %s = %d x the slowest stage %s + bubble %s + "
          "gradient sync %s; %.0f tokens/s (%lld tokens per step)", s->train ? "training" : "forward", sched,
          s->micro_batches, pl_fmt_time(s->step_s, t1, sizeof t1), s->micro_batches, pl_fmt_time(slow, t2, sizeof t2),
          pl_fmt_time(s->bubble_s, t3, sizeof t3), pl_fmt_time(s->sync_s, t4, sizeof t4),
          (double)pm->tokens / s->step_s, (long long)pm->tokens);
  pl_write_mfu(out, pm, s, prof);
  double params = s->rank_params[busiest * g];
  fprintf(out, "memory per GPU: parameters %s + activations%s %s = %s of %s (%s; stage %d, its busiest rank)\n",
          pl_fmt_bytes(params, b1, sizeof b1), s->train ? " and training state" : "",
          pl_fmt_bytes(s->stage_mem[busiest] - params, b2, sizeof b2), pl_fmt_bytes(s->stage_mem[busiest], b3, sizeof b3),
          pl_fmt_bytes(s->mem_cap, b4, sizeof b4), prof->device, busiest);
  if (s->train) pl_write_zero_report(out, s);
  fprintf(out, "stage inputs: %s per micro-batch summed over the boundaries (point to point, forward and backward)\n",
          pl_fmt_time(s->p2p_s, t1, sizeof t1));
  if (s->flat_step_s > 0)
    fprintf(out, "without stages (the flat search): step %s\n", pl_fmt_time(s->flat_step_s, t1, sizeof t1));
  fprintf(out, "search: %d layers x %d placements per stage; %d pipeline structures (stage GPUs x stages x replicas x "
          "micro-batches) in %.1f ms\n", pm->n, s->states, s->structures, s->search_ms);
}
