/* fuzz_options.c — the option parsers of `ntpc train` (--fail-at, numbers, checkpoints, -D),
 * `ntpc plan` and `ntpc goodput` (tools/ntpc/cli.h: ntpc_*_parse_options). The first byte picks
 * the command; the rest is its argv, one argument per line (a NUL ends the list). A parser must
 * accept the options (-1) or give --help's 0 or a usage error's 2: any other status, a crash, a
 * sanitizer report or a leak is a finding. Nothing is compiled, run or written. The parsers' usage
 * messages and --help: smoke.sh runs this harness with -close_fd_mask=3 (libFuzzer keeps its own
 * output). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fuzz_common.h"

enum { MAX_ARGS = 48 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 4096) return 0;
  static int (*const parse[])(int, char **) = {ntpc_train_parse_options, ntpc_plan_parse_options,
                                               ntpc_goodput_parse_options};
  static const char *const names[] = {"train", "plan", "goodput"};
  int which = data[0] % 3;
  char *text = malloc(size);
  if (!text) abort();
  memcpy(text, data + 1, size - 1);
  text[size - 1] = 0;
  char *argv[MAX_ARGS + 1];
  int argc = 0;
  argv[argc++] = (char *)names[which];
  for (char *p = text; argc < MAX_ARGS && p < text + size - 1;) {
    char *end = p + strcspn(p, "\n");
    bool last = !*end;
    *end = 0;
    argv[argc++] = p;
    if (last) break;
    p = end + 1;
  }
  argv[argc] = NULL;
  int rc = parse[which](argc, argv);
  if (rc != -1 && rc != 0 && rc != 2) {
    fprintf(fuzz_sink(), "%d\n", rc);
    abort(); /* a parser's status is accepted, --help, or a usage error */
  }
  free(text);
  return 0;
}
