/* ntprt.h — the ntp runtime. For now: the CPU reference backend, which runs the
 * unsharded IR and is the numerical oracle for every later backend and sharding. */
#ifndef NTPRT_H
#define NTPRT_H

#include <stdint.h>
#include <stdio.h>

#include "ntp_program.h"

/* A host tensor: float data (already rounded to its storage dtype) or int32 data. */
typedef struct ntp_host_tensor {
  const char *name;
  ntp_dtype dtype;
  ntp_shape shape;
  float *f;   /* float dtypes */
  int32_t *i; /* i32 */
} ntp_host_tensor;

/* Tensors of a run; their names are the module's (valid while the program that ran is). */
typedef struct ntp_cpu_result {
  ntp_host_tensor *outputs, *inputs, *params;
  size_t n_outputs, n_inputs, n_params;
  double seconds; /* forward time; the init, and freeing the parameters after their last use, excluded */
} ntp_cpu_result;

/* Deterministic default initialisation: element i of tensor `name` depends only on
 * (seed, name, i), so every sharding regenerates the same global tensors. */
void ntp_init_tensor(const ntp_module *m, int32_t value, uint64_t seed, ntp_host_tensor *t);

/* Runs the forward pass of `m` on the CPU with default-initialised inputs and params.
 * Returns 0, or -1 with a message in err. keep_all: also return inputs and params. */
int ntp_cpu_run(const ntp_module *m, uint64_t seed, int keep_all, ntp_cpu_result *res, char *err, size_t errlen);
/* The same with parameters read from a safetensors file (NULL: the default initialisation). */
typedef struct ntp_safetensors ntp_safetensors;
int ntp_cpu_run_params(const ntp_module *m, uint64_t seed, int keep_all, const ntp_safetensors *params,
                       ntp_cpu_result *res, char *err, size_t errlen);
/* The same with values given: given[v] (NULL, or an array over the module's values), when
 * set for an input or parameter v, replaces its initialisation (a global tensor of v's shape,
 * float values rounded to v's dtype here, or int32). */
int ntp_cpu_run_given(const ntp_module *m, uint64_t seed, int keep_all, const ntp_safetensors *params,
                      const ntp_host_tensor *const *given, ntp_cpu_result *res, char *err, size_t errlen);
void ntp_cpu_result_free(ntp_cpu_result *res);

/* inputs.c: a model's inputs from files, into given[] (an array over m's values, NULL-filled;
 * what is set there is the caller's to free with ntp_inputs_free). `spec` is FILE or NAME=FILE:
 * a NumPy .npy array (the input's shape; integers for i32 inputs, floats for the others), an
 * llm.c token file (.bin) or any other file as text (a token is a byte). Token ids fill the
 * model's token input row by row and, when a loss reads its targets from an input, the targets
 * with each token's successor, as `ntpc train` does. Ids outside the vocabulary of an embedding
 * or loss that reads them are errors. 0, or -1 with a message. */
int ntp_inputs_load(const ntp_module *m, const char *spec, ntp_host_tensor **given, char *err, size_t cap);
/* The same from text in memory (the byte tokenizer). */
int ntp_inputs_text(const ntp_module *m, const char *text, size_t len, ntp_host_tensor **given, char *err, size_t cap);
void ntp_inputs_free(const ntp_module *m, ntp_host_tensor **given);

/* The slice `box` of the same: what one rank holds of a sharded input or parameter. */
void ntp_init_slice(const ntp_module *m, int32_t value, const ntp_box *box, uint64_t seed, ntp_host_tensor *t);
/* One compute op on host tensors of local shapes (not INPUT/PARAM: see ntp_init_slice). */
int ntp_exec_op(const ntp_op *op, ntp_host_tensor *out, const ntp_host_tensor *const *args, char *err, size_t cap);

/* cpu_sim.c: all ranks of a sharded program in one process, each in its own arena laid
 * out by the memory plan, collectives done in memory with NCCL's semantics. The global
 * outputs are assembled from the ranks' pieces. */
int ntp_sim_run(const ntp_program *p, uint64_t seed, ntp_cpu_result *res, char *err, size_t errlen);

/* The same with state kept between forwards: parameters set or loaded once. */
typedef struct ntp_sim ntp_sim;
int ntp_sim_new(const ntp_program *p, ntp_sim **out, char *err, size_t errlen);
/* Time every step of the next runs alone (steps one at a time, not ranks in parallel), into
 * seconds[n_steps] (NULL: stop): what the pipeline's timeline is drawn from (bench_bubble). */
void ntp_sim_time_steps(ntp_sim *st, double *seconds);
/* Gives every rank its slices of global input or parameter `value` from a global tensor. */
int ntp_sim_set(ntp_sim *s, int32_t value, const ntp_host_tensor *global, char *err, size_t errlen);
/* Every rank reads only its parameter slices from a safetensors file. */
int ntp_sim_load(ntp_sim *s, const ntp_safetensors *f, char *err, size_t errlen);
/* Runs the step list; inputs and params neither set nor loaded get the default initialisation. */
int ntp_sim_forward(ntp_sim *s, uint64_t seed, ntp_cpu_result *res, char *err, size_t errlen);
/* Tensor t of the program in its rank's memory (fp32 values, rounded to t's dtype; int32 in the
 * same 4-byte slots), valid until ntp_sim_free: what a step left there, or, for a persistent
 * slice, where the caller may write its values (the slice is then not initialised by a forward).
 * The optimizer's access to the ranks' parameter slices and gradients (train.c). */
float *ntp_sim_tensor(ntp_sim *s, int32_t t);
/* Global input or parameter v as the ranks hold it (set, loaded, or else the default
 * initialisation for `seed`, which a forward would give it too), assembled from their slices
 * into *out (free its f or i). */
int ntp_sim_get(ntp_sim *s, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t errlen);
void ntp_sim_free(ntp_sim *s);

/* Storage bit patterns of values already rounded to bf16 / fp16 (exact both ways). */
float ntp_bf16_bits_to_float(uint16_t b);
uint16_t ntp_float_to_bf16_bits(float x);
float ntp_f16_bits_to_float(uint16_t h);
uint16_t ntp_float_to_f16_bits(float x);

/* safetensors.c: parameters in the global layout, read by slices */
int ntp_safetensors_open(const char *path, ntp_safetensors **out, char *err, size_t errlen);
void ntp_safetensors_close(ntp_safetensors *f);
/* Reads box `box` of tensor `name` (which must have dtype dt and shape `shape`) as floats. */
int ntp_safetensors_read_box(const ntp_safetensors *f, const char *name, ntp_dtype dt, const ntp_shape *shape,
                             const ntp_box *box, float *out, char *err, size_t errlen);
/* Reads f by another layout's names and shapes from now on (docs/runtime.md#checkpoint-layouts):
 * "ntp" (the model's own names), "hf-gpt2" (Hugging Face GPT-2: fused c_attn, Conv1D weights
 * transposed, positions tables longer than the model's), "hf-llama" (Hugging Face Llama); in
 * these, F32, BF16 and F16 tensors are converted to the model's dtype. -1 when a parameter of m
 * has no place in the layout. */
int ntp_safetensors_set_format(ntp_safetensors *f, const char *format, const ntp_module *m, char *err, size_t errlen);
/* Whether `format` is one of those layouts. */
bool ntp_param_format_known(const char *format);
/* Whether the layout has a place for every parameter of m, none shared (-1 with the message):
 * what ntp_safetensors_save_format would refuse, asked before the work whose result it saves. */
int ntp_safetensors_format_check(const char *format, const ntp_module *m, char *err, size_t errlen);
/* Writes the model's tensors in a layout ("ntp": as ntp_safetensors_save). */
int ntp_safetensors_save_format(const char *path, const char *format, const ntp_module *m, const ntp_host_tensor *ts,
                                size_t n, char *err, size_t errlen);
/* Writes tensors (global, in their storage dtype) to path, atomically (temp file + rename). */
int ntp_safetensors_save(const char *path, const ntp_host_tensor *tensors, size_t n, char *err, size_t errlen);
/* The same file written by parts, from several threads: the header of `n` fp32 tensors (names
 * and shapes of tensors; their data is not read) and a data block of zeros, in a temporary file;
 * put writes `count` elements of tensor `tensor` from row-major element `first` on (pwrite: any
 * thread, disjoint parts); commit (ok) renames the file into place, or removes it. */
typedef struct ntp_st_writer ntp_st_writer;
int ntp_st_writer_open(const char *path, const ntp_host_tensor *tensors, size_t n, ntp_st_writer **out, char *err,
                       size_t errlen);
int ntp_st_writer_put(ntp_st_writer *w, size_t tensor, int64_t first, const float *vals, int64_t count);
int ntp_st_writer_commit(ntp_st_writer *w, bool ok, char *err, size_t errlen);
/* max_i |a_i - b_i| / max_i |b_i| (0 when b is all zero and a equals it) */
double ntp_max_rel_error(const ntp_host_tensor *a, const ntp_host_tensor *ref);
/* The same measured against at least `floor` (a gradient that vanishes is round-off on both
 * sides: its own largest element is no scale for it) */
double ntp_max_rel_error_floor(const ntp_host_tensor *a, const ntp_host_tensor *ref, double floor);
/* max_i |t_i| */
double ntp_max_abs(const ntp_host_tensor *t);
/* A copy of src (its data owned by dst) named `name`; false when out of memory. */
bool ntp_host_tensor_copy(const ntp_host_tensor *src, const char *name, ntp_host_tensor *dst);

/* progress.c: a status line on stderr while the CPU backend works for long — stage, layer i of
 * N, share done, time so far and an estimate of the rest. Shown only when stderr is a terminal
 * and the work has lasted 2 s; erased when it ends. */
typedef struct ntp_progress {
  const char *stage;
  double total, t0, last; /* cost units (ntp_op_cost); seconds */
  int32_t n_layers;
  bool active, shown;
} ntp_progress;
/* On by default; off: nothing is ever printed (ntpc --quiet). */
void ntp_progress_enable(int on);
void ntp_progress_begin(ntp_progress *p, const char *stage, double total_cost, int32_t n_layers);
/* layer: the current global layer (-1: none), layer_name its name */
void ntp_progress_update(ntp_progress *p, double cost_done, int32_t layer, const char *layer_name);
void ntp_progress_end(ntp_progress *p);
/* A step's arithmetic for the estimate: a GEMM's multiply-adds, attention's scores and values,
 * an init's hashes, otherwise the output's elements. a: the first argument's shape or NULL. */
double ntp_op_cost(const ntp_op *op, const ntp_shape *out, const ntp_shape *a);

/* tensor_io.c */
/* Writes DIR/manifest.tsv and one raw little-endian file per tensor (see docs/cli.md). */
int ntp_dump_tensors(const ntp_cpu_result *res, const char *dir, char *err, size_t errlen);
/* "logits : bf16[2, 16, 256]  sum=... mean|x|=... [v0, v1, v2, v3 ...]" */
void ntp_print_tensor_summary(const ntp_host_tensor *t, FILE *out);

#endif
