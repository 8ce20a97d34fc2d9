/* cli_args.c — option values as both commands of the CLI (ntpc, ntpc plan) take them. */
#include <string.h>

#include "cli.h"

const char *cli_option_value(int argc, char **argv, int *i, const char *name, bool *missing) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != 0) return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}
