/* fuzz_source.c — source text through the whole front end: parse, check, build and verify
 * the IR, shard at one of several world sizes, verify the sharded program and its memory
 * plan, then every --emit kind. The first byte chooses the world; the rest is the source.
 * A finding is a crash, a sanitizer report, a hang, or a verifier rejecting what the
 * compiler built (NTPC_ERR_INTERNAL: a compiler bug by definition). */
#include "fuzz_common.h"
#include "ntpc.h"
#include "shard.h"

static const int32_t worlds[] = {-1, 0, 1, 2, 3, 4, 5, 8};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || fuzz_autoplan_too_big(data, size)) return 0;
  int32_t world = worlds[data[0] % (sizeof worlds / sizeof worlds[0])];
  char *src = fuzz_cstr(data + 1, size - 1);
  ntpc_session *s = ntpc_session_new();
  ntpc_set_world(s, world); /* -1: no sharding; 0: the plan's world (else 1) */
  ntpc_status st = ntpc_compile_string(s, "fuzz.ntp", src);
  if (st == NTPC_ERR_INTERNAL) {
    ntpc_print_diags(s, stderr, 0);
    abort(); /* a verifier rejected what the compiler built */
  }
  ntpc_print_diags(s, fuzz_sink(), 0); /* rendering is code too */
  if (st == NTPC_OK) {
    FILE *out = fuzz_sink();
    ntpc_emit(s, "tokens", out);
    ntpc_emit(s, "ast", out);
    ntpc_emit(s, "ir", out);
    const sh_program *p = ntpc_sharded(s);
    if (p) {
      char kind[32];
      ntpc_emit(s, "sharded-ir", out);
      ntpc_emit(s, "report", out);
      for (int32_t r = 0; r < p->world; r++) {
        snprintf(kind, sizeof kind, "rank:%d", r);
        ntpc_emit(s, kind, out);
        snprintf(kind, sizeof kind, "cuda:%d", r);
        ntpc_emit(s, kind, out);
      }
    }
  }
  ntpc_session_free(s);
  free(src);
  return 0;
}
