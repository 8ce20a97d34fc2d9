/* shard_timeline.c — a pipelined program's timeline: when each rank runs each step, given what
 * every step costs, and the bubble it leaves (the time a rank idles while the pipeline fills and
 * drains). The costs are measured (bench/bench_bubble.c times every step of the CPU
 * simulation), counted (the floating-point operations of each step: `ntpc report`), or one unit
 * per action (the schedule alone, which gives the textbook formulas exactly).
 *
 * The replay runs each rank's steps in the program's order: a compute step starts when its rank
 * is free and its operands are made; a transfer finishes on its receivers when they reach it and
 * the data was sent (a sender posts its part and goes on, as grouped NCCL send/recv lets it);
 * transfers cost nothing here, so the bubble is the schedule's, not the network's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

void sh_timeline_free(sh_timeline *t) {
  free(t->start);
  free(t->end);
  free(t->busy);
  *t = (sh_timeline){0};
}

double sh_step_flops(const sh_program *p, size_t s) {
  const sh_step *st = &p->steps[s];
  if (st->kind == SH_COMM) return 0;
  const ir_op *op = &st->op;
  if (op->code == IR_PARAM || op->code == IR_INPUT || op->code == IR_CONST) return 0;
  double out = (double)box_volume(&p->tensors[op->result].box);
  if (op->code == IR_MATMUL) { /* 2 M N K: the result's elements times the contracted dim */
    const ntp_box *a = &p->tensors[op->args[0]].box;
    int d = a->ndim - 1;
    double K = (double)(op->attr.mm.trans_a ? a->hi[d - 1] - a->lo[d - 1] : a->hi[d] - a->lo[d]);
    return 2 * out * K;
  }
  if (op->code == IR_ATTENTION || op->code == IR_ATTENTION_GRAD) { /* 4 S^2 HD per head and row (QK^T and PV) */
    const ntp_box *q = &p->tensors[op->args[0]].box;
    double S = (double)(q->hi[1] - q->lo[1]);
    return 4 * out * S;
  }
  double in = 0;
  for (int a = 0; a < op->nargs; a++) in += (double)box_volume(&p->tensors[op->args[a]].box);
  return out > in ? out : in; /* elementwise, norms, reductions: a pass over the larger side */
}

void sh_unit_costs(const sh_program *p, double *cost) {
  /* each (rank, phase, micro-batch, chunk): one unit (a B that carries its W: two), shared by
   * its steps in proportion to their flops, so the ranks of a stage go through an action at one
   * pace and meet at its collectives as they would */
  int32_t M = p->micro_batches, C = sh_max_chunks(p);
  size_t nk = (size_t)p->world * 3 * (size_t)M * (size_t)C;
  double *total = calloc(nk + 1, sizeof *total);
  size_t *key = malloc((p->n_steps + 1) * sizeof *key);
  if (!total || !key) ntp_out_of_memory();
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    cost[s] = 0;
    key[s] = nk;
    if (st->kind == SH_COMM || st->mb < 0) continue;
    sh_phase ph = sh_action_phase(p, st);
    key[s] = (((size_t)st->rank * 3 + (size_t)ph) * (size_t)M + (size_t)st->mb) * (size_t)C +
             (size_t)sh_rank_chunk(p, st->rank, st->at_layer);
    cost[s] = sh_step_flops(p, s);
    total[key[s]] += cost[s];
  }
  for (size_t s = 0; s < p->n_steps; s++) {
    if (key[s] == nk || total[key[s]] <= 0) continue;
    const sh_step *st = &p->steps[s];
    bool with_w = !p->sched.split_w && st->phase != SH_PHASE_F;
    cost[s] = (with_w ? 2.0 : 1.0) * cost[s] / total[key[s]];
  }
  free(total);
  free(key);
}

bool sh_timeline_run(const sh_program *p, const double *cost, sh_timeline *t) {
  *t = (sh_timeline){0};
  size_t ns = p->n_steps, nt = p->n_tensors;
  t->start = calloc(ns + 1, sizeof *t->start);
  t->end = calloc(ns + 1, sizeof *t->end);
  t->busy = calloc((size_t)p->world + 1, sizeof *t->busy);
  double *free_at = calloc((size_t)p->world + 1, sizeof *free_at), *made = calloc(nt + 1, sizeof *made);
  if (!t->start || !t->end || !t->busy || !free_at || !made) {
    free(free_at);
    free(made);
    sh_timeline_free(t);
    return false;
  }
  for (size_t s = 0; s < ns; s++) {
    const sh_step *st = &p->steps[s];
    double c = st->mb >= 0 ? cost[s] : 0; /* steps of no micro-batch (the sync, the loss's total): not the pipeline's */
    if (st->kind == SH_COMPUTE) {
      double at = free_at[st->rank];
      for (int a = 0; a < st->op.nargs; a++) at = fmax(at, made[st->op.args[a]]);
      t->start[s] = at;
      t->end[s] = at + c;
      free_at[st->rank] = t->end[s];
      made[st->op.result] = t->end[s];
      t->busy[st->rank] += c;
      continue;
    }
    /* each receiver waits for what is sent to it (a sender posts its part and goes on) */
    t->start[s] = t->end[s] = 0;
    for (size_t x = 0; x < st->nxfers; x++) {
      int32_t d = p->tensors[st->xfers[x].dst].rank;
      double at = fmax(free_at[d], made[st->xfers[x].src]);
      free_at[d] = at;
      t->end[s] = fmax(t->end[s], at);
    }
    for (size_t x = 0; x < st->nxfers; x++) /* a destination summed from several: when its last part is in */
      made[st->xfers[x].dst] = fmax(made[st->xfers[x].dst], free_at[p->tensors[st->xfers[x].dst].rank]);
  }
  for (int32_t r = 0; r < p->world; r++) t->makespan = fmax(t->makespan, free_at[r]);
  free(free_at);
  free(made);
  return true;
}

double sh_timeline_bubble(const sh_timeline *t, int32_t rank) {
  double b = t->busy[rank];
  return b > 0 ? (t->makespan - b) / b : 0;
}

/* ---- the timeline as an SVG: ranks as rows, a box per action ---- */

static const char *fill(sh_phase ph, int32_t mb) {
  static const char *f[] = {"#4e79a7", "#6b95c4", "#2f5f8a", "#86a9d6"};
  static const char *b[] = {"#59a14f", "#7cc06f", "#3b7f33", "#98d08c"};
  static const char *w[] = {"#edc948", "#f3da7e", "#c9a82a", "#f7e6a6"};
  int k = mb & 3;
  return ph == SH_PHASE_F ? f[k] : ph == SH_PHASE_B ? b[k] : w[k];
}

void sh_timeline_svg(const sh_program *p, const sh_timeline *t, const char *title, FILE *out) {
  const double W = 1000, row = 24, left = 70, top = 40;
  double scale = t->makespan > 0 ? W / t->makespan : 1;
  double H = top + row * p->world + 40;
  fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n",
          left + W + 20, H);
  fprintf(out, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s</text>\n", left, title);
  for (int32_t r = 0; r < p->world; r++) {
    double y = top + row * r;
    fprintf(out, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n", left, y, W, row - 4);
    fprintf(out, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + row / 2 + 2, r);
  }
  /* per rank, one box per run of its consecutive steps of one action */
  for (int32_t r = 0; r < p->world; r++) {
    double y = top + row * r;
    for (size_t s = 0; s < p->n_steps;) {
      const sh_step *st = &p->steps[s];
      if (st->kind == SH_COMM || st->rank != r || st->mb < 0 || t->end[s] <= t->start[s]) {
        s++;
        continue;
      }
      double x0 = t->start[s], x1 = t->end[s];
      size_t e = s + 1;
      for (; e < p->n_steps; e++) {
        const sh_step *n = &p->steps[e];
        if (n->kind == SH_COMM || n->rank != r || t->end[e] <= t->start[e]) continue;
        if (n->mb != st->mb || sh_action_phase(p, n) != sh_action_phase(p, st)) break;
        x1 = fmax(x1, t->end[e]);
      }
      fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"#ffffff\" "
                   "stroke-width=\"0.5\"><title>rank %d: %s of micro-batch %d</title></rect>\n",
              left + x0 * scale, y, fmax((x1 - x0) * scale, 0.5), row - 4, fill(sh_action_phase(p, st), st->mb), r,
              sh_action_phase(p, st) == SH_PHASE_F ? "forward"
              : sh_action_phase(p, st) == SH_PHASE_B ? (p->sched.split_w ? "backward (B)" : "backward")
                                                 : "weight gradients (W)",
              st->mb);
      if ((x1 - x0) * scale > 14)
        fprintf(out, "<text x=\"%.2f\" y=\"%.1f\" fill=\"#ffffff\">%s%d</text>\n", left + x0 * scale + 2,
                y + row / 2 + 2, sh_phase_letter(sh_action_phase(p, st)),
                st->mb);
      s = e;
    }
  }
  fprintf(out, "<text x=\"%.0f\" y=\"%.0f\">F forward, B backward, W weight gradients; the number is the micro-batch; "
               "grey: idle (the bubble)</text>\n</svg>\n",
          left, H - 12);
}
