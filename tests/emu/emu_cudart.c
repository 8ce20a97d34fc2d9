/* emu_cudart.c — the subset of libcudart that the CUDA backend calls, on emulated GPUs.
 *
 * Device memory is host memory between guard pages, filled with 0xff (NaN in every float
 * format) so that a read before a write shows. Streams, events and graphs are emu_streams.c's.
 * Modules are the host shared objects built by the emulated NVRTC; a launch runs every
 * block on the fiber scheduler (emu_sched.c) and, with the race check on, runs again in
 * another order and compares all the memory its pointer arguments reach. A fault during a
 * launch is sticky, as on a GPU: every later call fails with the same error. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

const ntp_emu_services *emu_services(void);

/* ---- settings, errors --------------------------------------------------------------------- */

static __thread int current_device;
static cudaError_t sticky = cudaSuccess;
static __thread cudaError_t last_error = cudaSuccess;
static char message[4096];

void emu_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ntp-emu: error: %s\n", message);
}
const char *emu_last_message(void) { return message; }

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 0) : dflt;
}
bool emu_verbose(void) { return env_long("NTP_EMU_VERBOSE", 0) != 0; }
int emu_device_count(void) {
  long n = env_long("NTP_EMU_GPUS", 8);
  return n < 0 ? 0 : n > 64 ? 64 : (int)n;
}
int emu_current_device(void) { return current_device; }

static bool failed_gpu[64]; /* NTP_EMU_FAIL_GPUS, once emu_gpus_fail has run (emu.h) */
void emu_gpus_fail(void) {
  static bool done;
  if (done) return;
  done = true;
  const char *v = getenv("NTP_EMU_FAIL_GPUS");
  if (v) emu_run_ready(); /* what was enqueued before the failure and could run, ran before it */
  for (char *end; v && *v; v = *end ? end + 1 : end) {
    long d = strtol(v, &end, 10);
    if (end == v) break;
    if (d >= 0 && d < 64) failed_gpu[d] = true, emu_streams_drop_device((int)d);
    if (emu_verbose()) fprintf(stderr, "ntp-emu: GPU %ld fails now (NTP_EMU_FAIL_GPUS)\n", d);
  }
}
bool emu_device_failed(int d) { return d >= 0 && d < 64 && failed_gpu[d]; }
static int device_gen[64];
int emu_device_gen(int d) { return d >= 0 && d < 64 ? device_gen[d] : 0; }
bool emu_object_ok(int d, int gen, const char *call) {
  if (!emu_device_ok(d, call)) return false;
  if (gen == emu_device_gen(d)) return true;
  emu_fatal("%s uses what was made on GPU %d before it failed and was replaced (NTP_EMU_REPAIR_GPUS): the repaired "
            "GPU is a new device", call, d);
}
/* a failed GPU of NTP_EMU_REPAIR_GPUS comes back, as a new device, when the program inspects it */
static void repair_if_listed(int d) {
  const char *v = getenv("NTP_EMU_REPAIR_GPUS");
  for (char *end; v && *v && emu_device_failed(d); v = *end ? end + 1 : end) {
    long x = strtol(v, &end, 10);
    if (end == v) break;
    if (x != d) continue;
    failed_gpu[d] = false, device_gen[d]++;
    if (emu_verbose()) fprintf(stderr, "ntp-emu: GPU %d repaired: a new device (NTP_EMU_REPAIR_GPUS)\n", d);
  }
}
bool emu_device_ok(int d, const char *call) {
  if (!emu_device_failed(d)) return true;
  emu_fatal("%s touches GPU %d, which has failed (NTP_EMU_FAIL_GPUS): nothing may use it any more", call, d);
}
/* On a real machine such a call hangs or fails where a clean-up path may ignore it: here the
 * process stops, so that no caller can. */
void emu_fatal(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ntp-emu: error: %s (the process stops)\n", message);
  if (getenv("NTP_EMU_BACKTRACE")) { /* where the program made the call (a debugging aid) */
    void *frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
  }
  fflush(NULL);
  _exit(134);
}
/* the current GPU, and the GPU of the allocation holding p (when it is device memory), alive */
static bool here_ok(const char *call) { return emu_device_ok(current_device, call); }
static bool memory_ok(const void *p, const char *call) {
  emu_alloc *a = emu_find(p, 0);
  return !a || emu_object_ok(a->device, a->gen, call);
}
uint64_t emu_racecheck(void) {
  const char *v = getenv("NTP_EMU_RACECHECK");
  if (!v || !*v || !strcmp(v, "off") || !strcmp(v, "0")) return 0;
  if (!strcmp(v, "reverse") || !strcmp(v, "on") || !strcmp(v, "1")) return 1;
  uint64_t s = strtoull(v, NULL, 0);
  return s < 2 ? s + 2 : s;
}

static cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}
#define STICKY()                                  \
  do {                                            \
    if (sticky != cudaSuccess) return fail(sticky); \
  } while (0)

cudaError_t emu_error(cudaError_t e) { return fail(e); }
cudaError_t emu_sticky(void) { return sticky; }
void emu_set_sticky(cudaError_t e) {
  if (sticky == cudaSuccess) sticky = e;
}
void emu_use_device(int d) { current_device = d; }
static uint64_t capture_epoch;
void emu_capture_epoch_bump(void) { capture_epoch++; }
uint64_t emu_capture_epoch(void) { return capture_epoch; }

/* A synchronous call waits for the work of every stream first (streams made by cudaStreamCreate
 * synchronise with the legacy default stream). A failure there is the launch's, sticky. */
static cudaError_t sync_first(void) {
  if (emu_sync_all() != 0) emu_set_sticky(cudaErrorLaunchFailure);
  return sticky;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
  case cudaErrorInvalidKernelImage: return "cudaErrorInvalidKernelImage";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  default: return "cudaErrorUnknown";
  }
}

/* The emulator's detail goes with the errors it raised. */
const char *cudaGetErrorString(cudaError_t e) {
  static char buf[4300];
  if (e == cudaSuccess) return "no error";
  if (e == last_error && message[0]) {
    snprintf(buf, sizeof buf, "%s (emulated GPU: %s)", cudaGetErrorName(e), message);
    return buf;
  }
  return cudaGetErrorName(e);
}
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return sticky != cudaSuccess ? sticky : e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky != cudaSuccess ? sticky : last_error; }

/* ---- devices ------------------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *n) {
  *n = emu_device_count();
  return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= emu_device_count()) {
    emu_fail("cudaSetDevice(%d): there are %d emulated GPUs", d, emu_device_count());
    return fail(cudaErrorInvalidDevice);
  }
  if (!emu_device_ok(d, "cudaSetDevice")) return fail(cudaErrorInvalidDevice);
  current_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
  if (d >= 0 && d < emu_device_count()) repair_if_listed(d);
  if (d < 0 || d >= emu_device_count() || !emu_device_ok(d, "cudaDeviceGetAttribute")) return fail(cudaErrorInvalidDevice);
  switch (a) {
  case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
  case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
  case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; return cudaSuccess;
  case cudaDevAttrWarpSize: *v = 32; return cudaSuccess;
  default:
    emu_fail("cudaDeviceGetAttribute: attribute %d is not emulated", (int)a);
    return fail(cudaErrorInvalidValue);
  }
}

/* ---- memory --------------------------------------------------------------------------------- */

static emu_alloc *allocs;
static const size_t PAGE = 4096;

emu_alloc *emu_find(const void *p, size_t n) {
  const unsigned char *c = p;
  for (emu_alloc *a = allocs; a; a = a->next)
    if (c >= a->base && c <= a->base + a->size && n <= (size_t)(a->base + a->size - c)) return a;
  return NULL;
}
emu_alloc *emu_near(const void *p) {
  const unsigned char *c = p;
  for (emu_alloc *a = allocs; a; a = a->next)
    if (c >= (unsigned char *)a->map && c < (unsigned char *)a->map + a->map_size) return a;
  return NULL;
}

cudaError_t cudaMalloc(void **p, size_t size) {
  STICKY();
  *p = NULL;
  if (!here_ok("cudaMalloc")) return fail(cudaErrorInvalidDevice);
  size_t body = (size + PAGE - 1) / PAGE * PAGE, total = body + 2 * PAGE;
  void *m = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  emu_alloc *a = calloc(1, sizeof *a);
  if (m == MAP_FAILED || !a || (body && mprotect((unsigned char *)m + PAGE, body, PROT_READ | PROT_WRITE) != 0)) {
    if (m != MAP_FAILED) munmap(m, total);
    free(a);
    emu_fail("cudaMalloc(%zu): out of host memory", size);
    return fail(cudaErrorMemoryAllocation);
  }
  /* the end of the allocation against the upper guard page (16-byte aligned, as cuBLASLt wants) */
  a->base = (unsigned char *)m + PAGE + ((body - size) & ~(size_t)15);
  a->size = size;
  a->map = m;
  a->map_size = total;
  a->device = current_device;
  a->gen = emu_device_gen(current_device);
  memset(a->base, 0xff, size);
  a->next = allocs;
  allocs = a;
  *p = a->base;
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  if (!p) return cudaSuccess;
  sync_first(); /* cudaFree waits for the device's work */
  for (emu_alloc **ap = &allocs; *ap; ap = &(*ap)->next)
    if ((*ap)->base == p) {
      emu_alloc *a = *ap;
      if (!emu_object_ok(a->device, a->gen, "cudaFree")) return fail(cudaErrorInvalidDevice);
      *ap = a->next;
      munmap(a->map, a->map_size);
      free(a);
      return cudaSuccess;
    }
  emu_fail("cudaFree(%p): not an allocation of the emulated GPU", p);
  return fail(cudaErrorInvalidDevicePointer);
}

/* a device range must lie inside one allocation */
static bool device_range(const void *p, size_t n, const char *call) {
  if (n == 0 || emu_find(p, n)) return true;
  emu_alloc *a = emu_find(p, 0);
  if (a)
    emu_fail("%s: %zu bytes at offset %zu run past the end of a %zu-byte allocation", call, n,
             (size_t)((const unsigned char *)p - a->base), a->size);
  else
    emu_fail("%s: %p is not device memory", call, p);
  return false;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  STICKY();
  if (emu_any_capture()) { /* CUDA invalidates the capture: a synchronous copy cannot be recorded */
    emu_fail("cudaMemcpy while a stream is capturing");
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  bool dd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDefault;
  bool sd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDefault;
  if (kind == cudaMemcpyDefault) {
    dd = emu_find(dst, 0) != NULL;
    sd = emu_find(src, 0) != NULL;
  }
  if ((dd && !device_range(dst, n, "cudaMemcpy (destination)")) || (sd && !device_range(src, n, "cudaMemcpy (source)")))
    return fail(cudaErrorInvalidValue);
  if (!here_ok("cudaMemcpy") || (dd && !memory_ok(dst, "cudaMemcpy (destination)")) ||
      (sd && !memory_ok(src, "cudaMemcpy (source)")))
    return fail(cudaErrorInvalidDevice);
  if (sync_first() != cudaSuccess) return fail(sticky);
  memmove(dst, src, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
  (void)s;
  return cudaMemcpy(dst, src, n, kind);
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
  STICKY();
  if (!device_range(p, n, "cudaMemset")) return fail(cudaErrorInvalidValue);
  if (!here_ok("cudaMemset") || !memory_ok(p, "cudaMemset")) return fail(cudaErrorInvalidDevice);
  if (sync_first() != cudaSuccess) return fail(sticky);
  memset(p, v, n);
  return cudaSuccess;
}
typedef struct memset_node { size_t bytes; void *p; int v; size_t n; } memset_node;
static int run_memset(void *ctx) {
  memset_node *m = ctx;
  memset(m->p, m->v, m->n);
  return 0;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  STICKY();
  if (!emu_stream_ok(s, "cudaMemsetAsync")) return fail(cudaErrorInvalidResourceHandle);
  if (!device_range(p, n, "cudaMemsetAsync")) return fail(cudaErrorInvalidValue);
  if (!memory_ok(p, "cudaMemsetAsync")) return fail(cudaErrorInvalidDevice);
  memset_node *m = malloc(sizeof *m);
  if (!m) return fail(cudaErrorMemoryAllocation);
  *m = (memset_node){sizeof *m, p, v, n};
  return emu_enqueue(s, run_memset, m) == 0 ? cudaSuccess : fail(sticky != cudaSuccess ? sticky : cudaErrorLaunchFailure);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
  memset(attr, 0, sizeof *attr);
  emu_alloc *a = emu_find(p, 0);
  attr->type = a ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  attr->device = a ? a->device : -1;
  attr->devicePointer = a ? (void *)p : NULL;
  attr->hostPointer = a ? NULL : (void *)p;
  return cudaSuccess;
}

/* ---- modules: the emulated NVRTC's shared objects ------------------------------------------- */

typedef struct emu_kernel_h { int magic; const ntp_emu_kernel *k; struct emu_library *lib; } emu_kernel_h;
typedef struct emu_library {
  int magic;
  void *dl;
  const ntp_emu_kernel *table;
  size_t n;
  emu_kernel_h *handles;
  struct emu_library *next_retired;
} emu_library;
static emu_library *retired; /* unloaded libraries: kept so that a stale handle is caught, not a crash */
enum { LIB_MAGIC = 0x4c494252, KERN_MAGIC = 0x4b45524e };

cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *jo, void **jv, unsigned njo,
                                enum cudaLibraryOption *lo, void **lv, unsigned nlo) {
  (void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
  STICKY();
  *lib = NULL;
  const unsigned char *c = code;
  /* the image is an ELF shared object whose section headers end the file */
  if (!c || memcmp(c, "\177ELF", 4) != 0 || c[4] != 2) {
    emu_fail("cudaLibraryLoadData: not a module of the emulated NVRTC");
    return fail(cudaErrorInvalidKernelImage);
  }
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, c + 0x28, 8);
  memcpy(&shentsize, c + 0x3a, 2);
  memcpy(&shnum, c + 0x3c, 2);
  size_t size = (size_t)shoff + (size_t)shentsize * shnum;
  char path[] = "/tmp/ntp-emu-module-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, code, size) != (ssize_t)size) {
    if (fd >= 0) close(fd), unlink(path);
    emu_fail("cudaLibraryLoadData: cannot write the module to /tmp");
    return fail(cudaErrorInvalidKernelImage);
  }
  close(fd);
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  unlink(path);
  ntp_emu_module_fn fn = dl ? (ntp_emu_module_fn)dlsym(dl, NTP_EMU_MODULE_SYMBOL) : NULL;
  if (!fn) {
    emu_fail("cudaLibraryLoadData: %s", dl ? "the module has no kernel table (a real CUBIN?)" : dlerror());
    if (dl) dlclose(dl);
    return fail(cudaErrorInvalidKernelImage);
  }
  emu_library *L = calloc(1, sizeof *L);
  const ntp_emu_services *svc = emu_services();
  if (!L || !svc) {
    dlclose(dl);
    free(L);
    return fail(cudaErrorMemoryAllocation);
  }
  L->magic = LIB_MAGIC;
  L->dl = dl;
  L->table = fn(svc, &L->n);
  L->handles = calloc(L->n + 1, sizeof *L->handles);
  for (size_t i = 0; i < L->n; i++) L->handles[i] = (emu_kernel_h){KERN_MAGIC, &L->table[i], L};
  *lib = (cudaLibrary_t)L;
  return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t lib) {
  emu_library *L = (emu_library *)lib;
  if (!L || L->magic != LIB_MAGIC) return fail(cudaErrorInvalidResourceHandle);
  for (size_t i = 0; i < L->n; i++) L->handles[i].magic = 0;
  L->magic = 0;
  dlclose(L->dl);
  L->next_retired = retired;
  retired = L;
  return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name) {
  emu_library *L = (emu_library *)lib;
  *k = NULL;
  if (!L || L->magic != LIB_MAGIC) return fail(cudaErrorInvalidResourceHandle);
  for (size_t i = 0; i < L->n; i++)
    if (!strcmp(L->table[i].name, name)) {
      *k = (cudaKernel_t)&L->handles[i];
      return cudaSuccess;
    }
  emu_fail("cudaLibraryGetKernel: the module has no kernel '%s'", name);
  return fail(cudaErrorSymbolNotFound);
}

/* ---- launches --------------------------------------------------------------------------------- */

typedef struct span { emu_alloc *a; unsigned char *before, *after; } span;

/* the allocations a launch can reach: those its pointer arguments point into */
static int reached(const ntp_emu_kernel *k, void **args, span *out, int cap) {
  int n = 0;
  for (int i = 0; i < k->nargs; i++) {
    if (!(k->pointer_args & (1u << i))) continue;
    void *p;
    memcpy(&p, args[i], sizeof p);
    if (!p) continue;
    emu_alloc *a = emu_find(p, 0);
    if (!a) {
      emu_fail("kernel %s: argument %d (%p) is not device memory", k->name, i, p);
      return -1;
    }
    if (a->device != current_device) {
      emu_fail("kernel %s launched on GPU %d: argument %d is memory of GPU %d", k->name, current_device, i, a->device);
      return -1;
    }
    bool seen = false;
    for (int j = 0; j < n; j++) seen |= out[j].a == a;
    if (!seen && n < cap) out[n++] = (span){a, NULL, NULL};
  }
  return n;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static unsigned long long launches;
static int launch_now(const emu_kernel_h *h, ntp_emu_dim g, ntp_emu_dim b, void **args);

/* a launch in a stream or a graph: the kernel, its geometry and a copy of its argument values */
typedef struct launch_node {
  size_t bytes;
  const emu_kernel_h *h;
  ntp_emu_dim grid, block;
  size_t at[16];
  unsigned char values[];
} launch_node;
static int run_launch(void *ctx) {
  launch_node *l = ctx;
  void *args[16];
  for (int i = 0; i < l->h->k->nargs; i++) args[i] = l->values + l->at[i];
  return launch_now(l->h, l->grid, l->block, args);
}
static cudaError_t enqueue_launch(const emu_kernel_h *h, ntp_emu_dim g, ntp_emu_dim b, void **args, cudaStream_t s) {
  const ntp_emu_kernel *k = h->k;
  size_t total = 0, at[16];
  for (int i = 0; i < k->nargs; i++) {
    at[i] = total;
    total += (k->arg_size[i] + 15) / 16 * 16;
  }
  launch_node *l = malloc(sizeof *l + total);
  if (!l) return fail(cudaErrorMemoryAllocation);
  *l = (launch_node){.bytes = sizeof *l + total, .h = h, .grid = g, .block = b};
  for (int i = 0; i < k->nargs; i++) {
    l->at[i] = at[i];
    memcpy(l->values + at[i], args[i], k->arg_size[i]); /* CUDA copies the values at the launch */
  }
  return emu_enqueue(s, run_launch, l) == 0 ? cudaSuccess : fail(sticky != cudaSuccess ? sticky : cudaErrorLaunchFailure);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t stream) {
  STICKY();
  const emu_kernel_h *h = func;
  if (!h || h->magic != KERN_MAGIC) {
    emu_fail("cudaLaunchKernel: not a kernel of a loaded module (unloaded, or never loaded)");
    return fail(cudaErrorInvalidResourceHandle);
  }
  const ntp_emu_kernel *k = h->k;
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (!emu_stream_ok(stream, "cudaLaunchKernel")) return fail(cudaErrorInvalidResourceHandle);
  if (stream && *((const int *)stream + 1) != current_device) { /* emu_stream: magic, device */
    emu_fail("kernel %s: launched on GPU %d into a stream of GPU %d", k->name, current_device,
             *((const int *)stream + 1));
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (threads == 0 || threads > 1024 || (int)threads > k->max_threads || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    emu_fail("kernel %s: launch of grid (%u, %u, %u) x block (%u, %u, %u) is out of bounds (at most %d threads a block "
             "by its __launch_bounds__)",
             k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z, k->max_threads);
    return fail(cudaErrorInvalidConfiguration);
  }
  if (smem) {
    emu_fail("kernel %s: %zu bytes of dynamic shared memory (extern __shared__ is not emulated)", k->name, smem);
    return fail(cudaErrorInvalidConfiguration);
  }
  ntp_emu_dim g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
  return enqueue_launch(h, g, b, args, stream);
}

/* Runs a launch (validated): once, or twice with the race check. 0, or -1 with sticky set. */
static int launch_now(const emu_kernel_h *h, ntp_emu_dim g, ntp_emu_dim b, void **args) {
  const ntp_emu_kernel *k = h->k;
  if (h->magic != KERN_MAGIC) {
    emu_fail("kernel launch through a graph whose module was unloaded");
    sticky = cudaErrorInvalidResourceHandle;
    return -1;
  }
  uint64_t mode = emu_racecheck();
  span sp[64];
  int ns = reached(k, args, sp, 64);
  if (ns < 0) {
    sticky = cudaErrorInvalidValue;
    return -1;
  }
  launches++;
  double t0 = now();
  if (mode) {
    for (int i = 0; i < ns; i++) {
      sp[i].before = malloc(sp[i].a->size + 1);
      sp[i].after = malloc(sp[i].a->size + 1);
      if (!sp[i].before || !sp[i].after) {
        emu_fail("race check: out of host memory");
        sticky = cudaErrorMemoryAllocation;
        return -1;
      }
      memcpy(sp[i].before, sp[i].a->base, sp[i].a->size);
    }
  }
  int rc = emu_run_grid(k, g, b, args, 0);
  if (rc == 0 && mode) {
    for (int i = 0; i < ns; i++) {
      memcpy(sp[i].after, sp[i].a->base, sp[i].a->size);
      memcpy(sp[i].a->base, sp[i].before, sp[i].a->size);
    }
    rc = emu_run_grid(k, g, b, args, mode);
    for (int i = 0; rc == 0 && i < ns; i++) {
      if (!memcmp(sp[i].after, sp[i].a->base, sp[i].a->size)) continue;
      size_t off = 0;
      while (sp[i].after[off] == sp[i].a->base[off]) off++;
      emu_fail("kernel %s: race: its result depends on the order in which blocks and threads run (byte %zu of a "
               "%zu-byte allocation differs between two orders: 0x%02x vs 0x%02x)",
               k->name, off, sp[i].a->size, sp[i].after[off], sp[i].a->base[off]);
      rc = -1;
    }
  }
  if (emu_verbose())
    fprintf(stderr, "ntp-emu: launch %llu: %s grid %u block %u on GPU %d%s: %.3f ms\n", launches, k->name, g.x, b.x,
            current_device, mode ? " (race check)" : "", (now() - t0) * 1e3);
  for (int i = 0; mode && i < ns; i++) {
    free(sp[i].before);
    free(sp[i].after);
  }
  if (rc != 0) {
    sticky = cudaErrorLaunchFailure;
    return -1;
  }
  return 0;
}
