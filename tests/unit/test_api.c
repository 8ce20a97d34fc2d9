/* test_api.c — libntpc as an embedding program uses it: compile strings, read
 * diagnostics as data, walk the IR, run it on the CPU reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir.h"
#include "ntpc.h"
#include "session_program.h"
#include "ntprt.h"

#include "check.h"

static const char good[] =
    "model tiny {\n"
    "  dim B = 2, D = 8, F = 2 * D;\n"
    "  input x : fp32[B, D];\n"
    "  h = up: linear(x, out = F, bias = true) @tp(2);\n"
    "  output y = down: linear(relu(h), out = D);\n"
    "}\n";

static void test_compile_and_walk(void) {
  ntpc_session *s = ntpc_session_new();
  CHECK(ntpc_define(s, "B", 3) == NTPC_OK);
  CHECK(ntpc_compile_string(s, "tiny.ntp", good) == NTPC_OK);
  CHECK(ntpc_diag_count(s) == 0);
  const ir_module *m = ntpc_module(s);
  CHECK(m && strcmp(m->name, "tiny") == 0);
  CHECK(m->n_layers == 2 && strcmp(m->layers[0].name, "up") == 0);
  CHECK(m->layers[0].tp.kind == TP_DEGREES && m->layers[0].tp.groups[0] == 2);
  CHECK(m->n_outputs == 1);
  const ir_value *y = &m->values[m->outputs[0].value];
  CHECK(y->shape.ndim == 2 && y->shape.dim[0] == 3 && y->shape.dim[1] == 8);
  /* every op keeps its source line */
  for (size_t i = 0; i < m->n_ops; i++) CHECK(m->ops[i].loc.first_line >= 3);

  /* the CPU reference agrees with a hand computation of the same model */
  ntp_cpu_result r;
  char err[256];
  ntp_program *prog = session_program(s, err, sizeof err);
  CHECK(prog != NULL);
  CHECK(ntp_cpu_run(&prog->global, 7, 1, &r, err, sizeof err) == 0); /* its names are the program's */
  const ntp_host_tensor *x = NULL, *w1 = NULL, *b1 = NULL, *w2 = NULL;
  for (size_t i = 0; i < r.n_inputs; i++) x = &r.inputs[i];
  for (size_t i = 0; i < r.n_params; i++) {
    if (!strcmp(r.params[i].name, "up.w")) w1 = &r.params[i];
    if (!strcmp(r.params[i].name, "up.b")) b1 = &r.params[i];
    if (!strcmp(r.params[i].name, "down.w")) w2 = &r.params[i];
  }
  CHECK(x && w1 && b1 && w2);
  if (x && w1 && b1 && w2) {
    double maxerr = 0;
    for (int b = 0; b < 3; b++)
      for (int o = 0; o < 8; o++) {
        double acc = 0;
        for (int f = 0; f < 16; f++) {
          double h = b1->f[f];
          for (int d = 0; d < 8; d++) h += (double)x->f[b * 8 + d] * w1->f[f * 8 + d];
          acc += (h > 0 ? h : 0) * w2->f[o * 16 + f];
        }
        double e = fabs(acc - r.outputs[0].f[b * 8 + o]);
        maxerr = e > maxerr ? e : maxerr;
      }
    CHECK(maxerr < 1e-5);
  }
  ntp_cpu_result_free(&r);
  ntp_program_free(prog);
  ntpc_session_free(s);
}

static void test_diagnostics_as_data(void) {
  ntpc_session *s = ntpc_session_new();
  const char *bad =
      "model m {\n"
      "  dim D = 8;\n"
      "  input x : fp32[D];\n"
      "  y = x + xx;\n"
      "  output z = lin: linear(x, out = D, bais = true);\n"
      "}\n";
  CHECK(ntpc_compile_string(s, "m.ntp", bad) == NTPC_ERR_INPUT);
  CHECK(ntpc_module(s) == NULL);
  CHECK(ntpc_error_count(s) == 2);
  const ntpc_diag *d0 = ntpc_diag_at(s, 0), *d1 = ntpc_diag_at(s, 1);
  CHECK(d0 && d0->severity == NTPC_ERROR && d0->line == 4 && d0->col == 11);
  CHECK(d0 && strstr(d0->message, "unknown name 'xx'") && strstr(d0->message, "did you mean 'x'"));
  CHECK(d1 && d1->line == 5 && strstr(d1->message, "did you mean 'bias'"));
  CHECK(d0 && strcmp(d0->file, "m.ntp") == 0);
  CHECK(ntpc_diag_at(s, 99) == NULL);
  ntpc_session_free(s);
}

static void test_usage_errors(void) {
  ntpc_session *s = ntpc_session_new();
  CHECK(ntpc_define_str(s, "S") == NTPC_ERR_USAGE);
  CHECK(strstr(ntpc_last_error(s), "NAME=VALUE") != NULL);
  CHECK(ntpc_define_str(s, "1S=3") == NTPC_ERR_USAGE);
  CHECK(ntpc_define_str(s, "S=12") == NTPC_OK);
  CHECK(ntpc_compile_file(s, "/nonexistent/x.ntp") == NTPC_ERR_USAGE);
  CHECK(strstr(ntpc_last_error(s), "cannot open") != NULL);
  CHECK(ntpc_emit(s, "ir", stdout) == NTPC_ERR_USAGE);
  ntpc_session_free(s);
}

/* issue 24 item 6: a source over the limit is refused with a diagnostic that names the file in
 * the session's own copy: the caller's path is freed (and overwritten) before it is read (a
 * use-after-free under ASan before; here also a wrong name) */
static void test_big_source_names_its_copy(void) {
  char *path = strdup("/tmp/ntp_test_api_big_XXXXXX");
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  FILE *f = fdopen(fd, "wb");
  static char chunk[1 << 20];
  memset(chunk, ' ', sizeof chunk);
  for (int i = 0; f && i < 17; i++) CHECK(fwrite(chunk, 1, sizeof chunk, f) == sizeof chunk);
  if (f) fclose(f);
  ntpc_session *s = ntpc_session_new();
  CHECK(ntpc_compile_file(s, path) == NTPC_ERR_INPUT);
  char *name = strdup(path);
  unlink(path);
  memset(path, 'x', strlen(path));
  free(path);
  const ntpc_diag *d = ntpc_diag_at(s, 0);
  CHECK(d && d->file && strcmp(d->file, name) == 0 && strstr(d->message, "larger than 16 MiB"));
  free(name);
  ntpc_session_free(s);
}

int main(void) {
  test_big_source_names_its_copy();
  test_compile_and_walk();
  test_diagnostics_as_data();
  test_usage_errors();
  return check_report("api");
}
