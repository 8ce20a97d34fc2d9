/* emu_nvrtc.c — the subset of libnvrtc the backend calls, compiling with the host C++
 * compiler: the source, force-including emu_device.h, becomes a shared object whose bytes
 * stand in for the CUBIN. Kernels are found by their __global__ declarations and listed in a
 * table appended to the source. nvrtcVersion reports major 0 (no real NVRTC does) and a
 * minor derived from the device header, so the kernel cache never mixes real and emulated
 * images, nor images built against an older shim. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emu.h"

#ifndef NTP_EMU_SOURCE_DIR
#define NTP_EMU_SOURCE_DIR "."
#endif

struct _nvrtcProgram {
  char *src, *name, *log, *image;
  size_t image_size;
};

static const char *include_dir(void) {
  const char *d = getenv("NTP_EMU_INCLUDE");
  return d && *d ? d : NTP_EMU_SOURCE_DIR;
}

const char *nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  default: return "NVRTC_ERROR_INTERNAL_ERROR";
  }
}

nvrtcResult nvrtcVersion(int *major, int *minor) {
  static int hash = -1;
  if (hash < 0) {
    char path[4200];
    snprintf(path, sizeof path, "%s/emu_device.h", include_dir());
    uint32_t h = 2166136261u ^ NTP_EMU_ABI;
    FILE *f = fopen(path, "rb");
    for (int c; f && (c = fgetc(f)) != EOF;) h = (h ^ (uint32_t)c) * 16777619u;
    if (f) fclose(f);
    hash = (int)(h % 100000);
  }
  *major = 0;
  *minor = hash;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int nheaders,
                               const char *const *headers, const char *const *include_names) {
  (void)headers, (void)include_names;
  if (!prog || !src) return NVRTC_ERROR_INVALID_INPUT;
  if (nheaders) return NVRTC_ERROR_INVALID_INPUT; /* not emulated: the backend passes none */
  struct _nvrtcProgram *p = calloc(1, sizeof *p);
  if (!p || !(p->src = strdup(src)) || !(p->name = strdup(name ? name : "program.cu"))) {
    if (p) free(p->src);
    free(p);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  *prog = p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog) {
  if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
  free((*prog)->src);
  free((*prog)->name);
  free((*prog)->log);
  free((*prog)->image);
  free(*prog);
  *prog = NULL;
  return NVRTC_SUCCESS;
}

/* "NAME(" after __global__ [void] [__launch_bounds__(N[, M])]: the kernels to list */
static void kernel_table(const char *src, FILE *out) {
  fputs("\nstatic ntp_emu_kernel ntp_emu_table[", out);
  size_t count = 0;
  for (const char *p = src; (p = strstr(p, "__global__")); p += 10) count++;
  fprintf(out, "%zu + 1];\nstatic size_t ntp_emu_n;\n", count);
  fputs("extern \"C\" __attribute__((visibility(\"default\"))) const ntp_emu_kernel *ntp_emu_module(const "
        "ntp_emu_services *s, size_t *count) {\n  ntp_emu_s = s;\n  ntp_emu_n = 0;\n",
        out);
  for (const char *p = src; (p = strstr(p, "__global__")); p += 10) {
    const char *q = p + 10;
    int bound = 1024;
    for (;;) {
      while (isspace((unsigned char)*q)) q++;
      if (!strncmp(q, "void", 4) && !isalnum((unsigned char)q[4]) && q[4] != '_') q += 4;
      else if (!strncmp(q, "__launch_bounds__", 17)) {
        q += 17;
        while (isspace((unsigned char)*q) || *q == '(') q++;
        bound = atoi(q);
        while (*q && *q != ')') q++;
        if (*q) q++;
      } else break;
    }
    const char *e = q;
    while (isalnum((unsigned char)*e) || *e == '_') e++;
    const char *after = e;
    while (isspace((unsigned char)*after)) after++;
    if (e > q && *after == '(') fprintf(out, "  NTP_EMU_KERNEL(%.*s, %d);\n", (int)(e - q), q, bound > 0 ? bound : 1024);
  }
  fputs("  *count = ntp_emu_n;\n  return ntp_emu_table;\n}\n", out);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) b[len] = 0, *n = (size_t)len;
  return b;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int nopts, const char *const *opts) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  for (int i = 0; i < nopts; i++) {
    const char *o = opts[i];
    if (strncmp(o, "--gpu-architecture=sm_", 22) && strncmp(o, "-arch=sm_", 9) && strcmp(o, "--std=c++17") &&
        strcmp(o, "-std=c++17") && strcmp(o, "-default-device") && strcmp(o, "--device-as-default-execution-space")) {
      free(p->log);
      size_t n = strlen(o) + 64;
      p->log = malloc(n);
      if (p->log) snprintf(p->log, n, "emulated NVRTC: option '%s' is not emulated\n", o);
      return NVRTC_ERROR_INVALID_OPTION;
    }
  }
  char dir[] = "/tmp/ntp-emu-nvrtc-XXXXXX";
  if (!mkdtemp(dir)) return NVRTC_ERROR_INTERNAL_ERROR;
  char src[64], so[64], log[64];
  snprintf(src, sizeof src, "%s/k.cpp", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  FILE *f = fopen(src, "w");
  if (!f) return NVRTC_ERROR_INTERNAL_ERROR;
  fputs(p->src, f);
  kernel_table(p->src, f);
  fclose(f);
  const char *cxx = getenv("NTP_EMU_CXX");
  char inc[4200];
  snprintf(inc, sizeof inc, "-I%s", include_dir());
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    /* -O1: the kernels are small and compiled once per cache key; IEEE single rounding */
    execlp(cxx && *cxx ? cxx : "c++", "c++", "-std=c++17", "-O1", "-g0", "-fPIC", "-shared", "-w", "-ffp-contract=off",
           "-fno-fast-math", "-fvisibility=hidden", "-U_FORTIFY_SOURCE", inc, "-include", "emu_device.h", "-x", "c++",
           src, "-o", so, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0) status = -1;
  size_t ln = 0, in = 0;
  free(p->log);
  p->log = slurp(log, &ln);
  free(p->image);
  p->image = NULL;
  bool ok = status == 0 && (p->image = slurp(so, &in)) != NULL;
  p->image_size = in;
  if (!ok && p->log && !*p->log) {
    free(p->log);
    p->log = strdup("emulated NVRTC: the host C++ compiler did not run (NTP_EMU_CXX?)\n");
  }
  unlink(src), unlink(so), unlink(log), rmdir(dir);
  return ok ? NVRTC_SUCCESS : NVRTC_ERROR_COMPILATION;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = (p->log ? strlen(p->log) : 0) + 1;
  return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
  if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
  strcpy(log, p->log ? p->log : "");
  return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) {
  if (!p || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = p->image_size;
  return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *out) {
  if (!p || !p->image) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(out, p->image, p->image_size);
  return NVRTC_SUCCESS;
}
