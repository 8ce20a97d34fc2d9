/* ir.h — the ntp IR: flat tables of values and ops addressed by index (QBE style).
 *
 * Every op defines exactly one value; operands name values by index and always
 * refer to earlier values (the op list is in execution order). Every op keeps the
 * source location it was lowered from. The op and dtype tables are X-macros, so
 * the enum, the printer's names and the verifier's arities never drift.
 *
 * The IR is the unsharded ("global") program. Values carry an optional explicit
 * layout (mesh + sharded axes per dim) and ops carry the layer they belong to;
 * layers carry their @tp annotation. Plans are kept beside as data. The sharding
 * pass reads these; the backward pass can be derived op by op because every op is
 * a primitive with a closed-form derivative.
 */
#ifndef NTP_IR_H
#define NTP_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "ntp_types.h"

#define NTP_MAX_GROUPS 64
#define NTP_MAX_PIPES 64 /* pipeline replicas in a plan (data parallel over pipelines): each has a group */
#define NTP_MAX_MESH_DIMS 4

/* Limits on what a source may ask for, checked by sema with a diagnostic, so that no size the
 * later passes compute (elements, bytes, bytes per rank, over every rank) can overflow 64 bits. */
#define NTP_MAX_WORLD 4096                     /* ranks; also bounds TP degrees, mesh dims, batch shares */
#define NTP_MAX_REPEAT 65536                   /* iterations of one 'repeat' */
#define NTP_MAX_OPS (1 << 22)                  /* ops of the unrolled model */
#define NTP_MAX_TENSOR_ELEMS (INT64_C(1) << 40) /* elements of one tensor (4 TiB in fp32) */
#define NTP_MAX_MODEL_ELEMS (INT64_C(1) << 52)  /* elements of all the model's tensors together */

/* The op, dtype and shape tables: runtime/core/ntp_types.h (shared with the runtime). */

/* Explicit layout: dim i is sharded over the mesh axes in the bitmask axes[i]. */
typedef struct ntp_layout {
  int32_t mesh; /* index into ir_module.meshes, -1 = no explicit layout */
  uint8_t axes[NTP_MAX_RANK];
  bool diagonal;
} ntp_layout;

typedef struct ir_value {
  ntp_shape shape;
  ntp_dtype dtype;
  int32_t def;      /* defining op */
  const char *name; /* parameter / input name, or the source variable it was bound to; may be NULL */
  ntp_layout layout;
} ir_value;

typedef struct ir_op {
  ir_opcode code;
  int32_t result;
  int32_t nargs;
  int32_t args[NTP_MAX_ARGS];
  int32_t layer; /* index into ir_module.layers, -1 = model level */
  ntp_loc loc;
  ntp_op_attr attr;
} ir_op;

typedef struct ir_dim {
  const char *name;
  int64_t value;
  bool overridden; /* set by -D */
  ntp_loc loc;
} ir_dim;

typedef struct ir_mesh {
  const char *name;
  int32_t ndims;
  int64_t size[NTP_MAX_MESH_DIMS];
  const char *axis[NTP_MAX_MESH_DIMS];
  ntp_loc loc;
} ir_mesh;

/* A TP annotation: none, auto, a uniform degree (n == 1), or explicit group sizes (n > 1). */
typedef enum { TP_NONE, TP_AUTO, TP_DEGREES } ir_tp_kind;
typedef struct ir_tp {
  ir_tp_kind kind;
  int32_t n;
  int64_t groups[NTP_MAX_GROUPS];
  ntp_loc loc;
} ir_tp;

#define NTP_LAYER_ROLES 12

/* A layer: a call of a layer kind (compiler/layers/). Its kind's file gives every rule that
 * depends on the kind; the IR records what those rules read, so no pass looks for a layer's
 * parts by name or by op pattern. */
typedef struct ir_layer {
  const char *name; /* hierarchical: blk.3.attn */
  int32_t kind;     /* index into layer_kinds[] (compiler/layers/registry.c) */
  ir_tp tp;
  ntp_loc loc;
  int32_t first_op, nops; /* ops of a layer are contiguous */
  int32_t weight;         /* a weight another layer may tie to (an embedding's table); -1 otherwise */
  int32_t input;          /* the value the layer reads */
  int32_t core;           /* the value its sharded core ends in; ops after it follow (bias adds) */
  int32_t role[NTP_LAYER_ROLES]; /* values by the kind's roles (parameters, internals); -1: none */
} ir_layer;

typedef struct ir_output {
  const char *name;
  int32_t value;
  bool has_layout; /* a requested output layout: -> [...] */
  ntp_layout layout;
  ntp_loc loc;
} ir_output;

typedef struct ir_rule {
  const char *pattern;
  ir_tp tp;
  bool seq_parallel;
  bool recompute; /* training: the layer's activations are recomputed in its backward */
  int32_t nbatch;
  int64_t batch[NTP_MAX_GROUPS];
  int32_t pipe; /* written inside pipeline block `pipe`: that pipeline's layers alone; -1 every pipeline */
  ntp_loc loc;
} ir_rule;

/* A pipeline stage as a plan writes it: the layers from `first` to `last` (each a layer name or
 * a dotted prefix of names, as blk.6 for blk.6.attn and blk.6.mlp) on ranks [rank_lo, rank_hi]. */
typedef struct ir_stage {
  const char *first, *last;
  ntp_loc first_loc, last_loc, ranks_loc, loc;
  int64_t rank_lo, rank_hi;
} ir_stage;

/* A pipeline: a replica of the whole model cut into stages, with its share of the batch rows
 * (0: in proportion to its ranks). */
typedef struct ir_pipeline {
  ir_stage *stages;
  size_t nstages;
  int64_t share;
  ntp_loc loc;
} ir_pipeline;

typedef struct ir_plan {
  const char *name, *model, *file;
  int64_t world; /* 0 = not given */
  ir_rule *rules;
  size_t nrules;
  ir_pipeline *pipes; /* none: no stages */
  size_t npipes;
  int64_t even_stages; /* 'stages N;': N stages of (nearly) equal layer counts and ranks; 0 = not given */
  ntp_loc even_loc;
  /* 'optimizer zero Z redundancy K;': AdamW's state (and with Z = 2 the gradients) sharded over the
     replicas of each parameter element, each shard on K of them; Z = 0: every replica keeps all */
  int32_t zero, redundancy;
  int32_t domain_size; /* 'domain D': GPUs per failure domain the copies are kept apart across; 0: not given */
  ntp_loc zero_loc;
  /* 'micro_batches M;': the batch cut into M micro-batches unless the command line says otherwise
     (ntpc_set_pipeline); 0 = not given (the batch whole) */
  int32_t micro_batches;
  ntp_loc mb_loc;
  /* 'schedule NAME;': the pipeline schedule unless the command line says otherwise (gpipe, 1f1b,
     interleaved, zb-h1; checked by sema); NULL = not given (1F1B, interleaved on shared rank sets) */
  const char *schedule;
  ntp_loc sched_loc;
  ntp_loc loc;
} ir_plan;

#define IR_TABLE(T, name) T *name; size_t n_##name, cap_##name

typedef struct ir_module {
  const char *name, *file;
  ntp_dtype dtype;
  IR_TABLE(ir_dim, dims);
  IR_TABLE(ir_mesh, meshes);
  IR_TABLE(ir_value, values);
  IR_TABLE(ir_op, ops);
  IR_TABLE(ir_layer, layers);
  IR_TABLE(ir_output, outputs);
  IR_TABLE(ir_plan, plans);
  int32_t active_plan; /* -1 = none */
  size_t n_forward_ops; /* training: ops [0, n) are the forward pass, the rest its backward (the
                           gradient pass's); 0: no backward */
} ir_module;

ir_module *ir_module_new(void);
void ir_module_free(ir_module *m);
/* Appends an op and its result value; returns the value index. */
int32_t ir_emit(ir_module *m, ir_opcode code, const int32_t *args, int32_t nargs, ntp_shape shape, ntp_dtype dt,
                int32_t layer, ntp_loc loc);
static inline ir_op *ir_def(const ir_module *m, int32_t value) { return &m->ops[m->values[value].def]; }
/* Plan patterns: '*' matches any run of characters (dots included), "{A..B}" a number A..B. */
/* A pipeline schedule's name (the plan's 'schedule', the command line's --schedule): 1 gpipe, 2
 * 1f1b, 3 interleaved, 4 zb-h1 (also zbh1), in sh_schedule_kind's order; 0 for another name. */
int ir_schedule_code(const char *name);
bool ir_glob_match(const char *pattern, const char *name);
/* The first (last: the last) layer named `name` or whose name starts with `name.` (a stage's
 * blk.6 is blk.6.attn ... blk.6.mlp); -1 when none. */
int32_t ir_layer_by_prefix(const ir_module *m, const char *name, bool last);
/* How specific a pattern is: its literal characters; a range counts 1, '*' nothing. */
int ir_pattern_specificity(const char *pattern);
/* Formats a rule violation into err and returns false (for the checks below). */
bool ir_fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ir_shape.c: the result shape and dtype of an op from its operands; false + message if illegal. */
bool ir_infer(const ir_module *m, const ir_op *op, ntp_shape *shape, ntp_dtype *dt, char *err, size_t errlen);
/* ir_print.c: stable text form (--emit=ir) */
void ir_print(const ir_module *m, FILE *out);
void ir_print_tp(const ir_tp *tp, FILE *out);
void ir_print_attrs(const ir_op *op, FILE *out); /* "  trans_b", "  eps=1e-05", ... */
/* ir_verify.c: structural and type invariants; false + message on the first violation. */
bool ir_verify(const ir_module *m, char *err, size_t errlen);

#endif
