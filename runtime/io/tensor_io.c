/* tensor_io.c — tensor dumps for independent checks, and one-line summaries. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "ntprt.h"
#include "outfile.h"

static int dump_one(FILE *manifest, const char *dir, const char *kind, const ntp_host_tensor *t, size_t idx,
                    char *err, size_t cap) {
  char file[64], path[4096];
  snprintf(file, sizeof file, "%s%zu.bin", kind, idx);
  snprintf(path, sizeof path, "%s/%s", dir, file);
  ntp_outfile out;
  if (ntp_outfile_open(&out, path, NULL, err, cap) != 0) return -1;
  size_t n = (size_t)shape_numel(&t->shape);
  /* raw little-endian float32 / int32: the host is x86-64 or arm64, both little-endian */
  size_t w = fwrite(t->f ? (const void *)t->f : (const void *)t->i, 4, n, out.f);
  if (ntp_outfile_commit(&out, w == n, err, cap) != 0) return -1;
  fprintf(manifest, "%s\t%s\t%s\t", kind, t->name, dtype_name(t->dtype));
  for (int d = 0; d < t->shape.ndim; d++) fprintf(manifest, "%s%lld", d ? "," : "", (long long)t->shape.dim[d]);
  fprintf(manifest, "\t%s\n", file);
  return 0;
}

int ntp_dump_tensors(const ntp_cpu_result *res, const char *dir, char *err, size_t cap) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, cap, "cannot create %s: %s", dir, strerror(errno));
    return -1;
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    snprintf(err, cap, "cannot write into %s: not a directory", dir);
    return -1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/manifest.tsv", dir);
  ntp_outfile out; /* the manifest last: present only when every file it names was written */
  if (ntp_outfile_open(&out, path, NULL, err, cap) != 0) return -1;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < res->n_inputs; i++) rc = dump_one(out.f, dir, "input", &res->inputs[i], i, err, cap);
  for (size_t i = 0; rc == 0 && i < res->n_params; i++) rc = dump_one(out.f, dir, "param", &res->params[i], i, err, cap);
  for (size_t i = 0; rc == 0 && i < res->n_outputs; i++) rc = dump_one(out.f, dir, "output", &res->outputs[i], i, err, cap);
  if (rc != 0) {
    ntp_outfile_abort(&out);
    return rc;
  }
  return ntp_outfile_commit(&out, !ferror(out.f), err, cap);
}

void ntp_print_tensor_summary(const ntp_host_tensor *t, FILE *out) {
  char sh[128];
  int64_t n = shape_numel(&t->shape);
  double sum = 0, abs_sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = t->f ? t->f[i] : t->i[i];
    sum += v;
    abs_sum += fabs(v);
  }
  fprintf(out, "%s : %s%s  sum=%.6e  mean|x|=%.6e  [", t->name, dtype_name(t->dtype), shape_str(&t->shape, sh, sizeof sh),
          sum, n ? abs_sum / (double)n : 0.0);
  for (int64_t i = 0; i < n && i < 4; i++) {
    if (t->f) fprintf(out, "%s%.6g", i ? ", " : "", t->f[i]);
    else fprintf(out, "%s%d", i ? ", " : "", t->i[i]);
  }
  fprintf(out, "%s]\n", n > 4 ? ", ..." : "");
}
