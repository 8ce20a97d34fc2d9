/* cli.h — what the two commands of the CLI (ntpc, ntpc plan) share. */
#ifndef NTP_CLI_H
#define NTP_CLI_H

#include <stdbool.h>

/* The value of option `name` at argv[*i] given as "NAME=V" or "NAME V" (then *i advances);
 * NULL if argv[*i] is another option, with *missing set when the value is absent. */
const char *cli_option_value(int argc, char **argv, int *i, const char *name, bool *missing);

/* `ntpc plan` (plan_cmd.c): its own options, its exit status. */
int ntpc_plan_command(int argc, char **argv);

#endif
