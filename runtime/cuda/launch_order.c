/* launch_order.c — the enqueue order of the CUDA backend's launches and collectives
 * (launch_order.h). */
#include "launch_order.h"

#include <stdlib.h>

/* One rank's list schedule: its units (launches and collectives, step order) u[0..m) into out,
 * in the order launch_order.h describes. An edge i -> j (i < j, at most the window apart) where
 * the two may not swap; a unit is a candidate once it lies in the window [next, next + K) from
 * the earliest unit not yet enqueued, so units further apart than the window never meet: the
 * earlier is enqueued by then. */
typedef struct sched {
  const ntp_program *p;
  const ntp_footprints *f;
  const int32_t *u;
  size_t m;
  bool *coll, *done, *pending, *urgent;
  int32_t *npred; /* preds not yet enqueued */
  int32_t *busy;  /* preds that are collectives in flight (enqueued, no consumer enqueued since) */
  size_t *pstart, *sstart; /* preds of j: pred[pstart[j] .. pstart[j + 1]); succs likewise */
  int32_t *pred, *succ;
} sched;

static bool may_swap(const sched *s, size_t i, size_t j) {
  if (s->coll[i] && s->coll[j]) return false; /* collectives keep their order */
  if (s->coll[i] || s->coll[j]) return !ntp_footprints_touch(s->f, (size_t)s->u[i], (size_t)s->u[j]);
  return !ntp_footprints_conflict(s->f, (size_t)s->u[i], (size_t)s->u[j]);
}

static int build_edges(sched *s) {
  size_t m = s->m, n = 0, cap = 0;
  if (!(s->pstart = calloc(m + 1, sizeof *s->pstart)) || !(s->sstart = calloc(m + 2, sizeof *s->sstart))) return -1;
  for (size_t j = 0; j < m; j++) {
    s->pstart[j] = n;
    for (size_t i = j >= NTP_LAUNCH_WINDOW ? j - NTP_LAUNCH_WINDOW + 1 : 0; i < j; i++) {
      if (may_swap(s, i, j)) continue;
      if (n == cap) {
        cap = cap ? 2 * cap : 1024;
        int32_t *v = realloc(s->pred, cap * sizeof *v);
        if (!v) return -1;
        s->pred = v;
      }
      s->pred[n++] = (int32_t)i;
      s->npred[j]++;
      s->sstart[i + 2]++;
    }
  }
  s->pstart[m] = n;
  if (!(s->succ = malloc((n + 1) * sizeof *s->succ))) return -1;
  for (size_t i = 0; i < m; i++) s->sstart[i + 2] += s->sstart[i + 1]; /* sstart[i + 1]: where i's succs go */
  for (size_t j = 0; j < m; j++)
    for (size_t e = s->pstart[j]; e < s->pstart[j + 1]; e++) s->succ[s->sstart[s->pred[e] + 1]++] = (int32_t)j;
  return 0; /* now sstart[i] .. sstart[i + 1] */
}

/* the units in [next, cn) that lead to collective cn (a path of edges to it) */
static void mark_urgent(sched *s, size_t next, size_t cn) {
  for (size_t i = cn; i-- > next;) {
    s->urgent[i] = false;
    for (size_t e = s->sstart[i]; !s->done[i] && e < s->sstart[i + 1] && !s->urgent[i]; e++) {
      size_t j = (size_t)s->succ[e];
      s->urgent[i] = j == cn || (j < cn && s->urgent[j]);
    }
  }
}

/* collective i in flight (on) or consumed: its successors wait for it or not */
static void set_pending(sched *s, size_t i, bool on) {
  if (s->pending[i] == on) return;
  s->pending[i] = on;
  for (size_t e = s->sstart[i]; e < s->sstart[i + 1]; e++) s->busy[s->succ[e]] += on ? 1 : -1;
}

static size_t next_coll(const sched *s, size_t from) {
  while (from < s->m && !s->coll[from]) from++;
  return from;
}

static int schedule(sched *s, int32_t *out, int32_t *moved) {
  size_t m = s->m, next = 0, cn = next_coll(s, 0), urgent_for = SIZE_MAX;
  if (build_edges(s) != 0) return -1;
  for (size_t k = 0; k < m; k++) {
    size_t hi = next + NTP_LAUNCH_WINDOW < m ? next + NTP_LAUNCH_WINDOW : m, pick = SIZE_MAX;
    if (cn < hi && s->npred[cn] == 0) {
      pick = cn; /* a collective as soon as it may start */
    } else {
      if (cn < hi && urgent_for != cn) mark_urgent(s, next, cn), urgent_for = cn;
      int best = 3; /* 0: leads to the next collective, 1: waits for nothing in flight, 2: a consumer */
      for (size_t j = next; j < hi && best > 0; j++) {
        if (s->done[j] || s->coll[j] || s->npred[j]) continue;
        bool busy = s->busy[j] > 0; /* it would wait for a collective in flight */
        int cls = !busy && urgent_for == cn && j < cn && s->urgent[j] ? 0 : busy ? 2 : 1;
        if (cls < best) best = cls, pick = j;
      }
    }
    /* the earliest unit not enqueued is always ready (a collective there is cn): pick is set */
    s->done[pick] = true;
    out[k] = s->u[pick];
    if (!s->coll[pick] && pick != next) ++*moved;
    for (size_t e = s->sstart[pick]; e < s->sstart[pick + 1]; e++) s->npred[s->succ[e]]--;
    if (s->coll[pick]) {
      set_pending(s, pick, true);
      cn = next_coll(s, pick + 1);
    } else {
      for (size_t e = s->pstart[pick]; e < s->pstart[pick + 1]; e++)
        if (s->coll[s->pred[e]]) set_pending(s, (size_t)s->pred[e], false); /* consumed */
    }
    while (next < m && s->done[next]) next++;
  }
  return 0;
}

static int rank_order(const ntp_program *p, const ntp_footprints *f, const int32_t *u, size_t m, int32_t *out,
                      int32_t *moved) {
  sched s = {.p = p, .f = f, .u = u, .m = m};
  s.coll = calloc(m + 1, sizeof *s.coll);
  s.done = calloc(m + 1, sizeof *s.done);
  s.pending = calloc(m + 1, sizeof *s.pending);
  s.urgent = calloc(m + 1, sizeof *s.urgent);
  s.npred = calloc(m + 1, sizeof *s.npred);
  s.busy = calloc(m + 1, sizeof *s.busy);
  int rc = -1;
  if (s.coll && s.done && s.pending && s.urgent && s.npred && s.busy) {
    for (size_t i = 0; i < m; i++) s.coll[i] = p->steps[u[i]].kind == SH_COMM;
    rc = schedule(&s, out, moved);
  }
  free(s.coll), free(s.done), free(s.pending), free(s.urgent), free(s.npred), free(s.busy);
  free(s.pstart), free(s.sstart), free(s.pred), free(s.succ);
  return rc;
}

int ntp_launch_order_build(const ntp_program *p, const ntp_footprints *f, int rank_lo, int rank_hi, bool reorder,
                           ntp_launch_order *o) {
  size_t S = p->n_steps, R = (size_t)(rank_hi - rank_lo), all = S;
  *o = (ntp_launch_order){0};
  /* the ranks' schedules one after another: a collective is in each of its ranks' (a pipeline's
   * micro-batches make many more of them than there are steps that read parameters) */
  for (size_t s = 0; s < S; s++)
    if (p->steps[s].kind == SH_COMM) all += (size_t)p->steps[s].nranks;
  int32_t *units = malloc((S + 1) * sizeof *units), *sched_ = malloc((all + 1) * sizeof *sched_);
  size_t *begin = calloc(R + 1, sizeof *begin), *cur = calloc(R + 1, sizeof *cur);
  if (!(o->step = malloc((S + 1) * sizeof *o->step)) || !units || !sched_ || !begin || !cur) goto oom;
  if (!reorder) { /* step order */
    for (size_t s = 0; s < S; s++)
      if (p->steps[s].kind == SH_COMM ||
          (ntp_step_launches(p, s) && p->steps[s].rank >= rank_lo && p->steps[s].rank < rank_hi))
        o->step[o->n++] = (int32_t)s;
    goto done;
  }
  /* every rank's schedule, one after another in sched_ (rank r's from begin[r - rank_lo]) */
  size_t at = 0;
  for (int r = rank_lo; r < rank_hi; r++) {
    size_t m = 0;
    for (size_t s = 0; s < S; s++) {
      const ntp_step *st = &p->steps[s];
      if (ntp_step_inits(st)) continue;
      if (st->kind == SH_COMM ? ntp_comm_takes_part(p, s, r) : ntp_step_launches(p, s) && st->rank == r) units[m++] = (int32_t)s;
    }
    begin[r - rank_lo] = cur[r - rank_lo] = at;
    if (rank_order(p, f, units, m, sched_ + at, &o->moved) != 0) goto oom;
    at += m;
  }
  /* merged at the collectives, which keep step order: before each, the launches each rank taking
   * part scheduled before it; the ranks' last launches at the end */
  for (size_t s = 0; s <= S; s++) {
    if (s < S && p->steps[s].kind != SH_COMM) continue;
    for (int r = rank_lo; r < rank_hi; r++) {
      size_t i = (size_t)(r - rank_lo), end = r + 1 < rank_hi ? begin[i + 1] : at;
      if (s < S && !ntp_comm_takes_part(p, s, r)) continue;
      while (cur[i] < end && (s == S || sched_[cur[i]] != (int32_t)s)) o->step[o->n++] = sched_[cur[i]++];
      if (cur[i] < end) cur[i]++; /* s itself, enqueued once below */
    }
    if (s < S) o->step[o->n++] = (int32_t)s;
  }
done:
  free(units), free(sched_), free(begin), free(cur);
  return 0;
oom:
  free(units), free(sched_), free(begin), free(cur);
  ntp_launch_order_free(o);
  return -1;
}

void ntp_launch_order_free(ntp_launch_order *o) {
  free(o->step);
  *o = (ntp_launch_order){0};
}

void ntp_overlap_measure(const ntp_program *p, const ntp_launch_order *o, const ntp_comm_deps *d, ntp_overlap_count *out) {
  *out = (ntp_overlap_count){0};
  size_t *pos = malloc((p->n_steps + 1) * sizeof *pos);
  if (!pos) return;
  for (size_t k = 0; k < o->n; k++) pos[o->step[k]] = k;
  for (size_t q = 0; q < o->n; q++) {
    int32_t j = o->step[q];
    for (int32_t w = d->start[j]; w < d->start[j + 1]; w++) {
      int32_t between = 0;
      for (size_t k = pos[d->wait[w]] + 1; k < q; k++)
        between += p->steps[o->step[k]].kind == SH_COMPUTE && p->steps[o->step[k]].rank == p->steps[j].rank;
      out->consumed++;
      out->overlapped += between > 0;
      out->launches += between;
    }
  }
  free(pos);
}
