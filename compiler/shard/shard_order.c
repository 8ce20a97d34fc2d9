/* shard_order.c — a pipelined program's steps put in its schedule's order.
 *
 * Every step of a micro-batch belongs, on each rank it involves, to one action of that rank's
 * row of the schedule: its phase (F, B, or W when the table splits the backward), its
 * micro-batch, and the chunk of the rank that holds the step's layer (for a transfer between
 * two stages, the sender's chunk on the sender and the receiver's on the receiver). A rank's
 * program is its actions in the table's order, each action's steps in the order lowering made
 * them. Steps of no micro-batch (reading parameters and inputs, the loss's seeds and total,
 * weight-gradient sums, the gradient sync) run as soon as their operands are there.
 *
 * The one program list every backend runs is then built by running the ranks together: a rank
 * advances while its next step's operands are ready, a collective when every rank in it has
 * reached it. If no rank can advance, the schedule deadlocks (or breaks a dependency): the
 * rank that waits and what it waits for are reported. The order found is the program's; the
 * memory plan then holds exactly the activations the schedule keeps alive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

/* Rank r's chunk for a step of layer `at`: the last of its chunks that starts no later than the
 * chunk holding `at` (a sender's chunk comes before the receiver's, in both directions). */
int32_t sh_rank_chunk(const sh_program *p, int32_t r, int32_t at) {
  if (!p->pipes.npipes) return 0;
  const sh_pipeline *pp = &p->pipes.pipe[p->pipes.pipe_of_rank[r]];
  int32_t set = p->pipes.set_of_rank[r], c_at = at >= 0 ? sh_pipe_chunk(pp, at) : 0, best = set;
  for (int32_t c = set; c < pp->nstages; c += pp->nsets)
    if (c <= c_at) best = c;
  return best;
}

int32_t sh_max_chunks(const sh_program *p) {
  int32_t C = 1;
  for (int32_t q = 0; q < p->pipes.npipes; q++) C = p->pipes.pipe[q].nstages > C ? p->pipes.pipe[q].nstages : C;
  return C;
}

sh_phase sh_action_phase(const sh_program *p, const sh_step *st) {
  return st->phase == SH_PHASE_W && !p->sched.split_w ? SH_PHASE_B : st->phase;
}

const char *sh_phase_letter(sh_phase ph) { return ph == SH_PHASE_F ? "F" : ph == SH_PHASE_B ? "B" : "W"; }

static int32_t row_of_rank(const sh_program *p, int32_t r) {
  const sh_schedule *s = &p->sched;
  int32_t q = p->pipes.npipes ? p->pipes.pipe_of_rank[r] : 0, set = p->pipes.npipes ? p->pipes.set_of_rank[r] : 0;
  for (int32_t k = 0; k < s->nrows; k++)
    if (s->row_pipe[k] == q && s->row_set[k] == set) return k;
  return -1;
}

/* Weight-gradient steps: backward computes on no path to an activation's gradient (the dW of
 * a layer, the embedding table's scatter): the W of ZB-H1. Everything on such a path is B. */
void sh_mark_weight_steps(sh_program *p) {
  size_t nt = p->n_tensors;
  bool *feeds_b = calloc(nt + 1, 1);
  if (!feeds_b) ntp_out_of_memory();
  for (size_t t = 0; t < nt; t++) feeds_b[t] = p->tensors[t].act_grad;
  for (size_t s = p->n_steps; s-- > 0;) {
    sh_step *st = &p->steps[s];
    if (st->phase == SH_PHASE_F || st->mb < 0) continue;
    if (st->kind == SH_COMM) { /* a transfer only weight gradients need (a recomputed input of a dW) is W too */
      bool b = false;
      for (size_t x = 0; x < st->nxfers; x++) b |= feeds_b[st->xfers[x].dst];
      for (size_t x = 0; b && x < st->nxfers; x++) feeds_b[st->xfers[x].src] = true;
      if (!b) st->phase = SH_PHASE_W;
      continue;
    }
    if (!feeds_b[st->op.result]) {
      st->phase = SH_PHASE_W;
      continue;
    }
    for (int a = 0; a < st->op.nargs; a++) feeds_b[st->op.args[a]] = true;
  }
  free(feeds_b);
}

typedef struct qentry {
  int32_t rank, pos, step;
  bool send_only; /* a transfer step in which this rank only sends: posted, not waited for */
} qentry;

static int by_rank_pos(const void *a, const void *b) {
  const qentry *x = a, *y = b;
  if (x->rank != y->rank) return (x->rank > y->rank) - (x->rank < y->rank);
  if (x->pos != y->pos) return (x->pos > y->pos) - (x->pos < y->pos);
  return (x->step > y->step) - (x->step < y->step);
}

typedef struct merge {
  sh_program *p;
  int32_t *pending;  /* per tensor: writers not yet run */
  bool *done;        /* per step */
  int32_t *order, n; /* the new order */
  qentry *q;         /* every (rank, action position, step), sorted */
  size_t nq;
  size_t *head, *end; /* per rank: its queue's range in q, the next entry */
  int32_t *wait_free; /* free steps: operands not yet ready */
  int32_t *free_readers, *free_start; /* per tensor: the free steps reading it (CSR) */
  int32_t *ready, nready;
  int32_t *posted, *senders; /* per step: send-only ranks that have posted their part, and how many there are */
  size_t nposts;             /* sends posted so far (progress, as a step run is) */
} merge;

static bool step_ready(const merge *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  if (st->kind == SH_COMPUTE) {
    for (int a = 0; a < st->op.nargs; a++)
      if (g->pending[st->op.args[a]]) return false;
    return true;
  }
  for (size_t x = 0; x < st->nxfers; x++)
    if (g->pending[st->xfers[x].src]) return false;
  return true;
}

static void wrote(merge *g, int32_t t) {
  if (--g->pending[t]) return;
  for (int32_t k = g->free_start[t]; k < g->free_start[t + 1]; k++)
    if (--g->wait_free[g->free_readers[k]] == 0) g->ready[g->nready++] = g->free_readers[k];
}

static void emit(merge *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  g->done[s] = true;
  g->order[g->n++] = s;
  if (st->kind == SH_COMPUTE) wrote(g, st->op.result);
  else
    for (size_t x = 0; x < st->nxfers; x++) wrote(g, st->xfers[x].dst);
}

/* Are rank r's sources in transfer step s ready? */
static bool sends_ready(const merge *g, int32_t s, int32_t r) {
  const sh_step *st = &g->p->steps[s];
  for (size_t x = 0; x < st->nxfers; x++)
    if (g->p->tensors[st->xfers[x].src].rank == r && g->pending[st->xfers[x].src]) return false;
  return true;
}

/* Rank r's next step not yet run, or -1. A send is posted and passed (as NCCL's grouped
 * send/recv lets a sender go on): the transfer runs when its receivers reach it. */
static int32_t head_of(merge *g, int32_t r) {
  while (g->head[r] < g->end[r]) {
    const qentry *e = &g->q[g->head[r]];
    if (!g->done[e->step] && !(e->send_only && sends_ready(g, e->step, r))) break;
    if (!g->done[e->step]) g->posted[e->step]++, g->nposts++;
    g->head[r]++;
  }
  return g->head[r] < g->end[r] ? g->q[g->head[r]].step : -1;
}

static bool receives(const sh_program *p, const sh_step *st, int32_t r) {
  for (size_t x = 0; x < st->nxfers; x++)
    if (p->tensors[st->xfers[x].dst].rank == r) return true;
  return false;
}

static bool can_run(merge *g, int32_t s) {
  const sh_step *st = &g->p->steps[s];
  if (!step_ready(g, s)) return false;
  if (st->kind == SH_COMM) {
    for (int k = 0; k < st->nranks; k++)
      if (receives(g->p, st, st->ranks[k]) && head_of(g, st->ranks[k]) != s) return false;
    if (st->mb >= 0 && g->posted[s] < g->senders[s]) return false;
  }
  return true;
}

/* A step not yet run that writes an operand step s waits for; -1 when none. */
static int32_t unready_writer(const merge *g, int32_t s) {
  const sh_program *p = g->p;
  const sh_step *st = &p->steps[s];
  int32_t t = -1;
  if (st->kind == SH_COMPUTE) {
    for (int a = 0; a < st->op.nargs && t < 0; a++)
      if (g->pending[st->op.args[a]]) t = st->op.args[a];
  } else {
    for (size_t x = 0; x < st->nxfers && t < 0; x++)
      if (g->pending[st->xfers[x].src]) t = st->xfers[x].src;
  }
  for (size_t i = 0; t >= 0 && i < p->n_steps; i++) {
    const sh_step *w = &p->steps[i];
    if (g->done[i]) continue;
    if (w->kind == SH_COMPUTE && w->op.result == t) return (int32_t)i;
    for (size_t x = 0; w->kind == SH_COMM && x < w->nxfers; x++)
      if (w->xfers[x].dst == t) return (int32_t)i;
  }
  return -1;
}

static void report_deadlock(merge *g, diag_sink *diags) {
  const sh_program *p = g->p;
  if (getenv("NTP_DEBUG_SCHEDULE"))
    for (int32_t r = 0; r < p->world; r++) {
      int32_t s = head_of(g, r);
      if (s < 0) continue;
      const sh_step *st = &p->steps[s];
      int32_t w = step_ready(g, s) ? -1 : unready_writer(g, s);
      fprintf(stderr, "rank %d at step %d %s mb %d ph %d at_layer %d (%s); waits for step %d (%s, mb %d ph %d, rank %d)\n", r, s,
              st->kind == SH_COMM ? sh_comm_name(st->comm) : ir_op_name(st->op.code), st->mb, st->phase, st->at_layer,
              st->why ? st->why : "", w, w >= 0 ? (p->steps[w].kind == SH_COMM ? sh_comm_name(p->steps[w].comm) : ir_op_name(p->steps[w].op.code)) : "-",
              w >= 0 ? p->steps[w].mb : -9, w >= 0 ? (int)p->steps[w].phase : -9, w >= 0 ? (p->steps[w].kind == SH_COMM ? p->steps[w].ranks[0] : p->steps[w].rank) : -1);
      if (st->kind == SH_COMM) {
        fprintf(stderr, "  posted %d of %d senders;", g->posted[s], g->senders[s]);
        for (int k = 0; k < st->nranks; k++) fprintf(stderr, " r%d%s", st->ranks[k], receives(p, st, st->ranks[k]) ? "(recv)" : "");
        fputc('\n', stderr);
      }
    }
  for (int32_t r = 0; r < p->world; r++) {
    int32_t s = head_of(g, r);
    if (s < 0) continue;
    const sh_step *st = &p->steps[s];
    int32_t ch = sh_rank_chunk(p, r, st->at_layer);
    char what[200];
    if (!step_ready(g, s)) {
      int32_t w = unready_writer(g, s);
      if (w < 0) snprintf(what, sizeof what, "an operand that no step makes");
      else {
        const sh_step *ws = &p->steps[w];
        int32_t wr = ws->kind == SH_COMM ? ws->ranks[0] : ws->rank;
        snprintf(what, sizeof what, "an operand made by rank %d's action '%d%s%d' (%s%s%s), not run yet", wr,
                 sh_rank_chunk(p, wr, ws->at_layer), ws->mb < 0 ? "-" : sh_phase_letter(ws->phase), ws->mb,
                 ws->kind == SH_COMM ? sh_comm_name(ws->comm) : ir_op_name(ws->op.code), ws->why ? ": " : "",
                 ws->why ? ws->why : "");
      }
    } else {
      int32_t other = -1;
      for (int k = 0; k < st->nranks && other < 0; k++)
        if (head_of(g, st->ranks[k]) != s && (receives(p, st, st->ranks[k]) || !sends_ready(g, s, st->ranks[k])))
          other = st->ranks[k];
      for (int k = 0; k < st->nranks && other < 0; k++) /* a sender that has not reached it */
        if (head_of(g, st->ranks[k]) != s) other = st->ranks[k];
      int32_t os = other >= 0 ? head_of(g, other) : -1;
      if (os >= 0)
        snprintf(what, sizeof what, "rank %d, which waits at its action '%d%s%d' (%s)", other,
                 sh_rank_chunk(p, other, p->steps[os].at_layer), sh_phase_letter(p->steps[os].phase), p->steps[os].mb,
                 p->steps[os].kind == SH_COMM ? sh_comm_name(p->steps[os].comm) : ir_op_name(p->steps[os].op.code));
      else
        snprintf(what, sizeof what, "rank %d, which has finished", other);
    }
    diag_emit(diags, NTPC_ERROR, p->sched.name ? p->sched.name : "<schedule>", NTP_NOLOC,
              "the schedule deadlocks: rank %d cannot run its action '%d%s%d' (%s%s%s): it waits for %s", r, ch,
              sh_phase_letter(st->phase), st->mb, st->kind == SH_COMM ? sh_comm_name(st->comm) : ir_op_name(st->op.code),
              st->why ? ": " : "", st->why ? st->why : "", what);
    return;
  }
  diag_emit(diags, NTPC_ERROR, "<schedule>", NTP_NOLOC, "the schedule deadlocks: steps of no micro-batch wait on each other");
}

/* Every (rank, position in its row, step) of the micro-batches' steps; false + reported when a
 * step's action is not in its rank's row. */
static bool build_queues(merge *g, diag_sink *diags) {
  sh_program *p = g->p;
  const sh_schedule *s = &p->sched;
  int32_t M = p->micro_batches, C = sh_max_chunks(p), nkeys = 3 * M * C;
  int32_t *pos = malloc(((size_t)s->nrows * (size_t)nkeys + 1) * sizeof *pos);
  if (!pos) ntp_out_of_memory();
  for (size_t k = 0; k < (size_t)s->nrows * (size_t)nkeys; k++) pos[k] = -1;
  for (int32_t r = 0; r < s->nrows; r++)
    for (int32_t k = 0; k < s->nacts[r]; k++) {
      const sh_action *a = &s->acts[r][k];
      pos[(size_t)r * (size_t)nkeys + (size_t)((a->phase * M + a->mb) * C + a->chunk)] = k;
    }
  size_t cap = 0;
  for (size_t i = 0; i < p->n_steps; i++) cap += p->steps[i].kind == SH_COMM ? (size_t)p->steps[i].nranks : 1;
  g->q = malloc((cap + 1) * sizeof *g->q);
  if (!g->q) ntp_out_of_memory();
  bool ok = true;
  for (size_t i = 0; i < p->n_steps && ok; i++) {
    const sh_step *st = &p->steps[i];
    if (st->mb < 0) continue;
    int n = st->kind == SH_COMM ? st->nranks : 1;
    for (int k = 0; k < n; k++) {
      int32_t r = st->kind == SH_COMM ? st->ranks[k] : st->rank, row = row_of_rank(p, r);
      sh_phase ph = sh_action_phase(p, st);
      int32_t ch = sh_rank_chunk(p, r, st->at_layer);
      int32_t at = row < 0 ? -1 : pos[(size_t)row * (size_t)nkeys + (size_t)((ph * M + st->mb) * C + ch)];
      if (at < 0) {
        diag_emit(diags, NTPC_ERROR, s->name ? s->name : "<schedule>", NTP_NOLOC,
                  "the schedule has no action '%d%s%d' for rank %d, which has a step of it (%s)", ch, sh_phase_letter(ph),
                  st->mb, r, st->kind == SH_COMM ? sh_comm_name(st->comm) : ir_op_name(st->op.code));
        ok = false;
        break;
      }
      bool so = st->kind == SH_COMM && !receives(p, st, r);
      g->q[g->nq++] = (qentry){r, at, (int32_t)i, so};
      g->senders[i] += so;
    }
  }
  free(pos);
  if (!ok) return false;
  qsort(g->q, g->nq, sizeof *g->q, by_rank_pos);
  for (size_t i = 0; i < g->nq; i++) {
    int32_t r = g->q[i].rank;
    if (i == 0 || g->q[i - 1].rank != r) g->head[r] = i;
    g->end[r] = i + 1;
  }
  return true;
}

/* Free steps: how many operands each waits for, and who reads each tensor (CSR). */
static size_t free_operands(const sh_step *st, int32_t *out) {
  size_t n = st->kind == SH_COMPUTE ? (size_t)st->op.nargs : st->nxfers;
  for (size_t a = 0; a < n; a++) out[a] = st->kind == SH_COMPUTE ? st->op.args[a] : st->xfers[a].src;
  return n;
}

static void build_free(merge *g) {
  sh_program *p = g->p;
  size_t nt = p->n_tensors, maxx = NTP_MAX_ARGS;
  for (size_t i = 0; i < p->n_steps; i++) maxx = p->steps[i].nxfers > maxx ? p->steps[i].nxfers : maxx;
  int32_t *ops = malloc((maxx + 1) * sizeof *ops), *cursor = calloc(nt + 1, sizeof *cursor);
  g->free_start = calloc(nt + 2, sizeof *g->free_start);
  g->wait_free = calloc(p->n_steps + 1, sizeof *g->wait_free);
  g->ready = malloc((p->n_steps + 1) * sizeof *g->ready);
  if (!ops || !cursor || !g->free_start || !g->wait_free || !g->ready) ntp_out_of_memory();
  for (size_t i = 0; i < p->n_steps; i++) {
    if (p->steps[i].mb >= 0) continue;
    size_t n = free_operands(&p->steps[i], ops);
    for (size_t a = 0; a < n; a++)
      if (g->pending[ops[a]]) g->free_start[ops[a] + 1]++, g->wait_free[i]++;
    if (!g->wait_free[i]) g->ready[g->nready++] = (int32_t)i;
  }
  for (size_t t = 0; t < nt; t++) g->free_start[t + 1] += g->free_start[t];
  g->free_readers = malloc(((size_t)g->free_start[nt] + 1) * sizeof *g->free_readers);
  if (!g->free_readers) ntp_out_of_memory();
  for (size_t i = 0; i < p->n_steps; i++) {
    if (p->steps[i].mb >= 0) continue;
    size_t n = free_operands(&p->steps[i], ops);
    for (size_t a = 0; a < n; a++)
      if (g->pending[ops[a]]) g->free_readers[g->free_start[ops[a]] + cursor[ops[a]]++] = (int32_t)i;
  }
  free(ops);
  free(cursor);
}

/* The steps in the new order; each tensor's def and last use renewed (outputs still live to the end). */
static void apply_order(sh_program *p, const int32_t *order) {
  sh_step *steps = malloc((p->n_steps + 1) * sizeof *steps);
  if (!steps) ntp_out_of_memory();
  for (size_t i = 0; i < p->n_steps; i++) steps[i] = p->steps[order[i]];
  memcpy(p->steps, steps, p->n_steps * sizeof *steps);
  free(steps);
  sh_recount_uses(p, (int32_t)p->n_steps);
}

void sh_recount_uses(sh_program *p, int32_t live_to_end) {
  int32_t n = (int32_t)p->n_steps;
  for (size_t t = 0; t < p->n_tensors; t++) {
    sh_tensor *x = &p->tensors[t];
    bool keep = x->last_use >= live_to_end;
    x->def = -1;
    x->last_use = keep ? n : -1;
  }
  for (int32_t s = 0; s < n; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMPUTE) {
      for (int a = 0; a < st->op.nargs; a++)
        if (p->tensors[st->op.args[a]].last_use < s) p->tensors[st->op.args[a]].last_use = s;
      if (p->tensors[st->op.result].def < 0) p->tensors[st->op.result].def = s;
      continue;
    }
    for (size_t x = 0; x < st->nxfers; x++) {
      sh_tensor *src = &p->tensors[st->xfers[x].src], *dst = &p->tensors[st->xfers[x].dst];
      if (src->last_use < s) src->last_use = s;
      if (dst->def < 0) dst->def = s;
      else if (dst->last_use < s) dst->last_use = s;
    }
  }
}

bool shard_order(sh_program *p, diag_sink *diags) {
  merge g = {.p = p};
  size_t nt = p->n_tensors, ns = p->n_steps;
  g.pending = calloc(nt + 1, sizeof *g.pending);
  g.done = calloc(ns + 1, 1);
  g.order = malloc((ns + 1) * sizeof *g.order);
  g.head = calloc((size_t)p->world + 1, sizeof *g.head);
  g.end = calloc((size_t)p->world + 1, sizeof *g.end);
  g.posted = calloc(ns + 1, sizeof *g.posted);
  g.senders = calloc(ns + 1, sizeof *g.senders);
  if (!g.pending || !g.done || !g.order || !g.head || !g.end || !g.posted || !g.senders) ntp_out_of_memory();
  for (size_t i = 0; i < ns; i++) { /* a tensor is ready once every step writing it has run */
    const sh_step *st = &p->steps[i];
    if (st->kind == SH_COMPUTE) g.pending[st->op.result]++;
    else
      for (size_t x = 0; x < st->nxfers; x++) g.pending[st->xfers[x].dst]++;
  }
  bool ok = build_queues(&g, diags);
  if (ok) build_free(&g);
  while (ok && (size_t)g.n < ns) {
    size_t posts = g.nposts;
    bool progress = false;
    while (g.nready) emit(&g, g.ready[--g.nready]), progress = true;
    for (int32_t r = 0; r < p->world; r++)
      for (int32_t s; (s = head_of(&g, r)) >= 0 && can_run(&g, s);) {
        emit(&g, s);
        progress = true;
        while (g.nready) emit(&g, g.ready[--g.nready]);
      }
    if (!progress && g.nposts == posts) {
      report_deadlock(&g, diags);
      ok = false;
    }
  }
  if (ok) apply_order(p, g.order);
  free(g.pending);
  free(g.done);
  free(g.order);
  free(g.head);
  free(g.end);
  free(g.q);
  free(g.wait_free);
  free(g.free_readers);
  free(g.free_start);
  free(g.ready);
  free(g.posted);
  free(g.senders);
  return ok;
}
