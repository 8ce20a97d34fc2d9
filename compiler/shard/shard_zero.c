/* shard_zero.c — the distributed optimizer: AdamW's state sharded over the replicas that hold
 * each parameter element, each shard kept by `redundancy` of them (docs/training.md).
 *
 * Without it every rank holding a parameter slice keeps an fp32 master and two moments for it (12
 * bytes per element per replica), and the gradient sync is an all-reduce. With 'optimizer zero Z
 * redundancy K' the program changes in three places, and nothing else does:
 *  - the cells of a parameter (the common refinement of its holders' slices: replicas at unequal
 *    degrees hold different boxes) are each cut into parts, one per holder of the cell, and part j
 *    is owned by K holders: j's own and K-1 others chosen so that the owners of a part lie in
 *    different failure domains wherever the holders span several, the least loaded first (so the
 *    state stays balanced: about K parts of n on each holder; choose_owners);
 *  - the gradient sync sums each part onto its owners only (a reduce-scatter; the same sums, in
 *    the same order, as the all-reduce made: the owners' copies stay equal bit for bit);
 *  - the owned parts are the persistent parameter slices, so the trainer keeps state (and runs
 *    AdamW) on those alone, and the checkpoints, the hand-over after a failure and the runtime see
 *    ordinary slices; the holders' slices become activations gathered from the owners where the
 *    parameter was read first (the all-gather of the updated parameters, done before the next
 *    forward rather than after the update, the same bytes).
 * ZeRO-2 also frees the gradients early: each parameter's sync is its own step, placed right after
 * its last contribution is made, so the whole-slice gradients die there (the memory plan sees it)
 * instead of living to the end of the backward as with ZeRO-1's one sync step. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

int32_t sh_domain_of(const sh_program *p, int32_t r) {
  int32_t gpu = p->gpu_of_rank ? p->gpu_of_rank[r] : r; /* survivors keep their GPUs, and those their nodes */
  return p->domain_size > 1 ? gpu / p->domain_size : gpu;
}

/* Part j of P of a cell: along its longest dimension (the first of equals), as even as can be. */
static ntp_box cut_part(const ntp_box *cell, int32_t P, int32_t j) {
  int d = 0;
  for (int k = 1; k < cell->ndim; k++)
    if (cell->hi[k] - cell->lo[k] > cell->hi[d] - cell->lo[d]) d = k;
  ntp_box b = *cell;
  if (cell->ndim == 0) return b;
  int64_t n = cell->hi[d] - cell->lo[d];
  b.lo[d] = cell->lo[d] + n * j / P;
  b.hi[d] = cell->lo[d] + n * (j + 1) / P;
  return b;
}

static int64_t longest(const ntp_box *cell) {
  int64_t m = cell->ndim ? 0 : 1;
  for (int k = 0; k < cell->ndim; k++)
    if (cell->hi[k] - cell->lo[k] > m) m = cell->hi[k] - cell->lo[k];
  return m;
}

/* The owners of a cell's P parts among its n holders h (by rank), K of each: part j's own holder,
 * then copy by copy the holder that is not an owner of the part yet and, in this order, lies in
 * a failure domain none of its owners is in, owns the fewest parts so far, comes soonest after the
 * part's own holder. So a part's copies are in distinct domains wherever its holders span enough of
 * them (whatever their number in each: the survivors of a failure), and the state stays balanced:
 * with holders in one domain, each owns K parts of n (the rotations). owner[j * K + c]: an index in h. */
static void choose_owners(const sh_program *p, const int32_t *hr, const int32_t *h, int32_t n, int32_t P, int32_t K,
                          int32_t *owner) {
  int32_t *load = calloc((size_t)n + 1, sizeof *load);
  if (!load) ntp_out_of_memory();
  for (int32_t j = 0; j < P; j++) owner[j * K] = j, load[j]++;
  for (int32_t c = 1; c < K; c++)
    for (int32_t j = 0; j < P; j++) {
      int32_t best = -1;
      int64_t best_key = INT64_MAX;
      for (int32_t o = 1; o < n; o++) {
        int32_t i = (j + o) % n;
        bool taken = false, same_domain = false;
        for (int32_t q = 0; q < c; q++) {
          taken |= owner[j * K + q] == i;
          same_domain |= sh_domain_of(p, hr[h[owner[j * K + q]]]) == sh_domain_of(p, hr[h[i]]);
        }
        int64_t key = ((int64_t)same_domain << 40) | ((int64_t)load[i] << 20) | o;
        if (!taken && key < best_key) best = i, best_key = key;
      }
      owner[j * K + c] = best;
      load[best]++;
    }
  free(load);
}

static bool failpoint(const char *name) {
  const char *f = getenv("NTP_FAILPOINT");
  return f && strcmp(f, name) == 0;
}

size_t shard_zero_parts(const sh_program *p, int32_t v, const int32_t *hr, const ntp_box *hb, size_t nh, ntp_box whole,
                        ntp_dtype dt, int64_t *ring, sh_zero *z) {
  size_t before = z->n;
  int32_t *h = malloc((nh + 1) * sizeof *h), *owner = malloc((nh + 1) * 65 * sizeof *owner);
  box_grid grid;
  if (!h || !owner || !box_grid_init(&grid, &whole, hb, nh)) ntp_out_of_memory();
  /* a deliberate bug for the tests (NTP_FAILPOINT=zero-two-owners): each part after the first
   * overlaps the one before by a slab that only the first holder's gradient reaches, as when the
   * holders disagree on where a part begins: that slab then has two owners that update it apart */
  bool two_owners = failpoint("zero-two-owners");
  ntp_box cell;
  while (box_grid_next(&grid, &cell)) {
    int32_t n = 0;
    for (size_t k = 0; k < nh; k++) /* the cell's holders, by rank */
      if (box_contains(&hb[k], &cell)) {
        int32_t i = n++;
        while (i > 0 && hr[h[i - 1]] > hr[k]) h[i] = h[i - 1], i--;
        h[i] = (int32_t)k;
      }
    if (!n) continue;
    int64_t len = longest(&cell);
    int32_t P = len < n ? (int32_t)len : n, K = p->redundancy < n ? p->redundancy : n;
    if (P < 1) P = 1;
    choose_owners(p, hr, h, n, P, K, owner);
    for (int32_t j = 0; j < P; j++) {
      ntp_box part = cut_part(&cell, P, j);
      bool partial = false;
      if (two_owners && j > 0) {
        for (int d = 0, done = 0; d < part.ndim && !done; d++)
          if (part.lo[d] > cell.lo[d]) part.lo[d]--, done = 1, partial = true;
      }
      for (int32_t c = 0; c < K; c++) {
        sh_zero_shard s = {.v = v, .rank = hr[h[owner[j * K + c]]], .box = part, .copy = c, .partial = partial};
        VEC_PUSH(z->s, z->n, z->cap, s);
      }
    }
    /* what the sync moves, as a collective library runs it: a ring reduce-scatter among the cell's
     * holders ((n-1)/n of it in and out of each), then each part to its K-1 further owners */
    int64_t b = box_volume(&cell) * (int64_t)dtype_bytes(dt);
    for (int32_t i = 0; i < n && n > 1; i++) ring[hr[h[i]]] += b * (n - 1 + K - 1) / n;
  }
  box_grid_free(&grid);
  free(h);
  free(owner);
  return z->n - before;
}

void shard_zero_free(sh_zero *z) {
  free(z->s);
  free(z->tensor);
  *z = (sh_zero){0};
}

/* Where each sharded parameter's shards and holders are: z->s[zs[v]..ze[v]) (shards are appended
 * parameter by parameter), and its holder slices hold[hs[v]..hs[v + 1]) (the persistent slices the
 * lowering made, before the rewrite), so no pass looks at more than one parameter's. */
typedef struct zindex {
  size_t *zs, *ze;
  int32_t *hs, *hold;
} zindex;

static void index_build(const sh_program *p, const sh_zero *z, size_t nt, zindex *ix) {
  size_t nv = p->global->n_values;
  ix->zs = calloc(nv + 1, sizeof *ix->zs), ix->ze = calloc(nv + 1, sizeof *ix->ze);
  ix->hs = calloc(nv + 2, sizeof *ix->hs), ix->hold = malloc((nt + 1) * sizeof *ix->hold);
  if (!ix->zs || !ix->ze || !ix->hs || !ix->hold) ntp_out_of_memory();
  for (size_t i = z->n; i-- > 0;) ix->zs[z->s[i].v] = i;
  for (size_t i = 0; i < z->n; i++) ix->ze[z->s[i].v] = i + 1;
  for (size_t t = 0; t < nt; t++) {
    const sh_tensor *x = &p->tensors[t];
    if (x->persistent && x->init_value >= 0 && ix->ze[x->init_value]) ix->hs[x->init_value + 1]++;
  }
  for (size_t v = 0; v < nv; v++) ix->hs[v + 1] += ix->hs[v];
  int32_t *at = calloc(nv + 1, sizeof *at);
  if (!at) ntp_out_of_memory();
  for (size_t t = 0; t < nt; t++) {
    const sh_tensor *x = &p->tensors[t];
    if (x->persistent && x->init_value >= 0 && ix->ze[x->init_value])
      ix->hold[ix->hs[x->init_value] + at[x->init_value]++] = (int32_t)t;
  }
  free(at);
}

static void index_free(zindex *ix) {
  free(ix->zs), free(ix->ze), free(ix->hs), free(ix->hold);
}

/* Every shard a persistent slice of its parameter, made by a parameter step (set, loaded or
 * initialised as any slice is), with the layer and place of a holder on its rank that contains it
 * (the owners are holders). */
static void make_shards(shard_lowering *L, sh_zero *z, const zindex *ix) {
  sh_program *p = shard_lowering_program(L);
  if (!(z->tensor = malloc((z->n + 1) * sizeof *z->tensor))) ntp_out_of_memory();
  for (size_t i = 0; i < z->n; i++) {
    const sh_zero_shard *s = &z->s[i];
    int32_t h = -1;
    for (int32_t k = ix->hs[s->v]; k < ix->hs[s->v + 1] && h < 0; k++) {
      const sh_tensor *x = &p->tensors[ix->hold[k]];
      if (x->rank == s->rank && box_contains(&x->init_box, &s->box)) h = ix->hold[k];
    }
    sh_step hs = p->steps[p->tensors[h].def]; /* a copy: the table grows */
    const sh_tensor *ht = &p->tensors[h];
    const char *name = ht->name;
    int32_t t = shard_backward_compute(L, s->rank, IR_PARAM, NULL, 0, &hs.op.attr, s->box, ht->dtype, hs.layer, hs.loc);
    sh_tensor *x = &p->tensors[t];
    x->global = s->v, x->persistent = true, x->init_value = s->v, x->init_box = s->box, x->name = name, x->mb = -1;
    sh_step *st = &p->steps[p->n_steps - 1];
    st->phase = SH_PHASE_F, st->mb = -1, st->at_layer = hs.at_layer;
    z->tensor[i] = t;
  }
}

/* Holder slice t's transfers from the owners of the parts it covers (its own copy where it owns
 * one, else one owner per part, spread over the copies), appended to xf; the tensor they fill: t,
 * or one in the parameter's coordinates when t is a slice of a slice (then re-boxed into t). */
static int32_t holder_xfers(shard_lowering *L, const sh_zero *z, const zindex *ix, int32_t t, sh_xfer *xf,
                            size_t *n) {
  sh_program *p = shard_lowering_program(L);
  const sh_tensor *x = &p->tensors[t];
  int32_t v = x->init_value, rank = x->rank, dst = t;
  if (!box_eq(&x->box, &x->init_box) || x->global != v) {
    dst = shard_new_temp(L, rank, x->init_box, x->dtype);
    p->tensors[dst].global = v;
    x = &p->tensors[t];
  }
  for (size_t i = ix->zs[v]; i < ix->ze[v]; i++) {
    const sh_zero_shard *s = &z->s[i];
    ntp_box cut;
    if (s->copy != 0 || !box_intersect(&s->box, &x->init_box, &cut)) continue;
    size_t ncopies = 0; /* this part's copies follow it */
    for (size_t j = i; j < ix->ze[v] && box_eq(&z->s[j].box, &s->box) && (j == i || z->s[j].copy); j++)
      ncopies++;
    size_t pick = i + (size_t)rank % ncopies;
    for (size_t j = i; j < i + ncopies; j++)
      if (z->s[j].rank == rank) pick = j;
    xf[(*n)++] = (sh_xfer){.src = z->tensor[pick], .dst = dst, .box = cut};
  }
  return dst;
}

/* Holder slices hold[0..nh) (a layer's) gathered by one step, which takes the first one's place; the holders become activations. Returns the steps made. */
static size_t gather_holders(shard_lowering *L, const sh_zero *z, const zindex *ix, const int32_t *hold, size_t nh) {
  sh_program *p = shard_lowering_program(L);
  sh_step hs = p->steps[p->tensors[hold[0]].def];
  size_t first = p->n_steps, n = 0, cap = 0;
  for (size_t k = 0; k < nh; k++) {
    int32_t v = p->tensors[hold[k]].init_value;
    cap += ix->ze[v] - ix->zs[v];
  }
  sh_xfer *xf = malloc((cap + 1) * sizeof *xf);
  int32_t *dst = malloc((nh + 1) * sizeof *dst);
  if (!xf || !dst) ntp_out_of_memory();
  for (size_t k = 0; k < nh; k++) dst[k] = holder_xfers(L, z, ix, hold[k], xf, &n);
  const char *why = nh == 1 ? arena_printf(&p->pool, "parameter gather: %s's slice from the owners of its parts",
                                           p->tensors[hold[0]].name)
                            : arena_printf(&p->pool, "parameter gather: %zu slices from the owners of their parts", nh);
  shard_backward_comm(L, COMM_ALL_GATHER, xf, n, why);
  for (size_t k = 0; k < nh; k++) {
    sh_tensor *x = &p->tensors[hold[k]];
    if (dst[k] != hold[k]) {
      shard_backward_compute(L, x->rank, IR_RESHAPE, &dst[k], 1, NULL, x->box, x->dtype, hs.layer, hs.loc);
      p->steps[p->n_steps - 1].op.result = hold[k];
      x = &p->tensors[hold[k]];
    }
    x->persistent = false, x->init_value = -1, x->mb = -1;
  }
  for (size_t s = first; s < p->n_steps; s++)
    p->steps[s].layer = hs.layer, p->steps[s].loc = hs.loc, p->steps[s].mb = -1, p->steps[s].phase = SH_PHASE_F,
    p->steps[s].at_layer = hs.at_layer;
  free(xf);
  free(dst);
  return p->n_steps - first;
}

/* The holders by layer: a layer's slices on every rank are one gather step, at the place of the
 * first of their parameter steps (a gather writes only its holders, which nothing reads before
 * their own parameter step would have made them, from shards made at the start). repl[s] and
 * nrepl[s]: the steps that take old step s's place (nrepl -1: none, its layer's gather took it). */
static void gather_by_layer(shard_lowering *L, const sh_zero *z, const zindex *ix, size_t n_old, int32_t *repl,
                            int32_t *nrepl) {
  sh_program *p = shard_lowering_program(L);
  size_t nl = p->global->n_layers + 1, nv = p->global->n_values;
  size_t *start = calloc(nl + 2, sizeof *start), *at = calloc(nl + 1, sizeof *at);
  int32_t *by_layer = malloc(((size_t)ix->hs[nv] + 1) * sizeof *by_layer);
  int32_t *holder_of_step = malloc((n_old + 1) * sizeof *holder_of_step);
  if (!start || !at || !by_layer || !holder_of_step) ntp_out_of_memory();
  for (size_t s = 0; s < n_old; s++) holder_of_step[s] = -1;
  for (int32_t k = 0; k < ix->hs[nv]; k++) holder_of_step[p->tensors[ix->hold[k]].def] = ix->hold[k];
#define LAYER_OF(s) (p->steps[s].layer >= 0 ? (size_t)p->steps[s].layer : nl - 1)
  for (size_t s = 0; s < n_old; s++)
    if (holder_of_step[s] >= 0) start[LAYER_OF(s) + 1]++;
  for (size_t l = 0; l < nl; l++) start[l + 1] += start[l];
  for (size_t s = 0; s < n_old; s++) /* in step order within each layer */
    if (holder_of_step[s] >= 0) by_layer[start[LAYER_OF(s)] + at[LAYER_OF(s)]++] = holder_of_step[s];
  for (size_t s = 0; s < n_old; s++) {
    if (holder_of_step[s] < 0) continue;
    size_t l = LAYER_OF(s);
    if (at[l] == SIZE_MAX) { /* its layer's gather is made already */
      nrepl[s] = -1;
      continue;
    }
    repl[s] = (int32_t)p->n_steps;
    nrepl[s] = (int32_t)gather_holders(L, z, ix, by_layer + start[l], start[l + 1] - start[l]);
    at[l] = SIZE_MAX; /* done */
  }
#undef LAYER_OF
  free(start);
  free(at);
  free(by_layer);
  free(holder_of_step);
}

typedef struct sync_at {
  int32_t ready, step;
} sync_at;
static int by_ready(const void *a, const void *b) {
  const sync_at *x = a, *y = b;
  return x->ready != y->ready ? (x->ready > y->ready) - (x->ready < y->ready) : (x->step > y->step) - (x->step < y->step);
}

/* ZeRO-2: each parameter's sync placed right after the last of the old steps writing what it sums. */
static sync_at *place_syncs(const sh_program *p, size_t n_old, size_t nt, const int32_t *syncs, size_t nsync) {
  int32_t *writer = malloc((nt + 1) * sizeof *writer);
  sync_at *q = malloc((nsync + 1) * sizeof *q);
  if (!writer || !q) ntp_out_of_memory();
  for (size_t t = 0; t < nt; t++) writer[t] = -1;
  for (size_t s = 0; s < n_old; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind == SH_COMPUTE) writer[st->op.result] = (int32_t)s;
    else
      for (size_t x = 0; x < st->nxfers; x++) writer[st->xfers[x].dst] = (int32_t)s;
  }
  for (size_t k = 0; k < nsync; k++) {
    const sh_step *st = &p->steps[syncs[k]];
    q[k] = (sync_at){-1, syncs[k]};
    for (size_t x = 0; x < st->nxfers; x++)
      if ((size_t)st->xfers[x].src < nt && writer[st->xfers[x].src] > q[k].ready) q[k].ready = writer[st->xfers[x].src];
  }
  qsort(q, nsync, sizeof *q, by_ready);
  q[nsync] = (sync_at){INT32_MAX, -1};
  free(writer);
  return q;
}

void shard_zero_rewrite(shard_lowering *L, sh_zero *z, const int32_t *syncs, size_t nsync) {
  sh_program *p = shard_lowering_program(L);
  size_t n_old = p->n_steps, nt = p->n_tensors;
  zindex ix;
  index_build(p, z, nt, &ix);
  int32_t *repl = malloc((n_old + 1) * sizeof *repl), *nrepl = calloc(n_old + 1, sizeof *nrepl);
  bool *is_sync = calloc(n_old + 1, 1);
  if (!repl || !nrepl || !is_sync) ntp_out_of_memory();
  make_shards(L, z, &ix);
  size_t n_init = p->n_steps;
  gather_by_layer(L, z, &ix, n_old, repl, nrepl);
  sync_at *q = place_syncs(p, n_old, nt, syncs, nsync);
  for (size_t k = 0; k < nsync; k++) is_sync[syncs[k]] = true;
  int32_t *order = malloc((p->n_steps + 1) * sizeof *order), n = 0;
  if (!order) ntp_out_of_memory();
  for (size_t s = n_old; s < n_init; s++) order[n++] = (int32_t)s; /* the shards: persistent, first */
  size_t k = 0;
  for (; q[k].ready < 0; k++) order[n++] = q[k].step; /* a sync of nothing made here (none in practice) */
  for (size_t s = 0; s < n_old; s++) {
    if (nrepl[s] > 0)
      for (int32_t j = 0; j < nrepl[s]; j++) order[n++] = repl[s] + j;
    else if (nrepl[s] == 0 && !is_sync[s])
      order[n++] = (int32_t)s;
    for (; q[k].ready == (int32_t)s; k++) order[n++] = q[k].step;
  }
  sh_step *steps = malloc(((size_t)n + 1) * sizeof *steps);
  if (!steps) ntp_out_of_memory();
  for (int32_t i = 0; i < n; i++) steps[i] = p->steps[order[i]];
  memcpy(p->steps, steps, (size_t)n * sizeof *steps);
  p->n_steps = (size_t)n;
  sh_recount_uses(p, INT32_MAX);
  free(steps);
  free(order);
  free(q);
  free(repl);
  free(nrepl);
  free(is_sync);
  index_free(&ix);
}
