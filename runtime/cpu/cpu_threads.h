/* cpu_threads.h — the OpenMP calls the CPU backend makes, and their one-thread stand-ins for a
 * compiler without OpenMP (the kernels' pragmas are then ignored and everything runs on the
 * calling thread, with the same results: no kernel's result depends on its thread count). */
#ifndef NTP_CPU_THREADS_H
#define NTP_CPU_THREADS_H

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

#endif
