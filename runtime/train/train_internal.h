/* train_internal.h — what the files of the trainer (runtime/train/: train.c the steps, train_state.c
 * its state files, train_handover.c the state after a failure) share: the trainer's parameters and
 * slices, the walk over a slice's box, and the helpers one file defines for the others. */
#ifndef NTP_TRAIN_INTERNAL_H
#define NTP_TRAIN_INTERNAL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "exec.h"
#include "ntp_train.h"

/* an operation of the trainer's executor (exec.h) */
#define EXEC(t, op, ...) ((t)->exec->ops->op((t)->exec->be, __VA_ARGS__))

typedef struct tparam {
  int32_t value;       /* in the module */
  int32_t grad_output; /* the output holding its gradient; -1: none (it does not affect the loss) */
  ntp_host_tensor cur; /* the master rounded to the module's dtype: what the module runs with */
  float *master, *m, *v;
  int64_t n;
  bool decay;
  int64_t *unheld, nunheld; /* a sharded run: elements no rank holds (rows of a table no op reads), updated
                               here with a zero gradient as the reference updates them */
} tparam;

/* A parameter slice on a rank with its share of the optimizer's state, in a sharded run (the
 * simulation or the CUDA backend): the fp32 master, the moments and the slice itself are
 * updated in place where they live (the simulated rank's memory, or the rank's GPU), from the
 * gradient the backward summed there; the global copies in tparam are gathered from the slices
 * when asked for (parameters, checkpoints, dumps). Replicas of an element update it alike: their
 * gradients are the same sums. */
typedef struct tslice {
  int32_t param;          /* index into t->p */
  int32_t tensor, grad;   /* the rank's slice, its summed gradient (-1: the parameter does not reach the loss) */
  int32_t rank;
  ntp_box box;            /* in the parameter's coordinates */
  int64_t n;
  float *master, *m, *v;  /* the executor's state buffers, where the rank lives (exec.h: alloc) */
  unsigned char *own;     /* the elements the global norm counts here: those no earlier slice holds */
  unsigned char *own_dev; /* the same in a state buffer */
  bool here;              /* its rank runs in this process (with one rank per process, one rank's slices
                             are; the others' are known by their boxes only) */
} tslice;

struct ntp_trainer {
  const ntp_module *mod;
  ntp_exec *exec; /* a sharded program's ranks (the simulation or the CUDA backend); NULL: the CPU reference */
  ntp_adamw o;
  uint64_t seed;
  tparam *p;
  size_t np;
  int32_t loss_output;
  int64_t step;
  const ntp_host_tensor **given; /* [n_values] */
  ntp_host_tensor *cur;          /* [np]: the cur tensors, contiguous (ntp_trainer_params) */
  ntp_cpu_result last;
  tslice *sl;                    /* sharded runs: every rank's parameter slices */
  size_t nsl;
  bool stale;                    /* the slices moved on since the global copies were gathered */
  int32_t loss_rank;             /* the rank whose piece of the loss is read */
  int32_t world;                 /* the program's ranks */
};

/* One rank per process (CUDA through NCCL, each process a rank): the trainer holds its rank's
 * slices only, and what the host needs of the others (the loss, the gradients' norm, the global
 * copies) is merged across the processes (ntp_cuda_merge: the word-wise sum of disjoint pieces,
 * so every process gets each piece's bits exactly). */
static inline bool per_process(const ntp_trainer *t) { return t->exec && !t->exec->ops->all_here(t->exec->be); }

static inline ntp_round_mode mode_of(ntp_dtype dt) {
  return dt == NTP_BF16 ? NTP_ROUND_BF16 : dt == NTP_FP16 ? NTP_ROUND_FP16 : NTP_ROUND_NONE;
}

/* Walks box b of a tensor of global shape gs in row-major order: box_walk_next gives the next
 * element's index in the tensor. */
typedef struct box_walk {
  const ntp_box *b;
  const ntp_shape *gs;
  int64_t idx[NTP_MAX_RANK];
} box_walk;

static inline box_walk box_walk_start(const ntp_box *b, const ntp_shape *gs) { return (box_walk){.b = b, .gs = gs}; }

static inline int64_t box_walk_next(box_walk *w) {
  int nd = w->b->ndim;
  int64_t gi = 0;
  for (int d = 0; d < nd; d++) gi = gi * w->gs->dim[d] + w->b->lo[d] + w->idx[d];
  for (int d = nd - 1; d >= 0; d--) {
    if (++w->idx[d] < w->b->hi[d] - w->b->lo[d]) break;
    w->idx[d] = 0;
  }
  return gi;
}

/* Copies box b of a tensor of global shape gs between the global array and a row-major local one;
 * to the global array, only the elements `only` marks (NULL: all). */
static inline void box_copy(float *global, const ntp_shape *gs, const ntp_box *b, float *local, bool to_local,
                     const unsigned char *only) {
  box_walk w = box_walk_start(b, gs);
  for (int64_t e = 0, n = box_volume(b); e < n; e++) {
    int64_t gi = box_walk_next(&w);
    if (to_local) local[e] = global[gi];
    else if (!only || only[e]) global[gi] = local[e];
  }
}

#pragma GCC visibility push(hidden) /* the runtime's own: not exported by libntprt.so */
/* A host buffer of the largest slice's size (staging between the slices and the global copies). */
float *ntp_train_slice_buffer(const ntp_trainer *t, char *err, size_t cap);
/* The global masters and moments into every slice, and the slices' parameters rounded from them. */
int ntp_train_scatter(ntp_trainer *t, char *err, size_t cap);
/* The slices' state into the global copies, when they moved on since the last gather. */
int ntp_train_gather(ntp_trainer *t, char *err, size_t cap);
#pragma GCC visibility pop

#endif
