/* memplan.c — one arena per rank: offsets from liveness (first fit), and a checker that
 * no two tensors alive at the same step share bytes. Parameter and input slices live for
 * the whole program in a block of their own. */
#include <stdint.h>
#include <stdlib.h>

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

static int by_offset(const void *a, const void *b) {
  const live_block *x = a, *y = b;
  return (x->offset > y->offset) - (x->offset < y->offset);
}

void sh_plan_memory(sh_program *p) {
  p->mem = calloc((size_t)p->world, sizeof *p->mem);
  int32_t *order = malloc((p->n_tensors + 1) * sizeof *order);
  live_block *live = malloc((p->n_tensors + 1) * sizeof *live);
  for (size_t i = 0; i < p->n_tensors; i++)
    if (p->tensors[i].last_use < p->tensors[i].def) p->tensors[i].last_use = p->tensors[i].def; /* written once */
  size_t n = defined_order(p, order, false);
  for (int32_t r = 0; r < p->world; r++) {
    sh_rank_mem *mem = &p->mem[r];
    for (size_t i = 0; i < p->n_tensors; i++) {
      sh_tensor *t = &p->tensors[i];
      if (t->rank != r || !t->persistent) continue;
      t->offset = add_sat(mem->param_bytes, mem->input_bytes);
      if (p->global->ops[p->global->values[t->init_value].def].code == IR_INPUT)
        mem->input_bytes = add_sat(mem->input_bytes, tensor_bytes(t));
      else mem->param_bytes = add_sat(mem->param_bytes, tensor_bytes(t));
    }
    size_t nlive = 0;
    for (size_t k = 0; k < n; k++) {
      sh_tensor *t = &p->tensors[order[k]];
      if (t->rank != r) continue;
      size_t keep = 0;
      for (size_t j = 0; j < nlive; j++)
        if (live[j].until >= t->def) live[keep++] = live[j];
      nlive = keep;
      qsort(live, nlive, sizeof *live, by_offset);
      int64_t size = tensor_bytes(t), at = 0;
      for (size_t j = 0; j < nlive; j++) {
        if (live[j].offset - at >= size) break;
        if (add_sat(live[j].offset, live[j].size) > at) at = add_sat(live[j].offset, live[j].size);
      }
      t->offset = at;
      live[nlive++] = (live_block){at, size, t->last_use};
      if (add_sat(at, size) > mem->arena_bytes) mem->arena_bytes = add_sat(at, size);
    }
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

bool sh_check_memory(const sh_program *p, char *err, size_t cap) {
  int32_t *order = malloc((p->n_tensors + 1) * sizeof *order);
  size_t n = defined_order(p, order, true); /* a rank's tensors together: only they can overlap */
  bool ok = true;
  for (size_t k = 0; k < n && ok; k++) {
    size_t i = (size_t)order[k];
    const sh_tensor *a = &p->tensors[i];
    if (a->offset < 0 || add_sat(a->offset, tensor_bytes(a)) > p->mem[a->rank].arena_bytes) {
      snprintf(err, cap, "tensor t%zu on rank %d lies outside its arena", i, a->rank);
      ok = false;
    }
    for (size_t l = k + 1; l < n && ok; l++) {
      size_t j = (size_t)order[l];
      const sh_tensor *b = &p->tensors[j];
      if (b->rank != a->rank || b->def > a->last_use) break; /* sorted by rank, then definition */
      if (a->offset < b->offset + tensor_bytes(b) && b->offset < a->offset + tensor_bytes(a)) {
        snprintf(err, cap, "rank %d: tensors t%zu (steps %d..%d) and t%zu (steps %d..%d) overlap in memory", a->rank, i,
                 a->def, a->last_use, j, b->def, b->last_use);
        ok = false;
      }
    }
  }
  free(order);
  return ok;
}
