/* cli.h — what the commands of the CLI (ntpc, ntpc plan, ntpc train) share. */
#ifndef NTP_CLI_H
#define NTP_CLI_H

#include <stdbool.h>

/* The value of option `name` at argv[*i] given as "NAME=V" or "NAME V" (then *i advances);
 * NULL if argv[*i] is another option, with *missing set when the value is absent. */
const char *cli_option_value(int argc, char **argv, int *i, const char *name, bool *missing);

/* A usage error of `command` ("ntpc", "ntpc plan", ...): "COMMAND: error: MESSAGE" and where to
 * read more, on stderr; returns 2, the exit status of usage errors. fmt takes one %s. */
int cli_usage_error(const char *command, const char *fmt, const char *arg);

/* Whether diagnostics get colour: --color=WHEN (auto, the default: stderr is a terminal and
 * NO_COLOR is unset; always; never). */
int cli_color(const char *when);

/* A finite number in [lo, hi] that is all of v. */
bool cli_number(const char *v, double lo, double hi, double *out);

/* --zero Z, --redundancy K, --domain-size D (the distributed optimizer, docs/training.md): -1 unset.
 * cli_optimizer_option takes one at argv[*i]: true when it was one (then *rc is -1, or the exit
 * status of its usage error); cli_optimizer_apply gives what was set to the session (--redundancy
 * alone means --zero 1), false with the error printed. */
typedef struct cli_optimizer {
  int zero, redundancy, domain_size;
} cli_optimizer;
#define CLI_OPTIMIZER_UNSET ((cli_optimizer){-1, -1, -1})
struct ntpc_session;
bool cli_optimizer_option(const char *command, int argc, char **argv, int *i, bool *missing, cli_optimizer *o, int *rc);
bool cli_optimizer_apply(const char *command, struct ntpc_session *s, const cli_optimizer *o);

/* `ntpc plan` (plan_cmd.c) and `ntpc train` (train_cmd.c): their own options, their exit status. */
int ntpc_plan_command(int argc, char **argv);
int ntpc_train_command(int argc, char **argv);
/* `ntpc goodput` (goodput_cmd.c) */
int ntpc_goodput_command(int argc, char **argv);
/* `ntpc calibrate` (calibrate_cmd.c): measures the local GPUs, writes a device profile */
int ntpc_calibrate_command(int argc, char **argv);

/* With NTP_VERBOSE set (and not "0"): what the executor's backend chose (ntp_exec_describe: the
 * CUDA backend's GEMM and overlap summaries) on stdout; nothing for the reference (NULL). */
struct ntp_exec;
void cli_verbose_exec(struct ntp_exec *e);

/* The option parsers alone (the options fuzzer, tests/fuzz/fuzz_options.c): -1 when the options
 * are accepted, else the exit status they give (0 for --help). Nothing is compiled, run or
 * written; what the options name is not opened (-D values and plan files of train are). */
int ntpc_train_parse_options(int argc, char **argv);
int ntpc_plan_parse_options(int argc, char **argv);
int ntpc_goodput_parse_options(int argc, char **argv);

#endif
