/* emu_abi.h — the contract between the emulated CUDA runtime (libntp_emu.so) and a kernel
 * module that the emulated NVRTC built from generated CUDA C with the host C++ compiler.
 *
 * A module exports one function, ntp_emu_module(), that binds the runtime's services and
 * returns its kernel table. Kernels reach threadIdx, barriers and warp exchange only through
 * the services below, so a module holds no state of its own besides its __shared__ arrays.
 * Shared by C (the runtime) and C++ (emu_device.h); change NTP_EMU_ABI with any change here. */
#ifndef NTP_EMU_ABI_H
#define NTP_EMU_ABI_H

#include <stddef.h>
#include <stdint.h>

#define NTP_EMU_ABI 3

typedef struct ntp_emu_dim { unsigned x, y, z; } ntp_emu_dim;

/* What the running emulated thread sees; the scheduler points `cur` at it before resuming. */
typedef struct ntp_emu_thread_view {
  ntp_emu_dim tid;
  unsigned lane, warp;
} ntp_emu_thread_view;

typedef struct ntp_emu_services {
  int abi;
  ntp_emu_thread_view *cur; /* the running thread */
  ntp_emu_dim block_idx, block_dim, grid_dim;
  /* __syncthreads(): returns when every thread of the block has reached it */
  void (*syncthreads)(void);
  /* a warp exchange: every lane in `mask` publishes `value`; returns the value of lane `src`
   * (src outside [0, 32) returns the caller's own value, as CUDA does for out-of-range
   * up/down shuffles) */
  uint64_t (*exchange)(unsigned mask, uint64_t value, int src);
  /* __syncwarp(mask) */
  void (*syncwarp)(unsigned mask);
  /* a kernel detected a fault of its own (a trap, an assert) */
  void (*trap)(const char *what);
} ntp_emu_services;

/* One kernel of a module: how to call it with the void **args of cudaLaunchKernel. */
typedef struct ntp_emu_kernel {
  const char *name;
  int max_threads;        /* __launch_bounds__, or 1024 */
  int nargs;
  size_t arg_size[16];    /* sizeof each parameter */
  unsigned pointer_args;  /* bit i: parameter i is a pointer (the race check snapshots what it reaches) */
  void (*invoke)(void **args);
} ntp_emu_kernel;

typedef const ntp_emu_kernel *(*ntp_emu_module_fn)(const ntp_emu_services *s, size_t *count);
#define NTP_EMU_MODULE_SYMBOL "ntp_emu_module"

#endif
