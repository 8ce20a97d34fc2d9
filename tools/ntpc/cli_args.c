/* cli_args.c — option values and colour as the commands of the CLI take them. */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "exec.h"
#include "ntpc.h"

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

int cli_color(const char *when) {
  if (!when || strcmp(when, "auto") == 0) return isatty(fileno(stderr)) && !getenv("NO_COLOR");
  return strcmp(when, "always") == 0;
}

int cli_usage_error(const char *command, const char *fmt, const char *arg) {
  fprintf(stderr, "%s: error: ", command);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nTry '%s --help'.\n", command);
  return 2;
}

bool cli_number(const char *v, double lo, double hi, double *out) {
  /* decimal only: strtod would also take hex (0x10), "inf", "nan" and leading spaces */
  if (!*v || strspn(v, "0123456789.eE+-") != strlen(v)) return false;
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(d) || d < lo || d > hi) return false;
  *out = d;
  return true;
}


void cli_verbose_exec(ntp_exec *e) {
  const char *v = getenv("NTP_VERBOSE");
  char lines[4096];
  if (!v || !*v || !strcmp(v, "0")) return;
  ntp_exec_describe(e, lines, sizeof lines);
  if (lines[0]) printf("%s\n", lines);
}

bool cli_optimizer_option(const char *command, int argc, char **argv, int *i, bool *missing, cli_optimizer *o, int *rc) {
  static const struct {
    const char *name;
    double lo, hi;
    size_t field;
  } opts[] = {{"--zero", 0, 2, offsetof(cli_optimizer, zero)},
              {"--redundancy", 1, 64, offsetof(cli_optimizer, redundancy)},
              {"--domain-size", 1, 4096, offsetof(cli_optimizer, domain_size)}};
  for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
    const char *v = cli_option_value(argc, argv, i, opts[k].name, missing);
    if (!v) continue;
    double d;
    char msg[160];
    *rc = -1;
    /* digits only: what the user wrote is what is used (no sign, exponent, spaces or other base) */
    if (!*v || strspn(v, "0123456789") != strlen(v) || !cli_number(v, opts[k].lo, opts[k].hi, &d)) {
      snprintf(msg, sizeof msg, "%s %%s: expected a whole number from %g to %g", opts[k].name, opts[k].lo, opts[k].hi);
      *rc = cli_usage_error(command, msg, v);
    } else
      *(int *)((char *)o + opts[k].field) = (int)d;
    return true;
  }
  return false;
}

bool cli_optimizer_apply(const char *command, struct ntpc_session *s, const cli_optimizer *o) {
  bool ok = true;
  if (o->zero >= 0 || o->redundancy >= 0)
    ok = ntpc_set_optimizer(s, o->zero >= 0 ? o->zero : 1, o->redundancy >= 0 ? o->redundancy : 1) == NTPC_OK;
  if (ok && o->domain_size >= 0) ok = ntpc_set_domain_size(s, o->domain_size) == NTPC_OK;
  if (!ok) fprintf(stderr, "%s: error: %s\n", command, ntpc_last_error(s));
  return ok;
}
