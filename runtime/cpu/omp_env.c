/* omp_env.c — how long the CPU backend's idle OpenMP threads spin, for the programs that
 * link this file (ntpc, bench_cpu; docs/runtime.md).
 *
 * libgomp's default is to spin 300,000 rounds at the end of every parallel region before
 * sleeping. The CPU backend runs thousands of short regions per forward (each elementwise op,
 * norm and GEMM), so on a machine whose cores are also busy with other processes a spinning
 * thread takes the core from the one that still has work, and every region lasts a scheduler
 * time slice: measured on 2 cores with one other busy process, GPT-2's forward (B=1, S=128)
 * took 0.73-1.1 s with the default spin (6 s in one run) and 0.55-0.57 s with 1000 rounds,
 * which cost nothing measurable on an idle machine.
 *
 * libgomp reads GOMP_SPINCOUNT once, in its own constructor, before any code of the program
 * runs (and libc is not ready for setenv in a pre-initialiser). So when neither GOMP_SPINCOUNT
 * nor OMP_WAIT_POLICY is set, this constructor sets GOMP_SPINCOUNT and executes the program
 * again (/proc/self/exe, same arguments): about 2 ms, once, and nothing has run yet that could
 * notice. If that exec fails the program simply goes on with libgomp's default. A setting the
 * user made is left as it is; embedders of the library choose their own. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ntpc runs the CPU backend only for `ntpc run`; its other commands skip the exec (2 ms, which
 * adds up over the test suite's thousand invocations). Other programs always want it. */
static bool runs_kernels(int argc, char **argv) {
  const char *slash = strrchr(argv[0], '/'), *name = slash ? slash + 1 : argv[0];
  return strcmp(name, "ntpc") != 0 || (argc > 1 && strcmp(argv[1], "run") == 0);
}

__attribute__((constructor)) static void ntp_omp_env(int argc, char **argv, char **envp) {
  (void)envp;
  if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY") || !argv || !argv[0] || !runs_kernels(argc, argv)) return;
  /* the marker lets a child process go back to its own default (bench_cpu's PyTorch) */
  if (setenv("GOMP_SPINCOUNT", "1000", 0) != 0 || setenv("NTP_SET_GOMP_SPINCOUNT", "1", 1) != 0) return;
  execv("/proc/self/exe", argv); /* returns only on failure: go on as we are */
}
