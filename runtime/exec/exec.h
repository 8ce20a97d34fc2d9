/* exec.h — the executor interface: what the trainer (runtime/train/), the model ABI
 * (runtime/abi/) and `ntpc run` need of a backend that runs the ranks of a sharded program, as a
 * table of functions. Two implement it: the CPU simulation (runtime/cpu/exec_sim.c: every rank in
 * this process, in host memory) and the CUDA backend (runtime/cuda/exec_cuda.c: loopback, NCCL
 * with several GPUs per process, or one rank per process). The unsharded CPU reference is not an
 * executor: it is the truth every executor is compared with, and the trainer runs the module on it
 * itself (ntp_exec_new gives no executor for an unsharded program on the cpu backend).
 *
 * Callers name a backend (ntp_exec_options.backend, as the user wrote it) and hold an ntp_exec,
 * calling through exec->ops; only exec.c, which holds the table of backends, knows which it is. A
 * new backend is a folder implementing this table and one row in exec.c
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

/* Where a program's ranks run. Zero-initialised: the cpu backend, every rank in this process. The
 * device fields are read by backends with devices (the CUDA backend); the others run every rank
 * in this process. */
typedef struct ntp_exec_options {
  const char *backend;      /* a row of the table in exec.c: "cpu" (also NULL), "cuda" */
  int32_t rank_lo, rank_hi; /* the ranks this process runs; rank_hi 0: every rank of the program */
  int device;               /* the device of this process's first rank */
  bool loopback;            /* every rank on one device, collectives as copies on it */
  void *comm;               /* an initialised world communicator of this process's one rank, or NULL */
  /* the survivors of a failure (ntp_exec_survivors.next), every rank here: per rank its device
   * and world communicator, taken over by the new executor */
  const int *devices;
  void **comms;
} ntp_exec_options;

/* After ranks failed (ntp_exec_lose): how the survivors go on. */
typedef struct ntp_exec_survivors {
  int n;                 /* the surviving ranks */
  int local;             /* one rank per process: this process's rank among the survivors; -1: all here */
  ntp_exec_options next; /* the executor options of the survivors' program (ranks, devices, communicators) */
  char report[512];      /* what the backend did to lose them (aborted communicators, ...), or "" */
  void *held;            /* the backend's (freed by ntp_exec_survivors_free) */
  void (*release)(struct ntp_exec_survivors *s);
} ntp_exec_survivors;

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

/* What measure found: the forwards timed and their mean device seconds, and the lines the backend
 * adds (its launch modes' host time, per-layer times when asked; "" for none). */
typedef struct ntp_exec_measured {
  long runs;
  double mean_s;
  char notes[8192];
} ntp_exec_measured;

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
  /* ranks lost[r] (this executor's ranks) failed with their devices: nothing waits on them any
   * more, and *s (its survivors counted by ntp_exec_lose) says how the survivors' executor is made */
  int (*lose)(void *be, const bool *lost, ntp_exec_survivors *s, char *err, size_t cap);
  /* after lose: the next program's `world` ranks, rank r being survivor from[r]; a survivor no
   * rank names is idle. 0 with s->next made for that order; 1 when this process's rank is idle;
   * -1 with err. NULL: any order (nothing is bound to a survivor's place) */
  int (*order)(void *be, ntp_exec_survivors *s, int32_t world, const int32_t *from, char *err, size_t cap);
  /* a repair: the next program's `world` ranks, rank r this executor's rank from[r] or a new one
   * (-1) on device devices[r]; *s says how its executor is made (the world grown by the new
   * ranks). 0; 1 when the next executor makes its world afresh (s->report: how and why, or "" when
 * there is nothing to say); -1 with err.
   * NULL: never. */
  int (*grow)(void *be, int32_t world, const int32_t *from, const int *devices, ntp_exec_survivors *s, char *err,
              size_t cap);
  /* did the last failed call fail because a peer is gone (the survivors then go on)? */
  bool (*peer_lost)(void *be);
  /* lines on what the backend chose (GEMM algorithms, overlap), for NTP_VERBOSE; "" for none */
  void (*describe)(void *be, char *buf, size_t cap);
  /* where the ranks run, for the log: "cpu (simulated)", "cuda loopback", "cuda nccl" */
  const char *(*label)(void *be);
  /* `ntpc run`'s measurement: up to iters timed forwards after the warm-up the backend needs (a
   * backend that is not for timing runs one), the last one's outputs in *res */
  int (*measure)(void *be, uint64_t seed, long iters, ntp_cpu_result *res, struct ntp_exec_measured *m, char *err,
                 size_t cap);
  void (*free)(void *be);
} ntp_exec_ops;

typedef struct ntp_exec {
  const ntp_exec_ops *ops;
  void *be; /* the backend's own state */
} ntp_exec;

/* A backend: its name, its operations, and how one is made. */
typedef struct ntp_exec_backend {
  const char *name;
  const ntp_exec_ops *ops;
  int (*create)(const ntp_program *p, const ntp_exec_options *o, void **be, char *err, size_t cap);
  /* 0 when this machine can run it, else -1 with the reason ("no CUDA driver") */
  int (*available)(char *err, size_t cap);
  bool devices;        /* it places ranks on devices: loopback, one rank per process, device numbers */
  bool runs_unsharded; /* it runs an unsharded program (one rank); else the CPU reference does */
  bool kernels;        /* it runs the per-rank CUDA kernels of the codegen pass (ntpc_want_cuda) */
  double fp32_tol;     /* its fp32 results against the CPU reference's (sums in another order) */
  const char *versus;  /* what the comparison is with, as `ntpc run` says it ("vs unsharded") */
  const char *what;    /* one line for --help and messages */
} ntp_exec_backend;

/* The backend of that name (NULL: "cpu"), or NULL with "unknown backend 'x' (expected cpu or
 * cuda)" in err. */
const ntp_exec_backend *ntp_exec_backend_find(const char *name, char *err, size_t cap);
/* The i-th backend of the table (NULL past the last): for --help. */
const ntp_exec_backend *ntp_exec_backend_at(size_t i);
/* An executor for program p on the backend o names (NULL: the cpu backend, every rank here). *out
 * is NULL (and 0 returned) when p is unsharded and the backend leaves it to the CPU reference. */
int ntp_exec_new(const ntp_program *p, const ntp_exec_options *o, ntp_exec **out, char *err, size_t cap);
void ntp_exec_free(ntp_exec *e);
/* The operations any caller may make on an executor it holds (NULL: the CPU reference, which has
 * one rank here, no devices and nothing to lose). */
int ntp_exec_lose(ntp_exec *e, const bool *lost, int32_t world, ntp_exec_survivors *s, char *err, size_t cap);
/* After ntp_exec_lose, before the survivors' executor is made: its program's `world` ranks, rank r
 * being survivor from[r] (0 .. s->n - 1, the survivors in their old rank order); survivors no rank
 * names are idle (a pipeline replica dropped) and ranks may move (failures packed into few
 * replicas). 0; 1 when this process's one rank is idle (it has nothing more to run); -1 with err. */
int ntp_exec_survivors_order(ntp_exec *e, ntp_exec_survivors *s, int32_t world, const int32_t *from, char *err,
                             size_t cap);
/* After a repair (ntp_exec_ops.grow): 0 with *s, the next executor's options; 1 when e's backend
 * makes the larger world afresh instead (s->report: how and why, or ""); -1 with err. */
int ntp_exec_grow(ntp_exec *e, int32_t world, const int32_t *from, const int *devices, ntp_exec_survivors *s,
                  char *err, size_t cap);
void ntp_exec_survivors_free(ntp_exec_survivors *s);
bool ntp_exec_peer_lost(ntp_exec *e);
void ntp_exec_describe(ntp_exec *e, char *buf, size_t cap);
const char *ntp_exec_name(const ntp_exec *e);

/* The rank and device a launcher gave this process: the first of torchrun (RANK, LOCAL_RANK),
 * Slurm (SLURM_PROCID, SLURM_LOCALID), Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK)
 * whose rank variable is set; the device is the local rank (0 when unset). -1 when none is set. */
int ntp_launcher_rank(int *rank, int *device);

/* the implementations (exec.c's table holds them) */
extern const ntp_exec_backend ntp_exec_sim_backend, ntp_exec_cuda_backend;

#endif
