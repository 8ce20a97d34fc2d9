/* test_oom.c — running out of memory while a compiler table grows is an error the library
 * returns ("out of memory", NTPC_ERR_INTERNAL), never an abort: every growth of a GPT-2 compile
 * (and of the planner) is made to fail once, in turn. */
#include <stdio.h>
#include <string.h>

#include "../check.h"
#include "compiler.h"
#include "ntpc.h"
#include "planner.h"

static ntpc_status compile_once(long fail_at, char *msg, size_t cap) {
  ntpc_session *s = ntpc_session_new();
  CHECK(s != NULL);
  ntpc_define(s, "L", 2);
  ntpc_define(s, "D", 64);
  ntpc_define(s, "H", 4);
  ntpc_define(s, "V", 128);
  ntpc_add_plan_file(s, "examples/plans/gpt2_auto.ntp");
  ntpc_set_world(s, 0);
  ntpc_want_cuda(s, true);
  ntp_fail_growth_after(fail_at);
  ntpc_status st = ntpc_compile_file(s, "examples/gpt2.ntp");
  ntp_fail_growth_after(0);
  snprintf(msg, cap, "%s", ntpc_last_error(s));
  ntpc_session_free(s);
  return st;
}

int main(void) {
  char msg[512];
  CHECK(compile_once(0, msg, sizeof msg) == NTPC_OK);
  long failed = 0, k;
  /* every growth until one is past the end (the compile then succeeds) */
  for (k = 1; k < 100000; k += k < 200 ? 1 : 37) {
    ntpc_status st = compile_once(k, msg, sizeof msg);
    if (st == NTPC_OK) break;
    CHECK(st == NTPC_ERR_INTERNAL);
    if (strcmp(msg, "out of memory") != 0) fprintf(stderr, "growth %ld: '%s'\n", k, msg);
    CHECK(strcmp(msg, "out of memory") == 0);
    failed++;
  }
  CHECK(failed > 50); /* the hook reaches the pipeline's tables */
  printf("%ld compiles failed cleanly on out of memory; growth %ld is past the end\n", failed, k);
  return check_report("oom");
}
