/* nvrtc_dl.h — NVRTC loaded at run time (dlopen), so nothing links a CUDA library and
 * every binary starts on machines without one. */
#ifndef NTP_NVRTC_DL_H
#define NTP_NVRTC_DL_H

#include <stddef.h>

/* The options every compilation uses besides the architecture (part of the cache key). */
#define NTP_NVRTC_OPTIONS "--std=c++17 -default-device"

/* Loads libnvrtc ($NTP_NVRTC_LIB, else the usual sonames). 0, or -1 with a message. */
int ntp_nvrtc_load(char *err, size_t cap);
/* "13.0" */
int ntp_nvrtc_version(int *major, int *minor);
/* Compiles CUDA C `src` to CUBIN for sm_<arch>. On success *cubin (malloc'd) and *size are set.
 * *log (malloc'd, may be empty) receives NVRTC's log in every case; warnings land there. */
int ntp_nvrtc_compile(const char *src, const char *name, int arch, void **cubin, size_t *size, char **log, char *err,
                      size_t cap);

#endif
