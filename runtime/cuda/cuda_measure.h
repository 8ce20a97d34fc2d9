/* cuda_measure.h — the measurements `ntpc calibrate` and the benchmarks make on the local GPUs:
 * cuBLASLt GEMMs, device-to-device copies, a streaming kernel, the launch gap, NCCL collectives.
 * Each call does its own set-up and clean-up, times `iters` repetitions with CUDA events after
 * one warm-up, and returns 0 with the mean seconds of one repetition, or -1 with a message
 * (no GPU, a library lacking a call, a CUDA error). The libraries are the CUDA backend's
 * (ntp_cuda_dl): the emulated GPU of tests/emu serves as well, with meaningless numbers. */
#ifndef NTP_CUDA_MEASURE_H
#define NTP_CUDA_MEASURE_H

#include <stddef.h>
#include <stdint.h>

#include "ntp_types.h"

/* GPUs visible */
int ntp_measure_devices(int *count, char *err, size_t cap);
/* GPU dev's name ("" where cudart cannot say, as on the emulated GPU) and memory in bytes (0 where
 * cudaMemGetInfo is missing) */
int ntp_measure_device_info(int dev, char *name, size_t name_cap, double *mem_bytes, char *err, size_t cap);

/* D[M,N] = A[M,K] B[K,N] through cuBLASLt: dt in and out, fp32 accumulation (as the backend's GEMMs) */
int ntp_measure_gemm(int dev, ntp_dtype dt, int64_t M, int64_t N, int64_t K, int iters, double *seconds, char *err,
                     size_t cap);
/* cudaMemcpyAsync of `bytes` from one device buffer to another (it reads and writes `bytes`) */
int ntp_measure_copy(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap);
/* an NVRTC-compiled kernel that reads `bytes` of fp32 and writes `bytes` (y = 2x + 1, grid-stride) */
int ntp_measure_stream(int dev, size_t bytes, int iters, double *seconds, char *err, size_t cap);
/* the gap per launch of an empty kernel, `iters` launched back to back on one stream */
int ntp_measure_launch(int dev, int iters, double *seconds, char *err, size_t cap);

typedef enum { NTP_MEASURE_ALL_REDUCE, NTP_MEASURE_REDUCE_SCATTER, NTP_MEASURE_ALL_GATHER, NTP_MEASURE_NCOLLS } ntp_measure_coll;
const char *ntp_measure_coll_name(ntp_measure_coll k); /* "all-reduce", ... (the profile's names) */
/* One collective over GPUs 0 .. ngpus-1 (one ncclCommInitAll for every size, one thread), at each
 * of sizes[0 .. nsizes) bytes (the whole buffer: all-reduce: each rank's; reduce-scatter: each
 * rank's input; all-gather: each rank's output), bf16: seconds[j] for sizes[j]. -1 with a message
 * when libnccl lacks the call. */
int ntp_measure_collective(int ngpus, ntp_measure_coll kind, const size_t *sizes, int nsizes, int iters, double *seconds,
                           char *err, size_t cap);

#endif
