/* ntp_types.h — the vocabulary the compiler and the runtime share: dtypes, shapes, the primitive
 * ops and their attributes, boxes, collectives. Each table is an X-macro defined once, so the
 * enum, the printed names and the arities never drift. The enums' numbers are part of the
 * program format (ntp_program.h): a change to a table is a change of its version.
 *
 * The names keep the IR's spelling (IR_MATMUL, COMM_ALL_REDUCE), since the compiler's IR
 * (compiler/ir/ir.h) is built from this vocabulary; this header owns it so that the runtime
 * builds from runtime/ alone. */
#ifndef NTP_TYPES_H
#define NTP_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- dtypes: X(enum suffix, spelling, bytes, is_float) ---- */
#define NTP_DTYPES(X)       \
  X(BF16, "bf16", 2, true)  \
  X(FP16, "fp16", 2, true)  \
  X(FP32, "fp32", 4, true)  \
  X(I32, "i32", 4, false)

typedef enum {
#define X(e, s, b, f) NTP_##e,
  NTP_DTYPES(X)
#undef X
  NTP_DTYPE_COUNT
} ntp_dtype;

const char *dtype_name(ntp_dtype t);
size_t dtype_bytes(ntp_dtype t);
bool dtype_is_float(ntp_dtype t);
/* -1 when `s` names no dtype */
int dtype_lookup(const char *s);

/* ---- shapes ---- */
#define NTP_MAX_RANK 6
#define NTP_MAX_ARGS 4

typedef struct ntp_shape {
  int32_t ndim;
  int64_t dim[NTP_MAX_RANK];
} ntp_shape;

int64_t shape_numel(const ntp_shape *s);
/* The element count, or -1 when it does not fit in 64 bits. */
int64_t shape_numel_checked(const ntp_shape *s);
bool shape_eq(const ntp_shape *a, const ntp_shape *b);
/* "[2, 16, 768]" into buf */
const char *shape_str(const ntp_shape *s, char *buf, size_t cap);

/* ---- the primitive ops: X(enum suffix, printed name, operand count) ---- */
#define IR_OPS(X)                                                                          \
  X(INPUT, "input", 0)         /* a model input; name + init.int_range for i32 */          \
  X(PARAM, "param", 0)         /* a parameter; name + init (center, scale) */              \
  X(CONST, "const", 0)         /* a scalar constant (shape []) */                           \
  X(GATHER, "gather", 2)       /* table [V, D], index i32 [...] -> [..., D] */             \
  X(SLICE, "slice", 1)         /* x restricted to [start, start+len) along axis */         \
  X(RESHAPE, "reshape", 1)     /* same elements, row-major, new shape */                   \
  X(MATMUL, "matmul", 2)       /* [..., M, K] x [K, N] or [..., K, N]; trans_b: b is [N, K] */ \
  X(ADD, "add", 2)             /* elementwise, NumPy broadcasting */                       \
  X(SUB, "sub", 2)                                                                         \
  X(MUL, "mul", 2)                                                                         \
  X(DIV, "div", 2)                                                                         \
  X(NEG, "neg", 1)                                                                         \
  X(GELU, "gelu", 1)           /* tanh approximation */                                    \
  X(RELU, "relu", 1)                                                                       \
  X(SILU, "silu", 1)                                                                       \
  X(SIGMOID, "sigmoid", 1)                                                                 \
  X(TANH, "tanh", 1)                                                                       \
  X(EXP, "exp", 1)                                                                         \
  X(SOFTMAX, "softmax", 1)     /* over the last dim */                                     \
  X(LAYERNORM, "layernorm", 1) /* (x - mean) / sqrt(var + eps) over the last dim; no affine */ \
  X(RMSNORM, "rmsnorm", 1)     /* x / sqrt(mean(x^2) + eps) over the last dim; no affine */ \
  X(ROPE, "rope", 1)           /* x [B, S, H, HD], rotate-half, theta */                    \
  X(ATTENTION, "attention", 3) /* q [B,S,H,HD], k, v [B,S,KV,HD] -> [B,S,H,HD] */             \
  /* the loss, and the backward ops after it (kernels: codegen/cg_loss.c, cg_grad.c) */          \
  X(CROSS_ENTROPY, "cross_entropy", 2) /* logits [..., V], targets i32 [...] -> fp32 [] mean */ \
  /* ---- backward ops (compiler/grad/): what the gradient pass emits ---- */                   \
  X(SUM_TO, "sum_to", 1)             /* x summed to the result's shape (broadcasting undone) */  \
  X(ACT_GRAD, "act_grad", 2)         /* (x, or y for tanh/sigmoid; dy): dy * f'; grad.of = f */  \
  X(SOFTMAX_GRAD, "softmax_grad", 2) /* (y, dy) -> y * (dy - sum(dy * y)) over the last dim */   \
  X(LAYERNORM_GRAD, "layernorm_grad", 2) /* (x, dy) -> dx */                                    \
  X(RMSNORM_GRAD, "rmsnorm_grad", 2) /* (x, dy) -> dx */                                        \
  X(ATTENTION_GRAD, "attention_grad", 4) /* (q, k, v, dy) -> dq, dk or dv (attn.which) */       \
  X(SCATTER_ADD, "scatter_add", 2)   /* (index i32 [...], dy [..., D]) -> table [V, D] */        \
  X(PAD, "pad", 1)                   /* x placed at [start, start+len) of the result's axis */   \
  X(CROSS_ENTROPY_GRAD, "cross_entropy_grad", 3) /* (logits, targets, dloss []) -> dlogits */ \
  /* ---- the vocabulary-parallel loss (compiler/shard/shard_loss.c): what the sharder makes of    \
   * cross_entropy when the logits' vocabulary is split over ranks; never in a global module ---- */ \
  X(CE_STATS, "ce_stats", 2)     /* (logits [..., Vk] of vocabulary [ce.lo, ce.lo + Vk), targets) ->  \
                                    fp32 [R, 4] per row: max, sum exp(l - max), target logit or 0, held */ \
  X(CE_ROWS, "ce_rows", 2)       /* (stats of a row block's t ranks [R, 4t], targets) -> fp32 [1, 2]:  \
                                    sum over counted rows of logsumexp - target logit, rows counted */ \
  X(CE_MEAN, "ce_mean", 1)       /* ([blocks, 2]) -> fp32 []: the sums over the counts */              \
  X(CE_STATS_GRAD, "ce_stats_grad", 3) /* (logits, targets, dstats) -> dlogits */                      \
  X(CE_ROWS_GRAD, "ce_rows_grad", 3)   /* (stats, targets, dpart [1, 2]) -> dstats */                  \
  X(CE_MEAN_GRAD, "ce_mean_grad", 2)   /* (parts, dloss []) -> dparts */                             \
  /* micro-batches (docs/pipeline.md): each row block's part gets the loss's gradient from the    \
   * targets alone, so a micro-batch's backward need not wait for the others' forward */         \
  X(CE_COUNT, "ce_count", 1)     /* (targets i32 [R]) -> fp32 [1, 2]: (0, rows counted) */            \
  X(CE_SEED, "ce_seed", 1)       /* (counts [n, 2]) -> fp32 [1, 2]: (1 / rows counted in all, 0) */

typedef enum {
#define X(e, s, n) IR_##e,
  IR_OPS(X)
#undef X
  IR_OP_COUNT
} ir_opcode;

const char *ir_op_name(ir_opcode op);
int ir_op_arity(ir_opcode op);
bool ir_op_is_unary_elementwise(ir_opcode op);
bool ir_op_is_binary_elementwise(ir_opcode op);

/* An op's attributes, by opcode (which member is meaningful). */
typedef union ntp_op_attr {
  struct { bool trans_b, trans_a; } mm;                  /* trans_a: a is [..., K, M] */
  struct { float eps; } norm;
  struct { float theta; int64_t pos0; bool inverse; } rope; /* pos0: first position (a sequence shard);
                                                            inverse: rotate back (its backward) */
  struct { bool causal; uint8_t which; float scale; int64_t q_off, group, kv_off; } attn; /* query head n uses
                                                            kv head n/group; which: attention_grad's 0 dq, 1 dk, 2 dv */
  struct { int64_t lo, hi; } gather;                     /* table rows held: [lo, hi); hi = 0: all */
  struct { int32_t axis; int64_t start, len; } slice;
  struct { double value; } cst;
  struct { float center, scale; int32_t int_range; } init; /* param / input: center + scale * U[-1, 1) */
  struct { int64_t ignore, lo; } ce;                      /* cross_entropy: targets equal to it are skipped;
                                                            ce_stats(_grad): the first vocabulary row held */
  struct { int32_t of; } grad;                            /* act_grad: the forward op (ir_opcode) */
  uint64_t raw[4];                                        /* all of the above: equality and hashing */
} ntp_op_attr;

_Static_assert(sizeof(ntp_op_attr) == 4 * sizeof(uint64_t), "op attributes must fit raw[4]");

/* ---- boxes: hyper-rectangles [lo, hi) of a global value's indices ---- */
typedef struct ntp_box {
  int32_t ndim;
  int64_t lo[NTP_MAX_RANK], hi[NTP_MAX_RANK];
} ntp_box;

int64_t box_volume(const ntp_box *b);
bool box_eq(const ntp_box *a, const ntp_box *b);
bool box_contains(const ntp_box *outer, const ntp_box *inner);
bool box_intersect(const ntp_box *a, const ntp_box *b, ntp_box *out);
ntp_box box_full(const ntp_shape *s);
ntp_shape box_shape(const ntp_box *b);
const char *box_str(const ntp_box *b, char *buf, size_t cap);

/* ---- collectives: X(enum suffix, printed name, the planner's profile key); the priced ones
 * come first, before COMM_LOCAL_COPY ---- */
#define SH_COMMS(X)                                                                                 \
  X(ALL_REDUCE, "all-reduce", "all-reduce")             /* sum of partials, result on every member */   \
  X(REDUCE_SCATTER, "reduce-scatter", "reduce-scatter") /* sum of partials, each member keeps a slice */ \
  X(ALL_GATHER, "all-gather", "all-gather")             /* each member receives every other's slice */  \
  X(ALL_TO_ALL, "all-to-all", "all-to-all")             /* every member sends a distinct slice to every other */ \
  X(SEND_RECV, "send/recv", "send-recv")                /* grouped point-to-point transfers */           \
  X(LOCAL_COPY, "local copy", NULL)                     /* slices copied within ranks: no communication */

typedef enum {
#define X(e, s, key) COMM_##e,
  SH_COMMS(X)
#undef X
  SH_COMM_COUNT
} sh_comm_kind;
typedef enum { SH_COMPUTE, SH_COMM } sh_step_kind; /* a step of a sharded program */
#define SH_NPRICED_COMMS COMM_LOCAL_COPY /* the collectives a device profile prices */
const char *sh_comm_name(sh_comm_kind k);
const char *sh_comm_profile_key(sh_comm_kind k); /* NULL for a local copy */

/* ---- FNV-1a, 64 bits (hash.c): h = NTP_FNV_BASIS to start, or a previous result to continue ---- */
#define NTP_FNV_BASIS UINT64_C(0xcbf29ce484222325)
uint64_t ntp_fnv1a64(const void *data, size_t len, uint64_t h);

#endif
