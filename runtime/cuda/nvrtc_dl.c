/* nvrtc_dl.c — the NVRTC entry points, fetched with dlopen/dlsym. The prototypes are
 * NVRTC's stable C ABI, declared here so the build needs no CUDA headers. */
#define _GNU_SOURCE
#include "nvrtc_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtc_result;
typedef struct nvrtc_program *nvrtc_program;

static struct {
  void *lib;
  nvrtc_result (*version)(int *, int *);
  nvrtc_result (*create)(nvrtc_program *, const char *, const char *, int, const char *const *, const char *const *);
  nvrtc_result (*compile)(nvrtc_program, int, const char *const *);
  nvrtc_result (*cubin_size)(nvrtc_program, size_t *);
  nvrtc_result (*cubin)(nvrtc_program, char *);
  nvrtc_result (*log_size)(nvrtc_program, size_t *);
  nvrtc_result (*log)(nvrtc_program, char *);
  nvrtc_result (*destroy)(nvrtc_program *);
  const char *(*error_string)(nvrtc_result);
} nv;

#define SYM(field, name)                                                             \
  do {                                                                               \
    *(void **)&nv.field = dlsym(nv.lib, name);                                       \
    if (!nv.field) {                                                                 \
      snprintf(err, cap, "libnvrtc lacks %s", name);                                 \
      dlclose(nv.lib);                                                               \
      nv.lib = NULL;                                                                 \
      return -1;                                                                     \
    }                                                                                \
  } while (0)

int ntp_nvrtc_load(char *err, size_t cap) {
  if (nv.lib) return 0;
  const char *names[] = {getenv("NTP_NVRTC_LIB"), "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                         "/usr/local/cuda/lib64/libnvrtc.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !nv.lib; i++)
    if (names[i] && *names[i]) nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!nv.lib) {
    snprintf(err, cap, "NVRTC is not installed (libnvrtc.so not found; set NTP_NVRTC_LIB to its path)");
    return -1;
  }
  SYM(version, "nvrtcVersion");
  SYM(create, "nvrtcCreateProgram");
  SYM(compile, "nvrtcCompileProgram");
  SYM(cubin_size, "nvrtcGetCUBINSize");
  SYM(cubin, "nvrtcGetCUBIN");
  SYM(log_size, "nvrtcGetProgramLogSize");
  SYM(log, "nvrtcGetProgramLog");
  SYM(destroy, "nvrtcDestroyProgram");
  SYM(error_string, "nvrtcGetErrorString");
  return 0;
}

int ntp_nvrtc_version(int *major, int *minor) { return nv.lib && nv.version(major, minor) == 0 ? 0 : -1; }

int ntp_nvrtc_compile(const char *src, const char *name, int arch, void **cubin, size_t *size, char **log, char *err,
                      size_t cap) {
  *cubin = NULL;
  *size = 0;
  *log = NULL;
  if (!nv.lib && ntp_nvrtc_load(err, cap) != 0) return -1;
  nvrtc_program prog;
  nvrtc_result r = nv.create(&prog, src, name, 0, NULL, NULL);
  if (r != 0) {
    snprintf(err, cap, "nvrtcCreateProgram: %s", nv.error_string(r));
    return -1;
  }
  char archopt[32];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=sm_%d", arch);
  const char *opts[] = {archopt, "--std=c++17", "-default-device"}; /* = NTP_NVRTC_OPTIONS */
  r = nv.compile(prog, 3, opts);
  size_t ls = 0;
  nv.log_size(prog, &ls);
  *log = calloc(ls + 1, 1);
  if (*log && ls) nv.log(prog, *log);
  if (r != 0) {
    snprintf(err, cap, "nvrtcCompileProgram: %s", nv.error_string(r));
    nv.destroy(&prog);
    return -1;
  }
  if (nv.cubin_size(prog, size) != 0 || *size == 0 || !(*cubin = malloc(*size)) || nv.cubin(prog, *cubin) != 0) {
    snprintf(err, cap, "no CUBIN for sm_%d", arch);
    free(*cubin);
    *cubin = NULL;
    nv.destroy(&prog);
    return -1;
  }
  nv.destroy(&prog);
  return 0;
}
