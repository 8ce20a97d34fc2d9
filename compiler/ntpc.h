/* ntpc.h — public C API of libntpc, the ntp compiler as a library.
 *
 * A session compiles one model (plus the plans found beside it or given with
 * ntpc_add_plan_file) and keeps its diagnostics as data. Nothing here prints or
 * exits; callers decide what to show.
 */
#ifndef NTPC_H
#define NTPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NTPC_VERSION_STRING "0.1.0"

typedef enum { NTPC_OK = 0, NTPC_ERR_INPUT = 1, NTPC_ERR_USAGE = 2, NTPC_ERR_INTERNAL = 3 } ntpc_status;
typedef enum { NTPC_ERROR, NTPC_WARNING, NTPC_NOTE } ntpc_severity;

/* One diagnostic. Positions are 1-based; end_col is inclusive (== col for a point). */
typedef struct ntpc_diag {
  ntpc_severity severity;
  const char *file;
  int line, col, end_col;
  const char *message;
} ntpc_diag;

typedef struct ntpc_session ntpc_session;
struct ir_module;
struct sh_program;
struct cg_module;

ntpc_session *ntpc_session_new(void);
void ntpc_session_free(ntpc_session *s);

/* -D NAME=VALUE: replaces the initialiser of dim NAME. An unknown name is an error at compile time. */
ntpc_status ntpc_define(ntpc_session *s, const char *name, int64_t value);
/* Parses "NAME=VALUE"; returns NTPC_ERR_USAGE with a message (ntpc_last_error) when malformed. */
ntpc_status ntpc_define_str(ntpc_session *s, const char *assignment);
/* Selects which model of a file with several to compile (default: the only / first one). */
void ntpc_select_model(ntpc_session *s, const char *model_name);
/* A plan file read in addition to the model source (--plan). */
ntpc_status ntpc_add_plan_file(ntpc_session *s, const char *path);
/* Plan to apply by name (default: the first plan of the first --plan file; a plan in the
 * model's own file is applied only when named). */
void ntpc_select_plan(ntpc_session *s, const char *plan_name);
/* Sharding: world > 0 shards for that many ranks; 0 shards for the active plan's world (or
 * 1); -1 (the default) does not shard (the IR still records the plans). */
void ntpc_set_world(ntpc_session *s, int32_t world);
/* Pipelining (docs/pipeline.md): the batch cut into micro_batches (1: whole) whose gradients
 * accumulate (0: the active plan's 'micro_batches' line, else 1), ordered by a schedule: a name (gpipe, 1f1b, interleaved, zb-h1; NULL: the default)
 * or the path of a CSV table (FILE.csv). NTPC_ERR_USAGE for a bad count or name, or a table that
 * cannot be opened. */
#define NTP_MAX_MICRO_BATCHES 4096
ntpc_status ntpc_set_pipeline(ntpc_session *s, int32_t micro_batches, const char *schedule);
/* The distributed optimizer (docs/training.md#the-distributed-optimizer), overriding the plan's
 * 'optimizer' line: ZeRO stage 0..2, each shard on `redundancy` (>= 1) of its element's replicas,
 * failure domains of domain_size GPUs (over the plan's 'domain'; without either, each GPU is its own).
 * NTPC_ERR_USAGE for a value out of range. ntpc_set_domain_size alone keeps the plan's stage and
 * redundancy. */
ntpc_status ntpc_set_optimizer(ntpc_session *s, int32_t zero, int32_t redundancy);
ntpc_status ntpc_set_domain_size(ntpc_session *s, int32_t domain_size);
/* Rank r runs on GPU gpus[r] (copied; n entries, the world compiled for): a failure domain is a
 * range of GPUs, so after a failure the survivors' domains stay their machines'. */
void ntpc_set_rank_gpus(ntpc_session *s, const int32_t *gpus, int32_t n);
/* Stop after n errors (default 20, as with clang's -ferror-limit; 0: no limit). */
void ntpc_set_error_limit(ntpc_session *s, size_t n);
/* The largest source (model or plan file) accepted: larger ones are an input error. */
#define NTPC_MAX_SOURCE_BYTES ((size_t)16 << 20)

/* The device profile of the compile: a built-in name (h100, h200, a100, b200) or a profile file
 * (docs/planner.md#profile-format; `ntpc calibrate` writes one). The autoplan pass plans 'tp auto'
 * layers for it (default h100, as `ntpc plan`); the codegen takes what it measured of the GPU
 * (attention_gemm_from: where attention's GEMMs beat the tiled kernel). Read when a pass needs it:
 * a name that is neither is an input error then. */
void ntpc_set_gpu(ntpc_session *s, const char *gpu);
/* Run the codegen pass (CUDA C++ for every rank): for --emit=cuda, a model library, the CUDA backend. */
void ntpc_want_cuda(ntpc_session *s, bool on);
/* Training: the gradient pass runs after sema, appending the backward ops of the model's loss
 * (its one scalar output, or the one named "loss") and an output "grad.NAME" per parameter
 * (docs/training.md). Unsharded only in this version. */
void ntpc_want_grad(ntpc_session *s, bool on);
/* Print the result of each named pass ("sema", "shard,memplan", ...) to out as it completes
 * (--dump-after); NTPC_ERR_USAGE naming the passes for an unknown name. */
ntpc_status ntpc_dump_after(ntpc_session *s, const char *passes, FILE *out);
/* The pipeline's passes in order (name, and what it does into *what); NULL past the end. */
size_t ntpc_pass_count(void);
const char *ntpc_pass_name(size_t i, const char **what);

/* Compile: run the pipeline (parse, names, sema, place, autoplan, shard, memplan, codegen; the
 * passes after sema only when sharding), each pass's verifier after it. NTPC_OK or NTPC_ERR_INPUT (see diagnostics). */
ntpc_status ntpc_compile_file(ntpc_session *s, const char *path);
ntpc_status ntpc_compile_string(ntpc_session *s, const char *name, const char *source);

size_t ntpc_diag_count(const ntpc_session *s);
const ntpc_diag *ntpc_diag_at(const ntpc_session *s, size_t i);
size_t ntpc_error_count(const ntpc_session *s);
/* Renders every diagnostic in compiler style (file:line:col: error: msg, source line, caret). */
void ntpc_print_diags(const ntpc_session *s, FILE *out, int color);
/* The same from diagnostic `first` on (what a later step added). */
void ntpc_print_diags_from(const ntpc_session *s, size_t first, FILE *out, int color);
/* The session's diagnostic sink, for the compiler's own tools and passes that run beside the
 * pipeline (the planner: `ntpc plan`); what they report renders with the session's sources. */
struct diag_sink *ntpc_diag_sink(ntpc_session *s);

/* Stage outputs. kind: "tokens", "ast", "ir", "sharded-ir", "rank:N", "report".
 * Returns NTPC_ERR_USAGE for an unknown kind. */
ntpc_status ntpc_emit(ntpc_session *s, const char *kind, FILE *out);

/* The verified IR after a successful compile (NULL otherwise); owned by the session. */
const struct ir_module *ntpc_module(const ntpc_session *s);

/* The sharded program after a successful compile that sharded (NULL otherwise). */
const struct sh_program *ntpc_sharded(const ntpc_session *s);

/* The model of `file` compiled again at other batch rows, for the planner's 3D search (its
 * micro-batches): give ntpc_rows_model and the set as plan_request.model_at_rows and .rows_ctx.
 * Each is compiled once, with dim `dim` at the rows, the other -D overrides (`defines`, kept by
 * reference) as given and `model` selected (NULL: the first); NULL when out of memory. */
struct plan_model;
typedef struct ntpc_rows_models ntpc_rows_models;
ntpc_rows_models *ntpc_rows_models_new(const char *file, const char *model, const char *const *defines, int ndefines,
                                       const char *dim);
const struct plan_model *ntpc_rows_model(void *rows_models, int64_t rows); /* NULL: it does not compile */
const char *ntpc_rows_dim(const ntpc_rows_models *r);
void ntpc_rows_models_free(ntpc_rows_models *r);
/* The dim of m that sets its batch: the one whose value is `rows`; of several, the one named B.
 * NULL with *why when there is none, or several and none named B. */
const char *ntpc_batch_dim(const struct ir_module *m, int64_t rows, const char **why);

/* The codegen pass's output, one per rank (NULL unless ntpc_want_cuda and a sharded compile). */
const struct cg_module *ntpc_cuda_modules(const ntpc_session *s);
/* The compiled program as the runtime reads it (runtime/ntp_program.h: ntp_program_read): the
 * global module, the sharded program when sharding ran, every rank's CUDA when codegen ran.
 * Owned by the session; NTPC_ERR_USAGE (and no image) until a compile has succeeded. */
ntpc_status ntpc_program_image(const ntpc_session *s, const void **data, size_t *len);
/* What the autoplan pass chose for 'tp auto' layers, one line per choice (NULL if none). */
const char *ntpc_autoplan_notes(const ntpc_session *s);

/* Message of the last failed call that is not an input error (usage, I/O). */
const char *ntpc_last_error(const ntpc_session *s);

#ifdef __cplusplus
}
#endif
#endif
