/* shard_zero_report.c — `ntpc report --train`: the training state per GPU (weights, optimizer
 * state, the arena's peak with the gradients in it), what the gradient sync and the parameter
 * gather move per step, and which failures leave some state without a copy (the checkpoint is
 * read then). Read off the program as lowered: the trainer keeps state for exactly the persistent
 * parameter slices (the owned parts with a distributed optimizer, shard_zero.c). */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"

#define human sh_human_bytes

static bool is_param(const sh_program *p, const sh_tensor *t) {
  return t->persistent && t->init_value >= 0 && p->global->ops[p->global->values[t->init_value].def].code == IR_PARAM;
}

static bool starts(const char *s, const char *prefix) { return s && !strncmp(s, prefix, strlen(prefix)); }

/* The state's cells: per parameter, the common refinement of its persistent slices (the owned
 * parts with a distributed optimizer), each with its elements and the ranks holding it. */
typedef struct state_cells {
  int64_t *vol;
  size_t *first; /* cell c's ranks: rank[first[c]..first[c + 1]) */
  int32_t *rank;
  size_t n, cap, nr, rcap;
} state_cells;

static void add_cells(const sh_program *p, int32_t v, const int32_t *ts, size_t n, ntp_box *boxes, state_cells *c) {
  for (size_t k = 0; k < n; k++) boxes[k] = p->tensors[ts[k]].init_box;
  ntp_box whole = box_full(&p->global->values[v].shape), cell;
  box_grid g;
  if (!n || !box_grid_init(&g, &whole, boxes, n)) return;
  while (box_grid_next(&g, &cell)) {
    size_t r0 = c->nr;
    for (size_t k = 0; k < n; k++)
      if (box_contains(&boxes[k], &cell)) VEC_PUSH(c->rank, c->nr, c->rcap, p->tensors[ts[k]].rank);
    if (c->nr == r0) continue;
    if (c->n + 2 > c->cap) {
      c->cap = 2 * c->cap + 16;
      c->vol = realloc(c->vol, c->cap * sizeof *c->vol), c->first = realloc(c->first, (c->cap + 1) * sizeof *c->first);
      if (!c->vol || !c->first) ntp_out_of_memory();
    }
    c->vol[c->n] = box_volume(&cell), c->first[c->n++] = r0;
  }
  box_grid_free(&g);
  if (c->first) c->first[c->n] = c->nr;
}

static void state_cells_build(const sh_program *p, state_cells *c) {
  size_t nv = p->global->n_values, *start = calloc(nv + 2, sizeof *start), *at = calloc(nv + 1, sizeof *at);
  int32_t *ts = malloc((p->n_tensors + 1) * sizeof *ts);
  ntp_box *boxes = malloc((p->n_tensors + 1) * sizeof *boxes);
  if (!start || !at || !ts || !boxes) ntp_out_of_memory();
  for (size_t t = 0; t < p->n_tensors; t++) /* the slices by parameter */
    if (is_param(p, &p->tensors[t])) start[p->tensors[t].init_value + 1]++;
  for (size_t v = 0; v < nv; v++) start[v + 1] += start[v];
  for (size_t t = 0; t < p->n_tensors; t++)
    if (is_param(p, &p->tensors[t])) ts[start[p->tensors[t].init_value] + at[p->tensors[t].init_value]++] = (int32_t)t;
  for (size_t v = 0; v < nv; v++) add_cells(p, (int32_t)v, ts + start[v], start[v + 1] - start[v], boxes, c);
  free(start), free(at), free(ts), free(boxes);
}

/* Elements of state that no rank outside `dead` holds. */
static int64_t lost_elements(const state_cells *c, const bool *dead) {
  int64_t lost = 0;
  for (size_t k = 0; k < c->n; k++) {
    bool alive = false;
    for (size_t r = c->first[k]; r < c->first[k + 1] && !alive; r++) alive = !dead[c->rank[r]];
    if (!alive) lost += c->vol[k];
  }
  return lost;
}

/* Which single-GPU (and, with domains, whole-domain) failures leave state without a copy. */
static void print_failures(const sh_program *p, FILE *out) {
  int32_t W = p->world, D = p->domain_size > 0 ? p->domain_size : 1, dmax = 0;
  for (int32_t r = 0; r < W; r++) dmax = sh_domain_of(p, r) > dmax ? sh_domain_of(p, r) : dmax;
  bool *dead = calloc((size_t)W + 1, 1), *used = calloc((size_t)dmax + 1, 1);
  state_cells c = {0};
  if (!dead || !used) ntp_out_of_memory();
  int32_t nd = 0;
  for (int32_t r = 0; r < W; r++) nd += !used[sh_domain_of(p, r)], used[sh_domain_of(p, r)] = true;
  state_cells_build(p, &c);
  for (int pass = 0; pass < (D > 1 && nd > 1 ? 2 : 1); pass++) {
    int32_t n = pass ? dmax + 1 : W, bad = 0, of = pass ? nd : W;
    char list[512] = "";
    size_t len = 0;
    for (int32_t u = 0; u < n; u++) {
      if (pass && !used[u]) continue;
      for (int32_t r = 0; r < W; r++) dead[r] = pass ? sh_domain_of(p, r) == u : r == u;
      int64_t lost = lost_elements(&c, dead);
      if (!lost) continue;
      if (bad++ < 6 && len < sizeof list - 64)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s %d (%lld elements)", bad > 1 ? ", " : "",
                                pass ? "domain" : "GPU", u, (long long)lost);
    }
    const char *what = pass ? "a failure domain's loss" : "a single GPU's loss";
    if (!bad) fprintf(out, "  %s: every element keeps a copy elsewhere, no checkpoint read\n", what);
    else
      fprintf(out, "  %s: %d of %d leave state with no copy (the checkpoint is read): %s%s\n", what, bad, of, list,
              bad > 6 ? ", ..." : "");
  }
  free(c.vol), free(c.first), free(c.rank);
  free(dead);
  free(used);
}

void sh_rank_weights(const sh_program *p, int64_t *weights) {
  bool *seen = calloc(p->n_tensors + 1, 1);
  if (!seen) ntp_out_of_memory();
  for (int32_t r = 0; r < p->world; r++) weights[r] = 0;
  for (size_t t = 0; t < p->n_tensors && !p->zero; t++) {
    const sh_tensor *x = &p->tensors[t];
    if (is_param(p, x)) weights[x->rank] += box_volume(&x->box) * (int64_t)dtype_bytes(x->dtype);
  }
  for (size_t s = 0; s < p->n_steps && p->zero; s++) {
    const sh_step *st = &p->steps[s];
    for (size_t x = 0; st->kind == SH_COMM && starts(st->why, "parameter gather") && x < st->nxfers; x++) {
      int32_t d = st->xfers[x].dst; /* the holders a gather fills, each once */
      if (seen[d]) continue;
      seen[d] = true;
      weights[p->tensors[d].rank] += box_volume(&p->tensors[d].box) * (int64_t)dtype_bytes(p->tensors[d].dtype);
    }
  }
  free(seen);
}

void sh_print_optimizer(const sh_program *p, FILE *out) {
  int32_t W = p->world;
  int64_t *weights = calloc((size_t)W + 1, sizeof *weights), *state = calloc((size_t)W + 1, sizeof *state);
  int64_t *sync = calloc((size_t)W + 1, sizeof *sync), *gather = calloc((size_t)W + 1, sizeof *gather);
  if (!weights || !state || !sync || !gather) ntp_out_of_memory();
  sh_rank_weights(p, weights);
  for (size_t t = 0; t < p->n_tensors; t++)
    if (is_param(p, &p->tensors[t])) /* an fp32 master and two fp32 moments */
      state[p->tensors[t].rank] += 12 * box_volume(&p->tensors[t].init_box);
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    bool g = starts(st->why, "parameter gather"), y = starts(st->why, "gradient sync");
    if (st->kind != SH_COMM || (!g && !y)) continue;
    for (int k = 0; k < st->nranks; k++) (g ? gather : sync)[st->ranks[k]] += st->bytes_out[k];
  }
  char a[32], b[32], c[32], d[32], e[32], f[32];
  fprintf(out, "\ntraining state per GPU (");
  if (p->zero)
    fprintf(out, "ZeRO-%d: AdamW's state on %d owner%s of each part of every parameter", p->zero, p->redundancy,
            p->redundancy == 1 ? "" : "s");
  else fputs("every replica keeps the state of what it holds", out);
  fprintf(out, "; failure domains of %d GPU%s)\n", p->domain_size > 0 ? p->domain_size : 1, p->domain_size > 1 ? "s" : "");
  fprintf(out, "  %-5s %12s %14s %14s %14s %12s %12s\n", "rank", "weights", "optim. state", "peak activ.", "total",
          "sync sent", "gather sent");
  for (int32_t r = 0; r < W; r++) {
    const sh_rank_mem *mm = &p->mem[r];
    int64_t total = mm->param_bytes + mm->input_bytes + mm->arena_bytes + state[r];
    fprintf(out, "  %-5d %12s %14s %14s %14s %12s %12s\n", r, human(weights[r], a, 32), human(state[r], b, 32),
            human(mm->arena_bytes, c, 32), human(total, d, 32), human(sync[r], e, 32), human(gather[r], f, 32));
  }
  fputs("  (weights: the whole slices each GPU computes with; optim. state: fp32 masters and moments; the peak\n"
        "  activations hold the gradients and, with ZeRO, the gathered weights; total: all of it with the inputs)\n",
        out);
  print_failures(p, out);
  free(weights);
  free(state);
  free(sync);
  free(gather);
}
