/* layer_kind.h — a layer kind, whole: one table entry per kind, each in its own file under
 * compiler/layers/ and listed once in registry.c (QBE's Target is the model). Every pass that
 * treats layers differently asks the entry and nothing else: sema checks the call's arguments
 * and lowers it to primitive ops, the sharder splits it and lowers it per TP group, the planner
 * costs it per rank, the printers name it. No pass switches over kinds.
 *
 * A layer's parameters and the internal values its passes need are recorded on its ir_layer by
 * role (an index the kind's file defines), never found by name or by op pattern; the layer's
 * input and the value its sharded core ends in are recorded too. docs/adding-a-layer.md walks
 * through adding a kind. */
#ifndef NTP_LAYER_KIND_H
#define NTP_LAYER_KIND_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler.h"
#include "ir.h"
#include "shard.h"

struct sema;
struct plan_profile;
typedef struct shard_lowering shard_lowering; /* the sharder's state (shard_lower.h) */
typedef struct shard_group shard_group;       /* one TP group of one layer (shard_lower.h) */

/* ---- the call: arguments checked generically from the entry's table ---------------------- */

typedef enum { LA_DIM, LA_FLOAT, LA_BOOL, LA_WORD, LA_LAYER, LA_FLAG } layer_arg_kind;
#define LAYER_MAX_ARGS 8

typedef struct layer_arg {
  const char *key;
  layer_arg_kind kind;
  bool required;
  const char *const *words; /* LA_WORD: the accepted words, NULL-terminated */
  const char *what;         /* LA_WORD: what a word names, in messages ("activation") */
} layer_arg;

typedef struct layer_arg_val {
  bool set;
  int64_t i;
  double f;
  bool b;
  const char *word;
  ntp_loc loc;
} layer_arg_val;

/* What a kind's lowering sees: its input, its checked arguments (in the table's order), where
 * it was called. */
typedef struct layer_call {
  const ast_expr *call;
  const char *name; /* full layer name */
  int32_t x;        /* the positional tensor argument */
  ntp_loc x_loc;
  layer_arg_val arg[LAYER_MAX_ARGS];
} layer_call;

/* ---- what the sharder and the planner know of one layer ----------------------------------- */

#define LAYER_MAX_SIZES 10
typedef struct layer_dims {
  int64_t units;                 /* what a TP group splits among its ranks */
  int64_t size[LAYER_MAX_SIZES]; /* the kind's own sizes and flags; its file names the slots */
  ntp_dtype wdt;                 /* the weights' dtype */
  int64_t width;                 /* the residual stream around the layer: elements per token */
} layer_dims;

/* What rank i of a group of t holds: units [lo, hi), and a second range for kinds that have
 * one (attention: the KV heads [lo2, hi2) its query heads read). */
typedef struct layer_slice {
  int64_t lo, hi, lo2, hi2;
} layer_slice;

/* The planner's question: one rank of a group, its kernel time and what it holds. */
typedef struct layer_cost_in {
  const struct plan_profile *prof;
  const layer_dims *d;
  ntp_dtype dt; /* activations */
  int t, i;     /* group size, this rank's index in it */
  int64_t b;    /* batch rows the group takes (> 0) */
  double M;     /* tokens the group takes: b times tokens per row */
  bool sp;      /* sequence parallel */
} layer_cost_in;

typedef struct layer_cost {
  double time, params, act; /* seconds; parameter bytes held; activation bytes alive at once */
} layer_cost;

typedef struct layer_kind {
  const char *name; /* the builtin's name in .ntp */
  layer_arg args[LAYER_MAX_ARGS];
  const char *const *roles; /* parameter roles, NULL-terminated: role r is parameter "<layer>.<roles[r]>" */
  int32_t (*lower)(struct sema *s, layer_call *c); /* the value the layer computes, or -1 (reported) */

  /* Sharding. A kind without `shard` is not split: its ops follow their input (norms). */
  const char *unit_name; /* "heads": what `units` counts, in messages */
  void (*describe)(const ir_module *m, const ir_layer *ly, layer_dims *d);
  void (*split)(const layer_dims *d, int t, int i, layer_slice *out); /* the split rule, written once */
  void (*shard)(shard_lowering *L, const shard_group *g);           /* one group's ranks */
  void (*cost)(const layer_cost_in *in, layer_cost *out);            /* one rank, for the planner */
  bool reduces;        /* the group's partial outputs are summed (row-parallel end); else the
                          output stays split along its last dim over the group */
  bool index_input;    /* the input holds indices: no feature dim (tokens per row = all but dim 0) */
  int8_t weight_role;  /* a weight split along dim 0 by `units`, which another layer may share
                          (a tied head); -1: none */
  bool tie_source;     /* a linear's 'tied = LAYER' may name a layer of this kind */
  const char *color;   /* in the planner's picture */
} layer_kind;

/* registry.c */
extern const layer_kind *const layer_kinds[];
extern const int32_t layer_nkinds;
/* The kind called `name` (and its index, for ir_layer.kind), or NULL. */
const layer_kind *layer_kind_named(const char *name, int32_t *index);
static inline const layer_kind *layer_kind_of(const ir_layer *ly) { return layer_kinds[ly->kind]; }
static inline bool layer_is_sharded(const ir_layer *ly) { return layer_kind_of(ly)->shard != 0; }
/* The kinds a 'tied = ' may name, as "an embedding" / "an embedding or a ..." into buf. */
const char *layer_tie_sources(char *buf, size_t cap);
/* The layer's description and rank i's slice, from its kind. */
void layer_describe(const ir_module *m, const ir_layer *ly, layer_dims *d);

/* ---- the lowering kit for kinds' `lower` (sema_layers.c) --------------------------------- */

/* A parameter of the current layer in role `role`, named after it; -1 if reported. */
int32_t layer_param(struct sema *s, int role, ntp_shape shape, float center, float scale, ntp_loc loc);
/* Records value v in role `role` of the current layer (internal values other passes need). */
void layer_mark(struct sema *s, int role, int32_t v);
/* Records the value the layer's sharded core ends in (ops after it follow its pieces). */
void layer_set_core(struct sema *s, int32_t v);
int64_t layer_last_dim(struct sema *s, int32_t v);
int32_t layer_reshape(struct sema *s, int32_t x, ntp_shape shape, ntp_loc loc);
int32_t layer_op1(struct sema *s, ir_opcode code, int32_t a, ntp_loc loc);
int32_t layer_op2(struct sema *s, ir_opcode code, int32_t a, int32_t b, ntp_loc loc);
/* x @ w^T with w stored [out, in], as PyTorch stores linear weights */
int32_t layer_matmul_tb(struct sema *s, int32_t x, int32_t w, ntp_loc loc);
float layer_fan_in_scale(int64_t fan_in);
/* y = x @ w^T (+ b) with w [out, in] in role wrole and b in role brole; *mm: the product */
int32_t layer_dense(struct sema *s, int32_t x, int64_t out, int wrole, int brole, bool bias, ntp_loc loc,
                    int32_t *mm);

static inline ntp_shape layer_shape1(int64_t a) { return (ntp_shape){1, {a}}; }
static inline ntp_shape layer_shape2(int64_t a, int64_t b) { return (ntp_shape){2, {a, b}}; }

#endif
