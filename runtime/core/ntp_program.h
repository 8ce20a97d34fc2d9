/* ntp_program.h — the program the runtime runs, and its versioned serialized form.
 *
 * The compiler hands the runtime a *program image*: bytes in the format below, written by
 * codegen/program_write.c (from the global IR, the sharded program and each rank's CUDA) and
 * read here into the runtime's own structs. A model library embeds the image; `ntpc run`
 * passes it in memory. Nothing of the compiler's internal layout crosses: the runtime builds
 * from runtime/ alone, and the compiler's structs may change freely as long as the image
 * they are written to keeps its version.
 *
 * The image, little-endian throughout:
 *   header   "NTPPROG\0", u32 version (NTP_PROGRAM_VERSION), u32 flags (0), u64 payload
 *            bytes, u64 FNV-1a of the payload
 *   payload  module: str name, u32 dtype, values, ops, layer names, outputs
 *            u32 has_program; then i32 world, tensors, steps, per-rank memory, pieces
 *            u32 has_cuda; then per rank: source, kernels, steps (one per program step), args
 * with u32 counts before every table, strings as u32 length + bytes (0xffffffff: none), a
 * box or shape as u32 ndim + its i64s, an op's attributes as the fields its opcode has
 * (floats as their bits). docs/ir.md ("The program image") lists every field.
 *
 * The reader refuses another version, a bad checksum, a short or overlong image, and any
 * index, count, dtype, opcode or offset out of range, so no image can make the runtime read
 * or write outside its tables and arenas. That shapes agree with their ops is the compiler's
 * verifier's guarantee (the checksum guards the bytes in between). */
#ifndef NTP_PROGRAM_H
#define NTP_PROGRAM_H

#include "ntp_types.h"

#define NTP_PROGRAM_MAGIC "NTPPROG"
#define NTP_PROGRAM_VERSION 3

/* ---- the global (unsharded) module: what the CPU reference runs ---- */
typedef struct ntp_value {
  ntp_shape shape;
  ntp_dtype dtype;
  int32_t def;      /* defining op */
  const char *name; /* may be NULL */
} ntp_value;

typedef struct ntp_op {
  ir_opcode code;
  int32_t result; /* a value (module) or a tensor (program step) */
  int32_t nargs;
  int32_t args[NTP_MAX_ARGS];
  int32_t layer; /* -1: model level */
  ntp_op_attr attr;
} ntp_op;

typedef struct ntp_output {
  const char *name;
  int32_t value;
} ntp_output;

typedef struct ntp_module {
  const char *name;
  ntp_dtype dtype;
  ntp_value *values;
  size_t n_values;
  ntp_op *ops; /* in execution order; every op defines one value */
  size_t n_ops;
  const char **layers; /* layer names (progress, messages) */
  size_t n_layers;
  ntp_output *outputs;
  size_t n_outputs;
} ntp_module;

/* ---- the sharded program: every rank's tensors and the steps that run on them ---- */
typedef struct ntp_tensor {
  int32_t rank;
  int32_t global;  /* the global value it holds a box of; -1 for a temporary */
  ntp_box box;     /* in the global value's coordinates (temporaries: their own) */
  ntp_dtype dtype;
  bool persistent; /* a parameter or input slice, in the rank's parameter block */
  const char *name;
  int32_t init_value; /* persistent: the input/param it is a slice of, and the box in its coordinates */
  ntp_box init_box;
  int32_t def;    /* defining step; -1: none */
  int64_t offset; /* bytes into the rank's arena, or into its parameter block if persistent */
} ntp_tensor;

/* One box moved from tensor src to tensor dst; for reductions dst receives the sum. */
typedef struct ntp_xfer {
  int32_t src, dst;
  ntp_box box;
} ntp_xfer;

typedef struct ntp_step {
  sh_step_kind kind;
  int32_t layer; /* global layer, -1: model level */
  int32_t rank;  /* compute */
  ntp_op op;     /* compute: args and result are tensor ids */
  sh_comm_kind comm;
  int32_t *ranks; /* comm: participants, ascending */
  int32_t nranks;
  ntp_xfer *xfers;
  size_t nxfers;
  int64_t elems; /* logical size of a collective */
} ntp_step;

typedef struct ntp_rank_mem {
  int64_t arena_bytes; /* activations */
  int64_t param_bytes, input_bytes;
} ntp_rank_mem;

/* CG_ATTENTION_GEMM: attention as the GEMM baseline, QK^T and PV strided-batched cuBLASLt GEMMs
 * with the step's kernel (scale, causal mask, softmax, rounding) between them, the scores and
 * probabilities in the scratch (ntp_attention_gemm_scratch) */
typedef enum { CG_NONE, CG_KERNEL, CG_GEMM, CG_FUSED, CG_ATTENTION_GEMM } cg_step_kind;
/* What a GEMM's epilogue does with the product before its one rounding (cuBLASLt epilogues):
 * forward, a bias over the output features and/or GELU; backward, GELU's derivative at the saved
 * GELU input (DGELU, with the bias gradient of its result: DGELU_BGRAD) or the bias gradient of
 * one operand summed over the GEMM's k (BGRADA: cuBLASLt's A, the IR's right operand; BGRADB:
 * cuBLASLt's B, the IR's left). X-macro: the enum and the names (cg_epilogue_name) from one list. */
#define CG_EPILOGUES(X) X(NONE) X(BIAS) X(GELU) X(GELU_BIAS) X(DGELU) X(DGELU_BGRAD) X(BGRADA) X(BGRADB)
typedef enum {
#define CG_EPI_ENUM(n) CG_EPI_##n,
  CG_EPILOGUES(CG_EPI_ENUM)
#undef CG_EPI_ENUM
  CG_EPI_COUNT
} cg_epilogue;
static inline const char *cg_epilogue_name(cg_epilogue e) {
#define CG_EPI_NAME(n) #n,
  static const char *const names[] = {CG_EPILOGUES(CG_EPI_NAME)};
#undef CG_EPI_NAME
  return (unsigned)e < CG_EPI_COUNT ? names[e] : "?";
}

/* Values a launch passes in its argument block (`struct ntp_args { i64 v[CG_MAX_ARGS]; }`, the
 * kernel's last parameter): its tensors' byte offsets and an init kernel's name hash. Nothing
 * else differs between the kernels of repeated layers, so those are one kernel, launched by
 * every step that needs it, and NVRTC compiles it once. */
#define CG_MAX_ARGS 48

/* How the runtime runs one compute step of the rank. */
typedef struct cg_step {
  cg_step_kind kind;    /* CG_FUSED: done by the kernel (or GEMM epilogue) of an earlier step */
  int32_t kernel;       /* index into kernels, for CG_KERNEL */
  cg_epilogue epilogue; /* CG_GEMM: what its epilogue does (above) */
  int32_t bias;         /* CG_GEMM with a bias: its tensor ([N], the product's dtype); with a bias
                           gradient (DGELU_BGRAD, BGRADA/B): the tensor it writes (the sum_to's) */
  int32_t aux;          /* CG_GEMM with DGELU: the GELU input it reads (cuBLASLt's aux), else -1 */
  int32_t mm;           /* CG_GEMM: the matmul step it computes: this step, or an earlier one when
                           the GEMM runs at the step of the act_grad it took into its epilogue */
  int32_t out;          /* CG_GEMM: the tensor written (the last fused step's result) */
  int64_t grid;         /* CG_KERNEL: blocks (1-D) */
  int32_t block, smem;  /* CG_KERNEL: threads per block, dynamic shared memory bytes */
  int32_t arg0, nargs;  /* CG_KERNEL: its argument block, args[arg0 .. arg0 + nargs) of the module */
  int32_t pre;          /* CG_KERNEL: a kernel launched just before, with the same block and arguments
                           (a first pass: attention's row statistics, kept in the scratch); -1: none */
  int64_t pre_grid;     /* its blocks */
} cg_step;

/* Where a rank's scratch starts: after its arena, aligned. A step may use the scratch while it
 * runs (nothing lives there between steps), so one region serves every step. */
static inline int64_t ntp_scratch_offset(int64_t arena_bytes) { return (arena_bytes + 255) / 256 * 256; }

/* The GEMM attention's scratch (B batches, H heads, S positions): the fp32 scores [B][H][S][S]
 * from byte 0, the probabilities in the storage dtype (esize bytes) from *probs; the bytes in all. */
static inline int64_t ntp_attention_gemm_scratch(int64_t B, int64_t H, int64_t S, int64_t esize, int64_t *probs) {
  int64_t at = (B * H * S * S * 4 + 255) / 256 * 256;
  if (probs) *probs = at;
  return at + B * H * S * S * esize;
}

typedef struct cg_kernel {
  char name[32];
  int32_t step;   /* the first step that launches it */
  int64_t grid;   /* that step's launch (others may launch it with another grid) */
  int32_t block;  /* threads per block */
  int32_t smem;   /* dynamic shared memory bytes */
} cg_kernel;

/* One rank's CUDA: a source NVRTC compiles, its kernels, and how each program step runs. */
typedef struct ntp_rank_code {
  const char *source;
  size_t len;
  cg_kernel *kernels;
  size_t nkernels;
  cg_step *steps; /* per step of the program (all ranks; only this rank's are set) */
  int64_t *args;  /* the argument blocks of the kernel steps */
  size_t nargs;
  int64_t scratch_bytes; /* device memory at ntp_scratch_offset(arena bytes) that steps use while they run */
} ntp_rank_code;

typedef struct ntp_program_pool ntp_program_pool;

typedef struct ntp_program {
  ntp_module global;
  int32_t world; /* 0: no sharded program in the image (the module alone) */
  ntp_tensor *tensors;
  size_t n_tensors;
  ntp_step *steps;
  size_t n_steps;
  ntp_rank_mem *mem;   /* per rank */
  int32_t **pieces;    /* per global value: the tensors holding boxes of it */
  size_t *npieces;
  ntp_rank_code *cuda; /* per rank, or NULL when the image has no CUDA */
  ntp_program_pool *pool;
} ntp_program;

/* Reads an image (copied: `data` may be freed after). 0, or -1 with a message in err. */
int ntp_program_read(const void *data, size_t len, ntp_program **out, char *err, size_t cap);
void ntp_program_free(ntp_program *p);

#endif
