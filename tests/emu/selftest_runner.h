/* selftest_runner.h — the emulator's self-tests (test_emu_selftest.c, test_emu_nccl.c): each case
 * runs in a child process (a launch failure is sticky for the rest of a process, as on a GPU, and
 * emu_fatal stops it), and must succeed, or fail with its expected words in the output. */
#ifndef NTP_SELFTEST_RUNNER_H
#define NTP_SELFTEST_RUNNER_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct selftest_case {
  const char *name;
  cudaError_t (*run)(void);
  const char *expect; /* in the error text; NULL: must succeed */
} selftest_case;

static inline cudaError_t as_cuda(int ok) { return ok ? cudaSuccess : cudaErrorUnknown; }

static int run_cases(const selftest_case *cases, int n) {
  int failed = 0;
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
    /* 134: the emulator stopped the process (emu_fatal) */
    bool ok = cases[i].expect ? exited && (code == 1 || code == 134) && strstr(buf, cases[i].expect) : exited && code == 0;
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

#endif
