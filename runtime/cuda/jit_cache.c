/* jit_cache.c — NVRTC compilations cached on disk, as Triton and CuPy do: the key hashes
 * everything that changes the CUBIN (source, options, NVRTC version, architecture); files
 * are written under a temporary name and renamed, so concurrent processes never read half
 * a kernel; a file that does not start with the ELF magic is ignored and rewritten. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_backend.h"
#include "nvrtc_dl.h"

/* two independent 64-bit FNV-1a lanes: a 128-bit key */
static void hash128(const char *const *parts, size_t n, uint64_t out[2]) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (size_t i = 0; i < n; i++) {
    for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++) {
      a = (a ^ *p) * 0x100000001b3ull;
      b = (b ^ (*p + 0x9e)) * 0x100000001b3ull;
    }
    a = (a ^ 0xff) * 0x100000001b3ull; /* part separator */
    b = (b ^ 0x5a) * 0x100000001b3ull;
  }
  out[0] = a;
  out[1] = b;
}

static int mkdirs(const char *path) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static const char *cache_dir(char *buf, size_t cap) {
  const char *d = getenv("NTP_CACHE_DIR");
  if (d && *d) return d;
  const char *home = getenv("XDG_CACHE_HOME");
  if (home && *home) snprintf(buf, cap, "%s/ntp", home);
  else snprintf(buf, cap, "%s/.cache/ntp", getenv("HOME") ? getenv("HOME") : "/tmp");
  return buf;
}

int ntp_jit_cubin(const char *src, const char *name, int arch, void **cubin, size_t *size, int *hit, char *err,
                  size_t cap) {
  *hit = 0;
  if (ntp_nvrtc_load(err, cap) != 0) return -1;
  int major = 0, minor = 0;
  ntp_nvrtc_version(&major, &minor);
  char ver[64], archs[16];
  snprintf(ver, sizeof ver, "nvrtc %d.%d", major, minor);
  snprintf(archs, sizeof archs, "sm_%d", arch);
  const char *parts[] = {src, NTP_NVRTC_OPTIONS, ver, archs};
  uint64_t key[2];
  hash128(parts, 4, key);
  const char *bypass = getenv("NTP_NO_CACHE");
  bool use_cache = !(bypass && *bypass && strcmp(bypass, "0") != 0);
  char dirbuf[4096], path[4300];
  const char *dir = cache_dir(dirbuf, sizeof dirbuf);
  snprintf(path, sizeof path, "%s/%016llx%016llx.%s.cubin", dir, (unsigned long long)key[0], (unsigned long long)key[1],
           archs);
  if (use_cache) {
    FILE *f = fopen(path, "rb");
    if (f) {
      fseek(f, 0, SEEK_END);
      long n = ftell(f);
      fseek(f, 0, SEEK_SET);
      unsigned char *buf = n > 4 ? malloc((size_t)n) : NULL;
      bool ok = buf && fread(buf, 1, (size_t)n, f) == (size_t)n && !memcmp(buf, "\177ELF", 4);
      fclose(f);
      if (ok) {
        *cubin = buf;
        *size = (size_t)n;
        *hit = 1;
        return 0;
      }
      free(buf); /* damaged: compile again and replace it */
    }
  }
  char *log = NULL;
  int rc = ntp_nvrtc_compile(src, name, arch, cubin, size, &log, err, cap);
  if (rc != 0 && log && *log) {
    size_t len = strlen(err);
    snprintf(err + len, cap - len, "\n%s", log);
  }
  free(log);
  if (rc != 0 || !use_cache) return rc;
  if (mkdirs(dir) == 0) {
    char tmp[4400];
    static _Atomic unsigned seq; /* threads of one process compile concurrently */
    snprintf(tmp, sizeof tmp, "%s.tmp%ld.%u", path, (long)getpid(), seq++);
    FILE *f = fopen(tmp, "wb");
    if (f) {
      bool ok = fwrite(*cubin, 1, *size, f) == *size;
      if (fclose(f) == 0 && ok && rename(tmp, path) == 0) return 0;
      remove(tmp);
    }
  }
  return 0; /* an unwritable cache only costs the next run a compilation */
}
