/* train_straggler.c — `ntpc train --slow GPU:FACTOR`: a GPU that is slow, not failed
 * (docs/training.md, "Stragglers").
 *
 * Times. In the CPU simulation every rank runs in this process, so a rank's time is taken on the
 * simulated timeline: each compute step costs its floating-point operations at its GPU's speed
 * (1 / FACTOR for a --slow one), a rank runs its steps in order, and a step waits for what it reads,
 * sent by other ranks (every transfer waits for its source; the rule of the pipeline timeline,
 * compiler/shard/shard_timeline.c, with every step counted). A step's time is the last rank's end;
 * each rank's busy time over its work (its steps' operations) is its measured speed.
 *
 * Detection: a GPU whose measured speed stays below 1 / STRAG_RATIO of the median's for
 * STRAG_STEPS steps in a row is a straggler.
 *
 * The re-split (no restart, the state moved live as after a failure): every layer's group that
 * holds the straggler is cut into consecutive pieces so that the straggler is a group of its own,
 * and the batch rows go one at a time to the group that finishes them soonest (its GPUs times its
 * slowest GPU's speed): the straggler keeps the rows it can do at its pace, its former group-mates
 * run at full speed. The loss is the mean over
 * the whole batch whatever the split, so the trajectory is the uninterrupted run's (within fp32
 * rounding). A plan with pipeline stages is re-planned as after a failure (plan_failover_stages):
 * the straggler's replica cut again around it (its stage's time its own: fewer layers there, fewer
 * rows for the replica), or its stage going on without it, or the straggler a group of its own inside
 * its stage (the stage's rows by pace), whichever the timeline finds fastest; the straggler's state
 * is still there to be read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec.h"
#include "ir.h"
#include "session_program.h"
#include "shard.h"
#include "train_straggler.h"

#define STRAG_RATIO 1.2 /* slower than the median by this factor */
#define STRAG_STEPS 3   /* for this many steps in a row */

static double box_vol(const ntp_box *b) {
  double v = 1;
  for (int d = 0; d < b->ndim; d++) v *= (double)(b->hi[d] - b->lo[d]);
  return v;
}

/* a compute step's operations (GEMMs 2 M N K, attention 4 S per output element, else a pass) */
static double step_flops(const ntp_program *p, const ntp_step *st) {
  const ntp_op *op = &st->op;
  if (op->code == IR_PARAM || op->code == IR_INPUT || op->code == IR_CONST) return 0;
  double out = box_vol(&p->tensors[op->result].box);
  if (op->code == IR_MATMUL) {
    const ntp_box *a = &p->tensors[op->args[0]].box;
    int d = a->ndim - 1;
    return 2 * out * (double)(op->attr.mm.trans_a ? a->hi[d - 1] - a->lo[d - 1] : a->hi[d] - a->lo[d]);
  }
  if (op->code == IR_ATTENTION || op->code == IR_ATTENTION_GRAD) {
    const ntp_box *q = &p->tensors[op->args[0]].box;
    return 4 * out * (double)(q->hi[1] - q->lo[1]);
  }
  double in = 0;
  for (int a = 0; a < op->nargs; a++) in += box_vol(&p->tensors[op->args[a]].box);
  return out > in ? out : in;
}

double straggler_timeline(const ntp_program *p, const int32_t *phys, const double *slow, double *busy, double *work) {
  double *free_at = calloc((size_t)p->world + 1, sizeof *free_at), *made = calloc(p->n_tensors + 1, sizeof *made);
  double span = 0;
  if (!free_at || !made) {
    free(free_at);
    free(made);
    return NAN;
  }
  for (int32_t r = 0; r < p->world; r++) busy[r] = work[r] = 0;
  for (size_t s = 0; s < p->n_steps; s++) {
    const ntp_step *st = &p->steps[s];
    if (st->kind == SH_COMPUTE) {
      double f = step_flops(p, st), c = f * slow[phys ? phys[st->rank] : st->rank], at = free_at[st->rank];
      for (int a = 0; a < st->op.nargs; a++)
        if (st->op.args[a] >= 0) at = fmax(at, made[st->op.args[a]]);
      free_at[st->rank] = made[st->op.result] = at + c;
      busy[st->rank] += c, work[st->rank] += f;
      continue;
    }
    for (size_t x = 0; x < st->nxfers; x++) { /* a receiver waits for what is sent to it */
      int32_t d = p->tensors[st->xfers[x].dst].rank;
      free_at[d] = fmax(free_at[d], made[st->xfers[x].src]);
    }
    for (size_t x = 0; x < st->nxfers; x++)
      made[st->xfers[x].dst] = fmax(made[st->xfers[x].dst], free_at[p->tensors[st->xfers[x].dst].rank]);
  }
  for (int32_t r = 0; r < p->world; r++) span = fmax(span, free_at[r]);
  free(free_at);
  free(made);
  return span;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int32_t straggler_watch(straggler_watch_state *w, const ntp_program *p, const int32_t *phys, const double *slow,
                        double *speed) {
  int32_t W = p->world, found = -1;
  double *busy = calloc((size_t)W + 1, sizeof *busy), *work = calloc((size_t)W + 1, sizeof *work);
  double *sp = calloc((size_t)W + 1, sizeof *sp);
  if (busy && work && sp && isfinite(straggler_timeline(p, phys, slow, busy, work))) {
    int32_t n = 0;
    for (int32_t r = 0; r < W; r++)
      if (busy[r] > 0) sp[n++] = work[r] / busy[r];
    qsort(sp, (size_t)n, sizeof *sp, cmp_double);
    double med = n ? sp[n / 2] : 1;
    for (int32_t r = 0; r < W; r++) {
      int32_t g = phys ? phys[r] : r;
      speed[g] = busy[r] > 0 ? work[r] / busy[r] / med : 1;
      w->streak[g] = speed[g] < 1 / STRAG_RATIO ? w->streak[g] + 1 : 0;
      if (w->streak[g] >= STRAG_STEPS && !w->handled[g] && found < 0) found = g;
    }
  }
  free(busy);
  free(work);
  free(sp);
  if (found >= 0) w->handled[found] = true;
  return found;
}

/* What a piece of a group (ranks [lo, hi)) does per unit of time: its rows over its slowest rank's
 * busy time on the last candidate's timeline; before any, its GPUs times its speed. */
typedef struct piece_rate {
  int32_t lo, hi;
  double rate;
} piece_rate;

typedef struct resplit {
  const sh_program *sp; /* the run's program, as compiled (its placements) */
  const int32_t *phys;  /* its rank r on physical GPU phys[r] (NULL: r) */
  int32_t slow_rank;
  double speed;
  bool isolate;         /* cut the straggler's groups so it is a group of its own */
  piece_rate *rates;
  int nrates;
  double pipe_share[NTP_MAX_PIPES]; /* a staged plan: each pipeline's batch share */
} resplit;

static double rate_of(const resplit *rs, int32_t lo, int32_t hi) {
  for (int k = 0; k < rs->nrates; k++)
    if (rs->rates[k].lo == lo && rs->rates[k].hi == hi && rs->rates[k].rate > 0) return rs->rates[k].rate;
  return (double)(hi - lo) * (rs->slow_rank >= lo && rs->slow_rank < hi ? rs->speed : 1.0);
}

/* Layer l's pieces (ranks) and rows in pipeline pi (-1: every group): its groups, cut around the
 * straggler when isolating; the rows one at a time to the piece that finishes them soonest. n
 * pieces; rows 0: a layer that follows. */
static int pieces(const resplit *rs, size_t l, int32_t pi, int32_t *lo, int32_t *hi, int64_t *share, int64_t *rows) {
  const sh_placement *pl = &rs->sp->placements[l];
  int n = 0, g0 = -1, g1 = -1;
  for (int g = 0; g < pl->ngroups && n + 3 <= NTP_MAX_GROUPS; g++) {
    if (pi >= 0 && pl->npipes && pl->group_pipe[g] != pi) continue;
    int32_t a = pl->group_start[g], e = pl->group_end[g], cut[4] = {a, a, e, e};
    if (rs->isolate && rs->slow_rank >= a && rs->slow_rank < e) cut[1] = rs->slow_rank, cut[2] = rs->slow_rank + 1;
    for (int k = 0; k < 3; k++)
      if (cut[k + 1] > cut[k]) lo[n] = cut[k], hi[n] = cut[k + 1], share[n++] = 0;
    g1 = g + 1;
    if (g0 < 0) g0 = g;
  }
  *rows = g0 < 0 ? 0 : pl->row_start[g1] - pl->row_start[g0];
  for (int64_t i = 0; i < *rows; i++) {
    int best = 0;
    for (int k = 1; k < n; k++)
      if ((double)(share[k] + 1) / rate_of(rs, lo[k], hi[k]) < (double)(share[best] + 1) / rate_of(rs, lo[best], hi[best]))
        best = k;
    share[best]++;
  }
  return n;
}

/* layer l's rule: its pieces in pipeline pi; its groups kept where a piece cut around the straggler
 * would be left without rows (a few rows a micro-batch); false when a piece is left without rows
 * even so (batch shares are positive) */
static bool write_layer(FILE *out, const char *indent, const ir_module *m, const resplit *rs, size_t l, int32_t pi) {
  int32_t lo[NTP_MAX_GROUPS], hi[NTP_MAX_GROUPS];
  int64_t share[NTP_MAX_GROUPS], rows;
  int n = pieces(rs, l, pi, lo, hi, share, &rows);
  for (int k = 0; k < n && rows > 0; k++)
    if (!share[k]) {
      if (!rs->isolate) return false;
      resplit kept = *rs;
      kept.isolate = false;
      return write_layer(out, indent, m, &kept, l, pi);
    }
  fprintf(out, "%s%s tp (", indent, m->layers[l].name);
  for (int k = 0; k < n; k++) fprintf(out, "%s%d", k ? ", " : "", hi[k] - lo[k]);
  fputc(')', out);
  for (int k = 0; rows > 0 && n > 1 && k < n; k++) fprintf(out, "%s%lld%s", k ? ", " : ", batch (", (long long)share[k], k + 1 == n ? ")" : "");
  const sh_placement *pl = &rs->sp->placements[l];
  fprintf(out, "%s%s;\n", pl->seq_parallel ? ", sequence_parallel" : "", pl->recompute ? ", recompute" : "");
  return true;
}

static bool write_resplit(FILE *out, const ir_module *m, const resplit *rs) {
  const sh_program *sp = rs->sp;
  bool ok = true;
  fprintf(out, "plan resplit for %s {\n  world %d;\n", m->name, sp->world);
  if (sp->micro_batches > 1) fprintf(out, "  micro_batches %d;\n", sp->micro_batches);
  if (sp->zero) fprintf(out, "  optimizer zero %d redundancy %d;\n", sp->zero, sp->redundancy);
  for (int32_t pi = 0; pi < sp->pipes.npipes; pi++) { /* a staged plan: each pipeline's stages and rules */
    const sh_pipeline *P = &sp->pipes.pipe[pi];
    fprintf(out, "  pipeline batch %.0f {\n", fmax(1, rs->pipe_share[pi]));
    for (int32_t i = 0; i < P->nstages; i++) {
      const sh_stage *st = &P->stages[i];
      fprintf(out, "    stage %s .. %s ranks %d..%d;\n", m->layers[st->first_layer].name, m->layers[st->last_layer].name,
              st->rank_lo, st->rank_hi - 1);
    }
    for (size_t l = 0; l < m->n_layers; l++) ok = ok && write_layer(out, "    ", m, rs, l, pi);
    fputs("  }\n", out);
  }
  for (size_t l = 0; !sp->pipes.npipes && l < m->n_layers; l++) ok = ok && write_layer(out, "  ", m, rs, l, -1);
  fputs("}\n", out);
  return ok;
}

/* one candidate compiled: its program (NULL when it is no plan), the plan's text kept in text[] */
static ntp_program *candidate(const train_source *src, const ir_module *m, const resplit *rs, char *text, size_t tcap,
                              char *err, size_t cap) {
  char path[] = "/tmp/ntp-resplit-XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    return snprintf(err, cap, "cannot write a re-split plan to %s", path), NULL;
  }
  bool ok = write_resplit(f, m, rs);
  ok = fclose(f) == 0 && ok;
  ntp_program *prog = NULL;
  FILE *in = ok ? fopen(path, "r") : NULL;
  size_t n = in ? fread(text, 1, tcap - 1, in) : 0;
  text[n] = 0;
  if (in) fclose(in);
  ntpc_session *s = ok ? train_session(src, true, rs->sp->world, path, "resplit", rs->phys, err, cap) : NULL;
  if (s) prog = session_program(s, err, cap);
  ntpc_session_free(s);
  unlink(path);
  return prog;
}

/* the rates each piece of rs showed on a candidate's timeline: busy[r], each rank's busy time there
 * (NULL: none measured, the pieces back to their GPUs times their speed) */
static void measure_rates(resplit *rs, const ir_module *m, const double *busy) {
  piece_rate *pr = calloc(NTP_MAX_GROUPS * 4, sizeof *pr);
  int np = 0;
  for (int32_t pi = rs->sp->pipes.npipes ? 0 : -1; busy && pr && pi < rs->sp->pipes.npipes; pi++)
    for (size_t l = 0; l < m->n_layers; l++) {
      int32_t lo[NTP_MAX_GROUPS], hi[NTP_MAX_GROUPS];
      int64_t share[NTP_MAX_GROUPS], rows;
      int n = pieces(rs, l, pi, lo, hi, share, &rows);
      for (int k = 0; k < n && rows > 0 && np < NTP_MAX_GROUPS * 4; k++) {
        bool seen = false;
        for (int j = 0; j < np && !seen; j++) seen = pr[j].lo == lo[k] && pr[j].hi == hi[k];
        double b = 0;
        for (int32_t r = lo[k]; r < hi[k]; r++) b = fmax(b, busy[r]);
        if (!seen && b > 0) pr[np++] = (piece_rate){lo[k], hi[k], (double)share[k] / b};
      }
    }
  free(rs->rates);
  rs->rates = pr, rs->nrates = np;
}

/* the pipelines' rows shared as the timeline measured them: each healthy pipeline's pace scaled by
 * its rows per busy time on candidate p (against the pace the plan gave it) */
static void measured_pace(const ntp_program *p, const int32_t *ph, const int32_t *pipe_of, int32_t npipes,
                          const double *busy, double *scale) {
  double *most = calloc((size_t)npipes, sizeof *most);
  if (!most) return;
  for (int32_t r = 0; r < p->world; r++) {
    int32_t pi = pipe_of[ph ? ph[r] : r];
    if (pi >= 0 && pi < npipes && busy[r] > most[pi]) most[pi] = busy[r];
  }
  /* a pipeline's slowest rank is busy in proportion to its rows over its pace */
  for (int32_t pi = 0; pi < npipes; pi++)
    if (most[pi] > 0) scale[pi] /= most[pi];
  double top = 0;
  for (int32_t pi = 0; pi < npipes; pi++) top = fmax(top, scale[pi]);
  for (int32_t pi = 0; pi < npipes && top > 0; pi++) scale[pi] /= top;
  free(most);
}

/* candidate rs compiled and run once on the timeline, its step in *span (NAN when it could not
 * run); what that run measured kept in rs for the next candidate: the pieces' rates, and in a
 * staged plan the replicas' shares moved halfway (geometrically) to the pace measured (it
 * oscillates on a few rows when moved all the way). NULL when rs is no plan. */
static ntp_program *timed_candidate(const train_source *src, const ir_module *m, resplit *rs, const double *slow,
                                    char *text, double *span, char *err, size_t cap) {
  ntp_program *p = candidate(src, m, rs, text, 1 << 16, err, cap);
  *span = NAN;
  if (!p) return NULL;
  double *busy = calloc((size_t)p->world + 1, sizeof *busy), *work = calloc((size_t)p->world + 1, sizeof *work);
  if (busy && work) *span = straggler_timeline(p, rs->phys, slow, busy, work);
  const sh_pipes *pp = &rs->sp->pipes;
  if (isfinite(*span) && pp->npipes) {
    double was[NTP_MAX_PIPES];
    memcpy(was, rs->pipe_share, sizeof was);
    measured_pace(p, NULL, pp->pipe_of_rank, pp->npipes, busy, rs->pipe_share);
    for (int32_t pi = 0; pi < pp->npipes; pi++) rs->pipe_share[pi] = sqrt(rs->pipe_share[pi] * 1000 * was[pi]);
  }
  measure_rates(rs, m, isfinite(*span) ? busy : NULL);
  free(busy);
  free(work);
  return p;
}

/* a staged plan, a third way: the straggler stays in its stage as a group of its own beside its
 * stage-mates (that stage data-parallel inside, its rows by pace), so the stage runs at
 * (n - 1 + speed) / n of a healthy one rather than at the straggler's speed, and the stages are cut
 * for that pace; the rows inside the stage and between the replicas measured again twice on the
 * timeline. Its program and GPUs, its plan in text[]; NULL when the stage has no one beside it. */
static ntp_program *staged_isolated(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                                    const sh_pipes *pipes, int32_t slow_gpu, double speed, const double *slow,
                                    double *span, int32_t **nphys, char *text, char *err, size_t cap) {
  const sh_pipeline *P = &pipes->pipe[pipes->pipe_of_rank[slow_gpu]];
  int32_t n = 0;
  for (int32_t i = 0; i < P->nstages; i++)
    if (P->stages[i].rank_lo <= slow_gpu && slow_gpu < P->stages[i].rank_hi)
      for (int32_t r = P->stages[i].rank_lo; r < P->stages[i].rank_hi; r++) {
        bool down = false;
        for (int32_t k = 0; k < nfailed; k++) down |= failed[k] == r;
        n += !down;
      }
  double *pace = n >= 2 ? malloc(4096 * sizeof *pace) : NULL;
  char *log = malloc(1 << 15), *cand = malloc(1 << 16);
  ntp_program *best = NULL;
  *span = INFINITY;
  if (!pace || !log || !cand) goto out;
  memcpy(pace, slow, 4096 * sizeof *pace);
  pace[slow_gpu] = n / (n - 1 + speed); /* the stage's slowdown, its straggler a group of its own */
  replan_ask ask = {.failed = failed, .nfailed = nfailed, .slow = pace, .log = log, .log_cap = 1 << 15};
  int32_t *ph = NULL;
  ntpc_session *s = train_replan_session(src, world, &ask, false, &ph, err, cap);
  const sh_program *sp = s ? ntpc_sharded(s) : NULL;
  resplit rs = {.sp = sp, .phys = ph, .slow_rank = -1, .speed = speed, .isolate = true};
  for (int32_t r = 0; sp && r < sp->world; r++)
    if (ph[r] == slow_gpu) rs.slow_rank = r;
  for (int32_t pi = 0; sp && pi < sp->pipes.npipes; pi++) rs.pipe_share[pi] = (double)sp->pipes.pipe[pi].share;
  printf("  its stage's GPUs split around it:");
  for (int it = 0; sp && rs.slow_rank >= 0 && it < 3; it++) {
    double t;
    ntp_program *p = timed_candidate(src, ntpc_module(s), &rs, slow, cand, &t, err, cap);
    if (p) printf(" %.4g%s", t, it ? " (rows as measured)" : " a step on the timeline (rows by the planner's pace),");
    else printf(" no plan (%s)", err[0] ? err : "a piece of a group left without rows");
    if (p && t < *span) {
      ntp_program_free(best);
      best = p, *span = t;
      memcpy(text, cand, 1 << 16);
    } else {
      ntp_program_free(p);
    }
    if (!p) break;
  }
  printf("\n");
  free(rs.rates);
  ntpc_session_free(s);
  if (best) *nphys = ph;
  else free(ph);
out:
  free(pace), free(log), free(cand);
  return best;
}

/* a staged plan: the stages cut around the straggler (its stage's time its own, so fewer layers
 * there and fewer rows for its replica), or the plan without it (its stage one GPU short, as after
 * its failure), the GPUs `failed` down in both; each with the rows shared by the planner's pace,
 * then twice more by the pace measured on its timeline; the fastest, its step in *span */
static ntp_program *staged_resplit(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                                   const sh_pipes *pipes, int32_t slow_gpu, double speed, const double *slow,
                                   double *span, int32_t **nphys, char *err, size_t cap) {
  int32_t down[65];
  if (nfailed > 64) return snprintf(err, cap, "too many GPUs down"), NULL;
  memcpy(down, failed, (size_t)nfailed * sizeof *down);
  down[nfailed] = slow_gpu;
  ntp_program *best = NULL;
  double scale[NTP_MAX_PIPES];
  char *log = malloc(1 << 15), *best_log = malloc(1 << 15);
  if (!log || !best_log) {
    free(log), free(best_log);
    return snprintf(err, cap, "out of memory"), NULL;
  }
  *span = INFINITY;
  static const char *const how[2] = {"its replica's stages cut again around it", "its stage without it"};
  int best_how = 0;
  for (int without = 0; without < 2; without++) {
    for (int32_t pi = 0; pi < NTP_MAX_PIPES; pi++) scale[pi] = 1;
    printf("  %s:", how[without]);
    for (int it = 0; it < 3; it++) {
      int32_t *ph = NULL;
      replan_ask ask = {.failed = down, .nfailed = nfailed + without, .slow = without ? NULL : slow,
                        .pipe_scale = it ? scale : NULL, .log = log, .log_cap = 1 << 15};
      ntp_program *p = train_replan(src, world, &ask, &ph, err, cap);
      double *busy = p ? calloc((size_t)p->world + 1, sizeof *busy) : NULL,
             *work = p ? calloc((size_t)p->world + 1, sizeof *work) : NULL;
      double t = busy && work ? straggler_timeline(p, ph, slow, busy, work) : NAN;
      if (isfinite(t)) measured_pace(p, ph, pipes->pipe_of_rank, pipes->npipes, busy, scale);
      free(busy);
      free(work);
      if (p) printf(" %.4g%s", t, it ? " (rows as measured)" : " a step on the timeline (rows by the planner's pace),");
      if (p && t < *span) {
        ntp_program_free(best);
        free(*nphys);
        best = p, *nphys = ph, *span = t, best_how = without;
        memcpy(best_log, log, 1 << 15);
      } else {
        ntp_program_free(p);
        free(ph);
      }
      if (!p) break;
    }
    printf("\n");
  }
  double iso_span;
  int32_t *iso_phys = NULL;
  char *iso_text = malloc(1 << 16);
  ntp_program *iso = iso_text ? staged_isolated(src, world, failed, nfailed, pipes, slow_gpu, speed, slow, &iso_span,
                                                &iso_phys, iso_text, err, cap)
                              : NULL;
  if (iso && iso_span < *span) {
    ntp_program_free(best);
    free(*nphys);
    best = iso, *nphys = iso_phys, *span = iso_span;
    printf("  the fastest, its stage's GPUs split around it:\n");
    for (char *line = strtok(iso_text, "\n"); line; line = strtok(NULL, "\n"))
      if (line[0] == ' ') printf("  %s\n", line);
  } else {
    ntp_program_free(iso);
    free(iso_phys);
    if (best) printf("  the fastest, %s:\n%s", how[best_how], best_log);
  }
  if (best) err[0] = 0;
  free(log), free(best_log), free(iso_text);
  return best;
}

ntp_program *straggler_resplit(const train_source *src, int32_t world, const int32_t *failed, int32_t nfailed,
                               int32_t slow_gpu, double speed, const double *slow, double *best_span, int32_t **nphys,
                               char *err, size_t cap) {
  ntp_program *best = NULL;
  *nphys = NULL;
  ntpc_session *now = train_session(src, false, world, src->plan_file, src->plan_name, NULL, err, cap);
  const sh_program *sp = now ? ntpc_sharded(now) : NULL;
  char *text = malloc(1 << 16), *best_text = malloc(1 << 16);
  *best_span = INFINITY;
  if (sp && sp->pipes.npipes) {
    best = staged_resplit(src, world, failed, nfailed, &sp->pipes, slow_gpu, speed, slow, best_span, nphys, err, cap);
    sp = NULL;
    if (best_text) best_text[0] = 0;
  }
  int32_t *phys = NULL, slow_rank = slow_gpu;
  if (sp && nfailed) { /* after a failure: the survivors' plan is the one re-split (rank r on GPU phys[r]) */
    ntpc_session_free(now), now = NULL, sp = NULL;
    char log[1]; /* the plan is printed once re-split */
    replan_ask ask = {.failed = failed, .nfailed = nfailed, .log = log, .log_cap = sizeof log};
    now = train_replan_session(src, world, &ask, false, &phys, err, cap);
    sp = now ? ntpc_sharded(now) : NULL;
    slow_rank = -1;
    for (int32_t r = 0; sp && r < sp->world; r++)
      if (phys[r] == slow_gpu) slow_rank = r;
    if (sp && slow_rank < 0) snprintf(err, cap, "internal: GPU %d is not in the survivors' plan", slow_gpu), sp = NULL;
  }
  for (int iso = 1; sp && text && best_text && iso >= 0; iso--) {
    resplit rs = {.sp = sp, .phys = phys, .slow_rank = slow_rank, .speed = speed, .isolate = iso};
    for (int it = 0; it < 3; it++) { /* the rows, then the rows again at the rates measured */
      double span;
      ntp_program *p = timed_candidate(src, ntpc_module(now), &rs, slow, text, &span, err, cap);
      if (!p) break;
      if (span < *best_span) {
        ntp_program_free(best);
        best = p, *best_span = span;
        memcpy(best_text, text, 1 << 16);
      } else {
        ntp_program_free(p);
      }
    }
    free(rs.rates);
  }
  if (best && best_text) { /* the plan, for the log */
    for (char *line = strtok(best_text, "\n"); line; line = strtok(NULL, "\n"))
      if (line[0] == ' ') printf("  %s\n", line);
  } else if (!err[0]) {
    snprintf(err, cap, "no re-split plan around GPU %d compiles", slow_gpu);
  }
  free(text);
  free(best_text);
  ntpc_session_free(now);
  if (best && phys && !*nphys) *nphys = phys; /* a flat plan after a failure: its ranks' GPUs */
  else if (phys != *nphys) free(phys);
  return best;
}

int train_absorb_straggler(straggler_watch_state *w, failover_run *fr, const double *slow, long step,
                           ntp_program **prog, ntp_trainer **tr, int32_t **phys, const ntp_adamw *aw, char *err,
                           size_t cap) {
  static double speed[4096];
  int32_t g = straggler_watch(w, *prog, *phys, slow, speed);
  if (g < 0) return 0;
  int32_t W = (*prog)->world;
  printf("step %4ld: GPU %d is slow: %.2fx the median GPU's time per operation, %d steps in a row (measured on the "
         "run's timeline); the plan is re-split around it:\n", step, g, 1 / speed[g], STRAG_STEPS);
  double t0 = train_now_s();
  err[0] = 0;
  double span = NAN;
  int32_t *nphys = NULL;
  if (!fr->world0) fr->world0 = W; /* no failure yet: the program's is the healthy world */
  ntp_program *np = straggler_resplit(&fr->src, fr->world0, fr->failed, fr->nfailed, g, speed[g], slow, &span, &nphys,
                                      err, cap);
  if (!np) return -1;
  double *busy = calloc((size_t)W + 1, sizeof *busy), *work = calloc((size_t)W + 1, sizeof *work);
  double *one = malloc(4096 * sizeof *one);
  for (int k = 0; one && k < 4096; k++) one[k] = 1;
  double healthy = busy && work && one ? straggler_timeline(*prog, *phys, one, busy, work) : NAN;
  double before = busy && work ? straggler_timeline(*prog, *phys, slow, busy, work) : NAN;

  double after = span;

  free(busy);
  free(work);
  free(one);
  if (!(after < before)) { /* nothing faster: the run goes on as it is */
    printf("  kept the plan: the re-split runs a step in %.4g on the timeline, %.4g as it is\n", after, before);
    ntp_program_free(np);
    free(nphys);
    return 0;
  }
  int *devs = nphys ? malloc((size_t)np->world * sizeof *devs) : NULL; /* rank r on its physical GPU */
  for (int32_t r = 0; devs && r < np->world; r++) devs[r] = nphys[r];
  ntp_exec_options x = {.backend = fr->backend, .loopback = fr->loopback, .devices = fr->loopback ? NULL : devs};
  int64_t moved = 0;
  bool staged = nphys != NULL;
  int rc = train_switch(fr, np, nphys, &x, aw, prog, tr, phys, &moved, err, cap);
  free(devs);
  if (rc != 0) return -1;
  /* a staged plan's later re-plans (a failure, a repair) cut their stages around it too */
  if (staged && !fr->slow_known && (fr->slow_known = malloc(4096 * sizeof *fr->slow_known)))
    for (int k = 0; k < 4096; k++) fr->slow_known[k] = 1;
  if (staged && fr->slow_known) fr->slow_known[g] = 1 / speed[g];
  printf("  resumed in %.3f s: %.1f KiB of state moved to the new slices (no checkpoint read); a step on the timeline "
         "(operations at each GPU's speed): %.4g healthy, %.4g with the straggler, %.4g re-split: %.0f%% of what the "
         "straggler cost recovered%s\n", train_now_s() - t0, (double)moved / 1024.0, healthy, before, after,
         before > healthy ? 100 * (before - after) / (before - healthy) : 100.0,
         after < healthy ? " (the re-split plan is faster than the healthy one on this timeline)" : "");
  return 0;
}

bool straggler_parse(const char *v, double *slow) {
  for (int k = 0; k < 4096; k++) slow[k] = 1;
  for (const char *p = v;;) {
    char *end;
    long g = strtol(p, &end, 10);
    if (end == p || *p < '0' || *p > '9' || g > 4095 || *end != ':') return false;
    p = end + 1;
    double f = strtod(p, &end);
    if (end == p || !(f >= 1 && f <= 100)) return false;
    slow[g] = f;
    if (!*(p = end)) return true;
    if (*p++ != ',') return false;
  }
}
