/* test_emu_selftest.c — the emulated GPU can fail: deliberately broken kernels, each of which
 * must be reported as a launch error naming the kernel and the defect, and correct kernels
 * that must pass with the race check on. Each case runs in a child process, since a launch
 * failure is sticky for the rest of a process (as on a GPU). */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char common[] =
    "extern \"C\" __global__ void __launch_bounds__(64) block_sum_ok(const float *x, float *out) {\n"
    "  __shared__ float sh[2];\n"
    "  float v = x[blockIdx.x * 64 + threadIdx.x];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"
    "  __syncthreads();\n"
    "  float t = (threadIdx.x & 31) < 2 ? sh[threadIdx.x & 31] : 0.0f;\n"
    "  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);\n"
    "  out[blockIdx.x * 64 + threadIdx.x] = t;\n"
    "}\n"
    /* the neighbour's slot is read before anyone waits for it to be written */
    "extern \"C\" __global__ void missing_barrier(float *out) {\n"
    "  __shared__ float sh[64];\n"
    "  sh[threadIdx.x] = (float)threadIdx.x;\n"
    "  out[threadIdx.x] = sh[(threadIdx.x + 1) % 64];\n"
    "}\n"
    "extern \"C\" __global__ void oob_write(float *out, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i <= n) out[i] = 1.0f; /* one past the end */\n"
    "}\n"
    /* half the warp returns, the other half reduces across all 32 lanes */
    "extern \"C\" __global__ void wrong_warp_reduction(const float *x, float *out) {\n"
    "  if (threadIdx.x >= 16) return;\n"
    "  float v = x[threadIdx.x];\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  out[threadIdx.x] = v;\n"
    "}\n"
    "extern \"C\" __global__ void blocks_race(int *out) { if (threadIdx.x == 0) out[0] = (int)blockIdx.x; }\n"
    "extern \"C\" __global__ void partial_barrier(float *out) {\n"
    "  if (threadIdx.x < 32) __syncthreads();\n"
    "  out[threadIdx.x] = 1.0f;\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(128) bounded(float *out) { out[threadIdx.x] = 0.0f; }\n"
    "extern \"C\" __global__ void stray_pointer(float *out) { out[(long long)1 << 40] = 1.0f; }\n";

static cudaKernel_t kern(const char *name) {
  static cudaLibrary_t lib;
  if (!lib) {
    nvrtcProgram p;
    const char *opts[] = {"--gpu-architecture=sm_90", "--std=c++17"};
    if (nvrtcCreateProgram(&p, common, "selftest.cu", 0, NULL, NULL) != NVRTC_SUCCESS) exit(3);
    if (nvrtcCompileProgram(p, 2, opts) != NVRTC_SUCCESS) {
      size_t n;
      nvrtcGetProgramLogSize(p, &n);
      char *log = malloc(n);
      nvrtcGetProgramLog(p, log);
      fprintf(stderr, "compile failed:\n%s\n", log);
      exit(3);
    }
    size_t n;
    nvrtcGetCUBINSize(p, &n);
    char *img = malloc(n);
    nvrtcGetCUBIN(p, img);
    if (cudaLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0) != cudaSuccess) exit(3);
    free(img);
    nvrtcDestroyProgram(&p);
  }
  cudaKernel_t k;
  if (cudaLibraryGetKernel(&k, lib, name) != cudaSuccess) exit(3);
  return k;
}

static cudaError_t launch(const char *name, unsigned grid, unsigned block, void **args) {
  cudaError_t e = cudaLaunchKernel((const void *)kern(name), (dim3){grid, 1, 1}, (dim3){block, 1, 1}, args, 0, NULL);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

/* the cases: each returns the launch's error (cudaSuccess for the correct kernels) */
static cudaError_t c_block_sum_ok(void) {
  float h[256], *x, *out, r[256];
  for (int i = 0; i < 256; i++) h[i] = (float)(i % 7) - 2.5f;
  cudaMalloc((void **)&x, sizeof h);
  cudaMalloc((void **)&out, sizeof h);
  cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice);
  void *a[] = {&x, &out};
  cudaError_t e = launch("block_sum_ok", 4, 64, a);
  if (e != cudaSuccess) return e;
  cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
  for (int b = 0; b < 4; b++) {
    float s = 0;
    for (int i = 0; i < 64; i++) s += h[b * 64 + i];
    for (int i = 0; i < 64; i++)
      if (r[b * 64 + i] != s) {
        fprintf(stderr, "block %d thread %d: %g, expected %g\n", b, i, r[b * 64 + i], s);
        return cudaErrorUnknown;
      }
  }
  return cudaSuccess;
}
static cudaError_t c_missing_barrier(void) {
  float *out;
  cudaMalloc((void **)&out, 64 * sizeof(float));
  void *a[] = {&out};
  return launch("missing_barrier", 1, 64, a);
}
static cudaError_t c_oob_write(void) {
  float *out;
  int n = 1000;
  cudaMalloc((void **)&out, (size_t)n * sizeof(float));
  void *a[] = {&out, &n};
  return launch("oob_write", 4, 256, a);
}
static cudaError_t c_wrong_warp_reduction(void) {
  float *x, *out;
  cudaMalloc((void **)&x, 32 * sizeof(float));
  cudaMalloc((void **)&out, 32 * sizeof(float));
  cudaMemset(x, 0, 32 * sizeof(float));
  void *a[] = {&x, &out};
  return launch("wrong_warp_reduction", 1, 32, a);
}
static cudaError_t c_blocks_race(void) {
  int *out;
  cudaMalloc((void **)&out, sizeof(int));
  void *a[] = {&out};
  return launch("blocks_race", 8, 32, a);
}
static cudaError_t c_partial_barrier(void) {
  float *out;
  cudaMalloc((void **)&out, 64 * sizeof(float));
  void *a[] = {&out};
  return launch("partial_barrier", 1, 64, a);
}
static cudaError_t c_launch_bounds(void) {
  float *out;
  cudaMalloc((void **)&out, 256 * sizeof(float));
  void *a[] = {&out};
  return launch("bounded", 1, 256, a);
}
static cudaError_t c_stray_pointer(void) {
  float *out;
  cudaMalloc((void **)&out, 64 * sizeof(float));
  void *a[] = {&out};
  return launch("stray_pointer", 1, 1, a);
}
static cudaError_t c_host_pointer(void) {
  static float host[64];
  float *p = host;
  void *a[] = {&p};
  return launch("missing_barrier", 1, 64, a);
}

static const struct {
  const char *name;
  cudaError_t (*run)(void);
  const char *expect; /* in the error text; NULL: must succeed */
} cases[] = {
    {"correct block reduction passes the race check", c_block_sum_ok, NULL},
    {"missing __syncthreads", c_missing_barrier, "kernel missing_barrier: race"},
    {"out-of-bounds write", c_oob_write, "kernel oob_write: out-of-bounds access"},
    {"warp reduction over returned lanes", c_wrong_warp_reduction, "kernel wrong_warp_reduction: lane 0 of warp 0 waits"},
    {"two blocks racing", c_blocks_race, "kernel blocks_race: race"},
    {"barrier reached by part of a block", c_partial_barrier, "kernel partial_barrier: __syncthreads reached by 32 of the 64"},
    {"launch beyond __launch_bounds__", c_launch_bounds, "kernel bounded: launch of grid"},
    {"stray pointer", c_stray_pointer, "kernel stray_pointer: invalid memory access"},
    {"host memory as an argument", c_host_pointer, "kernel missing_barrier: argument 0"},
};

int main(void) {
  setenv("NTP_EMU_RACECHECK", "reverse", 1);
  kern("block_sum_ok"); /* compiled and loaded once; every child inherits the module */
  int failed = 0, n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      close(pipefd[0]);
      dup2(pipefd[1], 2);
      cudaError_t e = cases[i].run();
      fprintf(stderr, "\nresult: %s\n", e == cudaSuccess ? "success" : cudaGetErrorString(e));
      _exit(e == cudaSuccess ? 0 : 1);
    }
    close(pipefd[1]);
    char buf[16384];
    size_t len = 0;
    ssize_t r;
    while ((r = read(pipefd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    buf[len] = 0;
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
    bool exited = WIFEXITED(status);
    int code = exited ? WEXITSTATUS(status) : -1;
    bool ok = cases[i].expect ? exited && code == 1 && strstr(buf, cases[i].expect) : exited && code == 0;
    printf("%-48s %s\n", cases[i].name, !ok ? "FAILED" : cases[i].expect ? "caught" : "ok");
    if (cases[i].expect && ok) {
      const char *line = strstr(buf, "ntp-emu: error: ");
      if (line) printf("    %.*s\n", (int)strcspn(line, "\n"), line);
    }
    if (!ok) {
      printf("    expected %s; exit %d, output:\n%s\n", cases[i].expect ? cases[i].expect : "success", code, buf);
      failed++;
    }
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed ? 1 : 0;
}
