/* ntp_train.h — training (on the CPU reference, the simulation or the CUDA backend): AdamW over
 * a module compiled with its gradient pass (ntpc_want_grad), and the llm.c token files it reads
 * (docs/training.md). */
#ifndef NTP_TRAIN_H
#define NTP_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ntprt.h"

/* ---- AdamW (train.c) ---------------------------------------------------------------- */
typedef struct ntp_adamw {
  double lr;          /* peak learning rate */
  double min_lr_frac; /* the cosine decays to lr * min_lr_frac at the last step */
  int64_t warmup;     /* steps of linear warmup: lr * (step + 1) / warmup */
  int64_t steps;      /* the schedule's length */
  double beta1, beta2, eps;
  double weight_decay; /* decoupled, on matrices and embedding tables (parameters of 2 or more dims) */
  double clip;         /* the gradients' global norm is clipped to this; 0: no clipping */
} ntp_adamw;

/* lr 1e-3, min_lr_frac 0.1, warmup 0, steps 1, betas 0.9 and 0.95, eps 1e-8, weight decay 0.1,
 * clip 1 */
void ntp_adamw_defaults(ntp_adamw *o);
/* The learning rate of step `step` (0-based) */
double ntp_adamw_lr(const ntp_adamw *o, int64_t step);
/* The options by name (adamw_options.c), one table for every caller (ntpc train, the model ABI,
 * Python): "lr", "warmup", "min_lr_frac", "steps", "beta1", "beta2", "eps", "weight_decay",
 * "clip". set takes the decimal text a user wrote (no hex, inf or nan), set_number a number; both
 * refuse a value outside the option's bounds (finite, 0 or more, betas below 1, step counts whole)
 * with what it expects in err ("expected a number of 0 or more"), the caller naming the option as
 * its user spells it. check: every field within bounds, else -1 with "NAME: expected ..., got V".
 * ntp_adamw_option(i, &help): the i-th name (NULL past the last) and a line of help. */
int ntp_adamw_set(ntp_adamw *o, const char *name, const char *text, char *err, size_t cap);
int ntp_adamw_set_number(ntp_adamw *o, const char *name, double v, char *err, size_t cap);
int ntp_adamw_check(const ntp_adamw *o, char *err, size_t cap);
const char *ntp_adamw_option(size_t i, const char **help);

typedef struct ntp_train_stats {
  int64_t step;     /* 1-based, the step just taken */
  double loss;      /* its loss (before the update) */
  double grad_norm; /* the gradients' global norm, before clipping */
  double lr;
  double seconds; /* forward + backward + update */
} ntp_train_stats;

typedef struct ntp_trainer ntp_trainer;

/* p: a program compiled with its gradient pass (a loss output and "grad.NAME" outputs), run where x
 * says (exec.h: a backend by name, the ranks of this process, devices; NULL: the cpu backend). A
 * sharded program (p->world > 0) runs every rank each step on the chosen backend (each rank's
 * forward, its backward and the gradients' sync: the simulation on the cpu, the GPUs on cuda; p
 * must then carry every rank's CUDA), an unsharded one on the CPU reference (or one GPU); the
 * update is the same. Parameters from `params` (NULL: the default initialisation with seed), fp32
 * master copies of them and zero moments; the program runs with the masters rounded to its dtype.
 *
 * A sharded trainer keeps the optimizer's state sharded like the parameters: each rank holds the
 * fp32 master and moments of its own slices and updates them in place (host memory or its GPU)
 * from the gradient the backward summed there; the global norm counts every element once (on its
 * first holder). The global copies (ntp_trainer_params, checkpoints, dumps) are gathered from the
 * slices when asked for.
 *
 * With one rank per process (x->rank_lo + 1 == x->rank_hi, NCCL) the trainer holds that rank's
 * slices; the loss, the slices' sums of squares and the gathered global copies are merged across
 * the processes (ntp_cuda_merge), so every process computes the same norm and update and every
 * call that gathers (ntp_trainer_params after steps, ntp_trainer_save_state, ntp_checkpoint_save,
 * ntp_trainer_take_state) is collective: every process makes it. Files are written by the process
 * of rank 0 alone (ntp_trainer_writes); each process reads its own boxes. */
struct ntp_exec_options;
int ntp_trainer_new(const ntp_program *p, const ntp_adamw *o, uint64_t seed, const ntp_safetensors *params,
                    const struct ntp_exec_options *x, ntp_trainer **out, char *err, size_t cap);
/* One step: forward and backward with the inputs given (given[v] for input values v, as for
 * ntp_cpu_run_given), then the update. keep: keep the run's inputs and parameters as well, for
 * ntp_trainer_last (a --dump). */
int ntp_trainer_step(ntp_trainer *t, const ntp_host_tensor *const *given, int keep, ntp_train_stats *st, char *err,
                     size_t cap);
/* Training initialisations (train_init.c; docs/training.md, "Initialisation"), each draw a function
 * of (seed, parameter name, element index) alone, so every sharding starts from the same numbers:
 * GPT2 — matrices and tables N(0, std), the residual branches' output projections (attention's wo,
 * the MLP's w_down) N(0, std / sqrt(2 L)), biases 0, gains 1; MEGATRON — the same numbers; LLAMA —
 * matrices and tables N(0, std), gains 1; UNIFORM — matrices and tables uniform with standard
 * deviation std; MODULE — the model's own (the comparison initialisation of the tests). */
typedef enum { NTP_INIT_MODULE, NTP_INIT_GPT2, NTP_INIT_MEGATRON, NTP_INIT_LLAMA, NTP_INIT_UNIFORM } ntp_init_scheme;
/* "gpt2", "megatron", "llama", "uniform", "module" (also "comparison"), any case; false for others */
bool ntp_init_scheme_named(const char *name, ntp_init_scheme *out);
const char *ntp_init_scheme_name(ntp_init_scheme s);
/* The model family's scheme: LLAMA where the model has an RMS norm, else GPT2. */
ntp_init_scheme ntp_trainer_family_init(const ntp_trainer *t);
/* The parameters (masters, moments untouched: call before the first step) set by `scheme` with
 * standard deviation std (<= 0: 0.02). */
int ntp_trainer_init(ntp_trainer *t, ntp_init_scheme scheme, double std, uint64_t seed, char *err, size_t cap);
/* ntp_trainer_init with UNIFORM (kept for callers of the first training initialisation). */
int ntp_trainer_init_std(ntp_trainer *t, double std, uint64_t seed, char *err, size_t cap);
/* The steps taken so far (a resumed trainer counts from its checkpoint's). */
int64_t ntp_trainer_steps_taken(const ntp_trainer *t);
/* Does this process write what the run saves (state files, checkpoints, parameters)? Every
 * process but, with one rank per process, those that do not run rank 0. */
bool ntp_trainer_writes(const ntp_trainer *t);
/* Every parameter's fp32 master and AdamW moments as one safetensors file (NAME, adamw.m.NAME,
 * adamw.v.NAME; global layout), written whole or not at all. */
int ntp_trainer_save_state(ntp_trainer *t, const char *path, char *err, size_t cap);
/* The same read back (the masters, the moments, the step count): the run continues exactly. */
int ntp_trainer_load_state(ntp_trainer *t, const ntp_safetensors *f, int64_t steps_taken, char *err, size_t cap);

/* Replaces the optimizer's options for the steps to come (its state, the step count, stays). */
void ntp_trainer_set_options(ntp_trainer *t, const ntp_adamw *o);
/* A run with the current parameters and no update (a forward and backward: the loss and the
 * gradients), into *res (ntp_cpu_result_free it). */
int ntp_trainer_eval(ntp_trainer *t, const ntp_host_tensor *const *given, ntp_cpu_result *res, char *err, size_t cap);
/* Sets parameter `value` (the module's value id) from a global tensor: its master and the copy
 * the program runs with; the moments stay. -1 with a message when value is not a parameter or
 * the shape differs. */
int ntp_trainer_set_param(ntp_trainer *t, int32_t value, const ntp_host_tensor *global, char *err, size_t cap);

/* The last step's run: its outputs (the loss, then the gradients "grad.NAME"), and with keep its
 * inputs and the parameters it ran with. */
const ntp_cpu_result *ntp_trainer_last(const ntp_trainer *t);
/* The current parameters (the masters rounded to the module's dtype), in the module's order; a
 * sharded run gathers them from its ranks' slices first (0 if that fails). */
size_t ntp_trainer_params(ntp_trainer *t, const ntp_host_tensor **params);
/* The same gather, with its reason when it fails (replicas that diverged): 0 or -1. */
int ntp_trainer_gather(ntp_trainer *t, char *err, size_t cap);
/* Parameter i's optimizer state (global layout, fp32: the master and AdamW's two moments), gathered
 * from wherever it lives (the owners of its shards with a distributed optimizer); valid until the
 * next step. -1 with a message when i is out of range or the gather fails. */
int ntp_trainer_state(ntp_trainer *t, size_t i, const float **master, const float **m, const float **v, char *err,
                      size_t cap);
void ntp_trainer_free(ntp_trainer *t);
/* After a failure: `t` (a new run of the same module under the survivors' plan) takes the
 * parameters, masters, moments and step count of `from` (a sharded run) from its surviving ranks'
 * memory: every element from a slice on a rank that did not fail (from_phys[r]: the physical GPU
 * of from's rank r, to_phys of t's; NULL: the identity; dead: by physical GPU). *bytes_moved: what
 * crosses between physical GPUs (fp32 master and moments and the parameter, per element).
 * *missing > 0 (and nothing taken) when some elements' only copies were on failed ranks: the
 * caller falls back on a checkpoint. With one rank per process (t on the survivors' world) every
 * survivor process calls it: each sends the elements whose chosen source slice it holds to the
 * ranks whose new slices need them (those no new slice holds to all), by NCCL send/recv on t's
 * world, and receives what its own new slices need. */
int ntp_trainer_take_state(ntp_trainer *t, ntp_trainer *from, const int32_t *from_phys, const int32_t *to_phys,
                           const bool *dead, int64_t *bytes_moved, int64_t *missing, char *err, size_t cap);
/* The executor a trainer runs on (exec.h; NULL: the CPU reference): after a failure its lost
 * ranks are let go there (ntp_exec_lose: NCCL's communicators aborted and shrunk) before the
 * survivors' trainer is made. */
struct ntp_exec;
struct ntp_exec *ntp_trainer_exec(ntp_trainer *t);

/* ---- token files (tokens.c): llm.c's format ------------------------------------------ */
/* A header of 256 little-endian int32 (magic 20240520, version 1, token count, the rest 0),
 * then the tokens as uint16. */
typedef struct ntp_tokens ntp_tokens;
int ntp_tokens_open(const char *path, ntp_tokens **out, char *err, size_t cap);
int64_t ntp_tokens_count(const ntp_tokens *d);
/* The file's first n ids (n <= its count), in order. */
int ntp_tokens_ids(const ntp_tokens *d, int64_t *ids, int64_t n);
/* The next batch of rows x len tokens and their targets (each token's successor): rows*len+1
 * consecutive tokens from the current position, which then advances by rows*len; past the end
 * it starts again (an epoch). With shuffle, every epoch visits the windows in an order drawn
 * from (seed, epoch). Token ids must be below vocab: -1 with a message otherwise, or when the
 * file holds fewer than rows*len+1 tokens. */
int ntp_tokens_next(ntp_tokens *d, int64_t rows, int64_t len, int64_t vocab, int32_t *tokens, int32_t *targets,
                    char *err, size_t cap);
void ntp_tokens_shuffle(ntp_tokens *d, uint64_t seed);
void ntp_tokens_close(ntp_tokens *d);
/* Where the next batch starts (token offset in order, or window index with shuffle) and the
 * epoch; seek restores both (the shuffled order is redrawn from (seed, epoch)). */
void ntp_tokens_position(const ntp_tokens *d, int64_t *pos, int64_t *epoch);
void ntp_tokens_seek(ntp_tokens *d, int64_t pos, int64_t epoch);
/* Whether (pos, epoch) is a position of this file (pos at most its token count, epoch below
 * 2^40): what a checkpoint's index may name. */
bool ntp_tokens_position_valid(const ntp_tokens *d, int64_t pos, int64_t epoch);
/* Every id of the file below vocab, checked before a run's first step (a bad id near the end
 * would otherwise end the run there): -1 naming the first one outside. */
int ntp_tokens_check_vocab(const ntp_tokens *d, int64_t vocab, char *err, size_t cap);
/* Writes tokens (uint16 ids) as a token file, whole or not at all. */
int ntp_tokens_save(const char *path, const uint16_t *ids, int64_t n, char *err, size_t cap);

/* ---- checkpoints (checkpoint.c) --------------------------------------------------------- */
/* DIR/ckpt-STEP.safetensors (the trainer's state, ntp_trainer_save_state) and DIR/checkpoint.json,
 * the index (format, version, step, the data position, the file's size and FNV-1a checksum),
 * replaced atomically after the state file is complete, so a crash during a save leaves the
 * last good checkpoint in force; the previous state file is kept, older ones removed. DIR is
 * created when missing. Parameters are in the global layout: a run resumes under any plan. */
int ntp_checkpoint_save(const char *dir, ntp_trainer *t, const ntp_tokens *data, char *err, size_t cap);
/* Restores the trainer and the data position from DIR's index; the state file must match its
 * recorded size and checksum. */
int ntp_checkpoint_load(const char *dir, ntp_trainer *t, ntp_tokens *data, char *err, size_t cap);

#endif
