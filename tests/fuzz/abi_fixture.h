/* abi_fixture.h — a model library without the library: a small model compiled and sharded
 * in-process, wrapped in the ntp_artifact a generated model.so would carry, so that the model
 * ABI (runtime/abi/model_abi.c) can be called directly by the misuse test and the ABI fuzzer. */
#ifndef NTP_ABI_FIXTURE_H
#define NTP_ABI_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "ntp_artifact.h"
#include "ntpc.h"
#include "session_program.h"

/* The model: tests/fuzz/fixture.ntp, found through NTP_FIXTURE (an absolute path that the
 * build defines). */
#ifndef NTP_FIXTURE
#error "NTP_FIXTURE: the path of tests/fuzz/fixture.ntp"
#endif

typedef struct abi_fixture {
  ntpc_session *s;
  ntp_artifact a;    /* its image is the session's */
  ntp_program *prog; /* the same image read, for the harnesses' own runs */
} abi_fixture;

/* 0, or -1 with the diagnostics printed. world: 1 or 2 ranks. */
static inline int abi_fixture_init(abi_fixture *f, int32_t world) {
  f->s = ntpc_session_new();
  ntpc_set_world(f->s, world);
  if (!f->s || ntpc_compile_file(f->s, NTP_FIXTURE) != NTPC_OK) {
    if (f->s) ntpc_print_diags(f->s, stderr, 0);
    return -1;
  }
  const void *image;
  size_t len;
  char err[512];
  if (ntpc_program_image(f->s, &image, &len) != NTPC_OK || !(f->prog = session_program(f->s, err, sizeof err)))
    return -1;
  f->a = (ntp_artifact){.abi_version = NTP_MODEL_ABI_VERSION, .image = image, .image_len = len};
  f->a.info.abi_version = NTP_MODEL_ABI_VERSION;
  f->a.info.name = "m";
  f->a.info.world = world;
  return 0;
}

static inline void abi_fixture_free(abi_fixture *f) {
  ntp_program_free(f->prog);
  ntpc_session_free(f->s);
}

#endif
