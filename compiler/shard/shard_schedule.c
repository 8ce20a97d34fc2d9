/* shard_schedule.c — pipeline schedules as data: for every rank set (physical stage) of every
 * pipeline, the list of its actions (F, B, W of a micro-batch on a chunk) in the order it runs
 * them. The tables of GPipe, 1F1B, interleaved 1F1B (Megatron's order) and ZB-H1 (zero bubble,
 * the backward split into B and W, the Ws filling the cool-down's bubbles) are made by small
 * functions here; a user may hand one as a CSV file instead (the format of
 * torch.distributed.pipelining: one line per rank set, cells such as 0F1 = chunk 0, forward,
 * micro-batch 1). Every table is checked before it is applied (shard_order.c applies it and
 * finds what only the program's dependencies can show: a deadlock across ranks). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

void sh_schedule_free(sh_schedule *s) {
  for (int32_t r = 0; r < s->nrows; r++) free(s->acts[r]);
  free(s->acts);
  free(s->nacts);
  free(s->row_pipe);
  free(s->row_set);
  *s = (sh_schedule){0};
}

/* ---- making tables ---- */

typedef struct row_builder {
  sh_action *a;
  int32_t n, cap;
} row_builder;

static void push(row_builder *b, sh_phase ph, int32_t mb, int32_t chunk) {
  if (b->n == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 16;
    b->a = realloc(b->a, (size_t)b->cap * sizeof *b->a);
    if (!b->a) ntp_out_of_memory();
  }
  b->a[b->n++] = (sh_action){ph, mb, chunk};
}

/* GPipe: every forward, chunk by chunk, then every backward, last chunk first. */
static void gpipe(row_builder *b, int32_t P, int32_t v, int32_t i, int32_t M) {
  for (int32_t c = 0; c < v; c++)
    for (int32_t k = 0; k < M; k++) push(b, SH_PHASE_F, k, i + c * P);
  for (int32_t c = v; c-- > 0;)
    for (int32_t k = 0; k < M; k++) push(b, SH_PHASE_B, k, i + c * P);
}

/* 1F1B: P - 1 - i forwards to fill the pipeline, then one forward and one backward in turn. */
static void one_f_one_b(row_builder *b, int32_t P, int32_t i, int32_t M) {
  int32_t warm = P - 1 - i < M ? P - 1 - i : M, nextf = 0;
  for (; nextf < warm; nextf++) push(b, SH_PHASE_F, nextf, i);
  for (int32_t k = 0; k < M; k++) {
    if (nextf < M) push(b, SH_PHASE_F, nextf++, i);
    push(b, SH_PHASE_B, k, i);
  }
}

/* ZB-H1 (zero bubble, the backward split into B and W): every stage's row at once, by running
 * the pipeline with each action's cost (cost[i * 3 + phase]: the stage's F, B and W, from the
 * flops of its steps) and letting each stage take, whenever it is free, a B that is ready (it
 * frees the stage before), else a forward (at most P - i micro-batches between forward and B, as
 * 1F1B keeps, and at most P + 1 whose W is still to come), else a W: the Ws fill the waits. With
 * equal costs this is the paper's bubble, (p - 1)(F + B - W). */
static void zbh1(row_builder *rows, int32_t P, int32_t M, const double *cost) {
  int32_t *f = calloc((size_t)P, sizeof *f), *bk = calloc((size_t)P, sizeof *bk), *w = calloc((size_t)P, sizeof *w);
  double *fend = malloc((size_t)P * (size_t)M * sizeof *fend), *bend = malloc((size_t)P * (size_t)M * sizeof *bend);
  double *free_at = calloc((size_t)P, sizeof *free_at);
  if (!f || !bk || !w || !fend || !bend || !free_at) ntp_out_of_memory();
  for (int64_t k = 0; k < (int64_t)P * M; k++) fend[k] = bend[k] = INFINITY;
  for (;;) {
    /* the stage that can start something soonest, and what */
    int32_t best = -1;
    sh_phase bph = SH_PHASE_F;
    double bt = INFINITY;
    for (int32_t i = 0; i < P; i++) {
      if (w[i] == M) continue;
      int32_t k = bk[i], kf = f[i];
      double tb = k < M && f[i] > k ? fmax(free_at[i], i == P - 1 ? 0 : bend[(i + 1) * M + k]) : INFINITY;
      double tf = kf < M && f[i] - bk[i] < P - i && f[i] - w[i] < P + 1
                      ? fmax(free_at[i], i == 0 ? 0 : fend[(i - 1) * M + kf]) : INFINITY;
      double tw = w[i] < bk[i] ? free_at[i] : INFINITY;
      /* at the moment the stage is free: B if ready, else F if ready, else W; else the earliest */
      double t;
      sh_phase ph;
      if (tb <= free_at[i]) t = tb, ph = SH_PHASE_B;
      else if (tf <= free_at[i]) t = tf, ph = SH_PHASE_F;
      else if (tw <= free_at[i]) t = tw, ph = SH_PHASE_W;
      else if (tb <= tf) t = tb, ph = SH_PHASE_B;
      else t = tf, ph = SH_PHASE_F;
      if (t < bt) bt = t, best = i, bph = ph;
    }
    if (best < 0 || isinf(bt)) break;
    int32_t i = best;
    double end = bt + cost[i * 3 + bph];
    free_at[i] = end;
    if (bph == SH_PHASE_B) push(&rows[i], SH_PHASE_B, bk[i], i), bend[i * M + bk[i]] = end, bk[i]++;
    else if (bph == SH_PHASE_F) push(&rows[i], SH_PHASE_F, f[i], i), fend[i * M + f[i]] = end, f[i]++;
    else push(&rows[i], SH_PHASE_W, w[i]++, i);
  }
  free(f);
  free(bk);
  free(w);
  free(fend);
  free(bend);
  free(free_at);
}

/* Each rank set's cost of an F, a B and a W of one micro-batch: the flops of its ranks' steps
 * of each phase, averaged over its ranks and micro-batches (an action with none counts 1). */
static void action_costs(const sh_program *p, int32_t q, int32_t P, double *cost) {
  int32_t M = p->micro_batches;
  for (int32_t k = 0; k < 3 * P; k++) cost[k] = 0;
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMM || st->mb < 0) continue;
    int32_t set = p->pipes.npipes ? p->pipes.set_of_rank[st->rank] : 0;
    if (p->pipes.npipes && p->pipes.pipe_of_rank[st->rank] != q) continue;
    int32_t n = p->pipes.npipes ? p->pipes.pipe[q].stages[set].rank_hi - p->pipes.pipe[q].stages[set].rank_lo : p->world;
    cost[set * 3 + st->phase] += sh_step_flops(p, s) / ((double)n * M);
  }
  for (int32_t k = 0; k < 3 * P; k++)
    if (cost[k] <= 0) cost[k] = 1;
}

/* Interleaved 1F1B (Megatron): forward k of M v runs micro-batch (k / Pv) P + k mod P on the
 * set's chunk (k mod Pv) / P; backwards the same with the chunks reversed; a longer warm-up. */
static void interleaved(row_builder *b, int32_t P, int32_t v, int32_t i, int32_t M) {
  int32_t total = M * v, warm = (P - i - 1) * 2 + (v - 1) * P;
  if (warm > total) warm = total;
  int32_t f = 0;
#define FWD(k) push(b, SH_PHASE_F, (k) / (P * v) * P + (k) % P, i + (k) % (P * v) / P * P)
#define BWD(k) push(b, SH_PHASE_B, (k) / (P * v) * P + (k) % P, i + (v - 1 - (k) % (P * v) / P) * P)
  for (; f < warm; f++) FWD(f);
  for (int32_t k = 0; k < total; k++) {
    if (f < total) FWD(f), f++;
    BWD(k);
  }
#undef FWD
#undef BWD
}

static sh_schedule_kind kind_for(const sh_pipe_options *opt, int32_t v) {
  if (opt->schedule != SH_SCHED_DEFAULT) return opt->schedule;
  return v > 1 ? SH_SCHED_INTERLEAVED : SH_SCHED_1F1B;
}

static const char *kind_name(sh_schedule_kind k) {
  switch (k) {
  case SH_SCHED_GPIPE: return "GPipe";
  case SH_SCHED_INTERLEAVED: return "interleaved 1F1B";
  case SH_SCHED_ZBH1: return "ZB-H1";
  default: return "1F1B";
  }
}

/* The rows (pipeline, rank set) of a program: one pipeline of one set when it has no stages. */
static void layout_rows(const sh_program *p, sh_schedule *s) {
  int32_t n = 0, np = p->pipes.npipes ? p->pipes.npipes : 1;
  for (int32_t q = 0; q < np; q++) n += p->pipes.npipes ? p->pipes.pipe[q].nsets : 1;
  s->nrows = n;
  s->row_pipe = calloc((size_t)n + 1, sizeof *s->row_pipe);
  s->row_set = calloc((size_t)n + 1, sizeof *s->row_set);
  s->acts = calloc((size_t)n + 1, sizeof *s->acts);
  s->nacts = calloc((size_t)n + 1, sizeof *s->nacts);
  if (!s->row_pipe || !s->row_set || !s->acts || !s->nacts) ntp_out_of_memory();
  n = 0;
  for (int32_t q = 0; q < np; q++)
    for (int32_t i = 0; i < (p->pipes.npipes ? p->pipes.pipe[q].nsets : 1); i++) s->row_pipe[n] = q, s->row_set[n++] = i;
}

static void pipe_shape(const sh_program *p, int32_t q, int32_t *P, int32_t *v) {
  *P = p->pipes.npipes ? p->pipes.pipe[q].nsets : 1;
  *v = p->pipes.npipes ? p->pipes.pipe[q].v : 1;
}

static bool generate(sh_program *p, const sh_pipe_options *opt, diag_sink *diags) {
  sh_schedule *s = &p->sched;
  layout_rows(p, s);
  int32_t M = p->micro_batches;
  for (int32_t r = 0; r < s->nrows; r++) {
    int32_t P, v, q = s->row_pipe[r], i = s->row_set[r];
    pipe_shape(p, q, &P, &v);
    sh_schedule_kind k = kind_for(opt, v);
    s->name = kind_name(k);
    if (v > 1 && (k == SH_SCHED_1F1B || k == SH_SCHED_ZBH1)) {
      diag_emit(diags, NTPC_ERROR, "<command line>", NTP_NOLOC,
                "--schedule %s runs one chunk per rank, but pipeline %d's ranks hold %d chunks each (interleaved "
                "stages): use interleaved or gpipe",
                s->name, q, v);
      return false;
    }
    if (k == SH_SCHED_INTERLEAVED && M % P) {
      diag_emit(diags, NTPC_ERROR, "<command line>", NTP_NOLOC,
                "interleaved 1F1B needs the micro-batches (%d) to be a multiple of pipeline %d's rank sets (%d)", M, q,
                P);
      return false;
    }
    s->split_w |= k == SH_SCHED_ZBH1;
    if (k == SH_SCHED_ZBH1) { /* the pipeline's rows together, made with its first */
      if (i) continue;
      row_builder *rows = calloc((size_t)P, sizeof *rows);
      double *cost = malloc(3 * (size_t)P * sizeof *cost);
      if (!rows || !cost) ntp_out_of_memory();
      action_costs(p, q, P, cost);
      zbh1(rows, P, M, cost);
      free(cost);
      for (int32_t j = 0; j < P; j++) s->acts[r + j] = rows[j].a, s->nacts[r + j] = rows[j].n;
      free(rows);
      continue;
    }
    row_builder b = {0};
    if (k == SH_SCHED_GPIPE) gpipe(&b, P, v, i, M);
    else if (k == SH_SCHED_INTERLEAVED) interleaved(&b, P, v, i, M);
    else one_f_one_b(&b, P, i, M);
    s->acts[r] = b.a;
    s->nacts[r] = b.n;
  }
  return true;
}

/* ---- reading a table (CSV) ---- */

static bool parse_cell(const char *c, sh_action *a) {
  char *end;
  errno = 0;
  long ch = strtol(c, &end, 10);
  if (end == c || errno || ch < 0 || ch > INT32_MAX) return false;
  char ph = (char)toupper((unsigned char)*end);
  if (ph != 'F' && ph != 'B' && ph != 'W') return false;
  const char *m = end + 1;
  long mb = strtol(m, &end, 10);
  if (end == m || errno || mb < 0 || mb > INT32_MAX) return false;
  while (isspace((unsigned char)*end)) end++;
  if (*end) return false;
  *a = (sh_action){ph == 'F' ? SH_PHASE_F : ph == 'B' ? SH_PHASE_B : SH_PHASE_W, (int32_t)mb, (int32_t)ch};
  return true;
}

static bool read_csv(sh_program *p, const char *path, diag_sink *diags) {
  sh_schedule *s = &p->sched;
  layout_rows(p, s);
  s->name = path;
  FILE *f = fopen(path, "r");
  if (!f) {
    diag_emit(diags, NTPC_ERROR, path, NTP_NOLOC, "cannot read the schedule: %s", strerror(errno));
    return false;
  }
  char line[1 << 16];
  int32_t row = 0, lineno = 0;
  bool ok = true;
  while (ok && fgets(line, sizeof line, f)) {
    lineno++;
    char *q = line;
    while (isspace((unsigned char)*q)) q++;
    if (!*q || *q == '#') continue;
    if (row == s->nrows) {
      diag_emit(diags, NTPC_ERROR, path, (ntp_loc){lineno, 1, lineno, 1},
                "the schedule has more lines than the program has rank sets (%d)", s->nrows);
      ok = false;
      break;
    }
    row_builder b = {0};
    int col = 1;
    for (char *cell = strtok(q, ",\n\r"); cell && ok; cell = strtok(NULL, ",\n\r"), col++) {
      while (isspace((unsigned char)*cell)) cell++;
      if (!*cell) continue;
      sh_action a;
      if (!parse_cell(cell, &a)) {
        diag_emit(diags, NTPC_ERROR, path, (ntp_loc){lineno, col, lineno, col},
                  "cell %d: '%s' is not an action (CHUNK F|B|W MICROBATCH, as 0F1)", col, cell);
        ok = false;
        break;
      }
      push(&b, a.phase, a.mb, a.chunk);
      s->split_w |= a.phase == SH_PHASE_W;
    }
    s->acts[row] = b.a;
    s->nacts[row++] = b.n;
  }
  fclose(f);
  if (ok && row < s->nrows) {
    diag_emit(diags, NTPC_ERROR, path, NTP_NOLOC, "the schedule has %d lines, but the program has %d rank sets", row,
              s->nrows);
    ok = false;
  }
  return ok;
}

/* ---- checking a table ---- */

/* Each row: its set's chunks only, each (phase, micro-batch, chunk) once and all there, F before
 * B before W. The first bad action is named. */
static bool check_table(const sh_program *p, const char *file, diag_sink *diags) {
  const sh_schedule *s = &p->sched;
  int32_t M = p->micro_batches;
  bool training = p->global->n_forward_ops > 0;
  for (int32_t r = 0; r < s->nrows; r++) {
    int32_t P, v, i = s->row_set[r];
    pipe_shape(p, s->row_pipe[r], &P, &v);
    int32_t n = 3 * M * v;
    int32_t *at = malloc(((size_t)n + 1) * sizeof *at);
    if (!at) ntp_out_of_memory();
    for (int32_t k = 0; k < n; k++) at[k] = -1;
    char where[160];
    for (int32_t k = 0; k < s->nacts[r]; k++) {
      const sh_action *a = &s->acts[r][k];
      snprintf(where, sizeof where, "schedule %s, rank set %d of pipeline %d, action %d '%d%s%d'", s->name, i,
               s->row_pipe[r], k, a->chunk, sh_phase_letter(a->phase), a->mb);
      const char *bad = NULL;
      int32_t cl = a->chunk % P == i ? a->chunk / P : -1;
      if (a->chunk % P != i || cl >= v) bad = "its chunk does not run on this rank set";
      else if (a->mb >= M) bad = "no such micro-batch";
      else if (a->phase == SH_PHASE_W && !s->split_w) bad = "a W in a table without Ws";
      else if (at[(a->phase * v + cl) * M + a->mb] >= 0) bad = "it comes twice";
      else if (a->phase != SH_PHASE_F && at[(0 * v + cl) * M + a->mb] < 0) bad = "a backward before its forward";
      else if (a->phase == SH_PHASE_W && at[(1 * v + cl) * M + a->mb] < 0) bad = "a W before its B";
      if (bad) {
        diag_emit(diags, NTPC_ERROR, file, NTP_NOLOC, "%s: %s", where, bad);
        free(at);
        return false;
      }
      at[(a->phase * v + cl) * M + a->mb] = k;
    }
    for (int32_t ph = 0; ph < (s->split_w ? 3 : training ? 2 : 1); ph++)
      for (int32_t cl = 0; cl < v; cl++)
        for (int32_t k = 0; k < M; k++)
          if (at[(ph * v + cl) * M + k] < 0) {
            diag_emit(diags, NTPC_ERROR, file, NTP_NOLOC,
                      "schedule %s, rank set %d of pipeline %d: action '%d%s%d' is missing", s->name, i, s->row_pipe[r],
                      i + cl * P, sh_phase_letter((sh_phase)ph), k);
            free(at);
            return false;
          }
    free(at);
  }
  return true;
}

bool shard_schedule(sh_program *p, const sh_pipe_options *opt, diag_sink *diags) {
  sh_mark_weight_steps(p); /* the W steps first: ZB-H1's table weighs them */
  bool ok = opt->schedule_csv ? read_csv(p, opt->schedule_csv, diags) : generate(p, opt, diags);
  ok = ok && check_table(p, opt->schedule_csv ? opt->schedule_csv : "<command line>", diags);
  return ok && shard_order(p, diags);
}

double sh_schedule_formula(const sh_program *p, int32_t pipe) {
  int32_t P, v, M = p->micro_batches;
  pipe_shape(p, pipe, &P, &v);
  const char *n = p->sched.name ? p->sched.name : "";
  if (!strcmp(n, "ZB-H1")) return (double)(P - 1) / (3.0 * M);
  if (!strcmp(n, "interleaved 1F1B")) return (double)(P - 1) / ((double)v * M);
  if (!strcmp(n, "GPipe") || !strcmp(n, "1F1B")) return (double)(P - 1) / M;
  return NAN; /* a table from a file: no formula */
}

static void print_bubbles(const sh_program *p, const double *cost, const char *what, FILE *out) {
  sh_timeline t;
  if (!sh_timeline_run(p, cost, &t)) return;
  fprintf(out, "  bubble (%s):", what);
  double sum = 0;
  for (int32_t r = 0; r < p->world; r++) {
    double b = sh_timeline_bubble(&t, r);
    sum += b;
    if (p->world <= 16) fprintf(out, " %.3f", b);
  }
  fprintf(out, "%s mean %.3f\n", p->world <= 16 ? ";" : "", sum / p->world);
  sh_timeline_free(&t);
}

/* ntpc report: the schedule, each rank set's peak activation memory, the bubble. */
void sh_print_pipeline(const sh_program *p, FILE *out) {
  const sh_schedule *s = &p->sched;
  sh_print_schedule(p, out);
  fputs("  peak activation memory per rank set (the arena: the micro-batches the schedule keeps):", out);
  for (int32_t r = 0; r < s->nrows; r++) {
    int32_t lo = 0, hi = p->world;
    if (p->pipes.npipes) lo = p->pipes.pipe[s->row_pipe[r]].stages[s->row_set[r]].rank_lo,
                         hi = p->pipes.pipe[s->row_pipe[r]].stages[s->row_set[r]].rank_hi;
    int64_t peak = 0;
    for (int32_t k = lo; k < hi && p->mem; k++) peak = p->mem[k].arena_bytes > peak ? p->mem[k].arena_bytes : peak;
    fprintf(out, "%s ranks %d..%d %.1f KiB", r ? "," : "", lo, hi - 1, (double)peak / 1024.0);
  }
  fputc('\n', out);
  double *cost = malloc((p->n_steps + 1) * sizeof *cost);
  if (!cost) return;
  sh_unit_costs(p, cost);
  print_bubbles(p, cost, "idle / busy per rank, one unit per action", out);
  double f = sh_schedule_formula(p, 0);
  if (!isnan(f)) fprintf(out, "  the formula for pipeline 0 (%s): %.3f\n", s->name, f);
  for (size_t k = 0; k < p->n_steps; k++) cost[k] = sh_step_flops(p, k);
  print_bubbles(p, cost, "idle / busy per rank, steps costed by their flops", out);
  free(cost);
}

void sh_print_schedule(const sh_program *p, FILE *out) {
  const sh_schedule *s = &p->sched;
  fprintf(out, "schedule %s: %d micro-batch%s\n", s->name ? s->name : "-", p->micro_batches,
          p->micro_batches == 1 ? "" : "es");
  for (int32_t r = 0; r < s->nrows; r++) {
    int32_t q = s->row_pipe[r], i = s->row_set[r];
    int32_t lo = 0, hi = p->world;
    if (p->pipes.npipes) {
      const sh_stage *st = &p->pipes.pipe[q].stages[i];
      lo = st->rank_lo, hi = st->rank_hi;
    }
    fprintf(out, "  pipeline %d set %d (ranks %d..%d):", q, i, lo, hi - 1);
    for (int32_t k = 0; k < s->nacts[r]; k++)
      fprintf(out, " %d%s%d", s->acts[r][k].chunk, sh_phase_letter(s->acts[r][k].phase), s->acts[r][k].mb);
    fputc('\n', out);
  }
}
