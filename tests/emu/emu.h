/* emu.h — internals shared by the parts of the emulated GPU (libntp_emu.so): device memory,
 * the error state, and the settings read from the environment.
 *
 *   NTP_EMU_GPUS=N       emulated GPUs (default 8)
 *   NTP_EMU_RACECHECK=M  off (default) | reverse | a number: every launch runs twice, the second
 *                        time with block and thread orders reversed (or shuffled by the seed),
 *                        and the memory it reaches must come out the same
 *   NTP_EMU_CXX          the host C++ compiler of the emulated NVRTC (default c++)
 *   NTP_EMU_INCLUDE      the folder of emu_device.h (default: the source tree's tests/emu)
 *   NTP_EMU_VERBOSE=1    one line per launch on stderr
 *   NTP_EMU_FAIL_GPUS=D[,D...]  test-only: these GPUs fail when the program first reacts to a
 *                        failure (its first ncclCommAbort or ncclCommShrink); from then on any
 *                        call that touches one is an error (emu_device_ok)
 *   NTP_EMU_REPAIR_GPUS=D[,D...]  test-only: these GPUs, once failed, are repaired (replaced)
 *                        when the program first inspects one (cudaDeviceGetAttribute): it works
 *                        again as a new device, and nothing made on it before it failed may be
 *                        used (emu_object_ok)
 *   NTP_EMU_STREAMS=M    eager | lazy (the default with the race check on): the stream model,
 *                        emu_streams.c */
#ifndef NTP_EMU_H
#define NTP_EMU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "emu_abi.h"

/* one cudaMalloc: [base, base + size) between two inaccessible guard pages */
typedef struct emu_alloc {
  unsigned char *base;
  size_t size;
  void *map;
  size_t map_size;
  int device;
  int gen; /* the device's generation when it was made (emu_object_ok) */
  struct emu_alloc *next;
} emu_alloc;

/* the allocation holding [p, p + n), or NULL */
emu_alloc *emu_find(const void *p, size_t n);
/* the allocation whose guard pages hold p (for fault messages), or NULL */
emu_alloc *emu_near(const void *p);
int emu_current_device(void);
int emu_device_count(void);

/* A GPU that fails (NTP_EMU_FAIL_GPUS). A test names the GPU that its program is told has failed
 * (ntpc train --fail-at); the emulator cannot know the step, so the GPU fails at the first sign
 * that the program knows: its first ncclCommAbort or ncclCommShrink (emu_gpus_fail, from
 * emu_nccl.c). Before that it works, so the steps before the failure run on it as on the others;
 * after it, every call that would touch it fails loudly (emu_device_ok): cudaSetDevice to it, a
 * call while it is current, a copy, set, free or kernel argument in its memory, its streams, and
 * any NCCL call on a communicator of it, creating one on it, or destroying one with a member on it
 * (a destroy would wait for the dead peer). That is how a test proves that nothing is read from a
 * failed GPU, freed on it or synchronised with it after it failed. The program under test does
 * not know of this: it sees the emulated GPU as it would a real one. */
void emu_gpus_fail(void);
/* true when GPU d has not failed; else the process stops (emu_fatal) */
bool emu_device_ok(int d, const char *call);
/* emu_fail, then the process stops (status 134): what would hang or fail unseen on a real
 * machine (a call on a failed GPU, a destroy waiting for one) cannot be ignored by a caller */
_Noreturn void emu_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool emu_device_failed(int d); /* the same without the error */
/* A repaired GPU (NTP_EMU_REPAIR_GPUS) is a new device: its generation counts its repairs. An
 * object (memory, stream, cuBLASLt handle, communicator) made on device d in generation gen may
 * be used while d has not failed and is still in that generation; else the process stops. */
int emu_device_gen(int d);
bool emu_object_ok(int d, int gen, const char *call);

/* The emulator's own diagnostics: printed on stderr as "ntp-emu: error: ..." and kept as the
 * text of the error that the failing call returns (cudaGetErrorString shows it). */
void emu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *emu_last_message(void);
bool emu_verbose(void);

/* race-check mode: 0 off, 1 reverse, else a shuffle seed */
uint64_t emu_racecheck(void);

/* storage formats (emu_numbers.c): round to nearest even, NaN kept quiet */
float emu_bf16_to_f32(uint16_t h);
uint16_t emu_f32_to_bf16(float f);
float emu_f16_to_f32(uint16_t h);
uint16_t emu_f32_to_f16(float f);
typedef enum { EMU_F32, EMU_F16, EMU_BF16 } emu_format;
float emu_load(const void *p, emu_format f, size_t i);
void emu_store(void *p, emu_format f, size_t i, float v);

/* Stream work (emu_streams.c). NTP_EMU_STREAMS=eager|lazy chooses the stream model: eager runs
 * work as it is enqueued, in program order; lazy (the default with the race check on) defers it
 * to the next host synchronisation and then runs, of what may run, the latest enqueued first, so
 * that a missing cudaStreamWaitEvent shows as a wrong result. emu_enqueue takes ctx (malloc'd,
 * starting with its size in bytes, so that a graph can copy it): captured into the stream's graph,
 * or queued; run(ctx) later runs it on the device that was current at the enqueue, and returns
 * 0, or -1 after emu_fail(). */
bool emu_streams_lazy(void);
bool emu_capturing(const void *stream);
bool emu_any_capture(void);
bool emu_stream_ok(const void *stream, const char *call);
int emu_enqueue(const void *stream, int (*run)(void *ctx), void *ctx);
/* A group of NCCL calls on one stream, in two phases (emu_nccl.c implements them): start when it
 * takes its place in its communicators (the call, or a graph launch), post when it reaches the
 * head of its stream, poll until its peers' calls matched it (1 done, 0 not yet, -1 failed). */
typedef struct emu_comm_ops {
  int (*start)(void *ctx);
  int (*post)(void *ctx);
  int (*poll)(void *ctx);
  bool (*local)(void *ctx);  /* every peer is in this process: waiting cannot help */
  void (*hang)(void *ctx);   /* says which call would hang */
  void (*idle)(void *ctx);   /* waits a little for a peer in another process */
  bool (*uses)(void *ctx, const void *comm);
  void (*copied)(void *ctx); /* optional: after ctx was copied */
  void (*release)(void *ctx); /* optional: before ctx is freed */
  /* it can never complete (a peer died or aborted): why, for a blocking wait that would hang */
  bool (*stuck)(void *ctx, char *why, size_t cap);
  /* a communicator of it has several ranks in this process (no CUDA graph may hold it) */
  bool (*shared)(void *ctx);
} emu_comm_ops;
int emu_enqueue_comm(const void *stream, const emu_comm_ops *ops, void *ctx);
int emu_sync_all(void);                        /* runs all stream work; 0, or -1 after emu_fail() */
int emu_run_ready(void);                       /* runs what can run without waiting; the same */
void emu_streams_cancel_comm(const void *comm); /* its queued operations end unrun (an abort) */
bool emu_streams_comm_busy(const void *comm);   /* an operation of it is queued on a stream */
void emu_streams_drop_device(int d);            /* a failed GPU's queued work never runs */
void emu_capture_epoch_bump(void);              /* a capture began or ended */
uint64_t emu_capture_epoch(void);

/* the runtime's error state, for the parts outside emu_cudart.c */
cudaError_t emu_error(cudaError_t e); /* the call's error (cudaGetLastError's) */
cudaError_t emu_sticky(void);         /* a launch failure, sticky as on a GPU, or cudaSuccess */
void emu_set_sticky(cudaError_t e);
void emu_use_device(int d);           /* the current device of this thread */

/* Runs a kernel over a grid (launch.c). Returns 0, or -1 after emu_fail(). */
int emu_run_grid(const ntp_emu_kernel *k, ntp_emu_dim grid, ntp_emu_dim block, void **args, uint64_t order);

#endif
