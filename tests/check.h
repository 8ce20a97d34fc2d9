/* check.h — the assertion macros of the C unit tests: report and count, keep going. */
#ifndef NTP_TEST_CHECK_H
#define NTP_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
      failures++;                                                                 \
    }                                                                             \
  } while (0)

/* the same with a message (printf-style) saying what was found */
#define CHECKF(cond, ...)                                                         \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                               \
      fputc('\n', stderr);                                                        \
      failures++;                                                                 \
    }                                                                             \
  } while (0)

/* main's last words: the count of failed checks, or the all-clear naming the suite */
static inline int check_report(const char *suite) {
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("%s: all checks passed\n", suite);
  return 0;
}

#endif
