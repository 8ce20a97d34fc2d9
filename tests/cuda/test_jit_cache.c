/* test_jit_cache.c — the NVRTC disk cache: a miss compiles and stores, a hit returns the
 * same bytes, a damaged entry is recompiled and replaced, NTP_NO_CACHE bypasses it, and a
 * different architecture is a different key. Exits 77 without NVRTC. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include "cuda_backend.h"
#include "nvrtc_dl.h"

#include "check.h"

static const char src[] = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n";

static int count_files(const char *dir, char *first, size_t cap) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, ".cubin") && !strstr(e->d_name, ".tmp")) {
      if (!n) snprintf(first, cap, "%s/%s", dir, e->d_name);
      n++;
    }
  if (d) closedir(d);
  return n;
}

int main(void) {
  char err[1024];
  if (ntp_nvrtc_load(err, sizeof err) != 0) {
    printf("skipped: %s\n", err);
    return 77;
  }
  char dir[] = "/tmp/ntp-jit-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  setenv("NTP_CACHE_DIR", dir, 1);
  unsetenv("NTP_NO_CACHE");
  void *a, *b;
  size_t na, nb;
  int hit;
  CHECK(ntp_jit_cubin(src, "k.cu", 90, &a, &na, &hit, err, sizeof err) == 0 && !hit && na > 0);
  char path[4200] = "";
  CHECK(count_files(dir, path, sizeof path) == 1);
  CHECK(ntp_jit_cubin(src, "k.cu", 90, &b, &nb, &hit, err, sizeof err) == 0 && hit && nb == na && !memcmp(a, b, na));
  free(b);
  /* damaged entry: recompiled and replaced */
  FILE *f = fopen(path, "wb");
  fputs("garbage", f);
  fclose(f);
  CHECK(ntp_jit_cubin(src, "k.cu", 90, &b, &nb, &hit, err, sizeof err) == 0 && !hit && nb == na);
  free(b);
  CHECK(ntp_jit_cubin(src, "k.cu", 90, &b, &nb, &hit, err, sizeof err) == 0 && hit);
  free(b);
  /* another architecture, another key */
  CHECK(ntp_jit_cubin(src, "k.cu", 80, &b, &nb, &hit, err, sizeof err) == 0 && !hit);
  free(b);
  CHECK(count_files(dir, path, sizeof path) == 2);
  /* bypass */
  setenv("NTP_NO_CACHE", "1", 1);
  CHECK(ntp_jit_cubin(src, "k.cu", 90, &b, &nb, &hit, err, sizeof err) == 0 && !hit);
  free(b);
  unsetenv("NTP_NO_CACHE");
  /* a compile error comes back with NVRTC's log */
  CHECK(ntp_jit_cubin("this is not cuda", "bad.cu", 90, &b, &nb, &hit, err, sizeof err) != 0 && strstr(err, "bad.cu"));
  free(a);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_report("jit cache");
}
