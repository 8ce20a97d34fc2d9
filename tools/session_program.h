/* session_program.h — for programs that hold both a compiler session and the runtime (the CLI,
 * tests, benchmarks): the session's compiled program, read by the runtime from its image as a
 * model library's would be (runtime/core/ntp_program.h). */
#ifndef NTP_SESSION_PROGRAM_H
#define NTP_SESSION_PROGRAM_H

#include <stdio.h>

#include "ntp_program.h"
#include "ntpc.h"

/* NULL with a message in err when the session has no image (no successful compile) or the
 * image does not read. Free with ntp_program_free. */
static inline ntp_program *session_program(const ntpc_session *s, char *err, size_t cap) {
  const void *image;
  size_t len;
  ntp_program *p = NULL;
  if (ntpc_program_image(s, &image, &len) != NTPC_OK) snprintf(err, cap, "no program image (nothing compiled)");
  else if (ntp_program_read(image, len, &p, err, cap) != 0) p = NULL;
  return p;
}

#endif
