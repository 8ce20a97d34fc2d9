/* memplan.c — one arena per rank: offsets from liveness (first fit), and a checker that
 * no two tensors alive at the same step share bytes. Parameter and input slices live for
 * the whole program in a block of their own. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard.h"

enum { ALIGN = 256 };

/* Sizes and offsets saturate at INT64_MAX instead of wrapping: sema caps tensors and models far
 * below it, and a saturated value still fails the checker rather than aliasing memory. */
static int64_t add_sat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t tensor_bytes(const sh_tensor *t) {
  int64_t b;
  if (__builtin_mul_overflow(box_volume(&t->box), (int64_t)dtype_bytes(t->dtype), &b) || b > INT64_MAX - ALIGN)
    return INT64_MAX;
  return (b + ALIGN - 1) / ALIGN * ALIGN;
}

typedef struct live_block {
  int64_t offset, size;
  int32_t until; /* last step that reads it */
} live_block;

typedef struct def_id {
  int32_t rank, def, id; /* rank: 0 for every tensor when sorting by definition alone */
} def_id;

static int by_def(const void *a, const void *b) {
  const def_id *x = a, *y = b;
  if (x->rank != y->rank) return (x->rank > y->rank) - (x->rank < y->rank);
  if (x->def != y->def) return (x->def > y->def) - (x->def < y->def);
  return (x->id > y->id) - (x->id < y->id);
}

/* Non-persistent tensor ids sorted by the step that defines them (by_rank: by rank first). */
static size_t defined_order(const sh_program *p, int32_t *order, bool by_rank) {
  def_id *pairs = malloc((p->n_tensors + 1) * sizeof *pairs);
  size_t n = 0;
  for (size_t i = 0; pairs && i < p->n_tensors; i++)
    if (!p->tensors[i].persistent)
      pairs[n++] = (def_id){by_rank ? p->tensors[i].rank : 0, p->tensors[i].def, (int32_t)i};
  qsort(pairs, n, sizeof *pairs, by_def);
  for (size_t i = 0; i < n; i++) order[i] = pairs[i].id;
  free(pairs);
  return n;
}


void sh_plan_memory(sh_program *p) {
  p->mem = calloc((size_t)p->world, sizeof *p->mem);
  int32_t *order = malloc((p->n_tensors + 1) * sizeof *order);
  live_block *live = malloc((p->n_tensors + 1) * sizeof *live);
  for (size_t i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].last_use < p->tensors[i].def) p->tensors[i].last_use = p->tensors[i].def; /* written once */
  for (size_t i = 0; i < p->n_tensors; i++) { /* parameters and inputs: a block of their own, in order */
    sh_tensor *t = &p->tensors[i];
    if (!t->persistent) continue;
    sh_rank_mem *mem = &p->mem[t->rank];
    t->offset = add_sat(mem->param_bytes, mem->input_bytes);
    if (p->global->ops[p->global->values[t->init_value].def].code == IR_INPUT)
      mem->input_bytes = add_sat(mem->input_bytes, tensor_bytes(t));
    else mem->param_bytes = add_sat(mem->param_bytes, tensor_bytes(t));
  }
  /* the arena, rank by rank in definition order: first fit among the blocks still alive, which
   * are kept in offset order (dropping the dead ones keeps it, and a new block goes where it fits) */
  size_t n = defined_order(p, order, true), nlive = 0;
  for (size_t k = 0; k < n; k++) {
    sh_tensor *t = &p->tensors[order[k]];
    if (k == 0 || p->tensors[order[k - 1]].rank != t->rank) nlive = 0;
    sh_rank_mem *mem = &p->mem[t->rank];
    size_t keep = 0;
    for (size_t j = 0; j < nlive; j++)
      if (live[j].until >= t->def) live[keep++] = live[j];
    nlive = keep;
    int64_t size = tensor_bytes(t), at = 0;
    size_t j = 0;
    for (; j < nlive; j++) {
      if (live[j].offset - at >= size) break;
      if (add_sat(live[j].offset, live[j].size) > at) at = add_sat(live[j].offset, live[j].size);
    }
    t->offset = at;
    memmove(&live[j + 1], &live[j], (nlive - j) * sizeof *live);
    live[j] = (live_block){at, size, t->last_use};
    nlive++;
    if (add_sat(at, size) > mem->arena_bytes) mem->arena_bytes = add_sat(at, size);
  }
  for (size_t s = 0; s < p->n_steps; s++) {
    const sh_step *st = &p->steps[s];
    if (st->kind != SH_COMM) continue;
    for (int i = 0; i < st->nranks; i++) {
      p->mem[st->ranks[i]].bytes_sent += st->bytes_out[i];
      p->mem[st->ranks[i]].bytes_received += st->bytes_in[i];
    }
  }
  free(order);
  free(live);
}

static bool overlap(const sh_tensor *a, const sh_tensor *b) {
  return a->offset < add_sat(b->offset, tensor_bytes(b)) && b->offset < add_sat(a->offset, tensor_bytes(a));
}

/* A sweep over each rank's tensors in definition order with the ones alive kept in offset order:
 * they are pairwise apart (else the check has failed already), so a new tensor can only meet the
 * blocks just below its offset (down to the first non-empty one ending before it) and those
 * starting before its end. */
bool sh_check_memory(const sh_program *p, char *err, size_t cap) {
  int32_t *order = malloc((p->n_tensors + 1) * sizeof *order), *alive = malloc((p->n_tensors + 1) * sizeof *alive);
  if (!order || !alive) ntp_out_of_memory();
  size_t n = defined_order(p, order, true), nalive = 0;
  bool ok = true;
  for (size_t k = 0; k < n && ok; k++) {
    const sh_tensor *b = &p->tensors[order[k]];
    if (b->offset < 0 || add_sat(b->offset, tensor_bytes(b)) > p->mem[b->rank].arena_bytes) {
      snprintf(err, cap, "tensor t%d on rank %d lies outside its arena", order[k], b->rank);
      ok = false;
      break;
    }
    if (k == 0 || p->tensors[order[k - 1]].rank != b->rank) nalive = 0;
    size_t keep = 0, at = 0;
    for (size_t j = 0; j < nalive; j++)
      if (p->tensors[alive[j]].last_use >= b->def) alive[keep++] = alive[j];
    nalive = keep;
    while (at < nalive && p->tensors[alive[at]].offset <= b->offset) at++;
    int32_t other = -1;
    for (size_t j = at; j-- > 0 && other < 0;) {
      const sh_tensor *a = &p->tensors[alive[j]];
      if (overlap(a, b)) other = alive[j];
      else if (tensor_bytes(a) > 0) break; /* the blocks below end before this one */
    }
    for (size_t j = at; j < nalive && other < 0 && p->tensors[alive[j]].offset < add_sat(b->offset, tensor_bytes(b)); j++)
      if (overlap(&p->tensors[alive[j]], b)) other = alive[j];
    if (other >= 0) {
      const sh_tensor *a = &p->tensors[other];
      snprintf(err, cap, "rank %d: tensors t%d (steps %d..%d) and t%d (steps %d..%d) overlap in memory", b->rank, other,
               a->def, a->last_use, order[k], b->def, b->last_use);
      ok = false;
    }
    memmove(&alive[at + 1], &alive[at], (nalive - at) * sizeof *alive);
    alive[at] = order[k];
    nalive++;
  }
  free(order);
  free(alive);
  return ok;
}
