/* exec.h — the executor interface: what the trainer (runtime/train/train.c) needs of a backend
 * that runs the ranks of a sharded program, as a table of functions. Two implement it: the CPU
 * simulation (runtime/cpu/exec_sim.c: every rank in this process, in host memory) and the CUDA
 * backend (runtime/cuda/exec_cuda.c: loopback, NCCL with several GPUs per process, or one rank
 * per process). The unsharded CPU reference is not an executor: it runs the module itself.
 *
 * Callers hold an ntp_exec and call through exec->ops; only exec.c, which makes one from the
 * options, knows which it is. A new backend is a folder implementing this table
 * (docs/adding-a-backend.md).
 *
 * Memory: a backend's state buffers (alloc) live where its ranks do (host memory for the
 * simulation, the rank's GPU for CUDA); the caller moves host bytes to and from them with put and
 * get, and never dereferences them. Every call returns 0, or -1 with a message in err. */
#ifndef NTP_EXEC_H
#define NTP_EXEC_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ntprt.h"

struct ntp_cuda_options;
struct ntp_cuda;

/* One AdamW step's numbers for a slice: c1, c2 the bias corrections 1 - beta^k, wd this
 * parameter's decoupled weight decay, scale the gradients' clipping factor. */
typedef struct ntp_exec_adamw {
  double lr, beta1, beta2, c1, c2, eps, wd, scale;
} ntp_exec_adamw;

/* One element's update from its (clipped) gradient ge, in double, every state rounded to fp32: the
 * unsharded reference's arithmetic, which every executor repeats element by element. */
static inline void ntp_adamw_element(const ntp_exec_adamw *a, double ge, float *m, float *v, float *w) {
  double mm = a->beta1 * *m + (1.0 - a->beta1) * ge, vv = a->beta2 * *v + (1.0 - a->beta2) * ge * ge;
  *m = (float)mm;
  *v = (float)vv;
  double x = *w;
  x -= a->lr * ((mm / a->c1) / (sqrt(vv / a->c2) + a->eps) + a->wd * x);
  *w = (float)x;
}

typedef struct ntp_exec_ops {
  const char *name; /* "cpu" (the simulation), "cuda" */
  /* which ranks this process runs: all of them, but with one rank per process */
  bool (*runs_rank)(const void *be, int rank);
  bool (*all_here)(const void *be);
  /* global input or parameter `value` given to the ranks that hold slices of it */
  int (*set)(void *be, int32_t value, const ntp_host_tensor *global, char *err, size_t cap);
  /* every rank's parameter slices from a safetensors file (each reads only its own boxes) */
  int (*load)(void *be, const ntp_safetensors *f, char *err, size_t cap);
  /* global input or parameter v assembled from the ranks' slices (free out->f or ->i); a backend
   * that cannot bring its parameters back says so */
  int (*value_get)(void *be, int32_t v, uint64_t seed, ntp_host_tensor *out, char *err, size_t cap);
  /* every rank's step list; forward gathers every output to the host, run leaves them where
   * they are and output brings one back (free h->f) */
  int (*forward)(void *be, uint64_t seed, ntp_cpu_result *res, char *err, size_t cap);
  int (*run)(void *be, uint64_t seed, char *err, size_t cap);
  int (*output)(void *be, size_t output, ntp_host_tensor *h, char *err, size_t cap);
  /* tensors in the backend's device memory (DLPack kDLCUDA): which GPU holds data (a backend
   * without device memory refuses, saying what it takes), bytes from it, a value set from a
   * global tensor there, an output written there; device_of gives -1 for memory that is not the
   * backend's */
  int (*device_of)(void *be, const void *data, int *dev, char *err, size_t cap);
  int (*copy_to_host)(void *be, void *dst, const void *src, size_t bytes, char *err, size_t cap);
  int (*set_device)(void *be, int32_t value, const void *data, int dev, char *err, size_t cap);
  int (*output_device)(void *be, size_t output, void *data, int dev, char *err, size_t cap);
  /* state buffers on a rank (freed with the backend), and host bytes to and from them */
  int (*alloc)(void *be, int rank, size_t bytes, void **buf, char *err, size_t cap);
  int (*put)(void *be, int rank, void *buf, const void *host, size_t bytes, char *err, size_t cap);
  int (*get)(void *be, int rank, void *host, const void *buf, size_t bytes, char *err, size_t cap);
  /* persistent tensor t (a parameter slice) takes these fp32 values, rounded to its dtype */
  int (*tensor_put)(void *be, int32_t tensor, const float *values, char *err, size_t cap);
  /* *acc += the sum of squares (in double) of tensor t's elements that mask (a state buffer of
   * one byte per element) marks */
  int (*sumsq)(void *be, int32_t tensor, const void *mask, double *acc, char *err, size_t cap);
  /* AdamW on a parameter slice where it lives: master, m, v (state buffers) from gradient tensor
   * grad (-1: none, a zero gradient), then the slice tensor rounded from the master */
  int (*adamw)(void *be, int32_t param, int32_t grad, void *master, void *m, void *v, const ntp_exec_adamw *a,
               char *err, size_t cap);
  /* one rank per process: `bytes` merged word-wise across the processes (ntp_cuda_merge), and host
   * floats exchanged with the other processes (ntp_cuda_exchange); nothing when all ranks are here */
  int (*merge)(void *be, void *host, size_t bytes, char *err, size_t cap);
  int (*exchange)(void *be, float *const *send, const size_t *n_send, float *const *recv, const size_t *n_recv,
                  char *err, size_t cap);
  void (*free)(void *be);
} ntp_exec_ops;

typedef struct ntp_exec {
  const ntp_exec_ops *ops;
  void *be; /* the backend's own state */
} ntp_exec;

/* An executor for program p: the CUDA backend with these options, or (cuda NULL) the simulation. */
int ntp_exec_new(const ntp_program *p, const struct ntp_cuda_options *cuda, ntp_exec **out, char *err, size_t cap);
void ntp_exec_free(ntp_exec *e);
/* The CUDA backend behind e, or NULL (the CLI's failover and reports until they are operations). */
struct ntp_cuda *ntp_exec_cuda(const ntp_exec *e);

/* the implementations */
extern const ntp_exec_ops ntp_exec_sim_ops, ntp_exec_cuda_ops;
int ntp_exec_sim_new(const ntp_program *p, void **be, char *err, size_t cap);
int ntp_exec_cuda_new(const ntp_program *p, const struct ntp_cuda_options *o, void **be, char *err, size_t cap);

#endif
